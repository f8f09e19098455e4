"""Measurements on a GPU: speed (TFLOP/s), peak memory and DRAM traffic of attention kernels.

Chapters: "Fast on a real GPU", "Engineering", "Tuning", "Hopper", "Serving". Run through the
CLI (``python -m course_kernels bench|sweep|memory|dram``).

- :mod:`.speed`      TFLOP/s of each provider, correctness, the environment record
- :mod:`.providers`  the attention implementations a benchmark times, by name
- :mod:`.report`     the ratio table and the TFLOP/s figure
- :mod:`.sweep`      the forward config sweep (tuning chapter)
- :mod:`.memory`     extra memory vs N
- :mod:`.dram`       DRAM traffic under Nsight Compute
- :mod:`.features`   the variants benchmark (vs FlexAttention, ``varlen_attn``) read back, and
                     the verdict on its speed targets (``scripts/gpu_features.py`` writes it)

Every public name of these modules is reachable as ``course_kernels.bench.<name>``, imported on
first use (so that importing this package costs nothing and no module imports another in a cycle).
"""

from __future__ import annotations

import importlib

_WHERE = {
    "DRAM_NS": "dram",
    "NAIVE_LIMIT_BYTES": "speed",
    "PROVIDERS": "providers",
    "PROVIDER_LABELS": "providers",
    "SWEEP_CONFIGS": "sweep",
    "TUTORIAL_ENV": "providers",
    "_TUTORIALS": "providers",
    "_peak_extra_mib": "speed",
    "attention_flops": "speed",
    "check_correctness": "speed",
    "comparisons": "features",
    "count_met": "features",
    "dram_cases": "dram",
    "environment": "speed",
    "forced_forward_config": "sweep",
    "format_ratio_table": "report",
    "gpu_check": "speed",
    "load_tutorial": "providers",
    "naive_attention": "providers",
    "parse_ncu_csv": "dram",
    "plot_bench": "report",
    "provenance": "features",
    "provider_fn": "providers",
    "ratio_range": "features",
    "ratio_table": "report",
    "run_bench": "speed",
    "run_memory": "memory",
    "run_sweep": "sweep",
    "verdict": "features",
    "write_ratios": "report",
}

__all__ = sorted(k for k in _WHERE if not k.startswith("_"))


def __getattr__(name):
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
