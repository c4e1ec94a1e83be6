"""A live progress display for ``fedprivacy simulate`` on a terminal; plain lines everywhere else.

The run's console lines come from the ServerApp through Flower's ``flwr`` logger: the accountant and
delta once at the start, then one line per round (:class:`fedprivacy.fl.callbacks.ConsoleCallback`,
``round   3/10  accuracy ...  ε ...``). On a terminal, :func:`round_progress` keeps every one of those
lines and draws a rich progress bar below them (rounds done of the run's total, the latest accuracy
and ε, the elapsed time), removed when the run ends. When stderr is not a terminal (a pipe, a file,
CI, a test) there is no bar and no colour codes: plain lines only.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

__all__ = ["round_progress"]

# The round line of fedprivacy.fl.callbacks.ConsoleCallback.
_ROUND = re.compile(r"^round\s+(\d+)/(\d+)\s+accuracy\s+(\S+).*?ε\s+(n/a|\S+)")


class _RoundFilter(logging.Filter):
    """Moves the bar on every round line of the ``flwr`` logger; lets every record through."""

    def __init__(self, progress: Progress, task: TaskID) -> None:
        super().__init__()
        self.progress, self.task = progress, task

    def filter(self, record: logging.LogRecord) -> bool:
        m = _ROUND.match(record.getMessage())
        if m:
            eps = "no DP" if m[4] == "n/a" else f"ε {m[4]}"
            self.progress.update(self.task, completed=int(m[1]), total=int(m[2]),
                                 figures=f"accuracy {m[3]}  {eps}")
        return True


@contextlib.contextmanager
def round_progress(total_rounds: int, *, console: Console | None = None) -> Iterator[Progress | None]:
    """While inside, a progress bar of the run's rounds if ``console`` (default: stderr) is a terminal.

    Yields the :class:`rich.progress.Progress` when it is shown, else None. Call it after Flower is
    imported: its console handler must exist to be routed above the bar.
    """
    from rich.console import Console

    console = console or Console(stderr=True)
    logger = logging.getLogger("flwr")
    if not console.is_terminal:
        # Flower colours its level names whatever the stream is: plain text for pipes and files.
        coloured = [h for h in logger.handlers if getattr(h, "colored", False)]
        for h in coloured:
            h.colored = False  # type: ignore[attr-defined]
        try:
            yield None
        finally:
            for h in coloured:
                h.colored = True  # type: ignore[attr-defined]
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(TextColumn("rounds"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[figures]}"), TimeElapsedColumn(), console=console,
                        transient=True)
    task = progress.add_task("rounds", total=total_rounds, figures="")
    # Flower's console handler only: not a file handler, nor a test's capture handler on this logger
    from flwr.common.logger import ConsoleHandler

    handlers = [h for h in logger.handlers if isinstance(h, ConsoleHandler)]
    round_filter = _RoundFilter(progress, task)
    with progress:
        # Flower's handler holds the stream it was created with; while the bar is live, its lines go
        # through rich's proxy of stderr, which prints them above the bar instead of through it.
        old = [h.setStream(sys.stderr) for h in handlers]
        logger.addFilter(round_filter)
        try:
            yield progress
        finally:
            logger.removeFilter(round_filter)
            for h, stream in zip(handlers, old, strict=True):
                if stream is not None:
                    h.setStream(stream)
