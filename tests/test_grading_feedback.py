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


def forward_factory(bug):
    """A tiled forward with one classic bug."""

    def flash_forward(q, k, v, causal=False, scale=None, block_q=64, block_k=64):
        nq, d = q.shape[-2:]
        nk, dv = k.shape[-2], v.shape[-1]
        scale = 1 / math.sqrt(d) if scale is None else scale
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
                    vis = cols < rows if bug == "strict" else cols <= rows
                    s = np.where(vis, s, -np.inf)
                m_new = np.maximum(m, s.max(-1))
                ms = np.where(np.isneginf(m_new), 0, m_new)
                p = np.exp(s - ms[..., None])
                alpha = np.exp(m - ms)
                if bug == "no_rescale":
                    l, acc = l + p.sum(-1), acc + p @ v[..., j0:j1, :]
                elif bug == "per_block":
                    rs = np.where(p.sum(-1, keepdims=True) == 0, 1, p.sum(-1, keepdims=True))
                    acc, l = acc + (p / rs) @ v[..., j0:j1, :], np.ones_like(l)
                else:
                    l = alpha * l + p.sum(-1)
                    acc = alpha[..., None] * acc + p @ v[..., j0:j1, :]
                m = m_new
            out[..., i0:i1, :] = acc / np.where(l == 0, 1, l)[..., None]
            lse[..., i0:i1] = m if bug == "lse_is_m" else m + np.log(l)
        return out, lse

    return flash_forward


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
