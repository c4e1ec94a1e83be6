"""Bad input a new user types is refused before anything starts: exit code 2 and one line naming the key,
on the in-process engine, on Flower's engine (``fedprivacy simulate --engine flower``) and through
``scripts/flwr_local.py``. Every case here fails in the preflight, so no SuperLink, Ray or client starts
(each call returns in well under the ~45 s Flower needs to start)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from server.engine import faults as faults_module
from server.engine.appspec import app_root
from server.engine.cli import _final_round, main, summary_line
from server.engine.faults import FaultPlan

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import flwr_local  # noqa: E402


def _simulate(engine: str, run_config: str, capsys: pytest.CaptureFixture[str], *extra: str
              ) -> tuple[int, list[str]]:
    code = main(["simulate", "--engine", engine, "--num-supernodes", "4", *extra, "--run-config", run_config])
    return code, capsys.readouterr().err.strip().splitlines()


def _flwr_local(run_config: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    code = flwr_local.main(["--supernodes", "4", "--run-config", run_config])
    return code, capsys.readouterr().err.strip().splitlines()


def _cases(tmp_path: Path) -> list[tuple[str, str]]:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    return [
        ("clip-norm=", "key 'clip-norm' has an empty value"),
        (f"output-dir='{blocker / 'runs'}'", "output-dir"),
        (f"output-dir='{blocker}'", "is not a folder"),
        (f"data-dir='{tmp_path / 'missing'}'", "data-dir"),
        ("privacy='central' secagg=false adaptive-clip=true", "adaptive-clip-count-std"),
        ("privacy='dpftrl' secagg=false scaffold=true", "scaffold=true is implemented for privacy"),
        ("privacy='central' secagg=false scaffold=true aggregation='median'",
         "aggregation='median' with scaffold=true is refused"),
    ]


@pytest.mark.parametrize("engine", ["inprocess", "flower"])
def test_simulate_refuses_with_exit_2_and_one_line_naming_the_key(
        engine: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for run_config, needle in _cases(tmp_path):
        code, err = _simulate(engine, run_config, capsys)
        assert code == 2 and len(err) == 1 and err[0].startswith("fedprivacy: error: "), (run_config, err)
        assert needle in err[0], (run_config, err)
    assert not (tmp_path / "a-file" / "runs").exists()


def test_flwr_local_refuses_with_exit_2_and_one_line_naming_the_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for run_config, needle in _cases(tmp_path):
        code, err = _flwr_local(run_config, capsys)
        assert code == 2 and len(err) == 1 and err[0].startswith("flwr_local: error: "), (run_config, err)
        assert needle in err[0], (run_config, err)


def test_the_app_is_found_from_a_folder_without_pyproject(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert app_root(".") == REPO
    # the installed app's keys are known: the refusal is about the key, not a missing pyproject.toml
    code, err = _simulate("inprocess", "clip-nrom=1", capsys)
    assert code == 2 and err == [err[0]] and "did you mean 'clip-norm'?" in err[0]
    # an explicit folder without the app is refused, naming it
    with pytest.raises(FileNotFoundError, match="app-dir"):
        app_root(tmp_path)


def test_a_fault_type_that_matches_nothing_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="type='trian' matches no message"):
        FaultPlan.parse("drop:type=trian,partitions=1")
    code, err = _simulate("inprocess", "num-server-rounds=1", capsys, "--faults", "drop:type=evaluate,partitions=1")
    assert code == 2 and len(err) == 1 and "--faults" in err[0] and "evaluate" in err[0]


def test_a_type_names_its_stages_and_the_start_up_query_only_when_named() -> None:
    train = FaultPlan.parse("drop:type=train,partitions=1")
    any_type = FaultPlan.parse("raise:partitions=7")
    query = FaultPlan.parse("drop:type=query,partitions=1")
    assert train.decide(message_type="train.secagg_masked", group_id="2", partition_id=1) is not None
    assert train.decide(message_type="query.secagg_share", group_id="2", partition_id=1) is None
    assert any_type.decide(message_type="query", group_id="1", partition_id=7) is None  # the start-up ask
    assert any_type.decide(message_type="query.secagg_unmask", group_id="1", partition_id=7) is not None
    assert query.decide(message_type="query", group_id="1", partition_id=1) is not None
    assert set(faults_module._app_message_types()) >= {"train", "query", "train.secagg_masked"}


def test_the_engine_summary_prints_the_runs_own_epsilon(tmp_path: Path) -> None:
    # a run whose rows carry one audience's ε while the run's own figure (privacy.epsilon) is infinite,
    # written by strict JSON as null
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"status": "completed", "rounds": [
        {"round": 1, "test_accuracy": 0.5, "epsilon": 267.387, "delta": 1e-5}],
        "privacy": {"mode": "distributed", "epsilon": None, "delta": 1e-5}}))
    summary = {"engine": "inprocess", "num_supernodes": 100, "num_server_rounds": 1, **_final_round(path)}
    line = summary_line(summary)
    assert "ε inf at δ=1e-05" in line and "267" not in line
    path.write_text(json.dumps({"status": "completed", "rounds": [
        {"round": 1, "test_accuracy": 0.5, "epsilon": None, "delta": None}],
        "privacy": {"mode": "none", "epsilon": None, "delta": None}}))
    none = summary_line({"engine": "inprocess", "num_supernodes": 4, **_final_round(path)})
    assert "no DP (ε not accounted)" in none
