"""Exit codes of every fedprivacy entry point, and the status file a ServerApp leaves for its launcher.

One table for ``fedprivacy simulate`` (both engines) and the ``flwr run`` launchers
(``scripts/flwr_local.py``); the README ("Exit codes") repeats it. 0 means the run completed as
configured, and nothing else does:

====  ==================  ==========================================================================
code  status              meaning
====  ==================  ==========================================================================
0     ``completed``       every configured round ran
1     ``error``           an unexpected error (a bug, a crashed engine): the log has the traceback
2     ``config-error``    bad configuration or usage, refused before anything started (one line)
3     ``budget-exhausted``  stopped by the privacy budget before the last configured round
4     ``clients-failed``  a round in which every sampled client failed, or more than
                          ``max-failed-fraction`` of them (crashed, timed out, non-finite update)
5     ``no-clients``      no SuperNode (or not every partition) answered the ServerApp
130   ``interrupted``     Ctrl-C or SIGTERM: the run and every process it started were stopped
====  ==================  ==========================================================================

Flower's ``flwr run`` returns 0 whatever the ServerApp did (it prints "Exit Code: 700" for a failed
ServerApp). So the ServerApp also writes its status to the JSON file named by the environment variable
:data:`STATUS_ENV` (when set), and the launchers read it back (:func:`read_status`). The variable is
inherited by the SuperLink and the ServerApp process the launcher starts.
"""

from __future__ import annotations

import json
import os
from enum import IntEnum
from pathlib import Path
from typing import Any

from fedprivacy._io import atomic_write_text

__all__ = ["STATUS_ENV", "ExitCode", "exit_code_for", "read_status", "write_status"]

STATUS_ENV = "FEDPRIVACY_STATUS_FILE"


class ExitCode(IntEnum):
    """Process exit codes (see the module docstring)."""

    OK = 0
    ERROR = 1
    CONFIG = 2
    BUDGET = 3
    CLIENTS_FAILED = 4
    NO_CLIENTS = 5
    INTERRUPTED = 130


_BY_STATUS = {
    "completed": ExitCode.OK,
    "error": ExitCode.ERROR,
    "config-error": ExitCode.CONFIG,
    "budget-exhausted": ExitCode.BUDGET,
    "clients-failed": ExitCode.CLIENTS_FAILED,
    "no-clients": ExitCode.NO_CLIENTS,
    "interrupted": ExitCode.INTERRUPTED,
}


def exit_code_for(status: str | None) -> ExitCode:
    """The exit code of a run status (``results.json["status"]`` or a status file); unknown: ERROR."""
    return _BY_STATUS.get(str(status), ExitCode.ERROR)


def write_status(status: str, *, message: str = "", results: str | None = None,
                 path: str | os.PathLike[str] | None = None) -> Path | None:
    """Write ``{"status", "exit_code", "message", "results"}`` to ``path`` (default: ``$STATUS_ENV``).

    Returns the path written, or None when no path is given and the variable is unset.
    """
    target = path if path is not None else os.environ.get(STATUS_ENV)
    if not target:
        return None
    out = Path(target)
    payload = {"status": status, "exit_code": int(exit_code_for(status)), "message": message,
               "results": results}
    atomic_write_text(out, json.dumps(payload, indent=1))
    return out


def read_status(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The status a ServerApp wrote, or None if it wrote none (it died before it could)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "status" in data else None
