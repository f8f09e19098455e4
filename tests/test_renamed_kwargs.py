"""Renamed public keywords keep working for one release: the old name warns (naming the new one)
and gives the same result; passing both is refused."""

import warnings

import pytest

from course_kernels import PaperBlockSizes, iosim, paper_block_sizes
from course_kernels._compat import renamed_kwargs


def test_io_blocks_old_keywords_warn_and_agree():
    new = iosim.flash_attention_io_blocks(1000, 64, block_q=32, block_k=48)
    with pytest.warns(DeprecationWarning, match="'block_r' is deprecated.*use 'block_q'"):
        old = iosim.flash_attention_io_blocks(1000, 64, block_r=32, block_k=48)
    assert old == new
    with pytest.warns(DeprecationWarning, match="use 'block_k'"):
        assert iosim.flash_attention_io_blocks(1000, 64, block_q=32, block_c=48) == new


def test_io_blocks_new_keywords_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        iosim.flash_attention_io_blocks(1000, 64, block_q=32, block_k=48)


def test_both_old_and_new_refused():
    with pytest.raises(TypeError, match="both 'block_r' .* and 'block_q'"):
        iosim.flash_attention_io_blocks(1000, 64, block_r=32, block_q=32, block_k=48)


def test_paper_block_sizes_old_names_warn():
    pb = paper_block_sizes(100_000, 64)
    with pytest.warns(DeprecationWarning, match="use block_q"):
        assert pb.block_r == pb.block_q
    with pytest.warns(DeprecationWarning, match="use block_k"):
        assert pb.block_c == pb.block_k
    with pytest.warns(DeprecationWarning) as caught:
        old = PaperBlockSizes(100_000, 64, block_c=pb.block_k, block_r=pb.block_q)
    assert {str(w.message).rsplit(" ", 1)[-1] for w in caught} == {"'block_q'", "'block_k'"}
    assert old == pb


def test_decorator_passes_the_value_under_the_new_name():
    @renamed_kwargs(old="new")
    def f(new=0):
        return new

    with pytest.warns(DeprecationWarning, match="f\\(\\): keyword 'old'"):
        assert f(old=7) == 7
    assert f(new=3) == 3


def test_gpt_and_decode_old_keywords():
    torch = pytest.importorskip("torch")
    from course_kernels.apps import gpt

    with pytest.warns(DeprecationWarning, match="use 'context_len'"):
        cfg = gpt.GPTConfig(10, block_size=16)
    assert cfg == gpt.GPTConfig(10, context_len=16)
    kw = dict(batch_size=1, n_layer=1, device="cpu")
    with pytest.warns(DeprecationWarning, match="use 'context_len'"):
        old = gpt.saved_activation_bytes("standard", block_size=32, **kw)
    assert old == gpt.saved_activation_bytes("standard", context_len=32, **kw)
    del torch
    from course_kernels.serving.decode import default_num_splits

    with pytest.warns(DeprecationWarning, match="use 'block_k'"):
        assert default_num_splits(8, 4096, block_n=64) == default_num_splits(8, 4096, block_k=64)


def test_online_softmax_old_keyword():
    import numpy as np

    from course_kernels.numpy import online_softmax

    x = np.random.default_rng(0).standard_normal((3, 20))
    with pytest.warns(DeprecationWarning, match="use 'block_k'"):
        old = online_softmax(x, block=4)
    np.testing.assert_array_equal(old, online_softmax(x, block_k=4))


def test_forced_forward_config_old_keywords():
    pytest.importorskip("triton")
    from course_kernels.bench import sweep as bench_sweep
    from course_kernels.triton import forward as triton_forward

    with (
        pytest.warns(DeprecationWarning, match="use 'block_q'"),
        bench_sweep.forced_forward_config(block_m=16, block_k=16, num_warps=4, num_stages=1),
    ):
        assert triton_forward._attn_fwd.configs[0].kwargs == {"BLOCK_M": 16, "BLOCK_N": 16}
