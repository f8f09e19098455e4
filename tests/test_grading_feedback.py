"""The check cells name the classic mistakes: each known-wrong implementation gets the right
sentence (run in-process, as in a student's notebook)."""

# The wrong implementations below overflow and divide by zero on purpose.
pytestmark = __import__("pytest").mark.filterwarnings("ignore::RuntimeWarning")

import math

import numpy as np
import pytest

from course_kernels.grading.runner import run_visible
from course_kernels.grading.builders import TF32_HINT
from course_kernels.grading.specs.triton_forward import build_attention_triton


def messages(name, fn):
    return " | ".join(v.message for v in run_visible(name, fn) if not v.passed)


def softmax_no_max(x):
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def update_factory(bug):
    def online_update(m, l, acc, s, v):
        m_new = np.maximum(m, s.max(-1))
        ms = m_new if bug == "no_guard" else np.where(np.isneginf(m_new), 0.0, m_new)
        p = np.exp(s - ms[:, None])
        alpha = np.exp(m - ms)
        if bug == "l_only":
            return m_new, alpha * l + p.sum(-1), acc + p @ v
        if bug == "no_rescale":
            return m_new, l + p.sum(-1), acc + p @ v
        return m_new, alpha * l + p.sum(-1), alpha[:, None] * acc + p @ v

    return online_update


def _visible(bug, rows, cols, nq, nk):
    """Which keys a (buggy) causal mask lets each query see."""
    if bug in ("strict", "strict_nan"):
        return cols < rows
    if bug == "plus_one":
        return cols <= rows + 1
    if bug == "bottom_right":
        return cols <= rows + (nk - nq)
    if bug == "causal_ignored":
        return np.ones_like(cols <= rows)
    return cols <= rows


def _lse(bug, m, l):
    """The logsumexp a (buggy) forward saves for the backward pass."""
    return {
        "lse_is_m": m,
        "lse_is_l": l,
        "lse_base2": (m + np.log(l)) / math.log(2),
    }.get(bug, m + np.log(l))


def _update(bug, l, acc, p, alpha, vb):
    """(l, acc) after one key block, with a (buggy) rescaling."""
    if bug == "no_rescale":
        return l + p.sum(-1), acc + p @ vb
    if bug == "l_only":
        return alpha * l + p.sum(-1), acc + p @ vb
    if bug == "per_block":
        rs = np.where(p.sum(-1, keepdims=True) == 0, 1, p.sum(-1, keepdims=True))
        return np.ones_like(l), acc + (p / rs) @ vb
    return alpha * l + p.sum(-1), alpha[..., None] * acc + p @ vb


def forward_factory(bug):
    """A tiled forward with one classic bug."""

    def flash_forward(q, k, v, causal=False, scale=None, block_q=64, block_k=64):
        nq, d = q.shape[-2:]
        nk, dv = k.shape[-2], v.shape[-1]
        if scale is None or bug == "scale_ignored":
            scale = 1.0 if bug == "unscaled" else 1 / math.sqrt(d)
        causal = causal or bug == "causal_always"
        out = np.empty((*q.shape[:-1], dv), q.dtype)
        lse = np.empty(q.shape[:-1], q.dtype)
        for i0 in range(0, nq, block_q):
            i1 = min(i0 + block_q, nq)
            m = np.full(q.shape[:-2] + (i1 - i0,), -np.inf)
            l = np.zeros_like(m)
            acc = np.zeros(q.shape[:-2] + (i1 - i0, dv))
            for j0 in range(0, nk, block_k):
                j1 = min(j0 + block_k, nk)
                s = scale * q[..., i0:i1, :] @ np.swapaxes(k[..., j0:j1, :], -1, -2)
                if causal:
                    rows, cols = np.arange(i0, i1)[:, None], np.arange(j0, j1)[None, :]
                    s = np.where(_visible(bug, rows, cols, nq, nk), s, -np.inf)
                m_new = np.maximum(m, s.max(-1))
                ms = m_new if bug == "strict_nan" else np.where(np.isneginf(m_new), 0, m_new)
                p = np.exp(s - ms[..., None])
                l, acc = _update(bug, l, acc, p, np.exp(m - ms), v[..., j0:j1, :])
                m = m_new
            out[..., i0:i1, :] = acc / np.where(l == 0, 1, l)[..., None]
            lse[..., i0:i1] = _lse(bug, m, l)
        return out, lse

    return flash_forward


