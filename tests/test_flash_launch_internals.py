"""Pins the Triton internals that ``course_kernels.triton.configs`` relies on.

``_launch`` skips ``Autotuner.run`` after a shape's first launch (it rebuilds its cache key from
every argument on each call; notes/kernel.md measures the host overhead this saves). Triton has
no public API for "launch the JIT function with the config the autotuner already chose", so
``_launch`` uses three internals:

* ``Autotuner.best_config`` (set by ``Autotuner.run``) and ``Config.all_kwargs()``;
* ``Autotuner.fn.run(*args, grid=..., warmup=False, **kwargs)`` (``JITFunction.run`` /
  ``InterpretedFunction.run``, what ``kernel[grid](...)`` ends in);
* no ``Config.pre_hook`` on any config (``Autotuner.run`` calls it; the shortcut does not).

On a GPU, ``KernelPlan.launch`` then skips ``JITFunction.run`` too (the direct launch): it keeps
the compiled kernel ``fn.run`` returned per (device, tensor alignments, option knobs) and calls
its launcher as ``fn.run`` does. That relies on how ``fn.run`` specialises (the second half of
this file checks, with Triton's own binder, that a plan and its tensors' alignments decide the
specialisation), on the launcher call it makes, and on ``CompiledKernel`` (``run`` a property,
``launch_metadata`` None without a hook). A Triton upgrade that changes any of them must fail
here, loudly, rather than make a launch crash or use the wrong config or compiled kernel; a
version not in ``configs.DIRECT_VERSIONS`` never takes the direct launch. Checked in Triton
3.9 (this machine, interpreter, one config) and 3.6 (the GPU machine's; autotuning on and off).
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
from course_kernels.triton import configs  # noqa: E402
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
    the plan's shortcut. Both must reach fn.run with the same positional and keyword arguments
    (the grid aside: a callable, then the tuple it gives). On a GPU the direct launch would skip
    fn.run from the third call on; tests/gpu/test_gpu_launch.py covers it."""
    calls = []
    real = _attn_fwd.fn.run

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(_attn_fwd.fn, "run", spy)
    monkeypatch.setattr(configs, "_TUNED", {})
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
    (tuned,) = configs._TUNED.values()
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


# ---- the direct launch: what it copies from JITFunction.run, and its key ------------------------


def _squash(src: str) -> str:
    return " ".join(src.split())


def test_direct_launch_only_where_its_internals_are_pinned():
    if _triton_env.INTERPRET or triton.__version__ not in configs.DIRECT_VERSIONS:
        assert not configs.DIRECT_SUPPORTED and not configs.DIRECT, FIX


def test_direct_launch_is_on_where_supported_unless_turned_off():
    """On by default since its GPU test passed on the H200 (notes/kernel.md item 14); ``0`` turns
    it off."""
    assert (configs.DIRECT_SUPPORTED and configs.direct_wanted()) == configs.DIRECT


def test_direct_launch_switch_reads_the_environment():
    """Unset or anything but 0: on; 0: off (``JITFunction.run`` for every launch)."""
    assert configs.direct_wanted({})
    assert configs.direct_wanted({configs.DIRECT_ENV: "1"})
    assert not configs.direct_wanted({configs.DIRECT_ENV: "0"})
    assert configs.direct_wanted({"OTHER": "0"})


def test_jit_run_launches_as_the_direct_launch_copies():
    """The direct launch repeats the last step of JITFunction.run: the launcher call, with the
    options JITFunction.run reads from the knobs as part of its key."""
    import re

    from triton.runtime.jit import JITFunction

    src = _squash(inspect.getsource(JITFunction.run))
    for line in (
        "device = driver.active.get_current_device()",
        "stream = driver.active.get_current_stream(device)",
        "for hook in self.pre_run_hooks:",
        "bound_args, specialization, options = binder(*args, **kwargs)",
        'kwargs["debug"] = kwargs.get("debug", self.debug) or knobs.runtime.debug',
        "launch_metadata = kernel.launch_metadata(grid, stream, *bound_args.values())",
        "kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, kernel.packed_metadata, "
        "launch_metadata, knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, "
        "*bound_args.values())",
    ):
        assert line in src, f"JITFunction.run no longer has {line!r}. {FIX}"
    assert src.endswith("return kernel"), FIX
    read = set(re.findall(r'kwargs\["(\w+)"\] =', src))
    assert read <= set(configs.OPTION_KWARGS), f"run reads knobs {sorted(read)}. {FIX}"


