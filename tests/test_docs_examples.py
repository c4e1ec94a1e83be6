"""Every code block of README.md and docs/ runs as written, or says why it cannot.

A fenced block's info string is its language, optionally followed by ``no-run: <reason>`` (output,
layouts, commands that need a GPU or another machine) or ``run-by: <test file>`` (run by that test).
Python blocks run in a fresh interpreter from a folder of the user's own (not the repository);
bash blocks run with the repository's ``.venv/bin`` on their path from a folder that links the
repository's files, so that ``runs/`` lands in the test's folder; ``bash scripts/setup.sh &&`` is
left out (the suite runs after it) and ``fedprivacy simulate`` runs two rounds. Every block run
is marked slow.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")))
_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^`\n]*)\n(?P<code>.*?)^(?P=indent)```[ \t]*$", re.S | re.M)
_RUNNABLE = ("python", "bash")
_SETUP = "bash scripts/setup.sh && "
README_MAX_LINES = 200


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    info: str
    code: str

    @property
    def language(self) -> str:
        return self.info.split(maxsplit=1)[0] if self.info else ""

    @property
    def mark(self) -> str:
        rest = self.info.split(maxsplit=1)[1] if " " in self.info else ""
        return rest.strip()

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _blocks() -> list[Block]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in _FENCE.finditer(text):
            code = "\n".join(line[len(m["indent"]):] for line in m["code"].splitlines())
            found.append(Block(page, text[:m.start()].count("\n") + 1, m["info"].strip(), code))
    return found


BLOCKS = _blocks()
RUN = [b for b in BLOCKS if b.language in _RUNNABLE and not b.mark]


def _param(b: Block) -> object:
    return pytest.param(b, id=b.id, marks=[pytest.mark.slow])  # each starts Python, most train


def test_every_block_is_run_or_says_why_not() -> None:
    bad = []
    for b in BLOCKS:
        if not b.language:
            bad.append(f"{b.id}: no language")
        elif b.mark and not re.match(r"(no-run: \S.*|run-by: tests/\S+\.py)$", b.mark):
            bad.append(f"{b.id}: info {b.info!r}: expected 'no-run: <reason>' or 'run-by: tests/<file>.py'")
        elif not b.mark and b.language not in _RUNNABLE:
            bad.append(f"{b.id}: a {b.language} block runs nowhere: mark it 'no-run: <reason>'")
        elif b.mark.startswith("run-by:") and not (ROOT / b.mark.split(":", 1)[1].strip()).is_file():
            bad.append(f"{b.id}: {b.mark}: no such test")
    assert not bad, "\n".join(bad)


def test_ci_runs_the_readmes_test_command() -> None:
    (test,) = [b for b in BLOCKS if b.page.name == "README.md" and "pytest" in b.code]
    assert test.code.strip() in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines, keep it to {README_MAX_LINES}"


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "\n".join(broken)


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), FLWR_TELEMETRY_ENABLED="0")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    return env


def _linked_checkout(tmp_path: Path) -> Path:
    """A folder that looks like the checkout (links to its files) but keeps its own ``runs/``."""
    work = tmp_path / "checkout"
    work.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in {"runs", ".venv", ".git"}:
            (work / entry.name).symlink_to(entry)
    (work / ".venv").symlink_to(Path(sys.executable).parent.parent)
    return work


@pytest.mark.parametrize("block", [_param(b) for b in RUN if b.language == "python"])
def test_python_block_runs_from_a_users_folder(block: Block, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(block.code, encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(), capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, f"{block.id} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@pytest.mark.parametrize("block", [_param(b) for b in RUN if b.language == "bash"])
def test_bash_block_runs(block: Block, tmp_path: Path) -> None:
    work = _linked_checkout(tmp_path)
    if "privacy_report.md" in block.code:  # reads the report of the run before it
        _run_bash(block, work, ".venv/bin/fedprivacy simulate --num-supernodes 20 "
                  "--run-config \"privacy='central' secagg=false num-server-rounds=1\"")
    # tiny overrides: two rounds show that the command runs (the figures are the README's own)
    code = "\n".join(re.sub(r"num-server-rounds=\d+", "num-server-rounds=2", line)
                     if "fedprivacy simulate" in line else line
                     for line in block.code.replace(_SETUP, "").splitlines())
    done = _run_bash(block, work, code)
    assert "Traceback" not in done.stderr, f"{block.id}:\n{done.stderr[-3000:]}"


def _run_bash(block: Block, work: Path, code: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=work, env=_env(),
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, f"{block.id} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done
