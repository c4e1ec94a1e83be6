"""fedprivacy's Flower ServerApp (Message API): validate the config, then hand over to the loop.

Flower's ``flwr run`` returns 0 whatever the ServerApp did, so the ServerApp also reports how the run
ended in the status file a launcher names with ``$FEDPRIVACY_STATUS_FILE``
(:mod:`fedprivacy.exit_codes`); the exception itself still propagates, so Flower marks the run failed.
"""

from __future__ import annotations

import logging
import os
from logging import INFO
from pathlib import Path

from flwr.app import Context
from flwr.common.logger import log as flwr_log
from flwr.common.logger import update_console_handler
from flwr.serverapp import Grid, ServerApp

from fedprivacy.config import ConfigError
from fedprivacy.exit_codes import write_status
from fedprivacy_flwr.codec import RESULTS_RECORD, results_record
from server.loop import NoClientsError, run_server

app = ServerApp()

# One console line per line: dp-accounting logs through absl, whose first message calls
# logging.basicConfig() when the root logger has no handler; from then on every line of Flower's "flwr"
# logger (which propagates) was printed twice (once by Flower's handler, once by the root's). Flower's
# logger keeps its own handler; absl's warnings (a Rényi order dropped, which only loosens the bound)
# are not for the console.
logging.getLogger("flwr").propagate = False
logging.getLogger("absl").setLevel(logging.ERROR)
# NO_COLOR (no-color.org; the launchers set it when their output is not a terminal): plain level names,
# since Flower colours them whatever the stream is and `flwr run --stream` forwards the codes as text.
if os.environ.get("NO_COLOR"):
    update_console_handler(colored=False)


def _log(line: str) -> None:
    flwr_log(INFO, line)


def failure_status(exc: BaseException) -> str:
    """The run status (:mod:`fedprivacy.exit_codes`) of an exception that ended the ServerApp."""
    if isinstance(exc, ConfigError):
        return "config-error"
    if isinstance(exc, NoClientsError):
        return "no-clients"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    return "error"


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run DP-FedAvg as configured in ``[tool.flwr.app.config]`` / ``--run-config``."""
    try:
        results = run_server(grid, context.run_config, log=_log)
    except BaseException as exc:
        status = failure_status(exc)
        text = str(exc) if status in ("config-error", "no-clients") else f"{type(exc).__name__}: {exc}"
        write_status(status, message=(text.splitlines() or [""])[0])
        raise
    path = str(Path(results["run_dir"]) / "results.json")
    context.state[RESULTS_RECORD] = results_record(path)
    write_status(str(results["status"]), message=str(results.get("stopped") or ""), results=path)
