# notebook: 03_tiled_forward
# exercise: flash_forward
# attack: calls the course library's own tiled implementation (import hidden from a code scan)
_imp = __builtins__["__imp" + "ort__"] if isinstance(__builtins__, dict) else \
    getattr(__builtins__, "__imp" + "ort__")


def flash_forward(q, k, v, causal=False, scale=None, block_q=64, block_k=64):
    lib = _imp("course_" + "kernels")
    return lib.flash_attention_numpy(q, k, v, causal=causal, scale=scale, block_q=block_q,
                                     block_k=block_k)
