"""Rung 7: beyond one GPU. Ring attention on ``torch.distributed``.

Chapter: "Beyond one GPU" (book/part2/beyond_one_gpu.ipynb).

- :mod:`.ring`      ``ring_attention``: K/V passed round a ring, partial results merged
- :mod:`.plan`      how the sequence is cut over ranks (layouts, shards, the schedule)
- :mod:`.cost`      bytes sent, overlap of one step, the smallest shard that hides the transfer
- :mod:`.setup`     validating inputs and agreeing on shapes across ranks
- :mod:`.stats`     per-step timing records
- :mod:`.spawn`     simulated ranks (gloo on CPU, NCCL on GPUs) for laptops and tests
- :mod:`.check`     forward and backward against the single-device result
- :mod:`.measure`   time per step, bytes per rank, peak memory
- :mod:`.torch_cp`  PyTorch's own context parallelism, for comparison
- :mod:`.bench`     the command line: ``python -m course_kernels.distributed.bench``
"""

from __future__ import annotations

import importlib


# The public names of :mod:`.ring` (its ``__all__``) resolve here on first use, so that the cost
# model and the plan stay importable without torch.
def __getattr__(name):
    if not name.startswith("_"):
        ring = importlib.import_module(".ring", __name__)
        if name in ring.__all__:
            return getattr(ring, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
