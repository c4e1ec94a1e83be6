"""End-to-end on Flower's own engines (slow): ``flwr run .`` simulation and the Deployment Engine.

Both run offline: ``FLWR_HOME`` is a temporary folder, runtime dependency installation is off, and every
process started here is stopped by process id afterwards (``server.engine.flower`` helpers).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from fedprivacy.accounting import epsilon_for
from fedprivacy.fl.run import read_participation
from server.engine import flower

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _leftovers(home: Path) -> list[int]:
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "flower-superlink" in cmd and str(home) in cmd and p.info["status"] != psutil.STATUS_ZOMBIE:
            out.append(p.pid)
    return out


def test_flwr_run_simulation_prints_epsilon_and_writes_results(tmp_path: Path) -> None:
    # Arrange
    home = tmp_path / "flwr-home"
    out = tmp_path / "runs"
    # Central DP (the app's default is distributed DP; its flwr run test is in test_secagg_e2e.py).
    run_config = (f"num-server-rounds=2 seed=0 run-name='sim' output-dir='{out}' "
                  "privacy='central' secagg=false accountant='pld'")
    # Act
    res = flower.run_flwr(num_supernodes=10, run_config=run_config, app_dir=REPO, flwr_home=home,
                          timeout=900, capture=True)
    # Assert
    log = res.output or ""
    assert res.exit_code == 0, (res.status, log[-3000:])  # flwr run returns 0 when the ServerApp fails
    assert "round   1/2" in log and "ε" in log
    results = json.loads((out / "sim" / "results.json").read_text())
    assert [r["round"] for r in results["rounds"]] == [1, 2]
    assert results["population"] == 10  # central mode: the counts are in the server's private log
    assert read_participation(out / "sim")[-1]["clients_sampled"] == 10
    # central DP, q = 1 (no sampling), sigma = 1, PLD: the same number `fedprivacy epsilon` gives
    ref = epsilon_for(noise_multiplier=1.0, sample_rate=1.0, steps=2, delta=1e-5)
    assert results["privacy"]["epsilon"] == pytest.approx(ref, abs=1e-6)
    assert (out / "sim" / "privacy_report.md").exists() and (out / "sim" / "rounds.csv").exists()
    assert _leftovers(home) == []


def _carries(proc: psutil.Process, home: str) -> bool:
    try:
        return proc.environ().get("FLWR_HOME") == home or home in " ".join(proc.cmdline())
    except psutil.Error:
        return False


def _run_deployment(*args: str) -> tuple[subprocess.CompletedProcess[str], list[int]]:
    """``scripts/deployment_local.py`` (the README's recipe) as a user runs it; the processes of its
    private FLWR_HOME still alive afterwards (none expected), and that FLWR_HOME must be gone."""
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "deployment_local.py"), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=1500, check=False)
    homes = [line.rsplit("FLWR_HOME=", 1)[1] for line in proc.stdout.splitlines() if "FLWR_HOME=" in line]
    assert len(homes) == 1, (proc.stdout + proc.stderr)[-3000:]
    left = [p.pid for p in psutil.process_iter() if _carries(p, homes[0])
            and p.status() != psutil.STATUS_ZOMBIE]
    assert not Path(homes[0]).exists(), f"temporary folder left behind: {homes[0]}"
    return proc, left


def test_deployment_engine_on_loopback(tmp_path: Path) -> None:
    # Arrange: one SuperLink and three SuperNodes, each on its own port, insecure, loopback only
    out = tmp_path / "runs"
    run_config = f"num-server-rounds=2 seed=0 run-name='deploy' output-dir='{out}' local-epochs=1 accountant='rdp'"
    # Act (the operator's own floor: this seeded research run needs its consent, and an unbounded total, since
    # a seeded round's noise is the server's to regenerate: it costs rho = inf; and a crowd floor for a world of
    # three, below the defaults)
    proc, left = _run_deployment("--supernodes", "3", "--node-config",
                                 "client-allow-seeded=true client-max-rho-total='inf' client-min-threshold=2 "
                                 "client-min-survivors=2 client-min-roster=3",
                                 "--run-config", run_config, "--timeout", "1200")
    # Assert
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert "deployment_local: completed (exit code 0)" in proc.stdout
    results = json.loads((out / "deploy" / "results.json").read_text())
    assert results["population"] == 3
    assert [(r["round"], r["clients_aggregated"]) for r in results["rounds"]] == [(1, 3), (2, 3)]
    # the default secure round: round 2's key stages rode on round 1's exchanges (docs/SECAGG.md), with the
    # sessions of two rounds in each SuperNode's node state at once
    assert [r["secagg_exchanges"] for r in results["rounds"]] == [5, 3]
    assert results["privacy"]["epsilon"] > 0
    assert left == []


def test_deployment_run_that_no_supernode_answers_exits_5(tmp_path: Path) -> None:
    # flwr run itself exits 0 here; the ServerApp gives up after client-timeout (10 s) without a node
    proc, left = _run_deployment("--supernodes", "3", "--start", "0", "--run-config",
                                 f"num-server-rounds=1 client-timeout=10 output-dir='{tmp_path}'",
                                 "--timeout", "600")
    assert proc.returncode == 5, (proc.stdout + proc.stderr)[-3000:]
    assert "no-clients: only partitions [] answered" in proc.stderr and left == []
