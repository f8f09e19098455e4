"""What the grader writes for each submission and each student: Gradescope's result format,
the feedback text, and the roster (one row per student).

Split from :mod:`course_kernels.grading.instructor.cli` (which re-exports these names); ``grade`` there writes
them into its output folder.
"""

from __future__ import annotations

import csv
import sys
import unicodedata
from pathlib import Path

from course_kernels.grading.exercises import NOTEBOOKS


def gradescope(res) -> dict:
    tests = [
        {
            "name": f"{v.exercise}: {v.name}" + (" (hidden)" if v.hidden else ""),
            "score": round(v.points, 4),
            "max_score": v.max_points,
            "output": v.message,
            "visibility": "after_published" if v.hidden else "visible",
        }
        for v in res.verdicts
    ]
    out = {"score": round(res.score, 4), "tests": tests}
    if res.notes:
        out["output"] = "\n".join(res.notes)
    return out


STUDENT_LINE = "      | "  # how every further line of a message (student text) starts


def _one_block(text) -> str:
    """Text that may hold a submission's words, on the grader's line: every further line is
    indented and marked, so nothing a student writes can start a line of the grader's (a
    ``[PASS]`` line, a note, a heading)."""
    lines = str(text).splitlines() or [""]
    return lines[0] + "".join("\n" + STUDENT_LINE + ln for ln in lines[1:])


def feedback_text(sid, res) -> str:
    lines = [_one_block(f"{sid}: {res.notebook}  {res.score:g}/{res.max_score:g}")]
    lines += [_one_block(f"  note: {n}") for n in res.notes]
    for v in res.verdicts:
        mark = "PASS" if v.passed else "FAIL"
        lines.append(
            _one_block(
                f"  [{mark}] {v.exercise} / {v.name}{' (hidden)' if v.hidden else ''} "
                f"({v.points:g}/{v.max_points:g}): {v.message}"
            )
        )
    return "\n".join(lines) + "\n"


FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\n", "|", "%")


def csv_safe(value):
    """A CSV cell no spreadsheet runs as a formula: text starting with = + - @ (or a tab or
    carriage return, ...) gets a leading apostrophe. Numbers stay numbers."""
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return value


def csv_row(row: dict) -> dict:
    return {k: csv_safe(v) for k, v in row.items()}


def same_id(text) -> str:
    """How ids are compared: Unicode NFC, case-folded, outer spaces removed (a roster typed in
    NFC matches a folder macOS named in NFD, Alice matches alice)."""
    return unicodedata.normalize("NFC", str(text)).casefold().strip()


def _safe_rel(sid: str) -> Path:
    parts = [p for p in Path(sid).parts if p not in ("", ".", "..", "/")]
    return Path(*parts) if parts else Path("submission")


def _write(path: Path, text: str) -> None:
    """Feedback is text from submissions: lone surrogates and odd bytes are escaped, never fatal."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8", errors="backslashreplace") as f:
            f.write(text)
    except (OSError, ValueError) as e:
        print(f"could not write {path!s}: {e}", file=sys.stderr)


def notebook_max(name: str, hidden=None) -> float:
    """A notebook's full marks: visible + hidden tests (what its heading says)."""
    from course_kernels.grading.exercises import NOTEBOOKS as NBS
    from course_kernels.grading.runner import build_cases

    return sum(c.points for c in build_cases(NBS[name], hidden))


def write_roster(roster, subs, results, target: Path, expect=None, hidden=None) -> list:
    """One row per student of the roster CSV (column ``id``): per-notebook scores, total, maximum
    and the notebooks missing. A submission's id is ``<student>/<notebook file>``; files of
    students not on the roster are listed in ``unknown`` of an extra row."""
    with open(roster, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames or "id" not in reader.fieldnames:
            raise SystemExit(f"{roster}: the roster needs a column named 'id'")
        people = [row for row in reader if (row.get("id") or "").strip()]
    expect = list(expect or NOTEBOOKS)
    maxima = {nb: notebook_max(nb, hidden) for nb in expect}
    by_student: dict = {}
    for sid, _ in subs:
        student = sid.split("/", 1)[0] if "/" in sid else ""
        res = results[sid]
        if res.notebook in maxima:
            best = by_student.setdefault(student, {})
            best[res.notebook] = max(best.get(res.notebook, 0.0), res.score)
    by_key: dict = {}
    folders: dict = {}
    for student, got in by_student.items():
        by_key.setdefault(same_id(student), {}).update(got)
    for sid, _ in subs:
        folder = sid.split("/", 1)[0] if "/" in sid else ""
        folders.setdefault(same_id(folder), folder)
    rows = []
    keys = set()
    for person in people:
        key = same_id(person["id"])
        keys.add(key)
        got = by_key.get(key, {})
        row = dict(person)
        for nb in expect:
            row[nb] = round(got[nb], 4) if nb in got else 0
        row["total"] = round(sum(got.values()), 4)
        row["max_total"] = sum(maxima.values())
        row["missing"] = " ".join(nb for nb in expect if nb not in got)
        row["note"] = "" if key in folders else "no folder of submissions for this id"
        rows.append(row)
    unknown = sorted(folder for key, folder in folders.items() if key not in keys)
    id_field = list(people[0].keys())[0] if people else "id"
    for folder in unknown:  # listed, never silently dropped
        got = by_key.get(same_id(folder), {})
        row = {"id": folder or "(files outside any student folder)"}
        for nb in expect:
            row[nb] = round(got[nb], 4) if nb in got else 0
        row["total"] = round(sum(got.values()), 4)
        row["max_total"] = sum(maxima.values())
        row["note"] = "folder not on the roster: not matched to any student"
        rows.append(row)
    fields = list(people[0].keys() if people else ["id"])
    if "id" not in fields:
        fields.insert(0, id_field)
    fields += expect + ["total", "max_total", "missing", "note"]
    with open(target, "w", newline="", encoding="utf-8", errors="backslashreplace") as f:
        w = csv.DictWriter(f, fieldnames=fields, restval="", extrasaction="ignore")
        w.writeheader()
        w.writerows(csv_row(r) for r in rows)
    if unknown:
        print(
            "submissions from folders not on the roster (listed at the end of roster.csv): "
            + ", ".join(repr(u) for u in unknown),
            file=sys.stderr,
        )
    return rows
