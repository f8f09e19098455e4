"""Rung 4: the IO model. A two-level memory (HBM and an SRAM of M elements) that counts traffic,
and the attention programs run against it.

Chapter: "IO complexity" (book/chapters/05_io_complexity.ipynb).

- :mod:`.memory`    the memory itself: :class:`TwoLevelMemory`, :class:`IOCount`, :class:`Virtual`,
                    :class:`SRAMOverflowError`
- :mod:`.programs`  standard attention, FA1's and FA2's loop orders run against it, their closed
                    forms, and :func:`count_io` for a student's own tiled function

NumPy only.
"""

from .memory import IOCount, SRAMOverflowError, TwoLevelMemory, Virtual
from .programs import (
    MODELS,
    count_io,
    flash_attention_io,
    flash_attention_io_asymptotic,
    flash_attention_io_blocks,
    flash_attention_io_formula,
    flash_block_sizes,
    standard_attention_io,
    standard_attention_io_formula,
)

__all__ = [
    "MODELS",
    "IOCount",
    "SRAMOverflowError",
    "TwoLevelMemory",
    "Virtual",
    "count_io",
    "flash_attention_io",
    "flash_attention_io_asymptotic",
    "flash_attention_io_blocks",
    "flash_attention_io_formula",
    "flash_block_sizes",
    "standard_attention_io",
    "standard_attention_io_formula",
]
