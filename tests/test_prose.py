"""Prose states the contract, not the history: no tracker or review labels, no machine paths.

Every text file of the repository (code, tests, docs, generated results; not ``.git``) is read. A label
is a tracker reference such as ``issue`` followed by a number, a review label (``review`` and a round
number, with or without an item tag), or a bare review tag in parentheses (a capital and one or two
digits). A machine path is a user's home or the build machine's folders. History lives in git.
Module docstrings say what the module does, its assumptions and its citation in at most 30 lines;
long rationale belongs to one docs/ page.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# built from parts so that this file does not match itself
_LABELS = re.compile("|".join((
    r"\b" + "iss" + r"ues?[\s-]*#?\d+",
    r"\b" + "rev" + r"iew[\s-]?\d+",
    r"\b" + "ses" + r"sion[\s-]\d+",
    r"\(" + r"[A-Z]\d{1,2}" + r"\)",
)), re.I)
# case-sensitive, and not a norm: a capital and digits such as a review item, but not (m0), (x1) or (L2)
_TAG = re.compile(r"\(" + r"(?!L\d)[A-Z]\d{1,2}" + r"\)")
_PATHS = re.compile("|".join(("/" + "work/", "/" + "tmp/ci", "/" + "home/")))
MAX_MODULE_DOCSTRING_LINES = 30


def _files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    return [ROOT / name for name in listed if (ROOT / name).is_file()]


def _text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace")


def _hits(pattern: re.Pattern[str]) -> list[str]:
    found = []
    for path in _files():
        text = _text(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for m in pattern.finditer(line):
                if m.group().startswith("(") and not _TAG.fullmatch(m.group()):
                    continue
                found.append(f"{path.relative_to(ROOT)}:{number}: {m.group()!r}")
    return found


def test_no_tracker_or_review_labels() -> None:
    hits = _hits(_LABELS)
    assert not hits, f"{len(hits)} labels (say what the code does instead):\n" + "\n".join(hits[:200])


def test_no_machine_paths() -> None:
    hits = _hits(_PATHS)
    assert not hits, f"{len(hits)} machine paths:\n" + "\n".join(hits[:200])


def test_module_docstrings_are_short() -> None:
    long = []
    for path in _files():
        if path.suffix != ".py":
            continue
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False)
        lines = doc.count("\n") + 1 if doc else 0
        if lines > MAX_MODULE_DOCSTRING_LINES:
            long.append(f"{path.relative_to(ROOT)}: {lines} lines")
    assert not long, "module docstrings over 30 lines (move the rationale to one docs/ page):\n" + "\n".join(long)
