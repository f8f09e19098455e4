"""Every "line N" reference to the papers' algorithms, in the package and in the book, matches
the algorithm as the paper prints it.

Chapter: "The backward pass" (book/chapters/backward_pass.ipynb) and every chapter that cites a
line. The three algorithms the course follows are transcribed once, as data, in
``tests/data/paper_algorithms.json`` (FA1 Alg. 1, FA2 Alg. 1, FA2 Alg. 2; paper and section
recorded there). This test finds the references and checks them against that transcription.

The convention (what makes a reference checkable):

- Name the algorithm and the line: ``# FA2 Alg. 2 line 9: load Q_i, O_i, dO_i, dQ_i, L_i, D_i``
  or ``lines 10-11``. ``FA1``/``FlashAttention`` and ``FA2``/``FlashAttention-2`` name the paper;
  ``Alg. 2`` or ``Algorithm 2`` the algorithm.
- In the package a bare ``# line 9: ...`` comment refers to the algorithm an earlier comment of
  the same function named (``# FA2 Alg. 1 line 3`` ... ``# line 9``), else the one its
  function's docstring names (exactly one, e.g. a docstring ``FlashAttention-2 Alg. 1: ...``),
  else the module docstring's; inside one docstring or comment, a bare ``line N`` refers to the
  algorithm named last before it. A bare reference with no algorithm in scope is an error.
- Text after a colon (``line 9: <text>``) is checked: every symbol it names (``Q_i``, ``dO_i``,
  ``dS``, ``K_j^T``, ``m``, ``l``, ``Tc``...), every function (``rowsum``, ``rowmax``, ``exp``,
  ``log``, ``diag``, ``max``) and every verb (``load``, ``write``, ``for``, ``return``,
  ``initialize``) must occur in the transcribed line (or range). Remarks in parentheses after a
  space, and anything after the first full stop, are commentary and are not checked.
- In the book's Markdown only references that name their algorithm right before the line
  (``FA2 Alg. 2 line 9``) are checked; a bare "(line 6)" in prose is not.

A shifted line number is caught when the neighbouring line names other symbols or verbs;
``test_shifted_package_comments_are_caught`` shifts every checked comment of the NumPy files by
one and counts how many the check catches.
"""

from __future__ import annotations

import ast
import inspect
import io
import json
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = json.loads((ROOT / "tests" / "data" / "paper_algorithms.json").read_text())
ALGORITHMS: dict[str, dict[int, str]] = {
    key: {int(n): text for n, text in alg["lines"].items()}
    for key, alg in DATA["algorithms"].items()
}
PACKAGE_FILES = sorted(
    p for p in (ROOT / "course_kernels").rglob("*.py") if "__pycache__" not in p.parts
)
NOTEBOOKS = sorted(
    p
    for p in (ROOT / "book").rglob("*.ipynb")
    if "_build" not in p.parts and ".ipynb_checkpoints" not in p.parts
)

# -- finding references ---------------------------------------------------------------------
_ALG_FULL = (
    r"(?P<paper>FA[12]|FlashAttention-2|FlashAttention)(?:\s*\(v1\))?(?:'s)?[\s,(]*"
    r"(?:arXiv\s*[\d.]+[,;]?\s*)?Alg(?:orithm|\.)?\s*(?P<alg>\d)"
)
_ALG_BARE = r"\bAlg(?:orithm|\.)?\s*(?P<alg2>\d)"
_LINE = (
    r"\blines?\s+(?P<a>\d+)(?:\s*(?:-|–|to)\s*(?P<b>\d+))?"
    r"(?P<colon>(?:,\s*[a-z][a-z ]*)?\s*:(?=\s))?"
)
MENTION = re.compile(f"{_ALG_FULL}|{_ALG_BARE}|{_LINE}")


def _paper(name: str) -> str:
    return "FA2" if name in ("FA2", "FlashAttention-2") else "FA1"


@dataclass
class Ref:
    where: str  # file:line or notebook cell
    algorithm: str | None  # "FA2 Alg. 2", or None when no algorithm is in scope
    first: int
    last: int
    text: str  # what follows "line N:", "" if nothing
    written: str  # the reference as written


def _drop_remark(m: re.Match) -> str:
    words = re.findall(r"\b[a-z]{3,}\b", m.group(0))
    return " " if any(w not in FUNCTIONS for w in words) else m.group(0)


def _text_after(chunk: str, end: int) -> str:
    text = chunk[end:].split("\n", 1)[0]
    text = re.sub(r"\s\([^()]*\)", _drop_remark, text)  # remarks in parentheses: commentary
    return re.split(r"\.(?:\s|$)", text, maxsplit=1)[0]


