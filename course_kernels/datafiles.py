"""Measured data the chapters read (benchmarks, memory, DRAM traffic, training runs).

Chapter: every chapter that plots or quotes a measurement.

One loader so that no chapter reads a path relative to the repository: ``data_path("bench/h200_bench.json")``
finds the file wherever the package is (a checkout, an editable install, a wheel in site-packages).
Files are looked up, in order, as package data (``course_kernels/data/<name>``) and then in the
checkout's top-level ``data/`` folder (a source checkout that has not moved them yet).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

__all__ = ["data_path", "load_json"]


def _candidates(name: str) -> list[Path]:
    pkg = Path(str(resources.files("course_kernels")))
    return [pkg / "data" / name, pkg.parent / "data" / name]


def data_path(name: str) -> Path:
    """Path of the measured data file ``name`` (e.g. ``"bench/h200_bench.json"``).

    Raises FileNotFoundError naming every place looked in when the file is not there.
    """
    if not isinstance(name, str) or not name or name.startswith(("/", "\\")) or ".." in Path(name).parts:
        raise ValueError(f"data file name must be a relative path inside data/, got {name!r}")
    places = _candidates(name)
    for p in places:
        if p.is_file():
            return p
    raise FileNotFoundError(
        f"measured data file {name!r} is not installed; looked in: "
        + ", ".join(str(p) for p in places)
    )


def load_json(name: str):
    """``json.load`` of :func:`data_path` ``(name)``."""
    with data_path(name).open(encoding="utf-8") as f:
        return json.load(f)
