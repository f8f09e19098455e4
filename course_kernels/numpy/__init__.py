"""Rungs 1-3 of the ladder in NumPy: the float64 truth, online softmax, and the tiled algorithm.

Nothing here imports torch or Triton (``tests/test_import_ladder.py`` checks it).

- :mod:`.reference`       standard attention in float64, the truth every other layer is checked against
- :mod:`.online_softmax`  the running (m, l) state, its update and the merge of partial results
- :mod:`.tiled`           FlashAttention's tiled forward, in FA1's and FA2's loop orders
- :mod:`.tiled_backward`  the tiled backward from the saved logsumexp (FA2's Algorithm 2)
- :mod:`.blocks`          block sizes from the SRAM budget (the papers' B_c = M/4d and friends)
"""

from .blocks import PaperBlockSizes, article_block_size, block_size, paper_block_sizes
from .online_softmax import (
    PartialAttention,
    SoftmaxState,
    finalize,
    merge,
    online_softmax,
    partial_attention,
    update,
)
from .reference import LN2, LOG2E, attention_naive, attention_reference, causal_mask
from .tiled import flash_attention_numpy
from .tiled_backward import attention_reference_backward, flash_attention_numpy_backward

__all__ = [
    "LN2",
    "LOG2E",
    "PaperBlockSizes",
    "PartialAttention",
    "SoftmaxState",
    "article_block_size",
    "attention_naive",
    "attention_reference",
    "attention_reference_backward",
    "block_size",
    "causal_mask",
    "finalize",
    "flash_attention_numpy",
    "flash_attention_numpy_backward",
    "merge",
    "online_softmax",
    "paper_block_sizes",
    "partial_attention",
    "update",
]
