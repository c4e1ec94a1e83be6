"""How a run ends and what it records: client-failure stops, refused and recorded resumptions, file modes.

The same tiny numpy "model" as tests/fl/test_loop.py (no torch, no Flower).
"""

from __future__ import annotations

import csv
import json
import os
import stat
from pathlib import Path

import pytest

from fedprivacy.accounting import NoSampling, epsilon_for
from fedprivacy.config import ConfigError
from fedprivacy.exit_codes import ExitCode, exit_code_for
from fedprivacy.fl.run import run_federated
from tests.fl.test_loop import N, _cfg, _exchange, _hooks, _Killed
from tests.fl.test_loop import _run as _loop_run


def _run(cfg, *, population: int = N, exchange=None, log=None):
    lines: list[str] = []
    res = run_federated(cfg, population=population, exchange=exchange or _exchange(), hooks=_hooks(),
                        log=log or lines.append)
    return res, lines


def test_a_round_where_every_client_fails_stops_the_run_with_its_own_status(tmp_path: Path) -> None:
    res, lines = _run(_cfg(tmp_path, **{"num-server-rounds": 4}), exchange=_exchange(fail=set(range(N))))
    assert res["status"] == "clients-failed" and exit_code_for(res["status"]) == ExitCode.CLIENTS_FAILED
    assert [r["round"] for r in res["rounds"]] == [1]
    # central: counts and who took part are private: the published reason names neither
    assert "sampled clients failed (every one of them)" in res["stopped"] and "of 12" not in res["stopped"]
    assert "boom" in res["stopped"] and "\n" not in res["stopped"] and "first: client" not in res["stopped"]
    assert not any("left out:" in line for line in lines)
    published, _ = _run(_cfg(tmp_path / "pub", **{"num-server-rounds": 4, "publish-participation": True}),
                        exchange=_exchange(fail=set(range(N))))
    assert "12 of 12 sampled clients failed (every one of them)" in published["stopped"]
    assert any(line.startswith("clients-failed: 1 rounds") for line in lines)


@pytest.mark.parametrize(("failing", "status"), [(6, "completed"), (7, "clients-failed")])
def test_more_than_max_failed_fraction_stops_the_run(tmp_path: Path, failing: int, status: str) -> None:
    # 6 of 12 is exactly one half (allowed by max-failed-fraction=0.5), 7 of 12 is more
    res, _ = _run(_cfg(tmp_path, **{"num-server-rounds": 2}), exchange=_exchange(fail=set(range(failing))))
    assert res["status"] == status
    assert len(res["rounds"]) == (2 if status == "completed" else 1)


def test_non_finite_updates_count_as_failures(tmp_path: Path) -> None:
    res, _ = _run(_cfg(tmp_path, **{"num-server-rounds": 2, "max-failed-fraction": 0.0}),
                  exchange=_exchange(poison={3}))
    assert res["status"] == "clients-failed" and "NaN/Inf" in res["stopped"]
    assert "client 3" not in res["stopped"]  # central: who took part is private


def test_resume_of_a_missing_run_is_refused_naming_the_runs_there(tmp_path: Path) -> None:
    _run(_cfg(tmp_path, **{"run-name": "real", "num-server-rounds": 1}))
    with pytest.raises(ConfigError, match=r"run-name 'rael' has no checkpoint.*real.*resume=false"):
        _run(_cfg(tmp_path, **{"run-name": "rael", "resume": True}))
    assert not (tmp_path / "rael" / "results.json").exists()


def test_resume_with_another_population_is_refused(tmp_path: Path) -> None:
    def kill_after_round_1(line: str) -> None:
        if line.startswith("round   1/"):
            raise _Killed

    with pytest.raises(_Killed):
        _run(_cfg(tmp_path, **{"run-name": "cut"}), log=kill_after_round_1)
    with pytest.raises(ConfigError, match=r"number of clients differs .*12 != 11.*--num-supernodes 12"):
        _run(_cfg(tmp_path, **{"run-name": "cut", "resume": True}), population=N - 1)
    with pytest.raises(ConfigError, match=r"accountant differs .*set accountant='rdp'"):
        _run(_cfg(tmp_path, **{"run-name": "cut", "resume": True, "accountant": "pld"}))


