"""End-to-end on Flower's own engines (slow): ``flwr run .`` simulation and the Deployment Engine.

Both run offline: ``FLWR_HOME`` is a temporary folder, runtime dependency installation is off, and every
process started here is stopped by process id afterwards (``server.engine.flower`` helpers).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
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
    assert res.returncode == 0, log[-3000:]
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


def _spawn(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    fh = log.open("wb")
    return subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=log.parent)


def _wait_port(port: int, timeout: float = 60.0) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def test_deployment_engine_on_loopback(tmp_path: Path) -> None:
    # Arrange: one SuperLink and three SuperNodes, each on its own port, insecure, loopback only
    home = tmp_path / "flwr-home"
    home.mkdir()
    env = flower.flwr_env(home)
    bindir = Path(sys.executable).parent
    link_port = flower.free_port()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "deploy"\n\n[superlink.deploy]\naddress = "127.0.0.1:{link_port}"\n'
        "insecure = true\n"
    )
    procs: list[subprocess.Popen[bytes]] = []
    out = tmp_path / "runs"
    try:
        procs.append(_spawn([str(bindir / "flower-superlink"), "--insecure", "--host", "127.0.0.1",
                             "--port", str(link_port), "--database", str(tmp_path / "state.db")],
                            env, tmp_path / "superlink.log"))
        _wait_port(link_port)
        for i in range(3):
            procs.append(_spawn([str(bindir / "flower-supernode"), "--insecure", "--superlink",
                                 f"127.0.0.1:{link_port}", "--port", str(flower.free_port()),
                                 # the operator's own floor: this seeded research run needs its consent
                                 "--node-config", f"partition-id={i} num-partitions=3 client-allow-seeded=true"],
                                env, tmp_path / f"supernode{i}.log"))
        run_config = (f"num-server-rounds=2 seed=0 run-name='deploy' output-dir='{out}' local-epochs=1 "
                      "accountant='rdp'")
        # Act
        proc = subprocess.run([str(bindir / "flwr"), "run", str(REPO), "deploy", "--stream",
                               "--run-config", run_config], env=env, cwd=REPO, capture_output=True,
                              text=True, timeout=1200, check=False)
        # Assert
        log = proc.stdout + proc.stderr
        assert proc.returncode == 0, log[-3000:]
        assert (out / "deploy" / "results.json").exists(), log[-5000:]
        results = json.loads((out / "deploy" / "results.json").read_text())
        assert results["population"] == 3
        assert [(r["round"], r["clients_aggregated"]) for r in results["rounds"]] == [(1, 3), (2, 3)]
        assert results["privacy"]["epsilon"] > 0
    finally:
        tree: list[psutil.Process] = []
        for p in procs:
            try:
                root = psutil.Process(p.pid)
                tree += [*root.children(recursive=True), root]
            except psutil.NoSuchProcess:
                pass
        victims = flower.stop_processes(tree)
        for p in procs:
            p.wait(timeout=30)
    alive = [p for p in victims if psutil.pid_exists(p)
             and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == [], f"processes still running: {alive}"
    assert os.environ.get("FLWR_HOME") != str(home)  # the test never touched the caller's FLWR_HOME
