"""Flower's Ray simulation on a real two-node Ray cluster (slow): ``fedprivacy simulate --ray-address``.

A head and a worker node are started on loopback with the venv's ``ray start`` (one CPU each, each
node with its own temp dir), a seeded central run goes through ``--ray-address``, and the cluster's own
tables (read through its GCS, as a second driver) say where the ClientApp actors ran. The test skips,
with Ray's reason, where ``ray start`` cannot bring a cluster up.

The cluster is stopped by process id: every process of it carries a marker in its environment (Ray's
daemons and workers inherit the environment of ``ray start``). ``ray stop`` is not used: it stops
every Ray process of the machine, other runs' included.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from fedprivacy.fl.run import read_participation
from server.engine.appspec import config_string
from server.engine.cli import main
from server.engine.flower import free_port
from server.engine.processes import stop_processes
from server.engine.run import run_inprocess

REPO = Path(__file__).resolve().parents[2]
RAY = Path(sys.executable).parent / "ray"
MARKER = "FEDPRIVACY_TEST_RAY_CLUSTER"
# Ray's Unix sockets live at <temp-dir>/session_<date>_<time>_<pid>/sockets/plasma_store (~62 characters
# below the temp dir); a socket path has at most 107 bytes on Linux.
SOCKET_TAIL, SOCKET_MAX = 64, 107

pytestmark = pytest.mark.slow

_COMPARED = ("round", "clients_sampled", "clients_aggregated", "train_loss", "test_loss", "test_accuracy",
             "epsilon", "delta")
_ROUNDED = ("train_loss", "test_loss", "test_accuracy")  # float sums in another order: rel 1e-6
_STATE = """
import json, sys, ray
from ray._private import state
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
print(json.dumps({
    "nodes": [{"id": n["NodeID"], "alive": n["Alive"]} for n in ray.nodes()],
    "jobs": [{"id": j["JobID"], "dead": j["IsDead"], "flwr": "flwr-simulation" in (j.get("Entrypoint") or "")}
             for j in state.jobs()],
    "actors": [{"cls": a["ActorClassName"], "job": a["JobID"], "node": a["Address"]["NodeID"]}
               for a in state.actors().values()],
}))
"""


@dataclass(frozen=True, slots=True)
class Cluster:
    address: str


def _ours(marker: str, dirs: tuple[str, ...]) -> list[psutil.Process]:
    """The live processes of the cluster started under ``marker`` (in their environment) or naming one of
    its nodes' temp ``dirs``."""
    me = psutil.Process()
    mine = {me.pid, *(p.pid for p in me.parents())}
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid in mine or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(proc.cmdline())
            if proc.environ().get(MARKER) == marker or any(d in cmd for d in dirs):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def _ray_start(args: list[str], env: dict[str, str]) -> str | None:
    """Run ``ray start``; None when it worked, else why not (its last line of output)."""
    try:
        out = subprocess.run([str(RAY), "start", "--disable-usage-stats", *args], env=env, capture_output=True,
                             text=True, timeout=120, check=False)
    except subprocess.TimeoutExpired:
        return "ray start did not return within 120 s"
    if out.returncode == 0:
        return None
    errors = [line for line in out.stderr.splitlines() if re.match(r"\w+(Error|Exception): ", line)]
    lines = errors or (out.stderr + out.stdout).strip().splitlines() or [f"exit code {out.returncode}"]
    return f"ray start {args[0]} failed: {lines[-1]}"


@pytest.fixture
def ray_cluster(tmp_path: Path) -> Iterator[Cluster]:
    if not RAY.is_file():
        pytest.skip(f"no `ray` command beside {Path(sys.executable).name}: Ray is not installed")
    root = tmp_path if len(str(tmp_path)) + 2 + SOCKET_TAIL <= SOCKET_MAX else Path(
        tempfile.mkdtemp(prefix="ray-"))
    if len(str(root)) + 2 + SOCKET_TAIL > SOCKET_MAX:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"no temporary folder short enough for Ray's Unix sockets ({len(str(root))} characters)")
    marker = secrets.token_hex(8)
    dirs = (f"{root}/h", f"{root}/w")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env[MARKER] = marker
    port = free_port()
    common = ["--num-cpus=1", "--object-store-memory=100000000"]
    try:
        why = _ray_start(["--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir={dirs[0]}",
                          f"--dashboard-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
                          *common], env)
        why = why or _ray_start([f"--address=127.0.0.1:{port}", f"--temp-dir={dirs[1]}",
                                 f"--dashboard-agent-listen-port={free_port()}", *common], env)
        if why:
            pytest.skip(f"Ray cannot start a two-node cluster here: {why}")
        yield Cluster(address=f"127.0.0.1:{port}")
    finally:
        stop_processes(_ours(marker, dirs))
        left = _ours(marker, dirs)
        if root != tmp_path:
            shutil.rmtree(root, ignore_errors=True)
        assert not left, f"cluster processes still running: {[p.pid for p in left]}"