def test_compiled_kernel_as_the_direct_launch_uses_it():
    from triton.compiler.compiler import CompiledKernel

    assert isinstance(inspect.getattr_static(CompiledKernel, "run"), property), FIX
    src = _squash(inspect.getsource(CompiledKernel.launch_metadata))
    assert "if knobs.runtime.launch_enter_hook is None: return None" in src, FIX
    assert hasattr(triton.knobs.runtime, "launch_exit_hook"), FIX


def _binder(kernel):
    """(JITFunction, Triton's own binder for it): what JITFunction.run calls to bind and
    specialise the arguments, built for an sm_90 target (no GPU needed)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    fn = kernel.fn if isinstance(kernel.fn, JITFunction) else JITFunction(kernel.fn.fn)
    backend = make_backend(GPUTarget("cuda", 90, 32))
    return fn, create_function_from_signature(fn.signature, fn.params, backend)


def _unaligned(x):
    """x's values in a contiguous tensor whose data starts 2 elements past a 16-byte boundary."""
    buf = torch.empty(x.numel() + 2, dtype=x.dtype, device=x.device)
    y = buf[2:].view(x.shape)
    y.copy_(x)
    return y


def _cases():
    device = _triton_env.device_kind()

    def r(*shape, dtype=torch.float16):
        return torch.randn(*shape, device=device).to(dtype)

    q, k, v = r(1, 2, 16, 16), r(1, 2, 16, 16), r(1, 2, 16, 16)
    yield (q, k, v), {"causal": True}
    yield (_unaligned(q), k, v), {"causal": True}  # same plan, other alignment bits
    yield (q, _unaligned(k), _unaligned(v)), {"causal": True}
    yield (q, k, v), {"causal": True, "scale": 1.0}  # another scale: another plan
    yield (r(1, 1, 1, 16), r(1, 1, 5, 16), r(1, 1, 5, 16)), {}  # N = 1, heads = 1: ints == 1
    yield (r(2, 4, 13, 16), r(2, 1, 13, 16), r(2, 1, 13, 16)), {"causal": True}  # GQA, N % 16
    yield (r(1, 2, 13, 16, dtype=torch.float32),) * 3, {"window_size": (3, 0), "softcap": 5.0}
    slopes = torch.rand(2, device=device)
    yield (r(1, 2, 7, 24), r(1, 2, 9, 24), r(1, 2, 9, 24)), {"alibi_slopes": slopes}
    t = r(1, 1, 2, 16).transpose(1, 2)  # contiguous, with a size-1 dim's odd stride
    yield (t, t, t), {}


def test_a_plan_and_its_alignment_bits_decide_tritons_specialisation(monkeypatch):
    """The direct launch keys compiled kernels on (plan, alignment bits of its tensors). For
    every launch of calls (odd shapes, unaligned views, GQA, N = 1, variants), Triton's own
    binder must give one specialisation per key, with each pointer's "divisible by 16" mark equal
    to the bit; and the constexprs the launcher gets must be the binder's."""
    seen, launches = {}, []  # the launches are recorded, not run: only their arguments count
    monkeypatch.setattr(configs.KernelPlan, "launch", lambda p, t: launches.append((p, t)))
    for (q, k, v), kw in _cases():
        q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
        flash.flash_attention(q, k, v, **kw).sum().backward()
    binders = {}
    bits_per_plan: dict = {}
    for plan, tensors in launches:
        tuned = plan.kernel.configs[0].all_kwargs()  # any config: Triton specialises the same
        if id(plan.kernel) not in binders:
            binders[id(plan.kernel)] = _binder(plan.kernel)
        fn, binder = binders[id(plan.kernel)]
        kwargs = {**plan.constexprs, **tuned}
        bound, spec, _ = binder(*tensors, *plan.scalars, **kwargs)
        bits = configs.alignment_bits(tensors)
        n = len(tensors)
        marks = [s[1] == "D" for s in spec[:n]]
        assert [s[0][0] for s in spec[:n]] == ["*"] * n, f"tensors are not a prefix. {FIX}"
        assert sum(m << (n - 1 - i) for i, m in enumerate(marks)) == bits, FIX
        key = (id(plan), bits)
        assert seen.setdefault(key, spec) == spec, f"one key, two specialisations. {FIX}"
        tail = configs.constexpr_tail(fn, n + len(plan.scalars), kwargs)
        assert tuple(bound.values())[n + len(plan.scalars) :] == tail, FIX
        bits_per_plan.setdefault(id(plan), set()).add(bits)
    assert any(len(b) > 1 for b in bits_per_plan.values()), "no plan saw two alignments"