def test_a_resumed_run_says_so_in_results_and_report(tmp_path: Path) -> None:
    def kill_after_round_2(line: str) -> None:
        if line.startswith("round   2/"):
            raise _Killed

    with pytest.raises(_Killed):
        _run(_cfg(tmp_path, **{"run-name": "cut"}), log=kill_after_round_2)
    res, lines = _run(_cfg(tmp_path, **{"run-name": "cut", "resume": True}))
    assert [r["after_round"] for r in res["resumed"]] == [2]
    saved = json.loads((tmp_path / "cut" / "results.json").read_text())
    assert saved["resumed"][0]["after_round"] == 2 and saved["status"] == "completed"
    assert "Resumed after round 2" in (tmp_path / "cut" / "privacy_report.md").read_text()
    assert any(line.startswith("resuming ") for line in lines)
    fresh, _ = _run(_cfg(tmp_path, **{"run-name": "fresh"}))
    assert fresh["resumed"] == []


def test_outputs_are_readable_like_any_file_the_user_writes(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        _run(_cfg(tmp_path, **{"run-name": "m", "num-server-rounds": 1}))
    finally:
        os.umask(old)
    run_dir = tmp_path / "m"
    owner_only = ("private", "checkpoint")
    files = [p for p in run_dir.rglob("*") if p.is_file() and not set(owner_only) & set(p.relative_to(run_dir).parts)]
    assert {p.name for p in files} >= {"results.json", "rounds.csv", "privacy_report.md",
                                       "accuracy_epsilon.png"}
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {oct(0o644)}
    # except the server's private log (central mode: participation counts) and the checkpoint
    # (its rows keep the counts): owner-only folders
    assert {oct(stat.S_IMODE((run_dir / d).stat().st_mode)) for d in owner_only} == {oct(0o700)}
    private = [p for p in run_dir.rglob("*") if p.is_file() and "private" in p.relative_to(run_dir).parts]
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in private} <= {oct(0o600)}


def _readable_by_others(run_dir: Path, path: Path) -> bool:
    """Whether a user other than the owner can read ``path`` (o+r, and o+x on every folder above it)."""
    folders = [run_dir, *[run_dir / Path(*path.relative_to(run_dir).parts[:i])
                          for i in range(1, len(path.relative_to(run_dir).parts))]]
    return bool(path.stat().st_mode & stat.S_IROTH) and all(f.stat().st_mode & stat.S_IXOTH for f in folders)


@pytest.mark.parametrize("mode", ["central", "none"])
def test_nothing_others_can_read_in_the_run_folder_names_a_cohort_or_a_count(tmp_path: Path, mode: str) -> None:
    # the checkpoint's rows (counts, train loss) and the DP-SGD journal (each round's cohort)
    # were world-readable while results.json and rounds.csv left exactly these out
    from tests.fl.test_loop import _dpsgd_exchange, _dpsgd_hooks

    old = os.umask(0o022)
    try:
        cfg = _cfg(tmp_path, **{"run-name": "v1", "privacy": mode, "sample-rate": 0.5, "dpsgd": True,
                                "num-server-rounds": 2})
        run_federated(cfg, population=N, exchange=_dpsgd_exchange(5, 0.1), hooks=_dpsgd_hooks(5, 0.1),
                      log=lambda _: None)
    finally:
        os.umask(old)
    run_dir = tmp_path / "v1"
    assert (run_dir / "private" / "privacy-journal-dpsgd.jsonl").exists()
    assert not (run_dir / "privacy-journal-dpsgd.jsonl").exists()
    readable = [p for p in run_dir.rglob("*") if p.is_file() and _readable_by_others(run_dir, p)]
    assert {p.name for p in readable} >= {"results.json", "rounds.csv", "privacy_report.md"}
    for p in readable:
        text = p.read_bytes().decode("utf-8", errors="replace")
        assert '"planned"' not in text and '"spends"' not in text, p.name  # the DP-SGD journal's cohorts
        if mode == "central":  # its ε is amplified by sampling: counts and un-noised losses stay private
            for secret in ("clients_sampled", "clients_aggregated", "train_loss"):
                assert secret not in text, (p.name, secret)


