"""``fedprivacy simulate``'s console: a rich progress bar on a terminal, the plain lines kept, nothing
changed when stderr is not a terminal."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from pathlib import Path

import flwr.common.logger  # noqa: F401 - installs Flower's console handler on the "flwr" logger
from rich.console import Console

from server.engine.console import round_progress

LOG = logging.getLogger("flwr")
LINE = "round {k:3d}/3  accuracy 0.{k}000  loss 1.0000  ε {eps}  clients 4/4  0.10s"


# Run in a fresh interpreter: inside the whole suite, streams and handlers that earlier tests left
# on the "flwr" logger or on sys.stderr made this count flaky (4 copies of a line, never alone).
_TERMINAL_CHECK = """
import io, json, logging, sys
import flwr.common.logger
from rich.console import Console
from server.engine.console import round_progress
LOG = logging.getLogger("flwr")
LINE = sys.argv[1]
out = io.StringIO()
console = Console(file=out, force_terminal=True, width=120)
with round_progress(3, console=console) as progress:
    assert progress is not None
    LOG.info(LINE.format(k=1, eps="1.250"))
    LOG.info(LINE.format(k=2, eps="2.500"))
    (task,) = progress.tasks
    state = [task.completed, task.total, task.fields["figures"]]
print(json.dumps({"state": state, "text": out.getvalue(), "filters": len(LOG.filters)}))
"""


def test_on_a_terminal_the_bar_follows_the_round_lines_which_are_all_kept() -> None:
    # Arrange
    repo = Path(__file__).resolve().parents[2]
    # Act
    proc = subprocess.run([sys.executable, "-c", _TERMINAL_CHECK, LINE], cwd=repo, capture_output=True,
                          text=True, timeout=120, check=False)
    # Assert
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["state"] == [2, 3, "accuracy 0.2000  ε 2.500"]
    text = got["text"]
    assert "round   1/3" in text and "round   2/3" in text  # printed above the bar, once each
    assert text.count("round   2/3  accuracy") == 1
    assert got["filters"] == 0  # the bar's filter is gone afterwards


def test_without_a_terminal_there_is_no_bar_and_no_colour_codes() -> None:
    # Arrange: Flower's handler writing to a pipe-like stream
    (handler,) = [h for h in LOG.handlers if hasattr(h, "colored")]
    pipe = io.StringIO()
    old = handler.setStream(pipe)  # type: ignore[attr-defined]
    console = Console(file=io.StringIO(), force_terminal=False)
    try:
        # Act
        with round_progress(3, console=console) as progress:
            LOG.info(LINE.format(k=1, eps="n/a (no DP)"))
    finally:
        handler.setStream(old)  # type: ignore[attr-defined]
    # Assert
    assert progress is None and console.file.getvalue() == ""  # type: ignore[attr-defined]
    assert pipe.getvalue().startswith("INFO :") and "\x1b[" not in pipe.getvalue()
    assert handler.colored  # type: ignore[attr-defined] # restored for whoever logs next


def test_a_log_file_keeps_its_lines_and_the_console_shows_each_once(tmp_path: Path) -> None:
    # Arrange: a file handler on Flower's logger, as flwr's configure(filename=...) leaves one
    log_file = logging.FileHandler(tmp_path / "flwr.log", encoding="utf-8")
    LOG.addHandler(log_file)
    out = io.StringIO()
    try:
        # Act
        with round_progress(3, console=Console(file=out, force_terminal=True, width=120)):
            LOG.info(LINE.format(k=1, eps="1.250"))
    finally:
        LOG.removeHandler(log_file)
        log_file.close()
    # Assert
    assert out.getvalue().count("round   1/3  accuracy") == 1
    assert (tmp_path / "flwr.log").read_text(encoding="utf-8").count("round   1/3  accuracy") == 1
