"""Every engine refuses a bad run the same way, before anything starts: one line naming the key, the
rule, the value and the fix (``server.engine.preflight``), and the ServerApp reports how a run ended in
its status file (``fedprivacy.exit_codes``), which is how ``flwr run``'s launchers learn the real outcome."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedprivacy.config import ConfigError
from fedprivacy.exit_codes import STATUS_ENV, ExitCode, exit_code_for, read_status, write_status
from server.engine.preflight import preflight

REPO_DIR = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        ("foo=1", ["unknown run-config key 'foo'", "valid keys: accountant,", "num-server-rounds"]),
        ("clip-nrom=1", ["did you mean 'clip-norm'?"]),
        ("clip-norm=-1", ["clip-norm must be >= 0, got -1.0"]),
        ("clip-norm='inf'", ["clip-norm must be a finite number, got inf"]),
        ("learning-rate=1e400", ["learning-rate must be a finite number, got inf"]),
        ("noise-multiplier='abc'", ["noise-multiplier must be a number, got str 'abc'"]),
        ("target-delta=0.2", ["target-delta must be < 1/number of clients = 1/10", "got 0.2",
                              "set e.g. target-delta=1e-5"]),
        ("privacy='central' adaptive-clip=true", ["adaptive-clip=true with privacy='central' and secagg=true",
                                                  "set secagg=false"]),
        ("privacy='distributed' secagg=false", ["set secagg=true"]),
        ("sampling='fixed' cohort-size=20 privacy='central' secagg=false neighbouring='replace-one'",
         ["cohort-size must be <= the number of clients (10), got 20"]),
        ("resume=true", ["run-name must be set when resume=true", "set run-name"]),
        ("num-server-rounds=", ["--run-config"]),
    ],
)
def test_bad_runs_are_refused_in_one_line_that_says_how_to_fix_them(overrides: str, needles: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        preflight(overrides, app_dir=REPO_DIR, num_supernodes=10)
    text = str(info.value)
    assert "\n" not in text
    for needle in needles:
        assert needle in text


def test_resume_of_a_mistyped_run_name_is_refused_before_anything_starts(tmp_path: Path) -> None:
    (tmp_path / "good" / "checkpoint").mkdir(parents=True)
    (tmp_path / "good" / "checkpoint" / "state.json").write_text("{}")  # only the folder is listed
    with pytest.raises(ConfigError, match=r"run-name 'godo' has no checkpoint .*: good\); check run-name"):
        preflight(f"resume=true run-name='godo' output-dir='{tmp_path}'", app_dir=REPO_DIR, num_supernodes=3)


def test_a_good_run_passes_with_output_dir_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    pre = preflight("output-dir='rel' num-server-rounds=2", app_dir=REPO_DIR, num_supernodes=10)
    assert pre.overrides["output-dir"] == str(tmp_path / "rel")
    assert pre.config.num_server_rounds == 2 and pre.fused["num-server-rounds"] == 2


@pytest.mark.parametrize(
    ("status", "code"),
    [("completed", 0), ("error", 1), ("config-error", 2), ("budget-exhausted", 3), ("clients-failed", 4),
     ("no-clients", 5), ("interrupted", 130), ("no-such-status", 1), (None, 1)],
)
def test_exit_codes_are_distinct_and_only_completed_is_zero(status: str | None, code: int) -> None:
    assert exit_code_for(status) == code
    assert len({int(c) for c in ExitCode}) == len(ExitCode)


def test_status_file_round_trip_and_absence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STATUS_ENV, raising=False)
    assert write_status("completed") is None  # no launcher asked for one
    monkeypatch.setenv(STATUS_ENV, str(tmp_path / "s.json"))
    write_status("budget-exhausted", message="stopped before round 3", results="/r/results.json")
    assert read_status(tmp_path / "s.json") == {"status": "budget-exhausted", "exit_code": 3,
                                                "message": "stopped before round 3",
                                                "results": "/r/results.json"}
    assert read_status(tmp_path / "missing.json") is None
    (tmp_path / "torn.json").write_text('{"stat')
    assert read_status(tmp_path / "torn.json") is None


def test_the_server_app_writes_its_status_on_success_and_on_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from server.engine.run import run_inprocess

    status = tmp_path / "status.json"
    monkeypatch.setenv(STATUS_ENV, str(status))
    base = {"num-server-rounds": 1, "privacy": "central", "secagg": False, "local-epochs": 1, "seed": 0,
            "output-dir": str(tmp_path)}
    # Act 1: a run the budget stops before round 1
    run_inprocess(run_config={**base, "run-name": "b", "target-epsilon": 0.5}, num_supernodes=3,
                  app_dir=REPO_DIR)
    # Assert 1
    first = json.loads(status.read_text())
    assert first["status"] == "budget-exhausted" and first["exit_code"] == 3
    assert first["results"] == str(tmp_path / "b" / "results.json") and "before round 1" in first["message"]
    # Act 2: a config the ServerApp refuses (nothing checked it before: the library path)
    with pytest.raises(ConfigError):
        run_inprocess(run_config={**base, "run-name": "c", "clip-norm": -1.0}, num_supernodes=3,
                      app_dir=REPO_DIR)
    second = json.loads(status.read_text())
    assert second["status"] == "config-error" and second["exit_code"] == 2
    assert second["message"] == "clip-norm must be >= 0, got -1.0"
