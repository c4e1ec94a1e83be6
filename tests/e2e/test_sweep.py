"""The goal: a new user's sweep over 20 configs through ``fedprivacy simulate``, some invalid on
purpose and one killed mid-way, gets the right exit code for each, one readable line for each bad one,
and leaves nothing running or lying in /tmp.

The in-process engine sweep runs in the fast suite: the configs go through the command's ``main``
(what the console script calls), the killed run is a real ``fedprivacy`` process killed with SIGKILL
(its forked client workers must die with it) and then resumed. The same sweep on Flower's engine
(``scripts/flwr_local.py``, Ray) is the slow test at the end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from server.engine.cli import main

REPO = Path(__file__).resolve().parents[2]
FEDPRIVACY = Path(sys.executable).parent / "fedprivacy"
QUICK = "local-epochs=1 seed=0"
CENTRAL = "privacy='central' secagg=false"

# (name, extra simulate options, run config, expected exit code, what the one stderr line must say)
SWEEP: list[tuple[str, list[str], str, int, str | None]] = [
    ("unknown key", [], "foo=1", 2, "unknown run-config key 'foo'; valid keys:"),
    ("typo", [], "clip-nrom=0.5", 2, "did you mean 'clip-norm'?"),
    ("negative clip", [], "clip-norm=-1", 2, "clip-norm must be >= 0, got -1.0"),
    ("infinite clip", [], "clip-norm='inf'", 2, "clip-norm must be a finite number"),
    ("overflowing lr", [], "learning-rate=1e400", 2, "learning-rate must be a finite number"),
    ("huge delta", ["--num-supernodes", "10"], "target-delta=0.2", 2, "target-delta must be < 1/number of clients"),
    ("not a number", [], "noise-multiplier='abc'", 2, "noise-multiplier must be a number, got str 'abc'"),
    ("central adaptive under secagg", [], "privacy='central' adaptive-clip=true", 2, "set secagg=false"),
    ("resume a typo", [], "resume=true run-name='centrl'", 2, "run-name 'centrl' has no checkpoint"),
    ("malformed", [], "num-server-rounds=", 2, "key 'num-server-rounds' has an empty value"),
    ("twice", [], "seed=1", 2, "key 'seed' is given twice"),
    ("central", [], f"{CENTRAL} run-name='central'", 0, None),
    ("distributed + secagg (default)", [], "", 0, None),
    ("budget stop", [], f"{CENTRAL} target-epsilon=0.5", 3, "budget: stopped before round 1"),
    ("every client crashes", ["--faults", "raise:type=train,fraction=1"], CENTRAL, 4,
     "every one of them"),
    ("one client crashes", ["--faults", "raise:type=train,partitions=1"], CENTRAL, 0, None),
    ("too many crash", ["--faults", "raise:type=train,partitions=1"], f"{CENTRAL} max-failed-fraction=0.2",
     4, "more than max-failed-fraction=0.2"),
    ("resume with more rounds", [], f"{CENTRAL} run-name='central' resume=true num-server-rounds=2", 0,
     None),
    ("resume with other clients", ["--num-supernodes", "5"], f"{CENTRAL} run-name='central' resume=true",
     2, "number of clients differs"),
]


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temp folder of the test's own (its runs' Flower homes land there, and a concurrent test's are not
    counted); Ray keeps the system's short one (its socket paths are limited to about 107 bytes)."""
    monkeypatch.setenv("RAY_TMPDIR", os.environ.get("RAY_TMPDIR", tempfile.gettempdir()))
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setenv("TMPDIR", str(private))
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    return private


def _tmp_leftovers() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("fedprivacy-flwr-*")}


def _sweep_one(args: list[str], run_config: str, out: Path, capsys: pytest.CaptureFixture[str]
               ) -> tuple[int, list[str]]:
    options = ["--num-supernodes", "4", *args] if "--num-supernodes" not in args else args
    rounds = "" if "num-server-rounds" in run_config else "num-server-rounds=1"
    code = main(["simulate", "--app-dir", str(REPO), *options, "--run-config",
                 f"{QUICK} {rounds} output-dir='{out}' {run_config}".strip()])
    return code, capsys.readouterr().err.strip().splitlines()


def _killed_and_resumed(out: Path) -> tuple[int, int, list[int]]:
    """A real ``fedprivacy simulate --workers 2`` SIGKILLed after round 1, then resumed."""
    cfg = f"{CENTRAL} num-server-rounds=40 local-epochs=1 seed=0 output-dir='{out}' run-name='killed'"
    cmd = [str(FEDPRIVACY), "simulate", "--app-dir", str(REPO), "--num-supernodes", "4", "--workers", "2",
           "--run-config", cfg]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = out / "killed" / "checkpoint" / "state.json"
    deadline = time.monotonic() + 600
    while not state.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    family = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    proc.send_signal(signal.SIGKILL)
    killed = proc.wait(timeout=30)
    resumed = subprocess.run([*cmd[:-1], cfg.replace("num-server-rounds=40", "num-server-rounds=2")
                              + " resume=true"], cwd=REPO, capture_output=True, text=True, timeout=600)
    return killed, resumed.returncode, family