def _state(address: str, folder: Path) -> dict[str, Any]:
    """The cluster's nodes, jobs and actors, read by a driver of its own (a script file: a job's entrypoint
    is its driver's command line)."""
    script = folder / "cluster_state.py"
    script.write_text(_STATE, encoding="utf-8")
    out = subprocess.run([sys.executable, str(script), address], capture_output=True, text=True, timeout=120,
                         check=True, env={k: v for k, v in os.environ.items() if not k.startswith("RAY_")})
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _config(tmp_path: Path, name: str) -> dict[str, Any]:
    return {"num-server-rounds": 2, "privacy": "central", "secagg": False, "dataset": "digits",
            "noise-multiplier": 1.0, "sample-rate": 1.0, "local-epochs": 1, "seed": 1,
            "output-dir": str(tmp_path), "run-name": name, "client-timeout": 60.0}


def _rows(results_path: Path) -> list[dict[str, Any]]:
    """Published rows joined with the server's private participation counts (central keeps them out)."""
    rows = json.loads(results_path.read_text())["rounds"]
    counts = {c["round"]: c for c in read_participation(results_path.parent)}
    return [{k: {**r, **counts.get(r["round"], {})}.get(k) for k in _COMPARED} for r in rows]


def _assert_same(left: list[dict[str, Any]], right: list[dict[str, Any]]) -> None:
    assert len(left) == len(right) == 2
    for a, b in zip(left, right, strict=True):
        assert {k: v for k, v in a.items() if k not in _ROUNDED} == {k: v for k, v in b.items() if k not in _ROUNDED}
        for k in _ROUNDED:
            assert a[k] == pytest.approx(b[k], rel=1e-6), k


def test_a_seeded_run_on_a_two_node_cluster_equals_the_inprocess_run(
    ray_cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Arrange: two live nodes; the reference run on the in-process engine
    before = _state(ray_cluster.address, tmp_path)
    nodes = {n["id"] for n in before["nodes"] if n["alive"]}
    assert len(nodes) == 2
    reference = run_inprocess(run_config=_config(tmp_path, "inprocess"), num_supernodes=4, app_dir=REPO)
    assert reference.results_path is not None
    # Act
    code = main(["simulate", "--engine", "flower", "--ray-address", ray_cluster.address, "--num-supernodes", "4",
                 "--run-config", config_string(_config(tmp_path, "cluster")), "--app-dir", str(REPO), "--json"])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    after = _state(ray_cluster.address, tmp_path)
    # Assert: it completed on that cluster, one ClientApp actor per node, and left both nodes running
    assert code == 0 and summary["status"] == "completed", summary
    assert "message" not in summary, summary  # a completed run is not said to have crashed
    assert summary["ray_address"] == ray_cluster.address
    known = {j["id"] for j in before["jobs"]}
    runs = [j for j in after["jobs"] if j["flwr"] and j["id"] not in known]
    assert len(runs) == 1 and runs[0]["dead"], after["jobs"]  # the simulation's driver joined, then left
    actors = [a for a in after["actors"] if a["job"] == runs[0]["id"] and a["cls"] == "ClientAppActor"]
    assert {a["node"] for a in actors} == nodes, actors
    assert {n["id"] for n in after["nodes"] if n["alive"]} == nodes
    # ... and the seeded run is the in-process run: same rows, counts and ε
    cluster_rows = _rows(tmp_path / "cluster" / "results.json")
    _assert_same(cluster_rows, _rows(reference.results_path))
    eps = json.loads(reference.results_path.read_text())["privacy"]["epsilon"]
    assert summary["final"]["epsilon"] == eps and eps > 0
