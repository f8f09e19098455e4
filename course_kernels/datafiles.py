"""Measured data the chapters read (benchmarks, memory, DRAM traffic, training runs).

Chapter: every chapter that plots or quotes a measurement.

One loader so that no chapter reads a path relative to the repository: ``data_path("bench/h200_bench.json")``
finds the file wherever the package is (a checkout, an editable install, a wheel in site-packages,
Colab). The files are package data, ``course_kernels/data/<name>`` (declared in pyproject.toml,
so every wheel carries them); each folder's README or file header records the GPU, software
versions, date and the command that regenerates it.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

__all__ = ["data_path", "load_json"]


def _data_dir() -> Path:
    return Path(str(resources.files("course_kernels"))) / "data"


def data_path(name: str) -> Path:
    """Path of the measured data file ``name`` (e.g. ``"bench/h200_bench.json"``).

    Raises FileNotFoundError naming the folder looked in and the files it has.
    """
    if (
        not isinstance(name, str)
        or not name
        or name.startswith(("/", "\\"))
        or ".." in Path(name).parts
    ):
        raise ValueError(f"data file name must be a relative path inside data/, got {name!r}")
    root = _data_dir()
    path = root / name
    if path.is_file():
        return path
    have = (
        sorted(
            p.relative_to(root).as_posix()
            for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        )
        if root.is_dir()
        else []
    )
    raise FileNotFoundError(
        f"measured data file {name!r} is not in {root} (the package's data folder); it has: "
        + (", ".join(have) if have else "nothing (an install without package data?)")
    )


def load_json(name: str):
    """``json.load`` of :func:`data_path` ``(name)``."""
    with data_path(name).open(encoding="utf-8") as f:
        return json.load(f)
