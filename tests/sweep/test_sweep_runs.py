"""Real sweeps on digits (few clients, one or two rounds): runs in parallel, a failed run reported with
its exit code without stopping the others, the table and figures written, and a sweep killed with
SIGKILL mid-way resumed with nothing that finished run again and no run process left behind."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
CHILD = "import sys; from server.engine.cli import main; sys.exit(main(sys.argv[1:]))"

SWEEP = """
[sweep]
name = "tiny"
num-supernodes = 4
seeds = [0, 1]

[base]
dataset = "digits"
num-server-rounds = 1
local-epochs = 1
secagg = false
privacy = "central"
noise-multiplier = 0.0
target-epsilon = 8.0
"""


def _sweep(tmp_path: Path, body: str, *extra: str) -> subprocess.Popen[str]:
    path = tmp_path / "s.toml"
    path.write_text(body)
    return subprocess.Popen([sys.executable, "-c", CHILD, "sweep", str(path), "--out", str(tmp_path / "out"),
                             "--app-dir", str(REPO), "--json", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)


@pytest.mark.slow
def test_a_failed_run_is_reported_with_its_code_and_the_others_finish(tmp_path: Path) -> None:
    body = SWEEP.replace("seeds = [0, 1]", "seeds = [0]") + "\n[grid]\nclient-timeout = [120.0, 1e-9]\n"

    proc = _sweep(tmp_path, body, "--jobs", "2")
    out, err = proc.communicate(timeout=600)

    assert proc.returncode == 1, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert (summary["runs"], summary["ran"], summary["failed"]) == (2, 2, 1)
    (failure,) = summary["failures"]
    assert "client-timeout=1e-09" in failure["name"] and failure["exit_code"] == 5
    assert "FAILED" in err and "exit code 5" in err
    rows = list(csv.DictReader((tmp_path / "out" / "sweep.csv").open()))
    ok = [r for r in rows if r["exit_code"] == "0"]
    assert len(ok) == 1 and 0.0 < float(ok[0]["test_accuracy"]) <= 1.0 and float(ok[0]["epsilon"]) <= 8.0
    md = (tmp_path / "out" / "sweep.md").read_text()
    assert "| failed run |" in md and failure["hash"] in md
    for name in ("accuracy_vs_epsilon.png", "accuracy_vs_round.png"):
        assert (tmp_path / "out" / name).stat().st_size > 1000


def _records(out: Path) -> dict[str, float]:
    return {p.parent.name: p.stat().st_mtime_ns for p in (out / "runs").glob("*/sweep-run.json")}


@pytest.mark.slow
def test_a_killed_sweep_resumes_with_nothing_finished_run_again(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _sweep(tmp_path, SWEEP, "--jobs", "1")
    deadline = time.monotonic() + 400
    while not _records(out) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
    children = psutil.Process(proc.pid).children(recursive=True)
    assert _records(out) and children, proc.communicate()
    before = _records(out)

    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    _gone, alive = psutil.wait_procs(children, timeout=20)
    assert alive == [], "a run process outlived the killed sweep"

    again = _sweep(tmp_path, SWEEP, "--jobs", "1")
    stdout, err = again.communicate(timeout=600)
    assert again.returncode == 0, err
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert (summary["runs"], summary["skipped"], summary["ran"], summary["failed"]) == (2, 1, 1, 0)
    after = _records(out)
    assert len(after) == 2 and all(after[h] == t for h, t in before.items())
    rows = list(csv.DictReader((out / "sweep.csv").open()))
    assert sorted(r["seed"] for r in rows) == ["0", "1"] and all(r["status"] == "completed" for r in rows)


@pytest.mark.slow
def test_the_speedup_bench_times_the_same_grid_serial_and_parallel(tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_sweep", REPO / "scripts" / "bench_sweep.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    code = module.main(["--rounds", "1", "--clients", "4", "--seeds", "0", "--json", str(tmp_path / "b.json")])

    result = json.loads((tmp_path / "b.json").read_text())
    assert code == 0 and result["runs"] == 2 and result["jobs"] == 2
    assert result["speedup"] == pytest.approx(result["serial_seconds"] / result["parallel_seconds"], rel=1e-2)
