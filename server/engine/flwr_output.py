"""``flwr run``'s console output, forwarded line by line without Flower's default-SuperNodes warning.

``flwr-simulation`` (flwr 1.42, ``flwr/simulation/app.py``) logs "Since flwr 1.32, default simulated
SuperNodes changed from 10 to 2." on every run, unconditionally, whatever ``num-supernodes`` the run was
given, and ``flwr run --stream`` relays it. When the launcher passed the count itself the line only
misleads, so :func:`forward_lines` drops exactly that record (level WARNING, that text, with or without
Flower's colour codes and timestamps) and passes every other line through unchanged, as it arrives.
:func:`run_forwarding` runs ``flwr run`` that way; its exit code, timeout and Ctrl-C behave as without.
"""

from __future__ import annotations

import locale
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Final

from server.engine.processes import die_with_parent

__all__ = ["DEFAULT_SUPERNODES_WARNING", "forward_lines", "is_default_supernodes_warning", "run_forwarding",
           "stdout_sink"]

DEFAULT_SUPERNODES_WARNING: Final = "Since flwr 1.32, default simulated SuperNodes changed from 10 to 2."

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# flwr.supercore.logger.ConsoleHandler: "WARNING : " + padding + message; "WARNING <asctime>: " when
# FLWR_LOG_LEVEL=DEBUG turns timestamps on.
_RECORD = re.compile(r"WARNING (?:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})?:\s+" + re.escape(DEFAULT_SUPERNODES_WARNING))


def is_default_supernodes_warning(line: str | bytes) -> bool:
    """Whether ``line`` (one console line, newline included or not) is that one warning of Flower's."""
    text = line.decode("utf-8", errors="replace") if isinstance(line, bytes) else line
    return _RECORD.fullmatch(_ANSI.sub("", text).rstrip("\r\n")) is not None


def forward_lines(source: IO[bytes], sink: Callable[[bytes], object], *,
                  drop_default_supernodes_warning: bool) -> None:
    """Copy ``source`` to ``sink`` until EOF, each line as soon as it is complete, bytes unchanged.

    With ``drop_default_supernodes_warning`` the warning above is left out (only that line). If the sink
    fails (our stdout was a pipe that closed), the rest is read and discarded, so the writer never blocks
    on a full pipe.
    """
    live: Callable[[bytes], object] | None = sink
    for line in iter(source.readline, b""):
        if live is None or (drop_default_supernodes_warning and is_default_supernodes_warning(line)):
            continue
        try:
            live(line)
        except OSError:
            live = None


def stdout_sink() -> Callable[[bytes], None]:
    """Write bytes to this process's ``sys.stdout`` (its binary buffer when it has one), flushed."""
    out = sys.stdout
    buffer = getattr(out, "buffer", None)

    def write(data: bytes) -> None:
        if buffer is None:
            out.write(data.decode(out.encoding or "utf-8", errors="replace"))
            out.flush()
            return
        out.flush()  # what this process printed itself comes first
        buffer.write(data)
        buffer.flush()

    return write


def run_forwarding(cmd: Sequence[str], *, env: Mapping[str, str], cwd: Path, timeout: float | None,
                   capture: bool, drop_warning: bool) -> tuple[int, str | None]:
    """Run ``cmd`` in its own session; its exit code, and its merged stdout/stderr when ``capture``.

    With ``capture`` or ``drop_warning`` its stdout (merged with stderr when ``capture``) goes through
    :func:`forward_lines`: into the returned text, or to our stdout line by line as it comes; stderr
    is otherwise inherited. With neither, it inherits our streams. The child is killed if it outlives
    ``timeout`` (then ``subprocess.TimeoutExpired``) or we are interrupted (the exception propagates).
    """
    # Own session: a terminal's Ctrl-C reaches only this launcher, which then stops everything once.
    proc = subprocess.Popen(list(cmd), env=dict(env), cwd=cwd,
                            stdout=subprocess.PIPE if capture or drop_warning else None,
                            stderr=subprocess.STDOUT if capture else None, start_new_session=True,
                            preexec_fn=die_with_parent)  # noqa: PLW1509 - prctl only, no locks
    lines: list[bytes] = []
    reader = None
    if proc.stdout is not None:
        reader = threading.Thread(target=forward_lines, daemon=True,
                                  args=(proc.stdout, lines.append if capture else stdout_sink()),
                                  kwargs={"drop_default_supernodes_warning": drop_warning})
        reader.start()
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if reader is not None and proc.stdout is not None:
            reader.join(timeout=30)  # EOF once the child is gone (flwr run's SuperLink logs to a file)
            if not reader.is_alive():
                proc.stdout.close()
    text = b"".join(lines).decode(locale.getpreferredencoding(False), errors="replace") if capture else None
    return proc.returncode, text
