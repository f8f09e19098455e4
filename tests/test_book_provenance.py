"""Every number in the book's prose comes from code, committed data or a cited source.

Chapter: all of them. The book's rule is that a number a student reads in the prose (Markdown
cells) is computed by the package or read from committed measured data, and reaches the text
through a myst-nb glue role. This test reads every chapter's Markdown cells, removes what is
explained, and fails on any digit sequence left over, naming the notebook, the cell and the text.

What is explained (removed before looking for digits):

- glue roles (``{glue:text}`name:fmt```, ``{glue:md}``, ``{glue}``): the number comes from code;
- code (fenced blocks and inline backticks): identifiers, shapes and commands, not claims;
- link targets (URLs) and arXiv identifiers;
- citations: years, "Alg. 1", "line 12", "lines 10-12", "Sec. 3.1", "Theorem 2",
  "Proposition 3", "Fig. 2", "Table 3", "Eq. (5)", issue and pull-request numbers (#175);
- names that contain digits: FlashAttention-2, FA1, GPT-2, Llama-2-7B, H200, sm_80, fp16, L2,
  exp2, the errata's row labels (E1, B13) and so on;
- inside math: symbols and small constants of formulas ($4N^2$, $2^{-11}$); a number of three
  or more digits in math is still a claim and is flagged;
- single-digit integers used as words ("one vs two programs", "4 warps").

A few numbers are quotations of the source article or of a cited paper that the package does not
compute; they are listed per notebook in ``QUOTED`` with the reason, and the list is kept short.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

BOOK = Path(__file__).resolve().parents[1] / "book"
NOTEBOOKS = sorted(
    p
    for p in BOOK.rglob("*.ipynb")
    if "_build" not in p.parts and ".ipynb_checkpoints" not in p.parts
)

# Numbers quoted from a cited source (not computed by the package), per notebook, with the reason.
_ARTICLE = "quoted from the source article, to be corrected next to it"
QUOTED: dict[str, dict[str, str]] = {
    "chapters/01_memory_hierarchy.ipynb": {
        "19": "the '~19 TB/s' SRAM figure as the article (and FA paper Sec. 2.1) quote it",
        "192": "the '192 KB' of L1 + shared memory the article takes as M",
    },
    "chapters/05_io_complexity.ipynb": {
        "192": "the '192 KB' the article takes as M",
        "60": "the L2 size the measured H200's driver reports (hardware.GPUS['H200-SXM'].sources)",
    },
    "part2/applications.ipynb": {
        "30": "the prediction recorded before the measurement (notes/decode.md)",
        "60": "the prediction recorded before the measurement (notes/decode.md)",
    },
    "part2/hopper.ipynb": {
        "10": "the TMA lever's prediction, recorded before the measurement (notes/kernel.md, Levers 1)",
        "989": "FlashAttention-3 paper (Shah et al. 2024), Sec. 3: H100 SXM5 FP16 matmul TFLOP/s",
        "3.9": "FlashAttention-3 paper (Shah et al. 2024), Sec. 3: H100 special-function TFLOP/s",
    },
    "part2/tuning.ipynb": {
        "35": "FlashAttention-3 paper (Shah et al. 2024), abstract: FA2's share of H100 peak",
        "75": "FlashAttention-3 paper (Shah et al. 2024), abstract: FA3's share of H100 peak",
    },
    # The errata table quotes the article's numbers and the cited papers' measurements.
    "appendix/errata.ipynb": {
        **{
            n: _ARTICLE
            for n in ("192", "96,000", "11.7", "19", "20", "50", "24", "32", "128", "90")
        },
        "15": "FA paper Sec. 4.1 (BERT-large vs the MLPerf 1.1 record)",
        "512": "FA paper Sec. 4.1 (BERT-large sequence length)",
        "1.7": "FA paper Sec. 4.1 (GPT-2 vs Megatron-LM)",
        "7.6": "FA paper Fig. 1 (attention alone)",
        "35": "FA3 paper, abstract",
        "75": "FA3 paper, abstract",
    },
}

GLUE = re.compile(r"\{glue(?::\w+)?\}`[^`]*`")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK_TARGET = re.compile(r"\]\([^)]*\)|<https?://[^>]*>|https?://\S+")
DISPLAY_MATH = re.compile(r"\$\$.*?\$\$", re.S)
INLINE_MATH = re.compile(r"(?<!\\)\$[^$\n]+?\$")
CITATION = re.compile(
    r"\b(?:Alg(?:orithm)?s?\.?|lines?|Sec(?:tion)?s?\.?|Theorem|Proposition|Lemma|Fig(?:ure)?s?\.?|"
    r"Table|Eq(?:uation)?s?\.?|Appendix|chapter|Step|row|Q|E|B)\s*\(?\d+(?:\.\d+)*\)?"
    r"(?:\s*(?:-|–|and|,)\s*\d+(?:\.\d+)*)*",
    re.I,
)
YEAR = re.compile(r"\b(?:19|20)\d\d\b")
ISSUE = re.compile(r"#\d+")
ARXIV = re.compile(r"\b\d{4}\.\d{4,5}\b")
# Names with digits in them: models, GPUs, formats, papers, instructions, memory levels.
NAMED = re.compile(
    r"\b(?:FlashAttention-\d|FA\d|GPT-\d|BERT|Llama-\d+(?:-\d+B)?|Llama-\d|Mistral-\d+B|[AHT]\d{1,3}|"
    r"sm_?\d+|cc\s?\d\.\d|fp\d+|bf\d+|float\d+|bfloat\d+|int\d+|FP\d+|BF\d+|TF\d+|L\d|exp2|log2|"
    r"ex2|MLPerf\s\d\.\d|Triton\s\d\.\d+|torch\s\d\.\d+|CUDA\s\d+(?:\.\d+)?|compute capability\s\d\.\d|"
    r"HBM\d[e]?|GDDR\d|PCIe|SXM\d?|MiB|KiB|GiB|x\d|\d+D|\d+-bit)\b"
)
SINGLE_DIGIT = re.compile(r"(?<![\d.,])\d(?![\d.,]*\d)")
DIGITS = re.compile(r"\d[\d,.]*")
LIST_MARKER = re.compile(r"^\s*\d+[.)]\s", re.M)  # an ordered list's "12. " is not a number


def _strip(text: str) -> tuple[str, list[str]]:
    """Text with everything explained removed, and the big numbers found inside math."""
    text = GLUE.sub(" ", text)
    text = FENCE.sub(" ", text)
    text = LIST_MARKER.sub(" ", text)
    text = INLINE_CODE.sub(" ", text)
    text = LINK_TARGET.sub(" ", text)
    math_claims = []
    for pattern in (DISPLAY_MATH, INLINE_MATH):
        for m in pattern.finditer(text):
            math_claims += [n for n in re.findall(r"\d{3,}", m.group(0))]
        text = pattern.sub(" ", text)
    for pattern in (ARXIV, ISSUE, CITATION, YEAR, NAMED):
        text = pattern.sub(" ", text)
    return text, math_claims


def unexplained_numbers(markdown: str, allowed=()) -> list[str]:
    """The digit sequences of ``markdown`` that nothing explains (see the module docstring)."""
    text, math_claims = _strip(markdown)
    found = [n.rstrip(".,") for n in DIGITS.findall(text)]
    found = [n for n in found if n and not SINGLE_DIGIT.fullmatch(n)]
    return [n for n in found + math_claims if n not in allowed]


def test_provenance_scanner_flags_what_it_should():
    # A deliberately wrong prose: hard-coded numbers outside glue are caught ...
    assert unexplained_numbers("The A100 reaches 312 TFLOP/s and $N = 8192$.") == ["312", "8192"]
    assert unexplained_numbers("about 10.2x less traffic") == ["10.2"]
    # ... and what is explained is not.
    ok = (
        "{glue:text}`a100_ratio:.1f` (FA2 paper, Sec. 3.1, Alg. 1 lines 10-12, Theorem 2; "
        "Dao 2023, arXiv 2307.08691, issue #175) in fp16 on an H200 with `BLOCK_M = 128`: "
        "$8N^2d^2/M$, one vs 2 programs, [paper](https://arxiv.org/abs/2205.14135)."
    )
    assert unexplained_numbers(ok) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(BOOK)))
def test_book_prose_numbers_have_a_source(path):
    nb = nbformat.read(path, as_version=4)
    allowed = QUOTED.get(str(path.relative_to(BOOK)), {})
    problems = []
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        bad = unexplained_numbers(cell.source, allowed)
        if bad:
            problems.append(f"cell {cell.get('id')}: {sorted(set(bad))}")
    assert not problems, (
        f"{path.relative_to(BOOK)}: numbers in the prose that no glue role, citation or allowed "
        "quotation explains (compute them in a code cell and glue them, or cite the source):\n"
        + "\n".join(problems)
    )


def test_sweep_record_says_autotuning_was_off():
    # bench.run_sweep forces one config at a time (forced_forward_config); its record must say so.
    from course_kernels.datafiles import load_json

    sweep = load_json("bench/sweep.json")
    assert sweep["environment"]["autotune"] is False
    assert all(
        {"block_m", "block_n", "num_warps", "num_stages"} <= set(r) for r in sweep["results"]
    )