def backward_factory(bug):
    """A dense backward (not tiled) with one classic bug, everything recomputed from q, k, v."""

    def flash_backward(q, k, v, out, lse, dout, causal=False, scale=None, block_q=64, block_k=64):
        scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
        s = scale * q @ np.swapaxes(k, -1, -2)
        if causal or bug == "causal_always":
            rows, cols = np.arange(q.shape[-2])[:, None], np.arange(k.shape[-2])[None, :]
            s = np.where(cols < rows if bug == "strict" else cols <= rows, s, -np.inf)
        m = s.max(-1, keepdims=True)
        p = np.exp(s - np.where(np.isneginf(m), 0, m))
        p = p / np.where(p.sum(-1, keepdims=True) == 0, 1, p.sum(-1, keepdims=True))
        o = p @ v
        dp = dout @ np.swapaxes(v, -1, -2)
        d_term = {"no_D": 0.0, "D_without_O": dout.sum(-1, keepdims=True)}
        ds = p * (dp - d_term.get(bug, (dout * o).sum(-1, keepdims=True)))
        sc = 1.0 if bug == "no_scale" else scale
        return sc * ds @ k, sc * np.swapaxes(ds, -1, -2) @ q, np.swapaxes(p, -1, -2) @ dout

    return flash_backward


def test_max_not_subtracted_is_named_overflow():
    assert "subtract the row max" in messages("stable_softmax", softmax_no_max)


def test_l_rescaled_but_not_o():
    assert "l is rescaled but acc" in messages("online_update", update_factory("l_only"))


def test_accumulator_not_rescaled():
    assert "not rescaled" in messages("online_update", update_factory("no_rescale"))
    assert "accumulator is not rescaled" in messages("flash_forward", forward_factory("no_rescale"))


def test_nan_on_fully_masked_rows():
    assert "fully masked" in messages("online_update", update_factory("no_guard"))


def test_normalizing_each_block():
    assert "normalised on its own" in messages("flash_forward", forward_factory("per_block"))


def test_causal_off_by_one():
    assert "off by one" in messages("flash_forward", forward_factory("strict"))


def test_wrong_logsumexp_saved_for_backward():
    assert "row max m, not the logsumexp" in messages("flash_forward", forward_factory("lse_is_m"))


def test_not_tiled_is_caught_by_memory():
    def dense(q, k, v, causal=False, scale=None, block_q=64, block_k=64):
        scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
        s = scale * (q @ np.swapaxes(k, -1, -2))
        if causal:
            s = np.where(np.tri(q.shape[-2], k.shape[-2], dtype=bool), s, -np.inf)
        m = s.max(-1, keepdims=True)
        p = np.exp(s - m)
        return p @ v / p.sum(-1, keepdims=True), (m + np.log(p.sum(-1, keepdims=True)))[..., 0]

    verdicts = run_visible("flash_forward", dense)
    failed = [v for v in verdicts if not v.passed]
    assert [v.name for v in failed] == ["really tiled: no N x N matrix"]
    assert "not tiled" in failed[0].message


