"""fedprivacy's Flower ServerApp (Message API): validate the config, then hand over to the loop."""

from __future__ import annotations

from logging import INFO
from pathlib import Path

from flwr.app import Context
from flwr.common.logger import log as flwr_log
from flwr.serverapp import Grid, ServerApp

from fedprivacy_flwr.codec import RESULTS_RECORD, results_record
from server.loop import run_server

app = ServerApp()


def _log(line: str) -> None:
    flwr_log(INFO, line)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run DP-FedAvg as configured in ``[tool.flwr.app.config]`` / ``--run-config``."""
    results = run_server(grid, context.run_config, log=_log)
    context.state[RESULTS_RECORD] = results_record(str(Path(results["run_dir"]) / "results.json"))
