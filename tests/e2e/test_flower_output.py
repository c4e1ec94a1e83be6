"""The README's ``flwr run`` command prints the run's progress without Flower's default-SuperNodes warning
(slow: a real local simulation, 2 SuperNodes, 1 round)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from server.engine.flwr_output import DEFAULT_SUPERNODES_WARNING

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_flwr_local_streams_progress_without_the_default_supernodes_warning(tmp_path: Path) -> None:
    # Arrange
    run_config = (f"num-server-rounds=1 privacy='none' secagg=false local-epochs=1 seed=0 "
                  f"output-dir='{tmp_path}' run-name='quiet'")
    # Act: as a user runs it; its stdout is what flwr run streamed, forwarded by the launcher
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "flwr_local.py"), "--supernodes", "2",
                           "--run-config", run_config, "--timeout", "600"],
                          cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
    # Assert
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert DEFAULT_SUPERNODES_WARNING not in log
    # Flower's neighbouring lines (the same process, the same stream) and the run's own lines came through
    assert "(2 simulated SuperNodes)" in proc.stdout
    assert "round   1/1  accuracy" in proc.stdout and "done: 1 rounds" in proc.stdout
    assert "flwr_local: completed (exit code 0)" in proc.stdout
    assert (tmp_path / "quiet" / "results.json").is_file()
