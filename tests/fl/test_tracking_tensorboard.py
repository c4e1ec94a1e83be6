"""TensorBoard tracking: the event files, read back with TensorBoard's own reader, hold exactly the
published rows of ``results.json``, round by round, and nothing that the run keeps private.

Real runs: the digits MLP trained in this process (:func:`fedprivacy.fl.local_exchange`), and the
Flower app on the in-process engine through ``fedprivacy simulate``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tensorboard", reason="the tracking extra (fedprivacy[tracking]) is not installed")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from fedprivacy.config import ConfigError, RunConfig  # noqa: E402
from fedprivacy.fl import FederatedRun, local_exchange  # noqa: E402
from fedprivacy.fl.run import read_participation  # noqa: E402
from server.engine.cli import main  # noqa: E402

REPO_DIR = Path(__file__).resolve().parents[2]
N = 4
PRIVATE = ("clients_sampled", "clients_aggregated", "seconds", "dpsgd_epsilon")


def _cfg(tmp_path: Path, **kw: Any) -> RunConfig:
    base: dict[str, Any] = {"privacy": "central", "noise-multiplier": 1.0, "num-server-rounds": 2,
                            "local-epochs": 1, "seed": 0, "output-dir": str(tmp_path), "run-name": "tb",
                            "tracking": "tensorboard", "target-delta": 1e-3}
    base.update(kw)
    return RunConfig.from_mapping(base)


def _run(cfg: RunConfig) -> tuple[Path, dict[str, Any]]:
    run_dir = Path(cfg.output_dir) / cfg.run_name
    FederatedRun(cfg, population=N, exchange=local_exchange(cfg, population=N), run_dir=run_dir,
                 log=lambda _line: None).run()
    return run_dir, json.loads((run_dir / "results.json").read_text(encoding="utf-8"))


def _scalars(log_dir: Path) -> dict[str, dict[int, float]]:
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def _wall_times(log_dir: Path) -> set[float]:
    """The wall times of every scalar in the events."""
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {e.wall_time for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)}


def _expected(results: dict[str, Any]) -> dict[str, dict[int, float]]:
    """The rows' numbers by key, and the configured clip norm (fixed clipping), per round."""
    out: dict[str, dict[int, float]] = {}
    for row in results["rounds"]:
        numbers = {k: v for k, v in row.items() if k != "round" and isinstance(v, int | float)
                   and not isinstance(v, bool)}
        numbers.setdefault("clip_norm", results["config"]["clip-norm"])
        for key, value in numbers.items():
            out.setdefault(key, {})[row["round"]] = value
    return out


def _assert_equal(got: dict[str, dict[int, float]], want: dict[str, dict[int, float]]) -> None:
    assert sorted(got) == sorted(want)
    for tag, steps in want.items():
        assert sorted(got[tag]) == sorted(steps), tag
        for step, value in steps.items():  # TensorBoard keeps float32
            assert got[tag][step] == pytest.approx(value, rel=1e-6, abs=1e-7), (tag, step)


def test_scalars_equal_the_published_rows_of_results_json(tmp_path: Path) -> None:
    run_dir, results = _run(_cfg(tmp_path, **{"publish-participation": True}))

    got = _scalars(run_dir / "tensorboard")

    _assert_equal(got, _expected(results))
    assert {"test_accuracy", "test_loss", "epsilon", "clip_norm", "seconds", "clients_sampled"} <= set(got)
    assert sorted(got["epsilon"]) == [1, 2] and got["epsilon"][2] > got["epsilon"][1] > 0
    assert len(_wall_times(run_dir / "tensorboard")) == 2  # published round times: real stamps


