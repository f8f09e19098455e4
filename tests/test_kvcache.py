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


# -- mutation audit: element sizes, every model's row, and each argument of max_context ----------


def test_kvcache_dtype_bytes_are_the_element_widths():
    """float32/float16/int8 from NumPy's itemsize; bfloat16 is 16 bits, fp8 8, int4 4."""
    import numpy as np

    for name in ("float32", "float16", "int8"):
        assert kvcache.dtype_bytes(name) == np.dtype(name).itemsize, name
    assert kvcache.dtype_bytes("bfloat16") == 16 / 8
    assert kvcache.dtype_bytes("fp8") == 8 / 8
    assert kvcache.dtype_bytes("int4") == 4 / 8
    assert kvcache.dtype_bytes(0.5) == 0.5 and kvcache.dtype_bytes(3) == 3.0
    for bad in (0, -2, True, None, "2"):
        with pytest.raises((TypeError, ValueError)):
            kvcache.dtype_bytes(bad)
    with pytest.raises(TypeError, match="positive number of bytes"):
        kvcache.dtype_bytes(True)
    with pytest.raises(TypeError, match="positive number of bytes"):
        kvcache.dtype_bytes(0)


def test_kvcache_every_model_per_token_and_group():
    """KiB per token in fp16 (2 * layers * kv_heads * head_dim * 2 B / 1024) from each published
    config (num_hidden_layers, num_key_value_heads, hidden_size / num_attention_heads): GPT-2
    12 x 768 -> 36, Llama-2-13B 40 x 5120 -> 800, Llama-2-70B 80 layers, 8 KV heads of 128 ->
    320, Mistral-7B and Llama-3-8B 32 layers, 8 KV heads of 128 -> 128."""
    kib = {name: kvcache.bytes_per_token(name) / 1024 for name in kvcache.MODELS}
    assert kib == {
        "GPT-2": 36,
        "Llama-2-7B": 512,
        "Llama-2-13B": 800,
        "Llama-2-70B": 320,
        "Mistral-7B": 128,
        "Llama-3-8B": 128,
    }
    hidden = {"GPT-2": 768, "Llama-2-7B": 4096, "Llama-2-13B": 5120, "Llama-2-70B": 8192}
    for name, h in hidden.items():
        cfg = kvcache.MODELS[name]
        assert cfg.heads * cfg.head_dim == h, name
    groups = {name: cfg.group_size for name, cfg in kvcache.MODELS.items()}
    assert groups == {
        "GPT-2": 1,
        "Llama-2-7B": 1,
        "Llama-2-13B": 1,
        "Llama-2-70B": 8,
        "Mistral-7B": 4,
        "Llama-3-8B": 4,
    }


def test_kvcache_weight_bytes_follow_the_dtype():
    assert kvcache.weight_bytes("Llama-2-7B", "fp8") == 6.74e9
    assert kvcache.weight_bytes("Llama-2-7B", "float32") == 4 * 6.74e9
    assert kvcache.weight_bytes("Llama-2-7B") == 2 * 6.74e9


def test_kvcache_max_context_by_hand():
    """24 GB (10^9 bytes) card, Llama-2-7B fp16: (24e9 - 13.48e9) / 524288 B = 20065.3 tokens."""
    assert kvcache.GB == 10**9
    assert kvcache.max_context("Llama-2-7B", 24 * kvcache.GB) == 20065
    per = kvcache.bytes_per_token("Llama-2-7B")  # 524288
    w = kvcache.weight_bytes("Llama-2-7B")
    mem = w + 100.5 * per  # room for 100 tokens and a half
    assert kvcache.max_context("Llama-2-7B", mem) == 100
    assert kvcache.max_context("Llama-2-7B", mem, batch=4) == 25  # 100 tokens over 4 sequences
    assert kvcache.max_context("Llama-2-7B", mem, reserve_bytes=10 * per) == 90
    assert kvcache.max_context("Llama-2-7B", mem, dtype="fp8") == 201  # 1 byte per element
    # fp8 weights free 6.74e9 bytes: 100.5 + 6.74e9 / 524288 = 100.5 + 12855.5 = 12956.0 tokens
    assert kvcache.max_context("Llama-2-7B", mem, weights_dtype="fp8") == 12956
    assert kvcache.max_context("Llama-2-7B", w) == 0  # exactly the weights: no room
    with pytest.raises(ValueError, match="batch"):
        kvcache.max_context("Llama-2-7B", mem, batch=0)


def test_kvcache_table_defaults_and_weights_stay_fp16():
    """The default table: every model, contexts 4K/32K/128K, fp16 cache; the weights column is
    the fp16 weights whatever the cache's dtype (quantizing the cache leaves them alone)."""
    rows = kvcache.table()
    assert [r[0] for r in rows] == [cfg.name for cfg in kvcache.MODELS.values()]
    gpt2 = rows[0]
    assert gpt2[:5] == [
        "GPT-2 (124M)",
        36.0,
        36 * 4096 / 2**20,
        36 * 32768 / 2**20,
        36 * 131072 / 2**20,
    ]
    assert gpt2[5] == pytest.approx(124e6 * 2 / GIB)
    fp8 = kvcache.table(["Llama-2-7B"], contexts=(1024,), dtype="fp8")
    assert fp8 == [["Llama-2-7B", 256.0, 0.25, pytest.approx(6.74e9 * 2 / GIB)]]


def test_kvcache_bad_sizes():
    with pytest.raises(ValueError, match="batch"):
        kvcache.kv_cache_bytes("Llama-2-7B", 8, batch=0)
    for field in ("layers", "heads", "kv_heads", "head_dim", "max_context"):
        kw = dict(layers=2, heads=4, kv_heads=2, head_dim=8, max_context=16)
        kw[field] = 0
        with pytest.raises(ValueError, match=field):
            ModelConfig("bad", params=1e6, source="test", **kw)
