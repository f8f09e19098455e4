# notebook: 03_tiled_forward
# exercise: flash_forward
# attack: PyTorch's scaled_dot_product_attention for the NumPy forward (plainly written: the lint refuses it)
import torch


def flash_forward(q, k, v, causal=False, scale=None, block_q=64, block_k=64):
    t = [torch.from_numpy(a) for a in (q, k, v)]
    o = torch.nn.functional.scaled_dot_product_attention(*t, is_causal=causal, scale=scale)
    s = (t[0] @ t[1].transpose(-1, -2)) * (scale or q.shape[-1] ** -0.5)
    return o.numpy(), torch.logsumexp(s, -1).numpy()
