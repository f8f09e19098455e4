"""Where the kernels run, in public names: the one device probe (``course_kernels.triton._env``
decides it once, at import, before any Triton kernel is defined) as the chapters read it.

- :data:`INTERPRET`: True when the kernels run in Triton's CPU interpreter (no CUDA GPU).
- :data:`HAS_GPU`: a CUDA GPU is visible to torch.
- :func:`device_kind`: ``"cuda"`` or ``"cpu"``, where tensors for the kernels must live.
- :func:`capability`: the GPU's compute capability, or None under the interpreter.
- :data:`SM75_SHARED_BYTES`: the shared memory one program may use on a T4 (sm_75).
- :func:`next_power_of_2`: Triton's power-of-two rounding, in plain Python.
"""

from .triton._env import (
    HAS_GPU,
    INTERPRET,
    SM75_SHARED_BYTES,
    capability,
    device_kind,
    next_power_of_2,
)

__all__ = [
    "HAS_GPU",
    "INTERPRET",
    "SM75_SHARED_BYTES",
    "capability",
    "device_kind",
    "next_power_of_2",
]