def test_a_run_with_private_counts_leaves_no_count_or_round_time_scalar(tmp_path: Path) -> None:
    run_dir, results = _run(_cfg(tmp_path, **{"tracking-dir": str(tmp_path / "tb-parent")}))

    got = _scalars(tmp_path / "tb-parent" / "tb")

    private = read_participation(run_dir)  # the counts and times exist, in the owner-only log only
    assert [r["round"] for r in private] == [1, 2] and all(r["seconds"] > 0 for r in private)
    assert not ({k for line in private for k in line} - {"round"}) & set(got)
    assert not set(PRIVATE + ("train_loss",)) & set(got)
    assert len(_wall_times(tmp_path / "tb-parent" / "tb")) == 1  # the stamps do not time the rounds
    assert not any(k in row for row in results["rounds"] for k in PRIVATE)
    _assert_equal(got, _expected(results))
    assert not (run_dir / "tensorboard").exists()


def test_a_resumed_run_has_each_round_once_in_its_events(tmp_path: Path) -> None:
    _run(_cfg(tmp_path, tracking=""))  # rounds 1-2 untracked: the resumed run logs them from its checkpoint
    _run(_cfg(tmp_path, resume=True, **{"num-server-rounds": 3}))
    run_dir, results = _run(_cfg(tmp_path, resume=True, **{"num-server-rounds": 4}))

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()

    steps = {tag: [e.step for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    assert [r["round"] for r in results["rounds"]] == [1, 2, 3, 4] and len(results["resumed"]) == 2
    assert steps and all(s == [1, 2, 3, 4] for s in steps.values()), steps  # once each, no duplicate
    _assert_equal(_scalars(run_dir / "tensorboard"), _expected(results))


def test_tracking_values_are_refused_naming_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"^tracking must be '' or a comma list of .*tensorbord"):
        _cfg(tmp_path, tracking="tensorbord")
    with pytest.raises(ConfigError, match="^tracking must name each tracker once"):
        _cfg(tmp_path, tracking="tensorboard, tensorboard")
    with pytest.raises(ConfigError, match="^tracking-dir is read only with tracking='tensorboard'"):
        _cfg(tmp_path, tracking="", **{"tracking-dir": "tb"})
    with pytest.raises(ConfigError, match="^tracking-dir must be set"):
        FederatedRun(_cfg(tmp_path), population=N, exchange=local_exchange(_cfg(tmp_path), population=N))
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # the package cannot be imported here
    with pytest.raises(ConfigError, match=r"^tracking='tensorboard' needs the tensorboard package"):
        _cfg(tmp_path)


def test_simulate_refuses_a_missing_tracker_with_exit_2_before_anything_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)

    code = main(["simulate", "--engine", "inprocess", "--num-supernodes", "3", "--app-dir", str(REPO_DIR),
                 "--run-config", f'tracking="tensorboard" output-dir="{tmp_path / "runs"}"'])

    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "tracking='tensorboard' needs the tensorboard package" in err[0]
    assert not (tmp_path / "runs").exists()


def test_simulate_tracks_a_distributed_run_with_each_audiences_epsilon(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = (f'num-server-rounds=2 local-epochs=1 seed=1 target-delta=1e-3 sample-rate=0.8 '
           f'output-dir="{tmp_path}" run-name="dist" tracking="tensorboard"')
    code = main(["simulate", "--engine", "inprocess", "--num-supernodes", "6", "--app-dir", str(REPO_DIR),
                 "--run-config", cfg])  # the app's defaults: distributed DP with secure aggregation
    capsys.readouterr()
    results = json.loads((tmp_path / "dist" / "results.json").read_text(encoding="utf-8"))

    got = _scalars(tmp_path / "dist" / "tensorboard")

    assert code == 0 and results["config"]["privacy"] == "distributed"
    assert results["privacy"]["participation"]["published"] is False  # sampled cohorts: counts private
    audiences = results["privacy"]["distributed"]["audiences"]
    for name in ("server", "participants", "observers"):
        assert got.pop(f"epsilon/{name}") == {2: pytest.approx(audiences[name]["epsilon"], rel=1e-6)}
    _assert_equal(got, _expected(results))
    private = {k for line in read_participation(tmp_path / "dist") for k in line} - {"round"}
    assert {"clients_sampled", "seconds", "secagg_survivors", "noise_std_sum"} <= private
    assert not private & set(got)  # what the owner-only log holds never reaches a tracker
    assert len(_wall_times(tmp_path / "dist" / "tensorboard")) == 1
