"""One torch-side checker (course_kernels.triton._torch_validate) behind every public torch function:
the same bad value raises the same exception type from flash_attention, flash_decode and
distributed.ring_attention (on a one-rank gloo group in a spawned process)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from course_kernels.triton import _env as _triton_env  # noqa: E402
from course_kernels.serving.decode import flash_decode  # noqa: E402
from course_kernels.triton.flash import flash_attention  # noqa: E402
from course_kernels.distributed.bench import spawn  # noqa: E402

DEVICE = _triton_env.device_kind()


def _good():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 1, 16, generator=g).to(DEVICE)
    k = torch.randn(1, 2, 8, 16, generator=g).to(DEVICE)
    return q, k, k.clone()


# name -> (a function of (q, k, v) giving the call's args and kwargs)
BAD = {
    "scale nan": lambda q, k, v: ((q, k, v), {"scale": float("nan")}),
    "scale inf": lambda q, k, v: ((q, k, v), {"scale": float("inf")}),
    "scale str": lambda q, k, v: ((q, k, v), {"scale": "0.1"}),
    "scale bool": lambda q, k, v: ((q, k, v), {"scale": True}),
    "causal int": lambda q, k, v: ((q, k, v), {"causal": 1}),
    "q not a tensor": lambda q, k, v: ((q.tolist(), k, v), {}),
    "q int64": lambda q, k, v: ((q.long(), k, v), {}),
    "q rank 3": lambda q, k, v: ((q[0], k, v), {}),
    "q empty": lambda q, k, v: ((q[:, :, :0], k, v), {}),
    "dtypes differ": lambda q, k, v: ((q.double().float().half(), k, v), {}),
}
EXPECTED = {
    "scale nan": ValueError,
    "scale inf": ValueError,
    "scale str": TypeError,
    "scale bool": TypeError,
    "causal int": TypeError,
    "q not a tensor": TypeError,
    "q int64": TypeError,
    "q rank 3": ValueError,
    "q empty": ValueError,
    "dtypes differ": TypeError,
}


def _raised(fn, name):
    args, kwargs = BAD[name](*_good())
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the type is what is compared
        return type(exc).__name__, str(exc)
    return None, "no error"


def _ring_worker(names):
    from course_kernels.distributed import ring_attention

    return {name: _raised(ring_attention, name) for name in names}


@pytest.mark.parametrize("name", sorted(BAD))
@pytest.mark.parametrize("fn", [flash_attention, flash_decode], ids=["flash", "decode"])
def test_same_bad_value_same_exception(fn, name):
    kind, message = _raised(fn, name)
    assert kind == EXPECTED[name].__name__, (name, kind, message)


def test_ring_attention_raises_the_same_types():
    if DEVICE != "cpu":
        pytest.skip("the one-rank check uses gloo on CPU tensors")
    (got,) = spawn(_ring_worker, 1, (sorted(BAD),), timeout_s=120)
    assert {n: kind for n, (kind, _) in got.items()} == {
        n: e.__name__ for n, e in EXPECTED.items()
    }, got
