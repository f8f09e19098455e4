"""course_kernels.numpy.blocks: the floor rule keeps 4*B*d <= M; the article's ceil can break it."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course_kernels import article_block_size, block_size, paper_block_sizes


def test_block_size_of_the_articles_example():
    assert block_size(100_000, 64) == 390
    assert article_block_size(100_000, 64) == 391
    assert 4 * 391 * 64 == 100_096 > 100_000  # the article's rounding up breaks the bound


@given(m=st.integers(1, 10**7), d=st.integers(1, 512))
def test_block_size_is_the_largest_that_fits(m, d):
    if m < 4 * d:
        with pytest.raises(ValueError, match="too small for one block"):
            block_size(m, d)
        return
    b = block_size(m, d)
    assert 4 * b * d <= m < 4 * (b + 1) * d


@given(m=st.integers(4, 10**6), d=st.integers(1, 256))
def test_ceil_rule_breaks_the_bound_exactly_when_m_is_not_a_multiple_of_4d(m, d):
    b = article_block_size(m, d)
    assert (4 * b * d > m) == (m % (4 * d) != 0)


def test_paper_block_sizes_report_the_score_tile():
    pb = paper_block_sizes(100_000, 64)
    assert (pb.block_k, pb.block_q) == (390, 64)
    assert pb.qkvo_elements == 2 * 64 * 64 + 2 * 390 * 64
    assert pb.score_tile_elements == 64 * 390
    assert pb.total_elements == pb.qkvo_elements + pb.score_tile_elements
    assert pb.fits


def test_article_sizes_with_square_score_tile_do_not_fit():
    """The article's B = 375-ish square tiles: the B x B score tile alone exceeds M."""
    m, d = 96_000, 64
    b = block_size(m, d)
    assert 4 * b * d <= m and b * b > m


@given(m=st.integers(256, 10**6), d=st.sampled_from([16, 32, 64, 128]))
def test_paper_br_is_min_of_bc_and_d(m, d):
    if m < 4 * d:
        return
    pb = paper_block_sizes(m, d)
    assert pb.block_q == min(pb.block_k, d)
    assert pb.fits == (pb.total_elements <= m)
    assert pb.block_k == math.floor(m / (4 * d))


@pytest.mark.parametrize(
    "m,d,exc,match",
    [
        (0, 64, ValueError, "sram_elements must be an integer >= 1"),
        (-5, 64, ValueError, "sram_elements must be an integer >= 1"),
        (1000, 0, ValueError, "head_dim must be an integer >= 1"),
        (100, 64, ValueError, "too small for one block row"),
        (1000.5, 8, TypeError, "sram_elements must be an integer"),
        (True, 8, TypeError, "sram_elements must be an integer"),
    ],
)
def test_block_size_bad_input(m, d, exc, match):
    with pytest.raises(exc, match=match):
        block_size(m, d)


@pytest.mark.parametrize("rule", [article_block_size, paper_block_sizes])
@pytest.mark.parametrize(
    "m,d,exc,match",
    [
        (0, 64, ValueError, "sram_elements must be an integer >= 1"),
        (1000, 0, ValueError, "head_dim must be an integer >= 1"),
        (1000.5, 8, TypeError, "sram_elements must be an integer"),
        (True, 8, TypeError, "sram_elements must be an integer"),
        (1000, 8.0, TypeError, "head_dim must be an integer"),
    ],
)
def test_other_block_rules_check_their_arguments(rule, m, d, exc, match):
    with pytest.raises(exc, match=match):
        rule(m, d)
