"""The two-level memory of the IO simulator: HBM (named arrays) and an SRAM of M elements.

Chapter: "IO complexity" (book/chapters/05_io_complexity.ipynb); the programs that run against
it, and the closed forms they are checked against, are in :mod:`.iosim`, which re-exports every
name defined here (``from course_kernels.iosim import TwoLevelMemory`` keeps working).

:class:`TwoLevelMemory` holds named arrays in HBM. ``load`` copies rows of one into SRAM and
counts the elements read; ``store`` writes rows back and counts the elements written; ``alloc``
reserves on-chip scratch (an accumulator) without traffic; ``free`` releases SRAM. A load or
alloc that would make the resident tiles exceed M raises :class:`SRAMOverflowError`.
``repeat`` runs an inner-loop body once against the memory and charges identical repetitions
by multiplication. :class:`Virtual` arrays have a shape and no data, so traffic can be counted
at N = 65536; :class:`IOCount` is what a program's run comes to. Elements are counted, not bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .._validate import check_positive_int


class SRAMOverflowError(RuntimeError):
    """A load or alloc would need more SRAM than the M elements there are."""


@dataclass(frozen=True)
class Virtual:
    """An HBM array known only by its shape (no data): enough to count traffic at N = 65536."""

    shape: tuple

    @property
    def ndim(self):
        return len(self.shape)


@dataclass(frozen=True)
class IOCount:
    """HBM traffic of one program, in elements."""

    reads: int
    writes: int
    peak_sram: int  # most elements resident in SRAM at once
    simulated_steps: int  # inner-loop bodies run against the memory
    charged_steps: int  # identical repetitions charged by multiplication

    @property
    def total(self) -> int:
        return self.reads + self.writes


class TwoLevelMemory:
    """HBM (named arrays) plus an SRAM of ``sram_elements`` (None = unbounded), counting traffic.

    >>> mem = TwoLevelMemory(1000, Q=np.ones((8, 4)))
    >>> tile = mem.load("Q", slice(0, 2))   # reads 8 elements
    >>> mem.store("Q", slice(0, 2), 2 * tile)  # writes 8
    >>> mem.free(tile); (mem.reads, mem.writes)
    (8, 8)
    """

    def __init__(self, sram_elements: int | None, **hbm):
        self._setup(
            None if sram_elements is None else check_positive_int(sram_elements, "sram_elements"),
            hbm,
        )

    @classmethod
    def _trusted(cls, capacity: int, **hbm) -> TwoLevelMemory:
        """A memory whose capacity the caller has already checked."""
        mem = cls.__new__(cls)
        mem._setup(capacity, hbm)
        return mem

    def _setup(self, capacity, hbm) -> None:
        self.capacity = capacity
        self.hbm = {}
        for name, arr in hbm.items():
            self.hbm[name] = arr if isinstance(arr, Virtual) else np.asarray(arr)
        self.reads = 0
        self.writes = 0
        self.in_use = 0
        self.peak = 0
        self._resident: dict[int, int] = {}
        self.simulated_steps = 0
        self.charged_steps = 0

    # -- SRAM bookkeeping ---------------------------------------------------------------
    def _reserve(self, n: int, what: str) -> None:
        if self.capacity is not None and self.in_use + n > self.capacity:
            raise SRAMOverflowError(
                f"{what} needs {n} elements but SRAM holds {self.capacity} and "
                f"{self.in_use} are in use ({self.in_use + n} > M = {self.capacity})"
            )
        self.in_use += n
        self.peak = max(self.peak, self.in_use)

    def _track(self, tile, n: int):
        self._resident[id(tile)] = self._resident.get(id(tile), 0) + n
        return tile

    def _shape_of(self, name: str, rows) -> tuple:
        if name not in self.hbm:
            raise KeyError(f"no array named {name!r} in HBM; have {sorted(self.hbm)}")
        arr = self.hbm[name]
        shape = arr.shape
        if isinstance(rows, slice):
            start, stop, step = rows.indices(shape[-2] if len(shape) >= 2 else shape[-1])
            if step != 1:
                raise ValueError(f"rows must be a contiguous slice; got step {step}")
            n_rows = max(0, stop - start)
        else:
            raise TypeError(f"rows must be a slice such as slice(i0, i1); got {rows!r}")
        if len(shape) == 1:  # a vector such as the logsumexp: rows index it directly
            return (n_rows,)
        return (*shape[:-2], n_rows, shape[-1])

    # -- the interface a tiled program uses ---------------------------------------------
    def load(self, name: str, rows: slice = slice(None), registers: bool = False):
        """Copy ``rows`` of HBM array ``name`` on chip; count the elements read.

        The tile is charged to SRAM (free it later), unless ``registers=True``: per-row
        statistics such as m and l sit in registers in the model and are not charged.
        """
        shape = self._shape_of(name, rows)
        n = math.prod(shape)
        if not registers:
            self._reserve(n, f"load of {name}[{rows.start}:{rows.stop}]")
        self.reads += n
        arr = self.hbm[name]
        tile = Virtual(shape) if isinstance(arr, Virtual) else np.array(_rows(arr, rows))
        return tile if registers else self._track(tile, n)

    def store(self, name: str, rows: slice, tile=None) -> None:
        """Write ``tile`` into ``rows`` of HBM array ``name``; count the elements written."""
        shape = self._shape_of(name, rows)
        self.writes += math.prod(shape)
        arr = self.hbm[name]
        if not isinstance(arr, Virtual):
            if tile is None or isinstance(tile, Virtual):
                raise ValueError(f"store to {name!r} needs data: this HBM array is real")
            _rows(arr, rows)[...] = tile

    def alloc(self, shape, fill: float = 0.0, dtype=np.float64):
        """Reserve an on-chip buffer (an accumulator); charged to SRAM, no HBM traffic."""
        shape = tuple(int(s) for s in shape)
        n = math.prod(shape)
        self._reserve(n, f"alloc of {shape}")
        virtual = any(isinstance(a, Virtual) for a in self.hbm.values())
        tile = Virtual(shape) if virtual else np.full(shape, fill, dtype=dtype)
        return self._track(tile, n)

    def free(self, *tiles) -> None:
        """Release SRAM held by tiles from ``load`` or ``alloc``."""
        for tile in tiles:
            n = self._resident.pop(id(tile), None)
            if n is None:
                raise ValueError("free() of a tile that is not resident in SRAM")
            self.in_use -= n

    def repeat(self, times: int, body: Callable[[], None], exact: bool = False) -> None:
        """Run ``body`` ``times`` times: once against the memory, the rest charged identically.

        The body must leave SRAM as it found it (free what it loads), in either mode: a
        RuntimeError says so otherwise. ``exact=True`` runs it every time instead.
        """
        if times <= 0:
            return
        if exact:
            for _ in range(times):
                self._run_freeing(body)
            self.simulated_steps += times
            return
        r0, w0 = self.reads, self.writes
        self._run_freeing(body)
        self.reads += (times - 1) * (self.reads - r0)
        self.writes += (times - 1) * (self.writes - w0)
        self.simulated_steps += 1
        self.charged_steps += times - 1

    def _run_freeing(self, body: Callable[[], None]) -> None:
        use0 = self.in_use
        body()
        if self.in_use != use0:
            raise RuntimeError("a repeated body must free the SRAM it takes")

    def count(self) -> IOCount:
        return IOCount(self.reads, self.writes, self.peak, self.simulated_steps, self.charged_steps)


def _rows(arr: np.ndarray, rows: slice):
    return arr[rows] if arr.ndim == 1 else arr[..., rows, :]
