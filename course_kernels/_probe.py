"""The one device probe: is a CUDA GPU usable by torch? No side effects (nothing is set), so the
CLI, the Colab setup cell and ``_triton_env`` (which then picks GPU or interpreter) all ask it."""

from __future__ import annotations


def cuda_available() -> bool:
    """True when torch imports and sees a CUDA GPU; False without torch."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())