def test_plan_key_tells_apart_what_the_kernels_see_apart():
    """-0.0 == 0.0 and 1 == 1.0 in a dict, not in a kernel (signed zeros; the int 1 is specialised)."""
    from course_kernels.triton.launch import _plan_key
    from course_kernels.triton.masks import CAUSAL

    assert _plan_key(CAUSAL, 0.0, None, None) != _plan_key(CAUSAL, -0.0, None, None)
    assert _plan_key(CAUSAL, 1, None, None) != _plan_key(CAUSAL, 1.0, None, None)


def test_no_hook_is_set_by_default_and_a_registered_one_is_seen():
    """With Triton's default knobs the direct launch must see no hook (Triton 3.6+ fills the
    slots with empty HookChains, which are truthy: reading them as set kept the direct launch
    from ever running on the H200); a registered hook must be seen."""
    from triton import knobs

    from course_kernels.triton.forward import _attn_fwd

    fn = _attn_fwd.fn
    assert not configs._hooks_set(fn), "the default knobs read as hooks set"
    chain = knobs.runtime.launch_enter_hook
    if hasattr(chain, "add"):  # a HookChain

        def hook(_metadata):
            return None

        chain.add(hook)
        try:
            assert configs._hooks_set(fn), "a registered launch hook was not seen"
        finally:
            chain.remove(hook)
        assert not configs._hooks_set(fn)


def test_dot_precision_is_ieee_for_fp32_only():
    """fp32 inputs: IEEE products (the fp32 reference's); fp16/bf16: tf32 (tensor cores). What
    the pruners read to pick the IEEE config (_triton_env.prune_configs), so GPU-only in effect."""
    from course_kernels.triton import launch
    from course_kernels.triton.masks import PLAIN

    assert launch._dot_precision(torch.float32) == "ieee"
    assert launch._dot_precision(torch.float16) == launch._dot_precision(torch.bfloat16) == "tf32"
    q = torch.empty(1, 2, 8, 40)
    for dtype, want in ((torch.float32, "ieee"), (torch.float16, "tf32")):
        consts = launch._constexprs(launch._layout(q, q, None), dtype, PLAIN, None, None)
        assert consts["DOT_PRECISION"] == want and consts["HEAD_DIM_PADDED"] == 64


def test_plan_cache_is_bounded_and_keys_every_varlen_size(monkeypatch):
    """_PLANS starts over at _MAX_PLANS entries; a varlen plan's key holds max_seqlen_k too (the
    kernels' N_CTX_K), and bwd_variant_args passes the keys' offsets, not the queries'."""
    from course_kernels.triton import launch
    from course_kernels.triton.masks import PLAIN

    monkeypatch.setattr(launch, "_PLANS", {})
    monkeypatch.setattr(launch, "_MAX_PLANS", 3)
    for i in range(10):
        assert launch._remember(("k", i), i) == i
        assert len(launch._PLANS) <= 3 and launch._PLANS[("k", i)] == i
    cu_q, cu_k = torch.tensor([0, 4, 9]).int(), torch.tensor([0, 5, 9]).int()
    key = launch._plan_key(PLAIN, 0.5, None, (cu_q, cu_k, 5, 5))
    assert key != launch._plan_key(PLAIN, 0.5, None, (cu_q, cu_k, 5, 6))
    assert key != launch._plan_key(PLAIN, 0.5, None, (cu_q, cu_k, 6, 5))
    q = torch.randn(9, 2, 16)
    common, _ = launch.bwd_variant_args(q, q, torch.empty(2, 9), PLAIN, 0.5, None,
                                        (cu_q, cu_k, 5, 5))  # fmt: skip
    assert common[0] is cu_q and common[1] is cu_k


def test_even_blocks_without_an_autotuning_list_keeps_the_masks(monkeypatch):
    """A backward kernel without configs to read the blocks from (not autotuned): no promise."""
    from types import SimpleNamespace

    from course_kernels.triton import launch

    assert launch._even(1 << 12, 1 << 12)
    monkeypatch.setattr(launch, "_attn_bwd_dq", SimpleNamespace())
    assert not launch._even(1 << 12, 1 << 12)


def test_one_key_backward_takes_the_closed_form(monkeypatch):
    """Nk = 1, every row seeing the key: _backward_c returns the closed form's gradients (dQ =
    dK = 0 exactly: notes/kernel.md), not the kernels'; with two keys the kernels run."""
    from course_kernels.triton import launch
    from course_kernels.triton.masks import CAUSAL, PLAIN

    calls = []
    monkeypatch.setattr(launch, "_backward_one_key", lambda *a: calls.append(a) or "closed")
    q, do = torch.randn(1, 2, 4, 16), torch.randn(1, 2, 4, 16)
    for variant in (PLAIN, CAUSAL):
        k = torch.randn(1, 2, 1, 16)
        o, lse_c = launch._forward_c(q, k, k, variant, 0.3)
        assert launch._backward_c(do, q, k, k, o, lse_c, variant, 0.3) == "closed"
    k = torch.randn(1, 2, 2, 16)
    o, lse_c = launch._forward_c(q, k, k, PLAIN, 0.3)
    assert launch._backward_c(do, q, k, k, o, lse_c, PLAIN, 0.3)[0].shape == q.shape
    assert len(calls) == 2


