"""Public names the chapters use instead of private ones: listings, the GPU config list, the
device facts, the -inf guard and the padded head dim."""

import re

import numpy as np
import pytest

from course_kernels import colab
from course_kernels.numpy.online_softmax import safe_max


def test_listing_is_the_package_source():
    src = colab.listing("tiled.forward_fa2")
    assert src.startswith("def _forward_fa2(") and "# line 4" in src
    assert colab.listing("triton_forward.attn_fwd_mask_inner").startswith("@triton.jit")
    assert "def _attn_fwd(" in colab.listing("triton_forward.attn_fwd")  # autotune unwrapped


def test_listing_unknown_name_is_a_clear_error():
    with pytest.raises(ValueError, match="no listing named 'tiled._forward_fa2'; the listings"):
        colab.listing("tiled._forward_fa2")


def test_safe_max_guards_minus_inf_only():
    m = np.array([-np.inf, -3.0, 0.0, 2.5, np.inf])
    np.testing.assert_array_equal(safe_max(m), [0.0, -3.0, 0.0, 2.5, np.inf])


def test_gpu_config_list_is_the_data_whatever_the_device():
    pytest.importorskip("triton")
    from course_kernels.triton import forward as triton_forward

    got = [
        (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)
        for c in triton_forward.fwd_gpu_configs()
    ]
    small = triton_forward.FWD_SMALL_CONFIG
    assert got == [*triton_forward.FWD_GPU_TILES, (*small.kwargs.values(), 4, 2)]
    from course_kernels import device

    if device.INTERPRET:  # the interpreter runs one config; a GPU tunes over the list
        assert triton_forward.fwd_configs() == [triton_forward.FWD_CPU_CONFIG]


def test_device_facts_and_padded_head_dim():
    pytest.importorskip("triton")
    from course_kernels import device
    from course_kernels.triton import flash

    assert device.device_kind() in ("cpu", "cuda")
    assert device.SM75_SHARED_BYTES == 64 * 1024
    assert [flash.head_dim_padded(d) for d in (8, 16, 40, 64, 96, 256)] == [
        16,
        16,
        64,
        64,
        128,
        256,
    ]
    assert (device.capability() is None) == device.INTERPRET


def test_one_device_probe(monkeypatch):
    import sys

    from course_kernels import _probe

    torch = pytest.importorskip("torch")
    assert _probe.cuda_available() == torch.cuda.is_available()
    from course_kernels.triton import _env as _triton_env

    assert _probe.cuda_available() == _triton_env.HAS_GPU
    monkeypatch.setitem(sys.modules, "torch", None)  # "import torch" now raises ImportError
    assert _probe.cuda_available() is False


def test_gluon_listings_are_read_from_the_file_where_gluon_does_not_import(monkeypatch):
    # The Gluon kernels are defined only where Gluon imports (inside ``if HAVE_GLUON:``); the
    # chapter's listings must read the same text from the module's file everywhere else.
    from course_kernels.gluon import producer

    src = colab.listing("gluon.load_tile")
    assert (
        src.startswith("@gluon.jit\ndef _load_tile(") and "tma.async_copy_global_to_shared" in src
    )
    monkeypatch.delattr(producer, "_load_tile", raising=False)
    assert colab.listing("gluon.load_tile") == src
    for name in colab.LISTINGS:
        text = colab.listing(name)
        # a private function, or the one public wrapper of a private module (gluon._lang)
        assert text == text.lstrip() and re.search(r"^def (_|tma_reduce_add\()", text, re.M), name
