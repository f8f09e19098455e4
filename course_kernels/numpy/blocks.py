"""Block sizes from the SRAM budget.

Chapter: "Tiling" (book/chapters/03_tiling.ipynb).

The article's rule: SRAM (M elements) holds four B x d blocks (Q, K, V, O), so 4*B*d <= M and
B = M / 4d. The largest integer B that keeps the bound is the *floor*; rounding up (as the
article says, and as FlashAttention's Alg. 1 line 1 writes ``ceil`` because its proofs only need
big-O sizes) can exceed M: M = 100000, d = 64 gives ceil = 391 and 4*391*64 = 100096 > M.

The paper also has to fit the score tile S (block_q x block_k): it sets B_c = M/4d and
B_r = min(B_c, d) (FA1 Alg. 1 line 1), our ``block_k`` and ``block_q``. Real kernels keep S and P in registers and use power-of-two tiles (64, 128).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

from .._compat import renamed_kwargs
from .._validate import check_positive_int


def block_size(sram_elements: int, head_dim: int) -> int:
    """The largest B with 4*B*d <= M (Q, K, V, O blocks of B rows each fit the SRAM).

    Args:
        sram_elements: M, the SRAM capacity in elements (>= 4*head_dim).
        head_dim: d (>= 1).

    Raises:
        ValueError: if M is too small for even one row of each block (M < 4d).
    """
    m = check_positive_int(sram_elements, "sram_elements")
    d = check_positive_int(head_dim, "head_dim")
    return _block_size(m, d)


def _block_size(m: int, d: int) -> int:
    """:func:`block_size` for checked integers (M and d each >= 1)."""
    b = m // (4 * d)
    if b < 1:
        raise ValueError(
            f"sram_elements={m} is too small for one block row at head_dim={d}: "
            f"need sram_elements >= 4*head_dim = {4 * d}"
        )
    return b


def article_block_size(sram_elements: int, head_dim: int) -> int:
    """The article's rule, B = ceil(M / 4d). Kept to *show* that it can break 4*B*d <= M."""
    m = check_positive_int(sram_elements, "sram_elements")
    d = check_positive_int(head_dim, "head_dim")
    return math.ceil(m / (4 * d))


@dataclass(frozen=True)
class PaperBlockSizes:
    """The paper's blocks (FA1 Alg. 1 line 1, with floor) and what they occupy in SRAM."""

    sram_elements: int  # M
    head_dim: int  # d
    block_k: int  # block_k = floor(M / 4d), rows of K and V blocks
    block_q: int  # block_q = min(block_k, d), rows of Q and O blocks

    @property
    def qkvo_elements(self) -> int:
        """Q_i, O_i (block_q x d each) and K_j, V_j (block_k x d each)."""
        return 2 * self.block_q * self.head_dim + 2 * self.block_k * self.head_dim

    @property
    def score_tile_elements(self) -> int:
        """The block_q x block_k tile of S (and P, which overwrites it)."""
        return self.block_q * self.block_k

    @property
    def total_elements(self) -> int:
        return self.qkvo_elements + self.score_tile_elements

    @property
    def fits(self) -> bool:
        return self.total_elements <= self.sram_elements

    @property
    def block_r(self) -> int:
        """Deprecated name of :attr:`block_q` (removed in the next release)."""
        warnings.warn(
            "PaperBlockSizes.block_r is deprecated; use block_q", DeprecationWarning, stacklevel=2
        )
        return self.block_q

    @property
    def block_c(self) -> int:
        """Deprecated name of :attr:`block_k` (removed in the next release)."""
        warnings.warn(
            "PaperBlockSizes.block_c is deprecated; use block_k", DeprecationWarning, stacklevel=2
        )
        return self.block_k


# The constructor's old keywords (block_r=, block_c=) keep working for one release.
PaperBlockSizes.__init__ = renamed_kwargs(block_r="block_q", block_c="block_k")(
    PaperBlockSizes.__init__
)


def paper_block_sizes(sram_elements: int, head_dim: int) -> PaperBlockSizes:
    """block_k = floor(M/4d), block_q = min(block_k, d), with the footprint of blocks and tile."""
    m = check_positive_int(sram_elements, "sram_elements")
    d = check_positive_int(head_dim, "head_dim")
    return _paper_block_sizes(m, d)


def _paper_block_sizes(m: int, d: int) -> PaperBlockSizes:
    """:func:`paper_block_sizes` for checked integers."""
    block_k = _block_size(m, d)
    return PaperBlockSizes(m, d, block_k, min(block_k, d))
