"""A run killed (SIGKILL) after round 2 and resumed ends with the same model and ε as an uninterrupted one.

The ServerApp runs in a child process on the in-process engine (seeded research mode), so the kill is a
real process kill between checkpoints, not an exception.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from fedprivacy.fl.checkpoint import load_checkpoint

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

BASE = {"num-server-rounds": 4, "seed": 11, "sample-rate": 0.7, "local-epochs": 1,
        "privacy": "central", "secagg": False, "accountant": "pld"}


def _script(run_config: dict) -> str:
    return textwrap.dedent(f"""
        import torch
        torch.set_num_threads(1)
        from server.engine import run_inprocess
        run_inprocess(run_config={run_config!r}, num_supernodes=10, app_dir={str(REPO)!r}, node_id_seed=3)
        print("FINISHED", flush=True)
    """)


def _run(run_config: dict, *, kill_after_round: int | None = None) -> str:
    proc = subprocess.Popen([sys.executable, "-c", _script(run_config)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=REPO, env=dict(os.environ))
    assert proc.stdout is not None
    seen = []
    deadline = time.monotonic() + 900
    for line in proc.stdout:
        seen.append(line)
        if kill_after_round is not None and f"round {kill_after_round:3d}/" in line:
            proc.send_signal(signal.SIGKILL)
            break
        if time.monotonic() > deadline:
            proc.kill()
            break
    proc.wait(timeout=120)
    return "".join(seen)


def test_killed_run_resumes_to_the_same_model_and_epsilon(tmp_path: Path) -> None:
    full_cfg = {**BASE, "output-dir": str(tmp_path), "run-name": "full"}
    cut_cfg = {**BASE, "output-dir": str(tmp_path), "run-name": "cut"}
    out = _run(full_cfg)
    assert "FINISHED" in out, out[-3000:]
    out = _run(cut_cfg, kill_after_round=2)
    assert "FINISHED" not in out
    assert load_checkpoint(tmp_path / "cut" / "checkpoint").round == 2
    assert not (tmp_path / "cut" / "results.json").exists()
    out = _run({**cut_cfg, "resume": True})
    assert "FINISHED" in out and "resuming" in out, out[-3000:]
    full = json.loads((tmp_path / "full" / "results.json").read_text())
    cut = json.loads((tmp_path / "cut" / "results.json").read_text())
    assert cut["privacy"]["epsilon"] == full["privacy"]["epsilon"]
    assert [r["test_accuracy"] for r in cut["rounds"]] == [r["test_accuracy"] for r in full["rounds"]]
    for a, b in zip(load_checkpoint(tmp_path / "full" / "checkpoint").weights,
                    load_checkpoint(tmp_path / "cut" / "checkpoint").weights, strict=True):
        np.testing.assert_array_equal(a, b)