def find_refs(chunk: str, where: str, context: str | None, explicit_only: bool = False):
    """References in one comment, docstring or Markdown cell. ``context`` is the algorithm in
    scope (``"FA2 Alg. 1"``) for bare references; ``explicit_only`` keeps only references whose
    algorithm is named right before the line number."""
    refs, current, paper, last_alg_end = [], context, None, -1
    if context:
        paper = context.split()[0]
    for m in MENTION.finditer(chunk):
        if m.group("alg"):
            paper = _paper(m.group("paper"))
            current, last_alg_end = f"{paper} Alg. {m.group('alg')}", m.end()
        elif m.group("alg2"):
            current = f"{paper} Alg. {m.group('alg2')}" if paper else None
            last_alg_end = m.end()
        else:
            gap = chunk[last_alg_end : m.start()] if last_alg_end >= 0 else "x"
            adjacent = re.fullmatch(r"[\s,]*", gap) is not None
            if explicit_only and (not adjacent or current is None):
                continue
            a = int(m.group("a"))
            b = int(m.group("b") or a)
            text = _text_after(chunk, m.end()) if m.group("colon") else ""
            refs.append(Ref(where, current, a, b, text, m.group(0).strip()))
    return refs


def _algorithms_named(text: str | None) -> set[str]:
    found = set()
    for m in re.finditer(_ALG_FULL, text or ""):
        found.add(f"{_paper(m.group('paper'))} Alg. {m.group('alg')}")
    return found


def python_refs(source: str, name: str):
    """References in a Python file's comments and docstrings, each with its algorithm in scope."""
    tree = ast.parse(source)
    scopes = []  # (first line, last line, algorithm named by the docstring or None)

    def scope_alg(node):
        named = _algorithms_named(ast.get_docstring(node, clean=False))
        return named.pop() if len(named) == 1 else None

    module_alg = scope_alg(tree)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scopes.append((node.lineno, node.end_lineno, scope_alg(node), node))

    def context_at(line: int) -> str | None:
        inner = [s for s in scopes if s[0] <= line <= s[1] and s[2]]
        return max(inner, key=lambda s: s[0])[2] if inner else module_alg

    def innermost(line: int):
        inner = [s for s in scopes if s[0] <= line <= s[1]]
        return max(inner, key=lambda s: s[0])[3] if inner else None

    refs, named_in_comments = [], {}  # function -> algorithm its comments named last
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            row = tok.start[0]
            scope = innermost(row)
            context = named_in_comments.get(scope) or context_at(row)
            found = find_refs(tok.string, f"{name}:{row}", context)
            refs += found
            named = _algorithms_named(tok.string)
            if named:
                named_in_comments[scope] = sorted(named)[-1]
    docs = [(1, ast.get_docstring(tree, clean=False), None)]
    docs += [(s[3].lineno, ast.get_docstring(s[3], clean=False), s[3]) for s in scopes]
    for row, doc, node in docs:
        if doc:
            outer = context_at(row - 1) if node is not None else None
            refs += find_refs(doc, f"{name}:{row} (docstring)", outer)
    return refs


def notebook_refs(path: Path):
    nb = nbformat.read(path, as_version=4)
    rel = path.relative_to(ROOT).as_posix()
    refs = []
    for index, cell in enumerate(nb.cells):
        where = f"{rel} cell {index} ({cell.get('id')})"
        if cell.cell_type == "markdown":
            refs += find_refs(cell.source, where, None, explicit_only=True)
        elif cell.cell_type == "code":
            for line in cell.source.splitlines():
                if "#" in line:
                    refs += find_refs(line[line.index("#") :], where, None, explicit_only=True)
    return refs


# -- checking one reference ------------------------------------------------------------------
SYMBOLS = {"Q", "K", "V", "O", "S", "P", "L", "D", "m", "l", "i", "j", "Tr", "Tc"}
SYMBOLS |= {"d" + s for s in "QKVOPS"}
FUNCTIONS = {"rowsum", "rowmax", "exp", "log", "diag", "max"}
VERBS = {"load", "write", "return", "initialize", "initialise"}
INDEX = re.compile(r"[ij0-9]+|T?[rc]")