def test_a_sweep_of_20_configs_gets_the_right_exit_code_and_one_line_each(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], private_tmp: Path) -> None:
    # Arrange
    before = _tmp_leftovers()
    out = tmp_path / "runs"
    # Act
    got = {name: _sweep_one(args, cfg, out, capsys) for name, args, cfg, _, _ in SWEEP}
    killed, resumed, family = _killed_and_resumed(out)
    # Assert: exit codes, and one line naming the problem for every bad run
    assert {name: code for name, (code, _) in got.items()} == {name: c for name, _, _, c, _ in SWEEP}
    for name, _, _, expected, needle in SWEEP:
        code, err = got[name]
        verdicts = [line for line in err if line.startswith("fedprivacy: ")]  # the rest is the run's log
        if expected == 0:
            assert verdicts == [], (name, verdicts)
        elif expected == 2:  # refused before anything started: that line is all there is
            assert len(err) == 1 and err[0].startswith("fedprivacy: error: ") and needle in err[0], (name, err)
        else:
            assert len(verdicts) == 1 and needle in verdicts[0], (name, verdicts)
    assert len(SWEEP) + 1 == 20
    # the killed run: SIGKILL (-9), its forked workers died with it, and it resumes to completion
    assert killed == -signal.SIGKILL and resumed == 0
    deadline = time.monotonic() + 20
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in family):
        assert time.monotonic() < deadline, f"processes of the killed run still running: {family}"
        time.sleep(0.2)
    results = json.loads((out / "killed" / "results.json").read_text())
    assert results["status"] == "completed" and results["resumed"][0]["after_round"] >= 1
    central = json.loads((out / "central" / "results.json").read_text())
    assert [r["after_round"] for r in central["resumed"]] == [1] and len(central["rounds"]) == 2
    # nothing refused left a run behind, and nothing lies in the temp folder
    assert not (out / "centrl").exists() and _tmp_leftovers() <= before


def test_the_command_prints_one_line_for_a_bad_config_and_one_line_per_round(tmp_path: Path) -> None:
    """As a subprocess (fresh logging): Poisson sampling under rdp used to print every line twice."""
    bad = subprocess.run([str(FEDPRIVACY), "simulate", "--app-dir", str(REPO), "--run-config", "clip-norm=-1"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "fedprivacy: error: clip-norm must be >= 0, got -1.0"]
    good = subprocess.run([str(FEDPRIVACY), "simulate", "--app-dir", str(REPO), "--num-supernodes", "6",
                           "--run-config", f"{CENTRAL} num-server-rounds=2 local-epochs=1 seed=0 "
                           f"sample-rate=0.5 accountant='rdp' output-dir='{tmp_path}'"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    log = (good.stdout + good.stderr).splitlines()
    assert good.returncode == 0, log[-20:]
    for r in (1, 2):
        assert sum(f"round   {r}/2" in line for line in log) == 1, log
    assert sum("accounting: rdp accountant, ε reported at δ=1e-05" in line for line in log) == 1
    summary = [line for line in log if line.startswith("engine inprocess: completed, 2/2 rounds")]
    assert len(summary) == 1 and "None" not in summary[0] and "ε " in summary[0]


@pytest.mark.slow
def test_the_sweep_on_flowers_engine_exits_with_the_runs_code_and_leaves_nothing(tmp_path: Path,
                                                                                private_tmp: Path) -> None:
    """``scripts/flwr_local.py`` (Ray simulation): a refused config starts nothing, a completed run is 0,
    a budget stop is 3 (``flwr run`` itself says 0 for it), a SIGKILLed launcher leaves no process of its
    run and no temporary folder."""
    before = _tmp_leftovers()
    script = [sys.executable, str(REPO / "scripts" / "flwr_local.py"), "--supernodes", "3", "--run-config"]
    quick = f"{QUICK} num-server-rounds=1 {CENTRAL} output-dir='{tmp_path}'"

    def run(cfg: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*script, f"{quick} {cfg}"], cwd=REPO, capture_output=True, text=True,
                              timeout=1200)

    bad = run("clip-nrom=1")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "did you mean" in bad.stderr
    assert "flwr run" not in bad.stdout  # nothing was started
    ok = run("run-name='ok'")
    assert ok.returncode == 0, (ok.stdout + ok.stderr)[-3000:]
    budget = run("run-name='budget' target-epsilon=0.5")
    assert budget.returncode == 3, (budget.stdout + budget.stderr)[-3000:]
    assert "budget-exhausted" in budget.stderr
    # killed mid-way: SIGKILL once the SuperLink is up
    proc = subprocess.Popen([*script, f"{QUICK} {CENTRAL} output-dir='{tmp_path}' run-name='killed' "
                                      "num-server-rounds=30"], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    home = None
    deadline = time.monotonic() + 600
    while home is None and time.monotonic() < deadline and proc.poll() is None:
        for p in psutil.Process(proc.pid).children(recursive=True):
            try:
                if "flower-superlink" in " ".join(p.cmdline()):
                    home = p.environ().get("FLWR_HOME")
            except psutil.Error:
                continue
        time.sleep(0.5)
    assert home is not None, "the SuperLink of the killed run never started"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        alive = [p.pid for p in psutil.process_iter() if _carries(p, home)]
        if not alive and not Path(home).exists():
            break
        time.sleep(0.5)
    assert not alive, f"processes of the killed run still running: {alive}"
    assert not Path(home).exists() and _tmp_leftovers() <= before


def _carries(proc: psutil.Process, home: str) -> bool:
    try:
        return proc.environ().get("FLWR_HOME") == home or home in " ".join(proc.cmdline())
    except psutil.Error:
        return False
