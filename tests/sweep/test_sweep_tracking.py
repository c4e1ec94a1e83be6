"""A tracked sweep groups its runs: one TensorBoard folder and one MLflow experiment per sweep, one
run (subfolder) per config hash, each holding its run's published rows; tracking is not part of a
run's identity. Real sweeps on digits (4 clients, 2 rounds) with the real libraries."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorboard", reason="the tracking extra (fedprivacy[tracking]) is not installed")
pytest.importorskip("mlflow", reason="the tracking extra (fedprivacy[tracking]) is not installed")
from mlflow.tracking import MlflowClient  # noqa: E402

from fedprivacy.config import ConfigError  # noqa: E402
from fedprivacy.sweep.spec import config_hash, parse_sweep  # noqa: E402
from tests.fl.test_tracking_tensorboard import _assert_equal, _expected, _scalars  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CHILD = "import sys; from server.engine.cli import main; sys.exit(main(sys.argv[1:]))"
SWEEP = """
[sweep]
name = "grouped"
num-supernodes = 4
seeds = [0]

[base]
num-server-rounds = 2
local-epochs = 1
secagg = false
privacy = "central"
target-delta = 1e-3
tracking = "tensorboard,mlflow"

[grid]
noise-multiplier = [0.8, 1.6]
"""


@pytest.mark.slow
def test_a_tracked_sweep_has_one_experiment_and_one_run_per_config_hash(tmp_path: Path) -> None:
    (tmp_path / "s.toml").write_text(SWEEP)
    out = tmp_path / "out"

    done = subprocess.run([sys.executable, "-c", CHILD, "sweep", str(tmp_path / "s.toml"), "--out", str(out),
                           "--app-dir", str(REPO), "--jobs", "2", "--json"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600, check=False)

    assert done.returncode == 0, done.stderr[-3000:]
    hashes = sorted(p.name for p in (out / "runs").iterdir())
    assert len(hashes) == 2 and sorted(p.name for p in (out / "tensorboard").iterdir()) == hashes
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("grouped")
    assert experiment is not None  # and MLflow's own "Default", empty
    assert [e.name for e in client.search_experiments() if client.search_runs([e.experiment_id])] == ["grouped"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "s.toml"]  # nothing in the working folder
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert sorted(runs) == hashes
    for digest in hashes:
        results = json.loads((out / "runs" / digest / "run" / "results.json").read_text(encoding="utf-8"))
        _assert_equal(_scalars(out / "tensorboard" / digest), _expected(results))
        run = runs[digest]
        metrics = {k: {m.step: m.value for m in client.get_metric_history(run.info.run_id, k)}
                   for k in run.data.metrics}
        assert metrics == _expected(results) and run.info.status == "FINISHED"
        assert run.data.params["noise-multiplier"] == str(results["config"]["noise-multiplier"])


def test_tracking_is_not_part_of_a_runs_identity_and_its_folders_are_the_sweeps() -> None:
    fused = {"privacy": "central", "seed": 0, "tracking": "", "tracking-dir": ""}
    tracked = {**fused, "tracking": "mlflow", "tracking-uri": "sqlite:///m.db", "tracking-run-name": "x"}
    assert config_hash(tracked, num_supernodes=4) == config_hash(fused, num_supernodes=4)
    for key in ("tracking-dir", "tracking-run-name"):
        with pytest.raises(ConfigError, match=f"^base.{key}: set by the sweep itself"):
            parse_sweep({"base": {key: "x"}})
