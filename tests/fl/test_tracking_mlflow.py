"""MLflow tracking: the store, read back with MLflow's own client, holds the run config as params,
the published rows of ``results.json`` as metrics per round and the run's published files as
artifacts, and nothing that the run keeps private.

Real runs: the digits MLP trained in this process (:func:`fedprivacy.fl.local_exchange`), logged to
a local store in the test's folder (MLflow's file store and its SQLite store).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mlflow", reason="the tracking extra (fedprivacy[tracking]) is not installed")
from mlflow.tracking import MlflowClient  # noqa: E402

from fedprivacy.config import ConfigError, RunConfig  # noqa: E402
from fedprivacy.fl import FederatedRun, local_exchange  # noqa: E402
from fedprivacy.fl.run import read_participation  # noqa: E402
from tests.fl.test_tracking_tensorboard import _expected  # noqa: E402

N = 4
FILES = {"results.json", "rounds.csv", "privacy_report.md", "accuracy_epsilon.png"}


def _cfg(tmp_path: Path, **kw: Any) -> RunConfig:
    base: dict[str, Any] = {"privacy": "central", "noise-multiplier": 1.0, "num-server-rounds": 2,
                            "local-epochs": 1, "seed": 0, "output-dir": str(tmp_path / "runs"),
                            "run-name": "ml", "tracking": "mlflow", "target-delta": 1e-3}
    base.update(kw)
    return RunConfig.from_mapping(base)


def _run(cfg: RunConfig) -> tuple[Path, dict[str, Any]]:
    run_dir = Path(cfg.output_dir) / cfg.run_name
    FederatedRun(cfg, population=N, exchange=local_exchange(cfg, population=N), run_dir=run_dir,
                 log=lambda _line: None).run()
    return run_dir, json.loads((run_dir / "results.json").read_text(encoding="utf-8"))


def _tracked(uri: str, experiment: str, label: str) -> tuple[MlflowClient, Any]:
    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, experiment
    (run,) = client.search_runs([found.experiment_id], filter_string=f"attributes.run_name = '{label}'")
    return client, run


def _metrics(client: MlflowClient, run: Any) -> dict[str, dict[int, float]]:
    return {key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
            for key in run.data.metrics}


def test_file_store_holds_params_metrics_and_artifacts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps its file store behind this
    uri = (tmp_path / "mlruns").as_uri()
    run_dir, results = _run(_cfg(tmp_path, **{"publish-participation": True, "tracking-uri": uri,
                                              "tracking-experiment": "exp"}))

    client, run = _tracked(uri, "exp", "ml")

    assert run.data.params == {k: str(v) for k, v in results["config"].items()}
    assert _metrics(client, run) == _expected(results)  # float64: equal, not approximately
    assert {"seconds", "clients_sampled", "test_accuracy", "epsilon"} <= set(run.data.metrics)
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == FILES
    local = client.download_artifacts(run.info.run_id, "results.json", str(tmp_path / "down"))
    assert Path(local).read_bytes() == (run_dir / "results.json").read_bytes()
    assert run.info.status == "FINISHED" and run.data.tags["fedprivacy.status"] == "completed"


def test_private_counts_reach_no_metric_in_the_default_sqlite_store(tmp_path: Path) -> None:
    run_dir, results = _run(_cfg(tmp_path))

    uri = f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"  # the default: beside the run folders
    client, run = _tracked(uri, "fedprivacy", "ml")

    private = {k for line in read_participation(run_dir) for k in line} - {"round"}
    assert {"clients_sampled", "seconds"} <= private
    assert not private & set(run.data.metrics)
    stamps = {m.timestamp for k in run.data.metrics for m in client.get_metric_history(run.info.run_id, k)}
    assert len(stamps) == 1  # the rounds' wall times are private: the stamps do not time them
    assert _metrics(client, run) == _expected(results)
    artifacts = client.list_artifacts(run.info.run_id)
    assert {a.path for a in artifacts} == FILES and "private" not in {a.path for a in artifacts}
    assert run.info.artifact_uri.startswith((tmp_path / "runs" / "mlartifacts").as_uri())


def test_mlflow_keys_are_refused_naming_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with pytest.raises(ConfigError, match="^tracking-uri .* is MLflow's file store"):
        _cfg(tmp_path, **{"tracking-uri": (tmp_path / "mlruns").as_uri()})
    with pytest.raises(ConfigError, match="^tracking-uri is read only with tracking='mlflow'"):
        _cfg(tmp_path, tracking="tensorboard", **{"tracking-uri": "sqlite:///x.db"})
    with pytest.raises(ConfigError, match="^tracking-experiment is read only with tracking='mlflow'"):
        _cfg(tmp_path, tracking="", **{"tracking-experiment": "e"})
    with pytest.raises(ConfigError, match="^tracking-run-name is read only with tracking="):
        _cfg(tmp_path, tracking="", **{"tracking-run-name": "x"})
    with pytest.raises(ConfigError, match="^tracking-run-name must be a plain name"):
        _cfg(tmp_path, **{"tracking-run-name": "a/b"})
    monkeypatch.setitem(sys.modules, "mlflow", None)  # the package cannot be imported here
    with pytest.raises(ConfigError, match=r"^tracking='mlflow' needs the mlflow-skinny package"):
        _cfg(tmp_path, tracking="tensorboard,mlflow")


def test_a_resumed_run_continues_its_mlflow_run(tmp_path: Path) -> None:
    _run(_cfg(tmp_path))
    run_dir, results = _run(_cfg(tmp_path, resume=True, **{"num-server-rounds": 3}))

    client, run = _tracked(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}", "fedprivacy", "ml")

    assert [r["round"] for r in results["rounds"]] == [1, 2, 3] and results["resumed"]
    assert _metrics(client, run) == _expected(results)
    for key in run.data.metrics:  # each round once: the checkpointed rounds are not logged again
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == [1, 2, 3], key
    assert run.data.params["num-server-rounds"] == "2" and run.data.params["resume"] == "False"  # its start
    assert run.info.status == "FINISHED"


def test_a_run_started_over_marks_its_dead_attempt_killed(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    (tmp_path / "runs").mkdir()
    client = MlflowClient(tracking_uri=uri)
    dead = client.create_run(client.create_experiment("fedprivacy"), run_name="ml",
                             tags={"fedprivacy.run": "ml"})  # an attempt that never ended

    _run(_cfg(tmp_path))

    runs = client.search_runs([dead.info.experiment_id])
    assert sorted((r.info.run_id == dead.info.run_id, r.info.status) for r in runs) == [
        (False, "FINISHED"), (True, "KILLED")]
