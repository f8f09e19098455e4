"""Pins the Triton internals that ``course_kernels.triton.launch._launch`` relies on.

``_launch`` skips ``Autotuner.run`` after a shape's first launch (it rebuilds its cache key from
every argument on each call; notes/kernel.md measures the host overhead this saves). Triton has
no public API for "launch the JIT function with the config the autotuner already chose", so
``_launch`` uses three internals:

* ``Autotuner.best_config`` (set by ``Autotuner.run``) and ``Config.all_kwargs()``;
* ``Autotuner.fn.run(*args, grid=..., warmup=False, **kwargs)`` (``JITFunction.run`` /
  ``InterpretedFunction.run``, what ``kernel[grid](...)`` ends in);
* no ``Config.pre_hook`` on any config (``Autotuner.run`` calls it; the shortcut does not).

A Triton upgrade that renames or reshapes any of them must fail here, loudly, rather than make
``_launch`` crash or launch with the wrong config. Checked in Triton 3.9 (this machine,
interpreter, one config) and on the GPU machine's Triton 3.6 with autotuning on and off.
"""

from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import torch.nn.functional as F  # noqa: E402
from triton.runtime.autotuner import Autotuner  # noqa: E402

from course_kernels.triton import _env as _triton_env  # noqa: E402
from course_kernels.triton import flash  # noqa: E402
from course_kernels.triton import launch as flash_launch  # noqa: E402
from course_kernels.triton.backward import _attn_bwd_dkdv, _attn_bwd_dq  # noqa: E402
from course_kernels.triton.forward import _attn_fwd  # noqa: E402

KERNELS = {"_attn_fwd": _attn_fwd, "_attn_bwd_dq": _attn_bwd_dq, "_attn_bwd_dkdv": _attn_bwd_dkdv}
FIX = (
    f"Triton {triton.__version__} changed an internal that course_kernels/triton/launch.py's _launch "
    "uses; update _launch (or drop its shortcut and call kernel[grid](...) every time) and this "
    "test together."
)


@pytest.mark.parametrize("name", KERNELS)
def test_kernel_is_an_autotuner_whose_fn_run_takes_grid_and_warmup(name):
    kernel = KERNELS[name]
    assert isinstance(kernel, Autotuner), f"{name} is {type(kernel).__name__}. {FIX}"
    run = getattr(getattr(kernel, "fn", None), "run", None)
    assert callable(run), f"{name}.fn.run is missing. {FIX}"
    params = inspect.signature(run).parameters
    kinds = {p.name: p.kind for p in params.values()}
    for required in ("grid", "warmup"):
        assert kinds.get(required) == inspect.Parameter.KEYWORD_ONLY, (
            f"{name}.fn.run{inspect.signature(run)} has no keyword-only {required!r}. {FIX}"
        )
    assert any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()), FIX
    assert any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in params.values()), FIX


@pytest.mark.parametrize("name", KERNELS)
def test_no_config_has_a_pre_hook_the_shortcut_would_skip(name):
    for config in KERNELS[name].configs:
        assert isinstance(config.all_kwargs(), dict), FIX
        assert config.pre_hook is None, (
            f"{name} config {config} has a pre_hook, which Autotuner.run calls and _launch's "
            "cached path does not: call it in _launch or drop the shortcut."
        )


def test_cached_launch_makes_the_same_fn_run_call_as_the_autotuner(monkeypatch):
    """The first (tuning) launch goes kernel[grid] -> Autotuner.run -> fn.run; the second is
    _launch's shortcut. Both must reach fn.run with the same positional and keyword arguments."""
    calls = []
    real = _attn_fwd.fn.run

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(_attn_fwd.fn, "run", spy)
    monkeypatch.setattr(flash_launch, "_TUNED", {})
    device = _triton_env.device_kind()
    q, k, v = (torch.randn(1, 2, 24, 16, device=device) for _ in range(3))
    # The tuning launch calls fn.run once per config it times (one config under the
    # interpreter or with COURSE_KERNELS_AUTOTUNE=0), then once more with the chosen config.
    outs = [flash.flash_attention(q, k, v, causal=True)]
    n_first = len(calls)
    assert n_first >= 1, f"the tuning launch never reached fn.run. {FIX}"
    outs.append(flash.flash_attention(q, k, v, causal=True))

    assert len(calls) == n_first + 1, (
        f"fn.run was called {len(calls) - n_first} times for one cached launch. {FIX}"
    )
    assert isinstance(_attn_fwd.best_config, triton.Config), f"best_config not set. {FIX}"
    (tuned,) = flash_launch._TUNED.values()
    assert tuned == _attn_fwd.best_config.all_kwargs()
    (a1, k1), (a2, k2) = calls[n_first - 1], calls[-1]  # the tuned launch, the cached one

    def same(x, y):  # tensors are new per call (o, lse2): compare their shape and dtype
        if isinstance(x, torch.Tensor):
            return isinstance(y, torch.Tensor) and (x.shape, x.dtype) == (y.shape, y.dtype)
        return x == y

    assert len(a1) == len(a2) and all(map(same, a1, a2)), FIX
    assert set(k1) == set(k2), f"tuning call kwargs {sorted(k1)} vs cached {sorted(k2)}. {FIX}"
    assert k1["warmup"] is False and k2["warmup"] is False, FIX
    assert {n: v for n, v in k1.items() if n != "grid"} == {
        n: v for n, v in k2.items() if n != "grid"
    }, FIX
    for out in outs:
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))