def test_block_size_rounded_up():
    msg = messages("block_size", lambda M, d: -(-M // (4 * d)) if M >= 4 * d else 1 // 0)  # noqa: SIM300
    assert "rounded up" in msg


def test_tf32_product_compared_with_exact():
    case = build_attention_triton(dict(n=32, d=16, seed=60))
    q, k, v = case.args

    def tf32(x):  # keep 10 mantissa bits, as TF32 does
        bits = np.asarray(x, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
        return bits.view(np.float32)

    from course_kernels.numpy.reference import attention_reference

    out, lse = attention_reference(tf32(q), tf32(k), v)
    with pytest.raises(Exception) as err:
        case.judge((out.astype(np.float32), lse.astype(np.float32)), None)
    assert TF32_HINT in str(err.value)


@pytest.mark.parametrize("name", ["stable_softmax", "online_update", "flash_forward"])
def test_correct_code_passes_in_process(name):
    right = {
        "stable_softmax": lambda x: (
            np.exp(x - x.max(-1, keepdims=True))
            / np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)
        ),
        "online_update": update_factory(None),
        "flash_forward": forward_factory(None),
    }[name]
    assert all(v.passed for v in run_visible(name, right))


def test_unmeasured_memory_fails_closed():
    """A 'really tiled' test whose memory measurement failed must not award the points."""
    from course_kernels.grading.builders import Fail, structure_message
    from course_kernels.grading.feedback import CallOutcome

    outcome = CallOutcome("ok")
    outcome.memory = None
    with pytest.raises(Fail, match="could not be measured"):
        q = np.zeros((1, 2048, 16))
        structure_message(outcome, q, q, q, {"block_q": 64, "block_k": 64})
    outcome.memory = (64 * 2**20, 16 * 2**20, "as the peak resident memory of the process")
    with pytest.raises(Fail, match="not tiled"):
        q = np.zeros((1, 2048, 16))
        structure_message(outcome, q, q, q, {"block_q": 64, "block_k": 64})
    outcome.memory = (1 * 2**20, 16 * 2**20, "as the peak resident memory of the process")
    assert "tiled (extra memory 1.0 MiB)" in structure_message(
        outcome, q, q, q, {"block_q": 64, "block_k": 64}
    )
    # a long key sequence: 12 MiB is a row chunk of the score matrix (12 rows x Nk), not tiles
    k = np.zeros((1, 131072, 16))
    outcome.memory = (12 * 2**20, "cgroup")
    with pytest.raises(Fail, match="not tiled"):
        structure_message(outcome, q[:, :64], k, k, {"block_q": 64, "block_k": 64})


def test_hidden_tests_fail_classic_wrong_answers():
    """A logsumexp without the max overflows on the hidden test (x ~ 800 in float64)."""
    from course_kernels.grading.exercises import NOTEBOOKS
    from course_kernels.grading.runner import _call_in_process, build_cases, judge

    def naive_logsumexp(x):
        return np.log(np.exp(x).sum(-1))

    hidden = [
        c
        for c in build_cases(NOTEBOOKS["01_stable_softmax"])
        if c.hidden and c.exercise == "logsumexp"
    ]
    assert hidden
    with np.errstate(all="ignore"):
        verdicts = [judge(c, _call_in_process(naive_logsumexp, c)) for c in hidden]
    assert not all(v.passed for v in verdicts)
    assert any("overflow" in v.message for v in verdicts)


# -- the judges' building blocks (course_kernels/grading/feedback.py), on hand-worked cases ----
class _TensorLike:
    """What ``as_array`` reads of a torch tensor (detach, cpu, float, numpy), without torch."""

    def __init__(self, values):
        self.values = np.asarray(values)

    def detach(self):
        return self

    def cpu(self):
        return self

    def float(self):
        return _TensorLike(self.values.astype(np.float32))

    def numpy(self):
        return self.values


def test_as_array_accepts_plain_float_arrays_of_the_shape_and_says_what_is_wrong():
    from course_kernels.grading.feedback import Fail, as_array

    x = np.zeros((2, 3), np.float32)
    assert as_array(x, "out", (2, 3)) is x
    got = as_array(_TensorLike(np.array([[1.0, 2.0]])), "out", (1, 2))  # a tensor from a check cell
    assert type(got) is np.ndarray and got.dtype == np.float32 and got.tolist() == [[1.0, 2.0]]
    for bad, says in [
        ([1.0, 2.0], "out should be a NumPy array; got list"),
        (np.ma.masked_array([1.0, 2.0]), "out should be a NumPy array; got MaskedArray"),
        (np.array([1, 2]), "out should be a floating-point array; got dtype int64"),
        (np.zeros(3), "out has shape (3,), expected (2,)"),
    ]:
        with pytest.raises(Fail) as err:
            as_array(bad, "out", (2,))
        assert str(err.value) == says


def test_unpack_names_the_count_of_values_returned():
    from course_kernels.grading.feedback import Fail, unpack

    assert unpack((1, 2), 2, "(out, lse)") == (1, 2)
    with pytest.raises(Fail, match=r"should return \(out, lse\) \(2 values\); got a tuple of 3"):
        unpack((1, 2, 3), 2, "(out, lse)")
    with pytest.raises(Fail, match=r"\(2 values\); got list"):
        unpack([1, 2], 2, "(out, lse)")


def test_close_allows_an_error_equal_to_the_budget_and_defaults_to_1e_9_relative():
    from course_kernels.grading.feedback import close

    # "at most" the budget: an error of exactly 0.5 against a budget of 0.5 passes
    assert close(np.array([1.5]), np.array([1.0]), budget=0.5) == (True, 0.5, 0.5)
    # no naive yardstick: 1e-9 x max(1, |ref|)
    assert close(np.array([1.0 + 1e-8]), np.array([1.0])) == (False, pytest.approx(1e-8), 1e-9)
    ok, _, bud = close(np.array([1000.0]), np.array([1000.0]))
    assert ok and bud == pytest.approx(1e-6)


def test_a_variant_matches_within_1e_3_relative_and_one_that_cannot_be_built_is_skipped():
    from course_kernels.grading.feedback import diagnose, matches

    v = np.array([1.0, -2.0])
    assert matches(v + np.array([1.5e-3, -2.5e-3]), v)  # within 1e-3 x (1 + |v|)
    assert not matches(v + np.array([2.5e-3, 0.0]), v)
    assert not matches(np.array([1.0]), v)  # another shape
    assert matches(np.array([np.nan, -np.inf]), np.array([np.nan, -np.inf]))

    def broken():
        raise IndexError("this variant needs a longer input")

    assert diagnose(v, [(broken, "never"), (v.copy(), "the named mistake")]) == "the named mistake"


def test_compare_says_nan_when_nothing_is_recognised_and_keeps_the_hint():
    from course_kernels.grading.feedback import Fail, compare

    ref = np.array([1.0, 2.0])
    with pytest.raises(Fail) as err:
        compare(np.array([1.0, np.nan]), ref, what="out", hint="check l")
    assert str(err.value) == "out contains NaN where the answer is finite. check l"
    with pytest.raises(Fail) as err:
        compare(np.array([1.0, 3.0]), ref, what="out", budget=0.5, hint="check l")
    assert str(err.value) == "out: max abs error 1.00e+00 exceeds the budget 5.00e-01. check l"


def test_mutation_message_names_arguments_past_the_known_names_by_position():
    from course_kernels.grading.feedback import mutation_message

    msg = mutation_message([0, 3], ["q", "k", "v"])
    assert msg.startswith("your function modified its input (q, argument 3) in place")


def test_error_messages_name_the_classic_failures():
    from course_kernels.grading.feedback import CallOutcome, error_message

    def said(t, m="", tb="", status="error"):
        out = CallOutcome(status, error={"type": t, "message": m, "traceback": tb})
        return error_message(out, "flash_forward")

    assert "called sys.exit(); a function must return its result" in said("SystemExit")[1]
    assert "printed more than the 1 MB" in said("OSError", "[Errno 27] File too large")[1]
    assert "ran out of memory (MemoryError): is something N x N" in said("MemoryError")[1]
    missing = "name 'flash_forward' is not defined in your solution cells"
    assert said("NameError", missing)[1] == (
        missing + " (keep the function's name and put it in the cell marked YOUR CODE)"
    )
    tb = (
        "Traceback (most recent call last):\n"
        '  File "cell", line 3, in flash_forward\n    return helper(q)\n'
        '  File "cell", line 9, in helper\n    raise ValueError("bad block")\n'
        "ValueError: bad block"
    )
    assert said("ValueError", "bad block", tb) == (
        "error",
        '`flash_forward` raised ValueError: bad block (File "cell", line 9, in helper)',
    )
    for st in ("timeout", "crash", "not_run", "invalid"):
        assert error_message(CallOutcome(st, message="why"), "f") == (st, "why")


def test_text_from_a_submission_is_cut_at_2000_characters_and_made_writable():
    from course_kernels.grading.feedback import clean_text

    assert clean_text("x" * 5000) == "x" * 2000
    assert clean_text("abcdef", limit=3) == "abc"
    assert clean_text("a\ud800b") == "a\\ud800b"


# -- the known-wrong variants (course_kernels/grading/variants.py) name each classic mistake ----
def quick_verdicts(name, fn) -> dict:
    """test name -> message of each failed visible test, the tiling test left out (N = 2048:
    its named mistakes are slow to build)."""
    from course_kernels.grading.exercises import EXERCISES
    from course_kernels.grading.runner import _call_in_process, judge

    verdicts = [
        judge(c, _call_in_process(fn, c)) for c in EXERCISES[name].cases() if c.probe != "memory"
    ]
    return {v.name: v.message for v in verdicts if not v.passed}


def quick_messages(name, fn):
    return " | ".join(quick_verdicts(name, fn).values())


@pytest.mark.parametrize(
    "bug, named",
    [
        ("plus_one", "causal is off by one: query i sees keys j <= i, not j <= i + 1"),
        ("strict_nan", "causal is off by one: query i sees keys j <= i (the diagonal included)"),
        ("bottom_right", "causal is aligned to the bottom-right corner"),
        ("causal_ignored", "causal=True was ignored: query i may only see keys j <= i"),
        ("causal_always", "a causal mask was applied although causal=False"),
        ("unscaled", "the scores were not scaled: S = Q K^T / sqrt(d) when scale is None"),
        ("scale_ignored", "the scale argument was ignored (1/sqrt(d) used instead)"),
        ("l_only", "l is rescaled but O is not"),
        ("lse_is_l", "that is l (the row sum), not its log"),
        ("lse_base2", "that is a base-2 logsumexp"),
    ],
)
def test_forward_mistakes_are_named(bug, named):
    assert named in quick_messages("flash_forward", forward_factory(bug))


@pytest.mark.parametrize(
    "bug, named",
    [
        ("no_D", "the -D term is missing: dS = P * (dP - D)"),
        ("D_without_O", "D = rowsum(dO * O) (elementwise product with O), not rowsum(dO)"),
        ("no_scale", "dQ and dK need the softmax scale"),
        ("causal_always", "a causal mask was applied although causal=False"),
        ("strict", "causal is off by one"),
    ],
)
def test_backward_mistakes_are_named(bug, named):
    assert named in quick_messages("flash_backward", backward_factory(bug))


def test_a_right_dense_backward_passes_and_a_nearly_right_one_is_not_misnamed():
    """Off by 1e-4 everywhere: over the budget, but no classic mistake may be named for it
    (non-causal tests: with Nq == Nk a bottom-right causal mask is the right one)."""
    right = backward_factory(None)
    assert quick_verdicts("flash_backward", right) == {}

    def nearly(*args, **kwargs):
        return tuple(g + 1e-4 for g in right(*args, **kwargs))

    said = quick_verdicts("flash_backward", nearly)
    for name in ("non-causal, uneven N", "cross-attention: Nq != Nk, dv != d"):
        assert said[name].startswith("dq: max abs error 1."), said[name]
        assert "e-04 exceeds the budget" in said[name], said[name]


def test_a_nearly_right_forward_is_not_misnamed():
    right = forward_factory(None)

    def nearly(*args, **kwargs):
        out, lse = right(*args, **kwargs)
        return out + 1e-4, lse

    said = quick_verdicts("flash_forward", nearly)
    for name in ("blocks divide N", "uneven N and blocks", "custom scale"):
        assert said[name].startswith("out: max abs error 1."), said[name]
        assert "e-04 exceeds the budget" in said[name], said[name]


# -- the builders' shared helpers (course_kernels/grading/builders.py) --------------------------
def test_qkv_inputs_follow_the_parameters_and_spread_grows_along_the_keys():
    from course_kernels.grading.builders import qkv_inputs

    q, k, v = qkv_inputs({"nq": 10, "d": 8, "seed": 1})
    assert (q.shape, k.shape, v.shape) == ((2, 10, 8), (2, 10, 8), (2, 10, 8))
    assert q.dtype == k.dtype == v.dtype == np.float32
    q, k, v = qkv_inputs({"lead": [3], "nq": 10, "nk": 12, "d": 8, "dv": 4, "dtype": "float64"})
    assert (q.shape, k.shape, v.shape) == ((3, 10, 8), (3, 12, 8), (3, 12, 4))
    assert v.dtype == np.float64
    plain, spread = (qkv_inputs({"nq": 5, "seed": 2, "spread": s})[1] for s in (None, 4))
    np.testing.assert_allclose(
        spread / plain, np.broadcast_to([[0.5], [1.375], [2.25], [3.125], [4.0]], plain.shape), 1e-6
    )


def test_fwd_kwargs_defaults_and_conversions():
    from course_kernels.grading.builders import fwd_kwargs

    assert fwd_kwargs({}) == {"causal": False, "block_q": 16, "block_k": 16}
    assert fwd_kwargs({"causal": 1, "block_q": "8", "scale": "0.5"}) == {
        "causal": True,
        "block_q": 8,
        "block_k": 16,
        "scale": 0.5,
    }


def test_tiling_limit_is_a_few_tiles_plus_slack_and_at_most_half_the_score_matrix():
    from course_kernels.grading.builders import Fail, structure_message, tiling_limit
    from course_kernels.grading.feedback import CallOutcome

    # 8 MiB + 16 x 8 bytes x (64 x 64 + (64 + 64) x 16) = 8388608 + 786432
    assert tiling_limit(2048, 2048, 16, 16, 64, 64) == 9_175_040
    assert tiling_limit(2048, 2048, 16, 16, 64, 16) == 8_388_608 + 128 * (64 * 16 + 80 * 16)
    assert tiling_limit(64, 64, 16, 16, 64, 64) == 64 * 64 * 8 // 2  # half the float64 matrix
    q = np.zeros((1, 2048, 16))
    kw = {"block_q": 64, "block_k": 16}
    for peak, tiled in ((8_683_520, True), (8_683_521, False)):
        outcome = CallOutcome("ok", memory=(peak, "cgroup"))
        if tiled:
            assert "tiled (extra memory 8.3 MiB)" in structure_message(outcome, q, q, q, kw)
        else:
            with pytest.raises(Fail, match="not tiled"):
                structure_message(outcome, q, q, q, kw)
    why = "cannot verify 'really tiled': this grader has no cgroup per sandbox"
    with pytest.raises(Fail, match=why):
        structure_message(CallOutcome("ok", memory_note=why), q, q, q, kw)


def test_as_int_takes_ints_and_0_d_int_arrays_only():
    from course_kernels.grading.builders import Fail, as_int

    assert as_int(3, "block_size") == 3
    assert as_int(np.array(4, np.int64), "block_size") == 4  # how an np.int64 comes back
    for bad, got in ((True, "bool"), (3.0, "float"), (np.array([3]), "ndarray")):
        with pytest.raises(Fail, match=f"block_size should be an int; got {got}"):
            as_int(bad, "block_size")
    with pytest.raises(Fail, match="got ndarray"):
        as_int(np.array(3.0), "block_size")


def test_tf32_hint_only_for_errors_of_tf32_size():
    from course_kernels.grading.builders import Fail, tf32_or

    ref = np.ones((2, 2))
    err = Fail("out: max abs error too large")
    assert str(tf32_or(err, ref + 1e-3, ref)) == str(err) + ". " + TF32_HINT
    assert tf32_or(err, ref + 0.1, ref) is err
    assert tf32_or(err, ref * np.nan, ref) is err


def test_gqa_inputs_and_mistakes_are_named():
    from course_kernels.grading.builders import Fail, bhnd_inputs
    from course_kernels.grading.specs.triton_causal_gqa import build_attention_triton_gqa
    from course_kernels.numpy.reference import attention_reference

    q, k, v = bhnd_inputs({"heads": 4, "kv_heads": 2, "n": 8, "d": 4})
    assert (q.shape, k.shape, v.shape) == ((1, 4, 8, 4), (1, 2, 8, 4), (1, 2, 8, 4))
    assert bhnd_inputs({"heads": 4}, kv_heads=1)[1].shape == (1, 1, 32, 16)

    case = build_attention_triton_gqa(dict(heads=4, kv_heads=2, n=16, d=8, causal=True, seed=5))
    q, k, v = case.args
    kk, vv = np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1)  # query heads 0, 1 -> kv head 0

    def judged(out):
        try:
            return case.judge(np.asarray(out, np.float32), None)
        except Fail as e:
            return str(e)

    def strict_nan(q, k, v):  # keys j < i, and row 0 (nothing visible) is 0 / 0
        s = np.where(np.tri(16, 16, -1, bool), q @ np.swapaxes(k, -1, -2) / math.sqrt(8), -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        return p @ v / p.sum(-1, keepdims=True)

    assert judged(attention_reference(q, kk, vv, True)[0]).startswith("max error")
    tiled = np.tile(k, (1, 2, 1, 1)), np.tile(v, (1, 2, 1, 1))  # head h -> kv head h % 2
    assert judged(attention_reference(q, *tiled, True)[0]) == (
        "out is wrong: query head h must use kv head h // (Hq / kv_heads) (groups of consecutive "
        "query heads share one kv head), not h % kv_heads"
    )
    unscaled = attention_reference(q, kk, vv, True, scale=1.0)[0]
    assert "the scores were not scaled by 1/sqrt(d)" in judged(unscaled)
    assert "causal is off by one" in judged(strict_nan(q, kk, vv))