def test_a_dpsgd_journal_of_an_older_run_folder_moves_under_private(tmp_path: Path) -> None:
    from tests.fl.test_loop import _dpsgd_exchange, _dpsgd_hooks

    kw = {"run-name": "old", "privacy": "central", "dpsgd": True, "num-server-rounds": 1}
    run_federated(_cfg(tmp_path, **kw), population=N, exchange=_dpsgd_exchange(5, 0.1), hooks=_dpsgd_hooks(5, 0.1),
                  log=lambda _: None)
    run_dir = tmp_path / "old"
    os.replace(run_dir / "private" / "privacy-journal-dpsgd.jsonl", run_dir / "privacy-journal-dpsgd.jsonl")
    res = run_federated(_cfg(tmp_path, **{**kw, "resume": True, "num-server-rounds": 2}), population=N,
                        exchange=_dpsgd_exchange(5, 0.1), hooks=_dpsgd_hooks(5, 0.1), log=lambda _: None)
    assert not (run_dir / "privacy-journal-dpsgd.jsonl").exists()
    moved = run_dir / "private" / "privacy-journal-dpsgd.jsonl"
    assert stat.S_IMODE(moved.stat().st_mode) == 0o600
    assert [json.loads(x)["kind"] for x in moved.read_text().splitlines()] == ["snapshot", "planned", "planned"]
    assert res["dpsgd"]["epsilon"] == pytest.approx(
        epsilon_for(noise_multiplier=1.0, sample_rate=0.1, steps=10, delta=1e-5, backend="pld",
                    neighbouring="replace-one"), rel=1e-9)


def _counting_hooks():
    """The loop's hooks, counting how often the global model is evaluated."""
    hooks = _hooks()
    calls: list[int] = []

    def evaluate(w):
        calls.append(1)
        return hooks.evaluate(w)

    return type(hooks)(init=hooks.init, evaluate=evaluate, num_classes=hooks.num_classes), calls


def test_eval_every_evaluates_every_kth_round_and_always_the_last(tmp_path: Path) -> None:
    hooks, calls = _counting_hooks()
    cfg = _cfg(tmp_path, **{"num-server-rounds": 7, "eval-every": 3, "run-name": "e"})
    res = run_federated(cfg, population=N, exchange=_exchange(), hooks=hooks, log=lambda _m: None)
    evaluated = [r["round"] for r in res["rounds"] if r["test_accuracy"] is not None]
    assert evaluated == [3, 6, 7] and len(calls) == 3
    assert all(r["test_loss"] is None for r in res["rounds"] if r["round"] not in evaluated)
    # same model, same accuracy as an every-round run (evaluation is post-processing only)
    every = _loop_run(_cfg(tmp_path, **{"num-server-rounds": 7, "run-name": "all"}))
    assert res["rounds"][-1]["test_accuracy"] == every["rounds"][-1]["test_accuracy"]
    assert res["rounds"][5]["test_accuracy"] == every["rounds"][5]["test_accuracy"]
    rows = list(csv.DictReader((tmp_path / "e" / "rounds.csv").open()))
    assert [r["test_accuracy"] != "" for r in rows] == [r in evaluated for r in range(1, 8)]
    assert (tmp_path / "e" / "accuracy_epsilon.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_stopped_between_evaluations_still_reports_its_final_model(tmp_path: Path) -> None:
    # the budget stops the run after round 2; eval-every 5 would evaluate nothing before that
    eps2 = epsilon_for(noise_multiplier=1.0, sampling=NoSampling(), steps=2, delta=1e-5, backend="rdp")
    eps3 = epsilon_for(noise_multiplier=1.0, sampling=NoSampling(), steps=3, delta=1e-5, backend="rdp")
    hooks, calls = _counting_hooks()
    cfg = _cfg(tmp_path, **{"num-server-rounds": 10, "eval-every": 5, "target-epsilon": (eps2 + eps3) / 2})
    lines: list[str] = []
    res = run_federated(cfg, population=N, exchange=_exchange(), hooks=hooks, log=lines.append)
    assert res["status"] == "budget-exhausted" and [r["round"] for r in res["rounds"]] == [1, 2]
    assert res["rounds"][0]["test_accuracy"] is None and res["rounds"][1]["test_accuracy"] is not None
    assert len(calls) == 1
    rounds = [line for line in lines if line.startswith("round ")]
    assert len(rounds) == 2 and all("accuracy –" in line for line in rounds)
    assert "budget-exhausted: 2 rounds, accuracy 0." in lines[-1]


@pytest.mark.parametrize("bad", [0, -2])
def test_eval_every_must_be_a_positive_int(tmp_path: Path, bad: int) -> None:
    with pytest.raises(ConfigError, match=rf"eval-every.*{bad}"):
        _cfg(tmp_path, **{"eval-every": bad})
