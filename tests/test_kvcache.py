"""KV-cache sizes: the formula, the errata E9 numbers, GQA, and bad input."""

import pytest

from course_kernels.serving import kvcache
from course_kernels.serving.kvcache import GIB, ModelConfig


def test_kvcache_llama2_7b_matches_errata():
    # 2 * 32 layers * 32 heads * 128 * 2 bytes = 0.5 MiB per token.
    assert kvcache.bytes_per_token("Llama-2-7B") == 512 * 1024
    assert kvcache.kv_cache_bytes("Llama-2-7B", 32 * 1024) == 16 * GIB
    assert kvcache.kv_cache_bytes("Llama-2-7B", 128 * 1024) == 64 * GIB


def test_kvcache_gqa_is_smaller_by_the_group_size():
    llama2, llama3 = kvcache.MODELS["Llama-2-7B"], kvcache.MODELS["Llama-3-8B"]
    assert llama3.group_size == 4
    ratio = kvcache.bytes_per_token(llama2) / kvcache.bytes_per_token(llama3)
    assert ratio == 4
    assert kvcache.kv_cache_bytes(llama3, 128 * 1024) == 16 * GIB


def test_kvcache_scales_linearly_in_context_batch_and_dtype():
    one = kvcache.kv_cache_bytes("Mistral-7B", 1000)
    assert kvcache.kv_cache_bytes("Mistral-7B", 3000, batch=5) == 15 * one
    assert kvcache.kv_cache_bytes("Mistral-7B", 1000, dtype="fp8") == one / 2
    assert kvcache.kv_cache_bytes("Mistral-7B", 1000, dtype=4) == 2 * one


def test_kvcache_24gb_card_cannot_hold_32k_for_llama2_7b():
    card = 24 * kvcache.GB
    n = kvcache.max_context("Llama-2-7B", card)
    assert 16_000 < n < 32 * 1024  # weights 12.6 GiB leave ~10 GiB: about 20K tokens
    # And the formula is consistent: n tokens fit, n + 1 do not.
    free = card - kvcache.weight_bytes("Llama-2-7B")
    assert kvcache.kv_cache_bytes("Llama-2-7B", n) <= free
    assert kvcache.kv_cache_bytes("Llama-2-7B", n + 1) > free
    assert kvcache.max_context("Llama-2-70B", card) == 0  # weights alone do not fit


def test_kvcache_table_rows():
    rows = kvcache.table(["Llama-2-7B"], contexts=(32768, 131072))
    assert rows == [["Llama-2-7B", 512.0, 16.0, 64.0, pytest.approx(6.74e9 * 2 / GIB)]]


def test_kvcache_bad_input():
    with pytest.raises(ValueError, match="unknown model"):
        kvcache.kv_cache_bytes("GPT-5", 10)
    with pytest.raises(TypeError, match="ModelConfig"):
        kvcache.kv_cache_bytes(3, 10)
    with pytest.raises(ValueError, match="context"):
        kvcache.kv_cache_bytes("Llama-2-7B", 0)
    with pytest.raises(TypeError, match="context"):
        kvcache.kv_cache_bytes("Llama-2-7B", 1.5)
    with pytest.raises(ValueError, match="unknown dtype"):
        kvcache.kv_cache_bytes("Llama-2-7B", 8, dtype="float12")
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        ModelConfig(
            "bad", 2, heads=6, kv_heads=4, head_dim=64, params=1e6, max_context=8, source="test"
        )
    with pytest.raises(ValueError, match="memory_bytes"):
        kvcache.max_context("Llama-2-7B", 0)
