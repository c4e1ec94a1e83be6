"""The transport-free round loop with a tiny numpy "model": accounting, faults, budget, resume, outputs.

Clients pull the model towards their own target vector; clipping and local noise use the real
``privatize_update``. No torch, no Flower.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from fedprivacy.accounting import Neighbouring, NoSampling, epsilon_for
from fedprivacy.config import RunConfig
from fedprivacy.dp.rng import RandomSource
from fedprivacy.fl.checkpoint import load_checkpoint
from fedprivacy.fl.client import client_rng, privatize_update
from fedprivacy.fl.run import read_participation, run_federated
from fedprivacy.fl.types import ClientUpdate, ModelHooks

N = 12
TARGETS = [RandomSource.seeded(100).child(p).normal(std=1.0, size=6) for p in range(N)]


def _hooks() -> ModelHooks:
    mean_target = np.mean(TARGETS, axis=0)

    def evaluate(w):
        loss = float(np.sum((np.concatenate([a.ravel() for a in w]) - mean_target) ** 2))
        return loss, 1.0 / (1.0 + loss)

    return ModelHooks(init=lambda seed: [np.zeros(4, np.float32), np.zeros(2, np.float32)],
                      evaluate=evaluate, num_classes=2)


def _exchange(poison: set[int] = frozenset(), fail: set[int] = frozenset()):
    def exchange(instr, cohort, weights):
        flat = np.concatenate([np.asarray(a, np.float64).ravel() for a in weights])
        updates, failures = [], {}
        for pid in cohort:
            if pid in fail:
                failures[pid] = "client error (code 0): boom"
                continue
            step = 0.5 * (TARGETS[pid] - flat)
            delta = [step[:4], step[4:]]
            if pid in poison:
                delta = [np.full(4, np.nan), step[4:]]
            else:
                delta = privatize_update(delta, privacy=instr.privacy, clip_norm=instr.clip_norm,
                                         local_noise_std=instr.local_noise_std,
                                         rng=client_rng(seed=instr.seed, partition_id=pid, round=instr.round))
            updates.append(ClientUpdate(partition_id=pid, delta=tuple(np.asarray(a, np.float32) for a in delta),
                                        num_examples=10, train_loss=float(np.sum(step**2))))
        return updates, failures

    return exchange


def _cfg(tmp_path: Path, **kw) -> RunConfig:
    base = {"output-dir": str(tmp_path), "seed": 7, "accountant": "rdp", "num-server-rounds": 3,
            "noise-multiplier": 1.0, "clip-norm": 1.0}
    base.update(kw)
    return RunConfig.from_mapping(base)


def _private(res: dict, run_dir: Path) -> list[dict]:
    """The published rows joined with the private counts (same rounds, same order)."""
    counts = {r["round"]: r for r in read_participation(run_dir)}
    return [{**row, **counts[row["round"]]} for row in res["rounds"]]


def _run(cfg: RunConfig, lines: list[str] | None = None, **kw):
    sink = lines if lines is not None else []
    return run_federated(cfg, population=N, exchange=kw.pop("exchange", _exchange()), hooks=_hooks(),
                         log=kw.pop("log", sink.append), **kw)


def test_central_epsilon_equals_epsilon_for_and_outputs_are_written(tmp_path: Path) -> None:
    # Arrange: PLD, Poisson q=0.5, sigma=1.0, 2 rounds
    cfg = _cfg(tmp_path, **{"accountant": "pld", "sample-rate": 0.5, "num-server-rounds": 2, "run-name": "c"})
    lines: list[str] = []
    # Act
    res = _run(cfg, lines)
    # Assert: epsilon per round = epsilon_for with the same (sigma, q, rounds, delta)
    for row in res["rounds"]:
        ref = epsilon_for(noise_multiplier=1.0, sample_rate=0.5, steps=row["round"], delta=1e-5)
        assert row["epsilon"] == pytest.approx(ref, abs=1e-6)
    run_dir = tmp_path / "c"
    saved = json.loads((run_dir / "results.json").read_text())
    assert saved["privacy"]["epsilon"] == pytest.approx(res["rounds"][-1]["epsilon"], abs=1e-12)
    assert saved["privacy"]["rng_mode"] == "seeded" and saved["config"]["sample-rate"] == 0.5
    assert set(saved["rounds"][0]) >= {"round", "train_loss", "test_loss", "test_accuracy", "epsilon",
                                       "delta", "seconds"}
    # central mode: participation counts are private (issue 11): not in results.json, rounds.csv or
    # the console, only in the server's private log (owner-only); the report says so
    assert not {"clients_sampled", "clients_aggregated"} & set(saved["rounds"][0])
    assert saved["privacy"]["participation"]["published"] is False
    assert [r["clients_sampled"] for r in read_participation(run_dir)] == [r["clients_sampled"]
                                                                          for r in _private(res, run_dir)]
    assert (run_dir / "private" / "participation.jsonl").stat().st_mode & 0o077 == 0
    rows = list(csv.DictReader((run_dir / "rounds.csv").open()))
    assert [int(r["round"]) for r in rows] == [1, 2] and "clients_sampled" not in rows[0]
    assert all("clients (private)" in line for line in lines if line.startswith("round "))
    assert (run_dir / "accuracy_epsilon.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (run_dir / "privacy_report.md").read_text()
    assert "Seeded research mode" in report and "add-remove" in report and "poisson(q=0.5" in report
    assert sum(line.startswith("round ") for line in lines) == 2 and "ε" in lines[-2]


def test_budget_stops_cleanly_before_the_round_that_would_overspend(tmp_path: Path) -> None:
    eps2 = epsilon_for(noise_multiplier=1.0, sampling=NoSampling(), steps=2, delta=1e-5, backend="rdp")
    eps3 = epsilon_for(noise_multiplier=1.0, sampling=NoSampling(), steps=3, delta=1e-5, backend="rdp")
    target = (eps2 + eps3) / 2
    lines: list[str] = []
    res = _run(_cfg(tmp_path, **{"target-epsilon": target, "num-server-rounds": 5}), lines)
    assert [r["round"] for r in res["rounds"]] == [1, 2]
    assert res["status"] == "budget-exhausted" and "before round 3" in res["stopped"]
    assert res["privacy"]["epsilon"] <= target
    assert any("stopped before round 3" in line for line in lines)


def test_nan_update_is_left_out_logged_and_accounting_unchanged(tmp_path: Path) -> None:
    lines: list[str] = []
    res = _run(_cfg(tmp_path, **{"num-server-rounds": 2, "run-name": "nan"}), lines,
               exchange=_exchange(poison={3}, fail={5}))
    counts = read_participation(tmp_path / "nan")
    assert len(counts) == 2
    assert all(r["clients_sampled"] == N and r["clients_aggregated"] == N - 2 for r in counts)
    assert any("client 3 left out" in line and "NaN" in line for line in lines)
    assert any("client 5 left out" in line and "boom" in line for line in lines)
    ref = epsilon_for(noise_multiplier=1.0, sampling=NoSampling(), steps=2, delta=1e-5, backend="rdp")
    assert res["privacy"]["epsilon"] == pytest.approx(ref, abs=1e-9)
    assert all(np.isfinite(r["test_loss"]) for r in res["rounds"])


class _Killed(BaseException):
    pass


def test_killed_run_resumes_with_the_same_model_and_epsilon(tmp_path: Path) -> None:
    full = _run(_cfg(tmp_path, **{"run-name": "full", "sample-rate": 0.5}))

    def kill_after_round_2(line: str) -> None:
        if line.startswith("round   2/"):
            raise _Killed

    with pytest.raises(_Killed):
        _run(_cfg(tmp_path, **{"run-name": "cut", "sample-rate": 0.5}), log=kill_after_round_2)
    assert load_checkpoint(tmp_path / "cut" / "checkpoint").round == 2
    resumed = _run(_cfg(tmp_path, **{"run-name": "cut", "sample-rate": 0.5, "resume": True}))
    assert resumed["privacy"]["epsilon"] == pytest.approx(full["privacy"]["epsilon"], abs=1e-12)
    assert [r["test_loss"] for r in resumed["rounds"]] == [r["test_loss"] for r in full["rounds"]]
    a = load_checkpoint(tmp_path / "full" / "checkpoint").weights
    b = load_checkpoint(tmp_path / "cut" / "checkpoint").weights
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


def test_rerun_into_an_existing_run_needs_resume_and_the_same_config(tmp_path: Path) -> None:
    _run(_cfg(tmp_path, **{"run-name": "r", "num-server-rounds": 1}))
    with pytest.raises(ValueError, match="resume"):
        _run(_cfg(tmp_path, **{"run-name": "r", "num-server-rounds": 1}))
    with pytest.raises(ValueError, match="clip-norm"):
        _run(_cfg(tmp_path, **{"run-name": "r", "resume": True, "clip-norm": 2.0}))


def test_seeded_runs_repeat_and_secure_runs_do_not(tmp_path: Path) -> None:
    a = _run(_cfg(tmp_path, **{"sample-rate": 0.5, "num-server-rounds": 2}))
    b = _run(_cfg(tmp_path, **{"sample-rate": 0.5, "num-server-rounds": 2}))
    assert [r["test_loss"] for r in a["rounds"]] == [r["test_loss"] for r in b["rounds"]]
    c = _run(_cfg(tmp_path, **{"seed": -1, "num-server-rounds": 2}))
    d = _run(_cfg(tmp_path, **{"seed": -1, "num-server-rounds": 2}))
    assert c["rounds"][-1]["test_loss"] != d["rounds"][-1]["test_loss"]
    assert c["privacy"]["rng_mode"] == "secure"


def test_local_mode_is_accounted_per_client_without_amplification(tmp_path: Path) -> None:
    res = _run(_cfg(tmp_path, **{"privacy": "local", "sample-rate": 0.5, "num-server-rounds": 2}))
    ref = epsilon_for(noise_multiplier=1.0, sampling=NoSampling(), steps=2, delta=1e-5, backend="rdp",
                      neighbouring=Neighbouring.REPLACE_ONE)
    assert res["privacy"]["epsilon"] == pytest.approx(ref, abs=1e-9)
    assert res["privacy"]["adjacency"] == "replace-one"


def test_none_mode_claims_nothing(tmp_path: Path) -> None:
    res = _run(_cfg(tmp_path, **{"privacy": "none", "run-name": "n"}))
    assert res["privacy"]["epsilon"] is None and all(r["epsilon"] is None for r in res["rounds"])
    assert "No differential privacy" in (tmp_path / "n" / "privacy_report.md").read_text()
    # without noise the model converges towards the mean target
    assert res["rounds"][-1]["test_loss"] < res["rounds"][0]["test_loss"]
