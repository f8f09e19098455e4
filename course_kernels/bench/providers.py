"""The benchmarks' providers: the attention implementations a benchmark times, by name.

Split from :mod:`course_kernels.bench` (which re-exports these names). ``flash`` (this
package's Triton kernel), ``sdpa-flash``, ``sdpa-cudnn``, ``sdpa-efficient`` (PyTorch SDPA's
backends), ``naive`` (:func:`naive_attention`) and ``tutorial`` (Triton's fused-attention
tutorial, loaded by :func:`load_tutorial` from the file named by ``$COURSE_KERNELS_TUTORIAL``;
:func:`_tutorial_provenance` names the copy in every result's environment).
"""

from __future__ import annotations

import os

PROVIDERS = ("flash", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "naive", "tutorial")
PROVIDER_LABELS = {
    "flash": "this course's kernel",
    "sdpa-flash": "SDPA FlashAttention-2",
    "sdpa-cudnn": "SDPA cuDNN",
    "sdpa-efficient": "SDPA memory-efficient",
    "naive": "naive attention",
    "tutorial": "Triton tutorial",
}
# The ``tutorial`` provider: Triton's fused-attention tutorial, loaded from a file you download
# (it is not part of this repository). Take the copy of the Triton version you benchmark, e.g.
# https://github.com/triton-lang/triton/blob/release/3.6.x/python/tutorials/06-fused-attention.py
# (MIT licence, Copyright OpenAI / the Triton authors), and point this variable at it.
TUTORIAL_ENV = "COURSE_KERNELS_TUTORIAL"


def _tutorial_provenance():
    """SHA-256 of the tutorial file in $COURSE_KERNELS_TUTORIAL (and its first header line that
    names its origin, if any), or None when the variable is unset."""
    import hashlib

    path = os.environ.get(TUTORIAL_ENV)
    if not path or not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        data = f.read()
    origin = [ln for ln in data.decode("utf-8", "replace").splitlines()[:5] if "source:" in ln]
    return {
        "sha256": hashlib.sha256(data).hexdigest(),
        "origin": origin[0].strip("# ") if origin else None,
    }


def naive_attention(q, k, v, causal=False, scale=None):
    """Standard attention in the inputs' dtype: S, P materialized in memory (N x N)."""
    import torch

    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale  # (B, H, Nq, Nk)
    if causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ v  # (B, H, Nq, d)


def load_tutorial(path=None):
    """Import Triton's fused-attention tutorial from ``path`` (default: $COURSE_KERNELS_TUTORIAL).

    Returns the module; its ``attention(q, k, v, causal, sm_scale)`` is the tutorial's
    differentiable op (fp16; head dims 16-256, powers of two; N a multiple of 128 for the
    backward in some versions). Raises ``RuntimeError`` saying where to get the file if it is
    not there. The file's SHA-256 is in ``module.__sha256__`` so results can name the copy used.
    """
    import hashlib
    import importlib.util

    path = path or os.environ.get(TUTORIAL_ENV)
    if path in _TUTORIALS:
        return _TUTORIALS[path]
    if not path or not os.path.isfile(path):
        raise RuntimeError(
            f"the 'tutorial' provider needs Triton's fused-attention tutorial: download "
            f"python/tutorials/06-fused-attention.py of your Triton version from "
            f"https://github.com/triton-lang/triton (e.g. the release/3.6.x branch) and set "
            f"{TUTORIAL_ENV}=/path/to/it; got {path!r}"
        )
    spec = importlib.util.spec_from_file_location("triton_fused_attention_tutorial", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "attention", None)):
        raise RuntimeError(
            f"{path} defines no attention(q, k, v, causal, sm_scale) function: "
            "is it python/tutorials/06-fused-attention.py?"
        )
    with open(path, "rb") as f:
        module.__sha256__ = hashlib.sha256(f.read()).hexdigest()
    _TUTORIALS[path] = module
    return module


_TUTORIALS: dict = {}  # path -> module: loaded (and its kernels compiled) once per process


def provider_fn(name):
    """A function (q, k, v, causal) -> out for each provider."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if name == "tutorial":
        tut = load_tutorial()

        def tutorial(q, k, v, causal):
            if q.dtype != torch.float16:
                raise ValueError(f"the Triton tutorial runs float16 only; got {q.dtype}")
            return tut.attention(q, k, v, causal, q.shape[-1] ** -0.5)

        return tutorial
    if name == "flash":
        from ..triton.flash import flash_attention

        return lambda q, k, v, causal: flash_attention(q, k, v, causal=causal)
    if name == "naive":
        return naive_attention
    backend = {
        "sdpa-flash": SDPBackend.FLASH_ATTENTION,
        "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
        "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
    }[name]

    def run(q, k, v, causal):
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return run
