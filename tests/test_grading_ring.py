"""Exercise 10 (ring attention, one spec module): the solution is right, the classic mistakes are
named, the hidden-test JSON is generated from the spec, and it stands apart from the library's
course_kernels.distributed."""

import inspect
import json
from pathlib import Path

from course_kernels.grading.runner import run_visible
from course_kernels.grading.specs import ring_attention as R

ROOT = Path(__file__).resolve().parents[1]


def _edited(old, new):
    src = inspect.getsource(R.ring_attention)
    assert old in src
    ns = dict(vars(R))
    exec(src.replace(old, new), ns)  # noqa: S102 - a variant of the solution, for the test
    return ns["ring_attention"]


def _messages(name, fn):
    return [(v.points, v.max_points, v.message) for v in run_visible(name, fn)]


def test_the_solution_passes_every_visible_test():
    for name in ("zigzag_chunks", "block_kind", "merge_step", "ring_attention"):
        assert all(p == m for p, m, _ in _messages(name, getattr(R, name))), name


def test_classic_ring_mistakes_are_named():
    cases = {
        "without rescaling": _edited("state[qc] = merge_step(", "state[qc] = _merge_no_rescale("),
        "rank order": _edited(
            "out[..., qc * c:(qc + 1) * c, :] = state[qc][2]",
            "out[..., (2 * r + held[r].index(qc)) * c:"
            "(2 * r + held[r].index(qc) + 1) * c, :] = state[qc][2]",
        ),
        "off by one": _edited("np.tri(c, dtype=bool)", "np.tri(c, k=-1, dtype=bool)"),
        "computed in full": _edited('if kind == "diagonal":', "if False:"),
    }
    for words, fn in cases.items():
        msgs = _messages("ring_attention", fn)
        assert sum(p for p, _, _ in msgs) < sum(m for _, m, _ in msgs), words
        assert any(words in msg for _, _, msg in msgs), (words, msgs)
    merge = _messages("merge_step", R._merge_no_rescale)
    assert any("not rescaled" in m for _, _, m in merge)
    zig = _messages("zigzag_chunks", lambda r, w: (2 * r, 2 * r + 1))
    assert all(p == 0 for p, _, _ in zig) and "contiguous" in zig[0][2]
    kind = _messages("block_kind", lambda q, k, causal: "skip" if k >= q else "full")
    assert any("diagonal block is not empty" in m for _, _, m in kind)


def test_hidden_json_is_generated_from_the_spec():
    from course_kernels.grading.notebooks import hidden_json

    on_disk = (ROOT / "course_kernels/grading/hidden_tests/10_ring_attention.json").read_text()
    assert on_disk == hidden_json(R), "run: python scripts/build_notebooks.py"
    assert json.loads(on_disk)["tests"]


def test_the_exercise_does_not_use_the_distributed_library():
    src = inspect.getsource(R)
    assert "distributed" not in src.replace("course_kernels.distributed``", "")
