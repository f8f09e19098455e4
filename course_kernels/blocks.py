"""Block sizes from the SRAM budget.

Chapter: "Tiling" (book/chapters/03_tiling.ipynb).

The article's rule: SRAM (M elements) holds four B x d blocks (Q, K, V, O), so 4*B*d <= M and
B = M / 4d. The largest integer B that keeps the bound is the *floor*; rounding up (as the
article says, and as FlashAttention's Alg. 1 line 1 writes ``ceil`` because its proofs only need
big-O sizes) can exceed M: M = 100000, d = 64 gives ceil = 391 and 4*391*64 = 100096 > M.

The paper also has to fit the Br x Bc score tile S: it sets Bc = M/4d and Br = min(Bc, d)
(FA1 Alg. 1 line 1). Real kernels keep S and P in registers and use power-of-two tiles (64, 128).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ._validate import check_positive_int


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
    block_c: int  # Bc = floor(M / 4d), rows of K and V blocks
    block_r: int  # Br = min(Bc, d), rows of Q and O blocks

    @property
    def qkvo_elements(self) -> int:
        """Q_i, O_i (Br x d each) and K_j, V_j (Bc x d each)."""
        return 2 * self.block_r * self.head_dim + 2 * self.block_c * self.head_dim

    @property
    def score_tile_elements(self) -> int:
        """The Br x Bc tile of S (and P, which overwrites it)."""
        return self.block_r * self.block_c

    @property
    def total_elements(self) -> int:
        return self.qkvo_elements + self.score_tile_elements

    @property
    def fits(self) -> bool:
        return self.total_elements <= self.sram_elements


def paper_block_sizes(sram_elements: int, head_dim: int) -> PaperBlockSizes:
    """Bc = floor(M/4d), Br = min(Bc, d), with the footprint of blocks and score tile reported."""
    bc = block_size(sram_elements, head_dim)
    return PaperBlockSizes(int(sram_elements), int(head_dim), bc, min(bc, int(head_dim)))
