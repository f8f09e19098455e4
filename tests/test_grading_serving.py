"""Exercise 11 (serving maps, one spec module): the solution earns every point, the classic
mistakes are named (top-left offset, off by one, empty programs, cu_seqlens off by one, pages in
sorted order, the table ignored), and the hidden-test JSON is generated from the spec."""

import json
from pathlib import Path

import numpy as np

from course_kernels.grading.runner import run_visible
from course_kernels.grading.specs import serving_maps as S

ROOT = Path(__file__).resolve().parents[1]


def _messages(name, fn):
    return [(v.points, v.max_points, v.message) for v in run_visible(name, fn)]


def _named(name, fn, words):
    msgs = _messages(name, fn)
    assert sum(p for p, _, _ in msgs) < sum(m for _, m, _ in msgs), words
    assert any(words in m for _, _, m in msgs), (words, msgs)


def test_the_solution_passes_every_visible_test():
    for name in ("chunk_mask", "varlen_programs", "gather_sequence"):
        assert all(p == m for p, m, _ in _messages(name, getattr(S, name))), name


def test_mask_mistakes_are_named():
    def tril(n_q, n_k, k=0):
        return np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + k

    _named("chunk_mask", lambda n_q, n_k: tril(n_q, n_k), "top-left")
    _named("chunk_mask", lambda n_q, n_k: tril(n_q, n_k, n_k - n_q - 1), "off by one")
    _named("chunk_mask", lambda n_q, n_k: tril(n_q, n_k, n_k - n_q + 1), "off by one")
    _named("chunk_mask", lambda n_q, n_k: tril(n_q, n_k, n_q - n_k), "wrong sign")
    _named("chunk_mask", lambda n_q, n_k: tril(n_k, n_q, n_k - n_q), "transposed")


def test_program_map_mistakes_are_named():
    def programs(count, seqs=lambda cu: range(len(cu) - 1), length=lambda cu, b: cu[b + 1] - cu[b]):
        def fn(cu, block_m):
            return [(b, m) for b in seqs(cu) for m in range(count(int(length(cu, b)), block_m))]

        return fn

    _named("varlen_programs", programs(lambda n, m: max(1, -(-n // m))), "empty sequence")
    _named("varlen_programs", programs(lambda n, m: n // m), "round the number of blocks up")
    _named(
        "varlen_programs",
        programs(
            lambda n, m: -(-n // m), seqs=lambda cu: range(len(cu)), length=lambda cu, b: cu[b]
        ),
        "off by one in cu_seqlens",
    )

    def padded(cu, block_m):
        longest = int(np.diff(cu).max())
        return [(b, m) for b in range(len(cu) - 1) for m in range(-(-longest // block_m))]

    _named("varlen_programs", padded, "as if padded")
    _named("varlen_programs", lambda cu, m: S.varlen_programs(cu, m) * 2, "twice")


def test_paged_lookup_mistakes_are_named():
    def gather(page_of, slot_of=lambda j, P: j % P, rows=lambda n, P: n):
        def fn(pages, table, lens, b):
            P = pages.shape[1]
            j = np.arange(rows(int(lens[b]), P))
            return pages[page_of(table, b, j, P), slot_of(j, P)]

        return fn

    n_pages = lambda table, b: int((table[b] >= 0).sum())  # noqa: E731
    _named("gather_sequence", gather(lambda t, b, j, P: np.sort(t[b, : n_pages(t, b)])[j // P]),
           "sorted order")  # fmt: skip
    _named("gather_sequence", gather(lambda t, b, j, P: j // P), "table was ignored")
    _named("gather_sequence", gather(lambda t, b, j, P: t[b, j // P], rows=lambda n, P: -(-n // P) * P),
           "whole pages")  # fmt: skip


def test_hidden_json_is_generated_from_the_spec():
    from course_kernels.grading.notebooks import hidden_json

    on_disk = (ROOT / "course_kernels/grading/hidden_tests/11_serving_maps.json").read_text()
    assert on_disk == hidden_json(S), "run: python scripts/build_notebooks.py"
    assert json.loads(on_disk)["tests"]


def test_the_exercise_does_not_use_the_serving_library():
    import inspect

    assert "serving." not in inspect.getsource(S).replace("course_kernels.serving``", "")