def test_pruners_on_a_gpu_pick_by_capability_precision_and_head_dim(monkeypatch):
    """prune_configs on a GPU: sm_80 and up keep the fp16/bf16 list (below sm_80 the T4 table),
    fp32 the IEEE config, padded head dim 256 the small one, COURSE_KERNELS_AUTOTUNE=0 the first;
    pick_configs lists the GPU configs then the IEEE one (the interpreter: the CPU one alone)."""
    ieee, small, fast1, fast2 = (triton.Config({"BLOCK_M": m}) for m in (8, 16, 32, 64))
    t4 = triton.Config({"BLOCK_M": 4})
    prune = _triton_env.prune_configs(ieee, small, {(256, False): t4, (256, True): t4})
    configs = [fast1, fast2, small, ieee]
    tf32 = dict(HEAD_DIM=64, HEAD_DIM_PADDED=64, DOT_PRECISION="tf32")
    monkeypatch.setattr(_triton_env, "AUTOTUNE", True)
    for cap in ((8, 0), (9, 0)):
        monkeypatch.setattr(_triton_env, "gpu_capability", lambda cap=cap: cap)
        assert prune(configs, tf32) == [fast1, fast2, small]
        assert prune(configs, {**tf32, "DOT_PRECISION": "ieee"}) == [ieee]
        assert prune(configs, {**tf32, "HEAD_DIM_PADDED": 256}) == [small]
        assert prune(configs, {**tf32, "HEAD_DIM_PADDED": 128}) == [fast1, fast2, small]
    monkeypatch.setattr(_triton_env, "gpu_capability", lambda: (7, 5))
    assert prune(configs, tf32) == [t4]
    monkeypatch.setattr(_triton_env, "gpu_capability", lambda: (9, 0))
    monkeypatch.setattr(_triton_env, "AUTOTUNE", False)
    assert prune(configs, tf32) == [fast1]
    assert _triton_env.pick_configs([fast1, fast2], small, ieee) == [small]  # interpreter
    monkeypatch.setattr(_triton_env, "INTERPRET", False)
    assert _triton_env.pick_configs([fast1, fast2], small, ieee) == [fast1, fast2, ieee]


def test_env_helpers_under_the_interpreter(monkeypatch):
    """No capability and no do_bench override under the interpreter (even with a GPU present);
    without a GPU and with TRITON_INTERPRET=0 require_triton says where Triton could run."""
    assert _triton_env.autotune_kwargs() == {}
    monkeypatch.setattr(_triton_env, "HAS_GPU", True)
    assert _triton_env.capability() is None
    monkeypatch.setattr(_triton_env, "HAS_GPU", False)
    monkeypatch.setattr(_triton_env, "INTERPRET", False)
    with pytest.raises(RuntimeError, match="found no CUDA GPU and TRITON_INTERPRET=0"):
        _triton_env.require_triton()


def test_hooks_the_direct_launch_leaves_to_triton(monkeypatch):
    """An empty slot (None) is no hook; a stages-inspection hook or a JIT pre-run hook sends the
    launch through JITFunction.run."""
    from types import SimpleNamespace

    from triton import knobs

    assert configs._hook_in_use(None) is False
    fn = SimpleNamespace(pre_run_hooks=[])
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", None, raising=False)
    monkeypatch.setattr(knobs.runtime, "launch_exit_hook", None, raising=False)
    monkeypatch.setattr(knobs.runtime, "add_stages_inspection_hook", None, raising=False)
    assert not configs._hooks_set(fn)
    assert configs._hooks_set(SimpleNamespace(pre_run_hooks=[print]))
    monkeypatch.setattr(knobs.runtime, "add_stages_inspection_hook", print, raising=False)
    assert configs._hooks_set(fn)


def test_forward_tile_arithmetic():
    """Shared memory: Q once plus a K and a V tile per stage; registers: the fp32 accumulator
    over 32 threads a warp."""
    assert configs.smem_estimate(128, 64, 3, 64) == 2 * (128 * 64 + 3 * 2 * 64 * 64)
    assert configs.smem_estimate(64, 32, 2, 128, dtype_bytes=4) == 4 * (64 * 128 + 4 * 32 * 128)
    assert configs.accumulator_registers(128, 64, 4) == 64
    assert configs.accumulator_registers(128, 128, 8) == 64
