"""A tiny character-level GPT whose attention is pluggable: the course kernel or standard attention.

Chapter: "Applications" (book part two), section "Training with the kernel".

The model is nanoGPT's (Karpathy) in miniature: token + position embeddings, ``n_layer`` blocks of
causal self-attention and an MLP (pre-LayerNorm, residuals), a final LayerNorm and a linear head.
Only the attention differs between the runs:

- ``"flash"``: ``course_kernels.flash_attention(q, k, v, causal=True)`` (Triton; on a CPU it runs
  in Triton's interpreter, which is slow: use tiny sizes there);
- ``"standard"``: S = Q K^T / sqrt(d), mask, softmax, P V with torch matmuls (saves the
  (B, H, T, T) probabilities for the backward);
- ``"sdpa"``: PyTorch's ``scaled_dot_product_attention(is_causal=True)`` (its fastest backend).

Because attention is exact in every case, two runs from the same seed see the same initial
weights and the same batches and produce the same loss curve up to rounding.
:func:`train` is deterministic for a given seed on a CPU (on a GPU, atomic additions in the
embedding's backward can change the last bits) and returns the loss curve, tokens/s
and the peak GPU memory (CUDA only); :func:`saved_activation_bytes` counts the bytes autograd
keeps for the backward, which works on any device and shows the T^2 term of standard attention.

Layout inside attention: (B, H, T, hd) = (batch, heads, time, head dim), like SDPA.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ..triton import _env as _triton_env  # decides GPU vs interpreter before any kernel is defined
from .._compat import renamed_kwargs

TEXT = "text/tiny_corpus.txt"  # package data: course_kernels/data/text/ (its README: the source)


# -- data ---------------------------------------------------------------------------------------
def load_text(name: str = TEXT) -> str:
    """The training text that ships with the package (``course_kernels/data/<name>``)."""
    from ..datafiles import data_path

    if isinstance(name, str) and name.startswith("data/"):
        name = name[len("data/") :]  # the older spelling, relative to the repository root
    return data_path(name).read_text(encoding="utf-8")


class CharTokenizer:
    """One token per distinct character of the text."""

    def __init__(self, text: str):
        if not isinstance(text, str) or not text:
            raise ValueError("text must be a non-empty string")
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, s: str) -> torch.Tensor:
        try:
            return torch.tensor([self.stoi[c] for c in s], dtype=torch.long)
        except KeyError as exc:
            raise ValueError(f"character {exc.args[0]!r} is not in the vocabulary") from None

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def get_batch(data: torch.Tensor, batch_size: int, context_len: int, generator: torch.Generator):
    """Random windows of the text: x (B, T) and the next characters y (B, T)."""
    start = torch.randint(len(data) - context_len - 1, (batch_size,), generator=generator)
    x = torch.stack([data[i : i + context_len] for i in start.tolist()])  # (B, T)
    y = torch.stack([data[i + 1 : i + 1 + context_len] for i in start.tolist()])  # (B, T)
    return x, y


# -- attention ------------------------------------------------------------------------------------
def standard_attention(q, k, v):
    """Causal softmax(Q K^T / sqrt(d)) V with explicit matrices. q, k, v: (B, H, T, hd)."""
    T = q.shape[-2]
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, H, T, T)
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()  # (T, T) key j <= query i
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s.float(), dim=-1).to(q.dtype)  # (B, H, T, T): kept for the backward
    return p @ v  # (B, H, T, hd)


def flash(q, k, v):
    """The course's Triton kernel (nothing T x T is stored)."""
    from ..triton.flash import flash_attention

    return flash_attention(q, k, v, causal=True)


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


ATTENTION = {"standard": standard_attention, "flash": flash, "sdpa": sdpa}


# -- model ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GPTConfig:
    """Model shape. ``n_embd / n_head`` is the head dim (a multiple of 8 for the flash kernel)."""

    vocab_size: int
    context_len: int = 32  # context length T
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    attention: str = "standard"  # a key of ATTENTION

    def __post_init__(self):
        for name in ("vocab_size", "context_len", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer; got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")
        if self.attention not in ATTENTION:
            raise ValueError(
                f"attention must be one of {sorted(ATTENTION)}; got {self.attention!r}"
            )
        if self.attention == "flash" and (self.n_embd // self.n_head) % 8:
            raise ValueError(
                f"the flash kernel needs a head dim that is a multiple of 8; got "
                f"{self.n_embd // self.n_head}"
            )


# The constructor's old keyword (block_size=) keeps working for one release.
GPTConfig.__init__ = renamed_kwargs(block_size="context_len")(GPTConfig.__init__)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.attend = ATTENTION[cfg.attention]

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 x (B, T, C)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = self.attend(q, k, v)  # (B, H, T, hd)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(), nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        )

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos = nn.Embedding(cfg.context_len, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    def forward(self, idx, targets=None):
        """idx (B, T) token ids -> logits (B, T, vocab) [, mean cross-entropy loss]."""
        B, T = idx.shape
        if self.cfg.context_len < T:
            raise ValueError(f"sequence length {T} exceeds context_len {self.cfg.context_len}")
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))  # (B, T, vocab)
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())

    @torch.no_grad()
    def generate(self, idx, n_new: int, generator: torch.Generator | None = None):
        """Sample ``n_new`` tokens after idx (B, T0), one at a time."""
        for _ in range(n_new):
            logits = self(idx[:, -self.cfg.context_len :])[:, -1].float()  # (B, vocab)
            nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)  # (B, 1)
            idx = torch.cat([idx, nxt], dim=1)
        return idx