def _normalise(text: str) -> str:
    t = text.replace("ℓ", "l").replace("\\ell", "l").replace("\\tilde", "").replace("~", "")
    t = t.replace("\\top", "T").replace("\\leftarrow", "<-").replace("\\", " ")
    t = re.sub(r"(?:mathrm|text|operatorname)\{(\w+)\}", r"\1", t)
    t = re.sub(r"_\{([^{}]*)\}", r"_\1", t)  # X_{ij} -> X_ij
    t = re.sub(r"\^\{\(([^{}]*)\)\}", r"^(\1)", t)  # X^{(j)} -> X^(j)
    t = re.sub(r"([A-Za-z]+)_i\^\((?:j|j-1|j−1|0)\)", r"\1_ij", t)  # X_i^(j) -> X_ij
    t = re.sub(r"\^\([^)]*\)", "", t)
    return t.replace("T_r", "Tr").replace("T_c", "Tc")


def _tokens(text: str) -> list[str]:
    return re.findall(r"[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)?", _normalise(text))


def _is_symbol(token: str) -> bool:
    return token in SYMBOLS or re.fullmatch(r"d?[A-Za-z]_[A-Za-z0-9]+", token) is not None


def vocabulary(text: str) -> set[str]:
    """What a transcribed line names: its symbols (with their bases: S_ij gives S, S_i, S_j),
    functions and verbs, lowercased for the words."""
    vocab = set()
    for tok in _tokens(text):
        vocab.add(tok)
        vocab.add(tok.lower())
        if "_" in tok:
            base, sub = tok.split("_", 1)
            vocab |= {base, *(f"{base}_{c}" for c in sub)}
            if sub == "1":  # "D_1, ..., D_T_r": the blocks D_i
                vocab |= {f"{base}_i", f"{base}_j"}
    return vocab


def problems_of(ref: Ref) -> list[str]:
    """What is wrong with one reference (empty if nothing)."""
    if ref.algorithm is None:
        return [
            f"{ref.where}: '{ref.written}' names no algorithm and none is in scope: write "
            "'FA2 Alg. 2 line N' (or name the algorithm in the function's docstring)"
        ]
    lines = ALGORITHMS.get(ref.algorithm)
    if lines is None:
        return []  # an algorithm the course does not transcribe (e.g. FA1 Alg. 4)
    if not (1 <= ref.first <= ref.last <= max(lines)):
        return [f"{ref.where}: {ref.algorithm} has lines 1-{max(lines)}; got '{ref.written}'"]
    if not ref.text.strip():
        return []
    quoted = " ".join(lines[n] for n in range(ref.first, ref.last + 1))
    vocab = vocabulary(quoted)
    missing = []
    for tok in _tokens(ref.text):
        word = tok.lower()
        if word in FUNCTIONS or word in VERBS:
            if word not in vocab and not (word == "initialise" and "initialize" in vocab):
                missing.append(tok)
        elif _is_symbol(tok) and tok not in vocab:
            base, _, sub = tok.partition("_")
            if not sub or INDEX.fullmatch(sub) or base not in vocab:
                missing.append(tok)  # X_new or X_old only need the base X
    if missing:
        span = f"line {ref.first}" if ref.first == ref.last else f"lines {ref.first}-{ref.last}"
        return [
            f"{ref.where}: '{ref.written} {ref.text.strip()}' names {sorted(set(missing))}, "
            f"which {ref.algorithm} {span} does not ('{quoted}')"
        ]
    return []


# -- the tests -------------------------------------------------------------------------------
def test_transcription_is_complete_and_numbered_from_one():
    for key, lines in ALGORITHMS.items():
        assert sorted(lines) == list(range(1, max(lines) + 1)), key
        alg = DATA["algorithms"][key]
        assert alg["paper"] and alg["section"].startswith("Sec. ")
    # The lines the issue and the book rely on (FA2 paper, Sec. 3.1.2).
    bwd = ALGORITHMS["FA2 Alg. 2"]
    assert bwd[3].startswith("Initialize dQ") and bwd[5].startswith("for 1 <= j")
    assert bwd[9].startswith("Load Q_i, O_i, dO_i, dQ_i, L_i, D_i")
    assert bwd[18].startswith("Write dK_j, dV_j") and len(bwd) == 20


@pytest.mark.parametrize(
    "path", PACKAGE_FILES, ids=lambda p: p.relative_to(ROOT / "course_kernels").as_posix()
)
def test_package_line_references_match_the_papers(path):
    refs = python_refs(path.read_text(), path.relative_to(ROOT).as_posix())
    problems = [p for ref in refs for p in problems_of(ref)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.relative_to(ROOT / "book").as_posix())
def test_book_line_references_match_the_papers(path):
    problems = [p for ref in notebook_refs(path) for p in problems_of(ref)]
    assert not problems, "\n".join(problems)


def _numpy_file(name: str) -> Path:
    """The NumPy forward ("tiled") or backward ("tiled_backward"), wherever the package keeps it."""
    import course_kernels

    fn = {
        "tiled": course_kernels.flash_attention_numpy,
        "tiled_backward": course_kernels.flash_attention_numpy_backward,
    }[name]
    return Path(inspect.getsourcefile(fn))


def test_the_numpy_files_cite_their_algorithms():
    # The NumPy forward and backward are annotated line by line; the check must see them.
    for name, least in (("tiled", 20), ("tiled_backward", 14)):
        path = _numpy_file(name)
        refs = python_refs(path.read_text(), name)
        assert len([r for r in refs if r.algorithm in ALGORITHMS]) >= least, name


@pytest.mark.parametrize(
    "comment, wrong",
    [
        ("# FA2 Alg. 2 line 9: load Q_i, O_i, dO_i, dQ_i, L_i, D_i", False),
        ("# FA2 Alg. 2 line 10: load Q_i, O_i, dO_i, dQ_i, L_i, D_i", True),  # the old off-by-one
        ("# FA2 Alg. 2 line 8: load Q_i, O_i, dO_i, dQ_i, L_i, D_i", True),
        ("# FA2 Alg. 2 line 3: dQ = 0 in HBM", False),
        ("# FA2 Alg. 2 line 5: dQ = 0 in HBM", True),
        ("# FA2 Alg. 2 line 5: for 1 <= j <= Tc", False),
        ("# FA2 Alg. 2 line 8: for 1 <= j <= Tc", True),
        ("# FA2 Alg. 2 lines 10-11: P_ij = exp(S_ij - L_i)", False),
        ("# FA2 Alg. 2 lines 11-12, transposed: P^T = exp(K Q^T - L)", True),
        ("# FA2 Alg. 2 line 19: write dK_j, dV_j", True),
        ("# FA2 Alg. 2 line 21", True),  # past the end
        ("# line 9: load Q_i", True),  # no algorithm in scope
        ("# FA1 Alg. 1 line 8: load Q_i, O_i, l_i, m_i", False),
        ("# FA2 Alg. 1 line 4: m = -inf, l = 0", True),
        ("# FA2 Alg. 1 lines 12-13: O = diag(l)^-1 O, L = m + log l (base 2 here).", False),
    ],
)
def test_the_check_catches_wrong_line_numbers(comment, wrong):
    refs = find_refs(comment, "example", None)
    assert len(refs) == 1
    assert bool(problems_of(refs[0])) == wrong, problems_of(refs[0])


def test_bare_comments_take_the_algorithm_of_their_function():
    source = (
        "def f():\n"
        '    """FlashAttention-2 Alg. 2: the backward."""\n'
        "    x = 1  # line 9: load Q_i, dO_i\n"
        "    y = 2  # line 8: load Q_i, dO_i\n"
    )
    refs = python_refs(source, "example.py")
    assert [r.algorithm for r in refs] == ["FA2 Alg. 2", "FA2 Alg. 2"]
    assert [bool(problems_of(r)) for r in refs] == [False, True]


def _shifted(source: str, comment_row: int, delta: int) -> str:
    lines = source.splitlines(keepends=True)
    lines[comment_row - 1] = re.sub(
        r"(#.*?\blines?\s+)(\d+)",
        lambda m: m.group(1) + str(int(m.group(2)) + delta),
        lines[comment_row - 1],
        count=1,
    )
    return "".join(lines)


@pytest.mark.parametrize("name", ["tiled", "tiled_backward"])
def test_shifted_package_comments_are_caught(name):
    # Plant an off-by-one in each checked comment in turn (both directions): the check must
    # flag nearly all of them. The few it cannot see are comments whose neighbouring line names
    # the same symbols (FA2 Alg. 1 lines 9 and 10 both name P~_ij, for instance).
    source = _numpy_file(name).read_text()
    checked = [
        r for r in python_refs(source, name) if r.text.strip() and "docstring" not in r.where
    ]
    caught = total = 0
    for ref in checked:
        row = int(ref.where.rsplit(":", 1)[1])
        for delta in (-1, 1):
            total += 1
            shifted = python_refs(_shifted(source, row, delta), name)
            caught += any(problems_of(r) for r in shifted if r.where == ref.where)
    assert total >= 16
    assert caught / total >= 0.8, f"{name}: only {caught} of {total} shifted comments caught"