# -- training ---------------------------------------------------------------------------------
@dataclass
class TrainResult:
    config: dict
    losses: list = field(default_factory=list)  # training loss at every step
    tokens_per_s: float = 0.0  # after the first step (which compiles kernels)
    seconds: float = 0.0
    peak_memory_bytes: int | None = None  # CUDA only (torch.cuda.max_memory_allocated)
    device: str = "cpu"
    amp_dtype: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def _default_device(device):
    """None -> the device the course kernel runs on here ("cuda" on a GPU, "cpu" otherwise)."""
    return _triton_env.device_kind() if device is None else device


@renamed_kwargs(block_size="context_len")
def train(
    attention: str = "standard",
    steps: int = 200,
    batch_size: int = 16,
    context_len: int = 32,
    n_layer: int = 2,
    n_head: int = 2,
    n_embd: int = 32,
    lr: float = 3e-3,
    seed: int = 0,
    device: str | None = None,
    amp_dtype: torch.dtype | None = None,
    text: str | None = None,
    progress: bool = True,
    cpu_threads: int | None = 1,
) -> TrainResult:
    """Train a fresh tiny GPT on the shipped text with AdamW; deterministic for a seed.

    Both the weights (``torch.manual_seed(seed)``) and the batches (a separate generator) depend
    only on ``seed``, so two runs that differ only in ``attention`` see identical data.
    ``device``: None = where the course kernel runs (``"cuda"`` on a GPU, else ``"cpu"``).
    ``amp_dtype`` (e.g. ``torch.bfloat16`` on a GPU) runs the model under autocast.
    ``cpu_threads``: torch threads on a CPU during the run (restored after). One is fastest for
    matrices this small: on a 2-core machine shared with other work, 2 threads ran 8x slower.
    None leaves torch's setting alone.
    """
    device = _default_device(device)
    threads = torch.get_num_threads()
    if cpu_threads is not None and not str(device).startswith("cuda"):
        torch.set_num_threads(cpu_threads)
    try:
        return _train(
            attention,
            steps,
            batch_size,
            context_len,
            n_layer,
            n_head,
            n_embd,
            lr,
            seed,
            device,
            amp_dtype,
            text,
            progress,
        )
    finally:
        torch.set_num_threads(threads)


def _train(
    attention,
    steps,
    batch_size,
    context_len,
    n_layer,
    n_head,
    n_embd,
    lr,
    seed,
    device,
    amp_dtype,
    text,
    progress,
) -> TrainResult:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer; got {steps!r}")
    text = load_text() if text is None else text
    tok = CharTokenizer(text)
    data = tok.encode(text)
    if len(data) < context_len + 2:  # long contexts on a short text: repeat it (for timing runs)
        data = data.repeat(-(-(context_len + 2) // len(data)))
    cfg = GPTConfig(tok.vocab_size, context_len, n_layer, n_head, n_embd, attention)
    torch.manual_seed(seed)
    model = GPT(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    result = TrainResult(
        config={**asdict(cfg), "steps": steps, "batch_size": batch_size, "lr": lr, "seed": seed},
        device=str(device),
        amp_dtype=None if amp_dtype is None else str(amp_dtype),
    )
    cuda = str(device).startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    from tqdm import tqdm

    t0 = None
    for step in tqdm(
        range(steps), desc=f"train ({attention})", disable=not progress, mininterval=2
    ):
        x, y = get_batch(data, batch_size, context_len, gen)
        x, y = x.to(device), y.to(device)
        with torch.autocast(
            device_type="cuda" if cuda else "cpu", dtype=amp_dtype, enabled=amp_dtype is not None
        ):
            _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        result.losses.append(loss.item())  # .item() synchronises: the timing is honest
        if step == 0:
            t0 = time.perf_counter()
    elapsed = time.perf_counter() - t0
    result.seconds = elapsed
    result.tokens_per_s = (steps - 1) * batch_size * context_len / elapsed if steps > 1 else 0.0
    if cuda:
        result.peak_memory_bytes = int(torch.cuda.max_memory_allocated())
    return result


@renamed_kwargs(block_size="context_len")
def saved_activation_bytes(
    attention: str,
    batch_size: int = 4,
    context_len: int = 64,
    n_layer: int = 2,
    n_head: int = 2,
    n_embd: int = 32,
    device: str | None = None,
    vocab_size: int = 64,
) -> int:
    """Bytes of the distinct tensors autograd saves for the backward of one forward pass.

    Counted with ``torch.autograd.graph.saved_tensors_hooks`` (each storage once; parameters
    excluded), so it works on a CPU too. Standard attention saves the (B, H, T, T) probabilities
    of every layer; the flash kernel saves O and the logsumexp. ``device``: as in :func:`train`.
    """
    device = _default_device(device)
    cfg = GPTConfig(vocab_size, context_len, n_layer, n_head, n_embd, attention)
    torch.manual_seed(0)
    model = GPT(cfg).to(device)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    idx = torch.randint(vocab_size, (batch_size, context_len), device=device)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _, loss = model(idx, idx)
    del loss
    return sum(seen.values())
