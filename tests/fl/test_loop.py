"""The transport-free round loop with a tiny numpy "model": accounting, faults, budget, resume, outputs.

Clients pull the model towards their own target vector; clipping and local noise use the real
``privatize_update``. No torch, no Flower.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest

from fedprivacy.accounting import (
    ChargeJournal,
    GaussianEvent,
    Neighbouring,
    NoSampling,
    epsilon_for,
)
from fedprivacy.config import RunConfig
from fedprivacy.dp.rng import RandomSource
from fedprivacy.errors import ConfigError
from fedprivacy.fl.aggregation import PlainAggregator
from fedprivacy.fl.callbacks import RunCallback, default_callbacks
from fedprivacy.fl.checkpoint import load_checkpoint
from fedprivacy.fl.client import client_rng, privatize_update
from fedprivacy.fl.mechanisms import get_client_mechanism
from fedprivacy.fl.modes.plain import CentralMode, LocalMode
from fedprivacy.fl.run import read_participation, round_seconds, run_federated
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
                delta = privatize_update(delta, clip_norm=instr.clip_norm,
                                         mechanism=get_client_mechanism(instr.client_mechanism),
                                         noise_multiplier=instr.noise_multiplier, private=instr.private,
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
    assert set(saved["rounds"][0]) >= {"round", "test_loss", "test_accuracy", "epsilon", "delta"}
    # central mode: participation counts, the train loss (clients' un-noised losses) and each round's
    # wall time (it grows with the cohort) are private (review-dp N2): not in
    # results.json, rounds.csv or the console, only in the server's private log (owner-only); the
    # report says so; the run's total time stays published
    assert not {"clients_sampled", "clients_aggregated", "train_loss", "seconds"} & set(saved["rounds"][0])
    assert saved["seconds"] > 0 and "wall times" in saved["privacy"]["participation"]["note"]
    timed = round_seconds(run_dir)
    assert timed == [r["seconds"] for r in read_participation(run_dir)] and len(timed) == 2
    assert all(t > 0 for t in timed)
    assert all(isinstance(r["train_loss"], float) for r in read_participation(run_dir))
    assert saved["privacy"]["participation"]["published"] is False
    assert [r["clients_sampled"] for r in read_participation(run_dir)] == [r["clients_sampled"]
                                                                          for r in _private(res, run_dir)]
    assert (run_dir / "private" / "participation.jsonl").stat().st_mode & 0o077 == 0
    rows = list(csv.DictReader((run_dir / "rounds.csv").open()))
    assert [int(r["round"]) for r in rows] == [1, 2] and not {"clients_sampled", "train_loss", "seconds"} & set(rows[0])
    round_lines = [line for line in lines if line.startswith("round ")]
    assert all("clients (private)" in line and not re.search(r"\d+\.\d\ds", line) for line in round_lines)
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
    # central: who was left out is private: in the private log, not on the console
    assert not any("client 3" in line or "client 5" in line for line in lines)
    assert any("clients left out (ids and reasons in the private log)" in line for line in lines)
    assert all("NaN" in r["left_out"]["3"] and "boom" in r["left_out"]["5"] for r in counts)
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


# ---------------------------------------------------------------------- resume re-accounting
def _kill_after(rnd: int):
    def log(line: str) -> None:
        if line.startswith(f"round {rnd:3d}/"):
            raise _Killed

    return log


@pytest.mark.parametrize("privacy", ["central", "local"])
def test_a_resume_that_would_recalibrate_the_noise_is_refused(tmp_path: Path, privacy: str) -> None:
    # Arrange: z calibrated for 3 rounds (target ε 6); killed after round 2 (review-dp F3)
    kw = {"privacy": privacy, "noise-multiplier": 0.0, "target-epsilon": 6.0, "run-name": "cal",
          "sample-rate": 0.5 if privacy == "central" else 1.0}
    with pytest.raises(_Killed):
        _run(_cfg(tmp_path, **kw), log=_kill_after(2))
    # Act / Assert: with 6 rounds z would be recalibrated, and rounds 1-2 ran at the old z: refused
    with pytest.raises(ConfigError, match=r"num-server-rounds differs .*\(3 != 6\).*calibrated"):
        _run(_cfg(tmp_path, **{**kw, "num-server-rounds": 6, "resume": True}))
    # the same rounds resume, at the z that ran, and the figure is the composition of what ran
    res = _run(_cfg(tmp_path, **{**kw, "resume": True}))
    z = res["privacy"]["noise_multiplier"]
    journal = ChargeJournal.recover(tmp_path / "cal" / "privacy-journal.jsonl")
    assert [e.event.mechanism.noise_multiplier for e in journal.accountant.ledger] == [z] * 3
    assert journal.plan is not None and journal.plan["noise_multiplier"] == z
    cfg = _cfg(tmp_path, **kw)
    mode = cfg.mode
    assert isinstance(mode, CentralMode | LocalMode)
    ref = epsilon_for(noise_multiplier=z, sampling=mode.sampling(cfg, N), steps=3, delta=1e-5,
                      backend="rdp", neighbouring=mode.neighbouring(cfg))
    assert res["privacy"]["epsilon"] == pytest.approx(ref, rel=1e-9) and ref <= 6.0


def test_a_resume_with_more_rounds_at_a_configured_noise_accounts_every_round(tmp_path: Path) -> None:
    kw = {"privacy": "central", "noise-multiplier": 1.3, "sample-rate": 0.5, "run-name": "more"}
    with pytest.raises(_Killed):
        _run(_cfg(tmp_path, **kw), log=_kill_after(2))
    res = _run(_cfg(tmp_path, **{**kw, "num-server-rounds": 5, "resume": True}))
    assert [r["round"] for r in res["rounds"]] == [1, 2, 3, 4, 5]
    ref = epsilon_for(noise_multiplier=1.3, sample_rate=0.5, steps=5, delta=1e-5, backend="rdp")
    assert res["privacy"]["epsilon"] == pytest.approx(ref, rel=1e-9)


class _DriftedCentral(CentralMode):
    """What another fedprivacy version (or a changed calibration) might plan for the same config."""

    def plan(self, cfg, *, population, dim=None):
        plan = super().plan(cfg, population=population, dim=dim)
        z = plan.noise_multiplier * 1.5
        return dataclasses.replace(plan, noise_multiplier=z, central_noise_std=z * plan.clip_norm,
                                   event=dataclasses.replace(
                                       plan.event, mechanism=GaussianEvent(noise_multiplier=z)))


class _KillingAggregator(PlainAggregator):
    """Dies right after the round's charge (plain rounds charge just before aggregating)."""

    def aggregate(self, *args, **kwargs):
        raise _Killed


def test_a_resume_whose_privacy_plan_differs_is_refused(tmp_path: Path) -> None:
    kw = {"privacy": "central", "sample-rate": 0.5}
    # checkpointed run: the checkpoint's plan refuses the drifted one
    with pytest.raises(_Killed):
        _run(_cfg(tmp_path, **kw, **{"run-name": "ck"}), log=_kill_after(2))
    with pytest.raises(ConfigError, match=r"privacy plan differs .*noise_multiplier"):
        _run(_cfg(tmp_path, **kw, **{"run-name": "ck", "resume": True}), mode=_DriftedCentral())
    # killed after round 1's charge, before any checkpoint: the journal's header refuses it
    with pytest.raises(_Killed):
        _run(_cfg(tmp_path, **kw, **{"run-name": "jr"}),
             aggregator=_KillingAggregator(clip_norm=1.0, noise_std=1.0))
    assert not (tmp_path / "jr" / "checkpoint").exists()
    with pytest.raises(ConfigError, match=r"privacy plan differs .*privacy-journal.jsonl.*event"):
        _run(_cfg(tmp_path, **kw, **{"run-name": "jr", "resume": True}), mode=_DriftedCentral())
    res = _run(_cfg(tmp_path, **kw, **{"run-name": "jr", "resume": True}))  # the same plan resumes
    assert res["privacy"]["write_ahead"]["charged_rounds"] == [1, 1, 2, 3]


def test_a_checkpoint_whose_journal_is_missing_is_refused(tmp_path: Path) -> None:
    # Arrange: killed after round 2's checkpoint; round 3 charged, then cut off (review-dp F8)
    kw = {"privacy": "central", "sample-rate": 0.5, "run-name": "lost"}
    with pytest.raises(_Killed):
        _run(_cfg(tmp_path, **kw), log=_kill_after(2))
    run_dir = tmp_path / "lost"
    journal = ChargeJournal.recover(run_dir / "privacy-journal.jsonl")
    journal.charge(journal.accountant.ledger[-1].event, round=3)  # a charge after the checkpoint
    (run_dir / "privacy-journal.jsonl").unlink()
    # Act / Assert: recreating the journal from the checkpoint would refund round 3's charge
    with pytest.raises(ConfigError, match=r"privacy journal .*lost/privacy-journal.jsonl is missing"):
        _run(_cfg(tmp_path, **{**kw, "resume": True}))
    assert not (run_dir / "privacy-journal.jsonl").exists()  # nothing written by the refusal


def test_a_checkpoint_from_before_the_journal_still_resumes(tmp_path: Path) -> None:
    kw = {"privacy": "central", "sample-rate": 0.5, "run-name": "old"}
    with pytest.raises(_Killed):
        _run(_cfg(tmp_path, **kw), log=_kill_after(2))
    state = tmp_path / "old" / "checkpoint" / "state.json"
    saved = json.loads(state.read_text())
    for key in ("journal", "plan"):  # what a checkpoint written before the journal lacks
        del saved["extra"][key]
    state.write_text(json.dumps(saved))
    (tmp_path / "old" / "privacy-journal.jsonl").unlink()
    lines: list[str] = []
    res = _run(_cfg(tmp_path, **{**kw, "resume": True}), lines)
    assert any("checkpoint older than the journal" in line for line in lines)
    ref = epsilon_for(noise_multiplier=1.0, sample_rate=0.5, steps=3, delta=1e-5, backend="rdp")
    assert res["privacy"]["epsilon"] == pytest.approx(ref, rel=1e-9)


def test_a_fixed_cohort_runs_printed_epsilon_holds_against_the_adaptive_adversary(tmp_path: Path) -> None:
    # Arrange: central, 3 of 12 clients per round (without replacement), replace-one, 20 rounds
    from dp_accounting.pld import privacy_loss_distribution as pld_lib
    from dp_accounting.pld import privacy_loss_mechanism as plm

    from fedprivacy.accounting.adversary import adaptive_delta, fixed_cohort_orientations

    z, m, rounds, delta = 2.0, 3, 20, 1e-3
    cfg = _cfg(tmp_path, **{"privacy": "central", "accountant": "pld", "sampling": "fixed", "cohort-size": m,
                            "neighbouring": "replace-one", "noise-multiplier": z, "target-delta": delta,
                            "num-server-rounds": rounds, "run-name": "fc"})
    # Act
    res = _run(cfg)
    eps = json.loads((tmp_path / "fc" / "results.json").read_text())["privacy"]["epsilon"]
    # Assert: the adversary that switches direction round by round (Lebeda et al. 2024) does not beat
    # the printed figure, and does beat the old one (each direction composed alone, dp-accounting)
    old = max(
        pld_lib.PrivacyLossDistribution(pld_lib._create_pld_pmf_from_monotone_privacy_loss(
            plm.GaussianPrivacyLoss(z, sensitivity=2.0, sampling_prob=m / N, adjacency_type=adj),
            value_discretization_interval=1e-4, pessimistic_estimate=True, use_connect_dots=True),
        ).self_compose(rounds).get_epsilon_for_delta(delta)
        for adj in (plm.AdjacencyType.REMOVE, plm.AdjacencyType.ADD))
    adversary = fixed_cohort_orientations(mechanism="gaussian", noise_multiplier=z, sample_rate=m / N,
                                          grid=2e-3)
    assert res["privacy"]["epsilon"] == eps and len(res["rounds"]) == rounds
    assert adaptive_delta(adversary, rounds=rounds, epsilon=old) > delta  # 5.430 is beaten
    assert adaptive_delta(adversary, rounds=rounds, epsilon=eps) <= delta  # 5.809 is not


class _KillAtRelease(RunCallback):
    """Dies at round ``rnd``'s release: after its charges (and DP-SGD spends), before its checkpoint."""

    def __init__(self, rnd: int) -> None:
        self.rnd = rnd

    def on_released(self, run, rnd, event) -> None:
        if rnd == self.rnd:
            raise _Killed


def _dpsgd_exchange(steps: int, rate: float):
    plain = _exchange()

    def exchange(instr, cohort, weights):
        updates, failures = plain(instr, cohort, weights)
        return [dataclasses.replace(u, metrics={"dpsgd_steps": float(steps), "dpsgd_sample_rate": rate})
                for u in updates], failures

    return exchange


def _dpsgd_hooks(steps: int, rate: float) -> ModelHooks:
    """:func:`_hooks` whose DP-SGD schedule (what the server plans per client) is ``steps`` at ``rate``."""
    return dataclasses.replace(_hooks(), dpsgd_schedule=lambda pid: (steps, rate))


def _dpsgd_run(cfg: RunConfig, exchange, hooks: ModelHooks | None = None, **kw):
    return run_federated(cfg, population=N, exchange=exchange, hooks=hooks or _dpsgd_hooks(5, 0.1),
                         log=lambda _: None, **kw)


def _dpsgd_journal(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "private" / "privacy-journal-dpsgd.jsonl").read_text().splitlines()]


def test_a_killed_dpsgd_run_keeps_the_example_level_spends_of_the_cut_off_round(tmp_path: Path) -> None:
    # Arrange: DP-SGD reported by every client (5 steps at rate 0.1 per round); killed at round 2's
    # release, after its spends, before its checkpoint (review-dp N3)
    kw = {"privacy": "central", "dpsgd": True, "dpsgd-noise-multiplier": 1.2, "run-name": "sgd"}
    ex = _dpsgd_exchange(5, 0.1)
    with pytest.raises(_Killed):
        _dpsgd_run(_cfg(tmp_path, **kw), ex, callbacks=[*default_callbacks(lambda _: None), _KillAtRelease(2)])
    assert load_checkpoint(tmp_path / "sgd" / "checkpoint").round == 1
    # Act: resumed; rounds 2 and 3 run (again)
    res = _dpsgd_run(_cfg(tmp_path, **{**kw, "resume": True}), ex)
    # Assert: the example-level figure composes rounds 1, 2 (cut off), 2 and 3: 4 x 5 steps per client
    ref = epsilon_for(noise_multiplier=1.2, sample_rate=0.1, steps=20, delta=1e-5, backend="pld",
                     neighbouring="replace-one")
    assert res["dpsgd"]["epsilon"] == pytest.approx(ref, rel=1e-9)
    # a checkpoint written with the DP-SGD journal refuses to resume without it
    (tmp_path / "sgd" / "private" / "privacy-journal-dpsgd.jsonl").unlink()
    with pytest.raises(ConfigError, match=r"DP-SGD journal .*privacy-journal-dpsgd.jsonl is missing"):
        _dpsgd_run(_cfg(tmp_path, **{**kw, "resume": True, "num-server-rounds": 4}), ex)


def test_a_dpsgd_only_journal_without_a_checkpoint_is_replayed_only_by_the_run_that_wrote_it(tmp_path: Path) -> None:
    # Arrange: privacy none + DP-SGD (its only DP claim is the example-level figure), killed in
    # round 1 after the planned spends at z = 0.5 were on disk (the instructions had left), before any
    # checkpoint; there is no user-level journal to check a relaunch against
    kw = {"privacy": "none", "dpsgd": True, "dpsgd-noise-multiplier": 0.5, "sample-rate": 1.0, "run-name": "x1",
          "num-server-rounds": 1}

    def killed(instr, cohort, weights):
        raise _Killed

    with pytest.raises(_Killed):
        _dpsgd_run(_cfg(tmp_path, **kw), killed)
    assert [ln["kind"] for ln in _dpsgd_journal(tmp_path / "x1")] == ["snapshot", "planned"]
    assert not (tmp_path / "x1" / "checkpoint").exists()
    ex = _dpsgd_exchange(5, 0.1)
    # Act / Assert: a fresh start under the same name, or a resume at another noise multiplier, is refused
    # (it would replay the z = 0.5 spends at z = 4.0: 0.744 published for charges worth 12.444 in the repro)
    with pytest.raises(ConfigError, match=r"holds the DP-SGD journal of a run that was charged .*resume=true"):
        _dpsgd_run(_cfg(tmp_path, **{**kw, "dpsgd-noise-multiplier": 4.0}), ex)
    with pytest.raises(ConfigError, match=r"dpsgd-noise-multiplier differs .*0\.5"):
        _dpsgd_run(_cfg(tmp_path, **{**kw, "dpsgd-noise-multiplier": 4.0, "resume": True}), ex)
    lines: list[str] = []
    res = run_federated(_cfg(tmp_path, **{**kw, "resume": True}), population=N, exchange=ex,
                        hooks=_dpsgd_hooks(5, 0.1), log=lines.append)
    # the resumed run composes the cut-off round's spends and its own: 2 x 5 steps at z = 0.5 per client
    ref = epsilon_for(noise_multiplier=0.5, sample_rate=0.1, steps=10, delta=1e-5, backend="pld",
                      neighbouring="replace-one")
    assert res["dpsgd"]["epsilon"] == pytest.approx(ref, rel=1e-9)
    assert [r["after_round"] for r in res["resumed"]] == [0]
    assert any("from its DP-SGD journal alone" in ln for ln in lines)
    # a journal written before it recorded its run cannot be checked: refused rather than guessed
    journal = tmp_path / "x1" / "private" / "privacy-journal-dpsgd.jsonl"
    first, *rest = journal.read_text().splitlines(keepends=True)
    head = json.loads(first)
    del head["run"]
    journal.write_text(json.dumps(head) + "\n" + "".join(rest))
    (tmp_path / "x1" / "checkpoint").rename(tmp_path / "x1" / "checkpoint.old")
    with pytest.raises(ConfigError, match=r"does not record the run that wrote it"):
        _dpsgd_run(_cfg(tmp_path, **{**kw, "resume": True}), ex)


def test_dpsgd_spends_are_on_disk_before_the_instructions_leave(tmp_path: Path) -> None:
    # Arrange: an exchange that looks at the DP-SGD journal the moment the instructions would leave
    # the server, then the clients train and reply, and the server dies before the round function
    # returns (the replies were seen, the old code had journaled nothing of the round)
    kw = {"privacy": "central", "dpsgd": True, "dpsgd-noise-multiplier": 1.2, "sample-rate": 0.5,
          "run-name": "wa"}
    seen: dict[int, list] = {}
    calls: list[list[int]] = []  # every cohort sent instructions, by either process
    inner = _dpsgd_exchange(5, 0.1)

    def exchange(instr, cohort, weights):
        calls.append(list(cohort))
        on_disk = [ln for ln in _dpsgd_journal(tmp_path / "wa") if ln.get("round") == instr.round]
        seen[instr.round] = [(ln["kind"], sorted(p for p, _, _ in ln["spends"])) for ln in on_disk]
        replies = inner(instr, cohort, weights)
        if instr.round == 2 and "killed" not in seen:
            seen["killed"] = sorted(cohort)
            raise _Killed  # after the replies, before the round function returns
        return replies

    with pytest.raises(_Killed):
        _dpsgd_run(_cfg(tmp_path, **kw), exchange)
    # Assert: before round 1's and round 2's instructions left, every sampled client's spend was on disk
    planned = {ln["round"]: sorted(p for p, _, _ in ln["spends"])
               for ln in _dpsgd_journal(tmp_path / "wa") if ln["kind"] == "planned"}
    assert seen[1] == [("planned", planned[1])] and seen[2] == [("planned", planned[2])]
    assert planned[2] == seen["killed"] and planned[1]
    # Act: resumed (round 2 is run again, with a fresh cohort)
    res = _dpsgd_run(_cfg(tmp_path, **{**kw, "resume": True}), exchange)
    # Assert: the cut-off round stays charged; each client's figure composes every round it was sent
    # instructions in, the cut-off one included (the worst client's is printed)
    sent: dict[int, int] = {}
    for ln in _dpsgd_journal(tmp_path / "wa"):
        assert ln["kind"] in ("snapshot", "planned")  # every reply reported exactly the plan
        for pid, steps, _ in ln.get("spends", []):
            sent[pid] = sent.get(pid, 0) + steps
    assert sorted(ln["round"] for ln in _dpsgd_journal(tmp_path / "wa") if ln["kind"] == "planned") == [1, 2, 2, 3]
    times = {pid: sum(pid in c for c in calls) for pid in range(N)}
    assert sent == {pid: 5 * k for pid, k in times.items() if k}
    ref = epsilon_for(noise_multiplier=1.2, sample_rate=0.1, steps=5 * max(times.values()), delta=1e-5,
                      backend="pld", neighbouring="replace-one")
    assert res["dpsgd"]["epsilon"] == pytest.approx(ref, rel=1e-9)


def test_dpsgd_charges_every_client_sent_instructions_and_more_if_it_reports_more(tmp_path: Path) -> None:
    # Arrange: client 0 fails (no reply), client 1's update is non-finite (dropped from the sum) and
    # client 2 reports 7 steps at rate 0.2 where the server planned 5 at 0.1 (the reply beyond the plan:
    # the old code charged only aggregated clients, from their reports)
    inner = _dpsgd_exchange(5, 0.1)

    def exchange(instr, cohort, weights):
        updates, failures = inner(instr, [p for p in cohort if p != 0], weights)
        updates = [dataclasses.replace(u, delta=tuple(np.full_like(a, np.nan) for a in u.delta))
                   if u.partition_id == 1 else
                   dataclasses.replace(u, metrics={"dpsgd_steps": 7.0, "dpsgd_sample_rate": 0.2})
                   if u.partition_id == 2 else u for u in updates]
        return updates, {**failures, 0: "client error (code 0): boom"}

    cfg = _cfg(tmp_path, **{"privacy": "central", "dpsgd": True, "dpsgd-noise-multiplier": 1.2,
                            "num-server-rounds": 1, "run-name": "all", "max-failed-fraction": 0.5})
    # Act
    res = _dpsgd_run(cfg, exchange)
    # Assert: all 12 planned (q = 1), clients 0 and 1 charged though not aggregated, client 2 twice
    lines = _dpsgd_journal(tmp_path / "all")
    assert [ln["kind"] for ln in lines] == ["snapshot", "planned", "spends"]
    assert sorted(p for p, _, _ in lines[1]["spends"]) == list(range(N))
    assert lines[2]["spends"] == [[2, 7, 0.2]]
    from fedprivacy.accounting import Accountant, PoissonSampling, PrivacyEvent

    both = Accountant(backend="pld", neighbouring="replace-one", unit="example")
    both.spend(PrivacyEvent(mechanism=GaussianEvent(noise_multiplier=1.2), sampling=PoissonSampling(rate=0.1),
                            count=5))
    both.spend(PrivacyEvent(mechanism=GaussianEvent(noise_multiplier=1.2), sampling=PoissonSampling(rate=0.2),
                            count=7))
    assert res["dpsgd"]["epsilon"] == pytest.approx(both.epsilon(delta=1e-5), rel=1e-12)


def test_a_journal_only_resume_checks_the_config_and_says_it_resumed(tmp_path: Path) -> None:
    # Arrange: killed after round 1's charge, before any checkpoint
    kw = {"privacy": "central", "sample-rate": 0.5, "run-name": "jo"}
    with pytest.raises(_Killed):
        _run(_cfg(tmp_path, **kw), aggregator=_KillingAggregator(clip_norm=1.0, noise_std=1.0))
    assert not (tmp_path / "jo" / "checkpoint").exists()
    # Act / Assert: another data or model setting, or population, is refused as with a checkpoint
    with pytest.raises(ConfigError, match=r"local-epochs differs"):
        _run(_cfg(tmp_path, **{**kw, "resume": True, "local-epochs": 3}))
    with pytest.raises(ConfigError, match=r"number of clients differs"):
        run_federated(_cfg(tmp_path, **{**kw, "resume": True}), population=N - 1, exchange=_exchange(),
                      hooks=_hooks(), log=lambda _: None)
    res = _run(_cfg(tmp_path, **{**kw, "resume": True}))
    assert [r["after_round"] for r in res["resumed"]] == [0]
    assert res["privacy"]["write_ahead"]["charged_rounds"] == [1, 1, 2, 3]


def test_an_event_released_beyond_the_charge_is_charged_even_over_the_budget(tmp_path: Path) -> None:
    # Arrange: a round function that charges the plan's event at its release point but reports that
    # it released more (z = 0.5); the budget admits the first charge and not both
    from fedprivacy.accounting import Accountant, PrivacyEvent
    from fedprivacy.fl.modes.base import plain_round

    small = epsilon_for(noise_multiplier=1.0, sampling=NoSampling(), steps=1, delta=1e-5, backend="rdp")
    bigger = PrivacyEvent(mechanism=GaussianEvent(noise_multiplier=0.5))
    inner = plain_round(_exchange(), PlainAggregator(clip_norm=1.0, noise_std=1.0), denominator=N)

    def round_fn(instr, cohort, weights, rng):
        return dataclasses.replace(inner(instr, cohort, weights, rng), event=bigger)

    cfg = _cfg(tmp_path, **{"privacy": "central", "target-epsilon": small * 1.5, "run-name": "over"})
    # Act
    res = run_federated(cfg, population=N, round_fn=round_fn, hooks=_hooks(), log=lambda _: None)
    # Assert: both events are in the journal (never refunded), the run stopped, nothing applied
    journal = ChargeJournal.recover(tmp_path / "over" / "privacy-journal.jsonl")
    assert [e.event.mechanism.noise_multiplier for e in journal.accountant.ledger] == [1.0, 0.5]
    assert res["status"] == "budget-exhausted" and res["rounds"] == [] and "discarded" in res["stopped"]
    both = Accountant(backend="rdp")
    both.spend(PrivacyEvent(mechanism=GaussianEvent(noise_multiplier=1.0)))
    both.spend(bigger)
    assert res["privacy"]["epsilon"] == pytest.approx(both.epsilon(delta=1e-5), rel=1e-12)
    assert res["privacy"]["epsilon"] > small * 1.5


def test_with_counts_private_no_published_dpsgd_figure_depends_on_the_cohorts(tmp_path: Path) -> None:
    # the worst client's example-level ledger moves only in rounds its client is sampled, and
    # its step is a function of the client's (public) partition size, so a published per-round "worst
    # client" figure tells who took part, which central mode's amplified ε assumes secret.
    # Arrange: client 0's class (3 steps at 1/3) differs from everyone else's (5 at 0.2); two seeds
    # give two different cohort sequences
    def schedule(pid: int) -> tuple[int, float]:
        return (3, 1 / 3) if pid == 0 else (5, 0.2)

    plain = _exchange()

    def exchange(instr, cohort, weights):
        updates, failures = plain(instr, cohort, weights)
        return [dataclasses.replace(u, metrics={"dpsgd_steps": float(schedule(u.partition_id)[0]),
                                                "dpsgd_sample_rate": schedule(u.partition_id)[1]})
                for u in updates], failures

    hooks = dataclasses.replace(_hooks(), dpsgd_schedule=schedule)
    published, cohorts = [], []
    for seed in (1, 2):
        lines: list[str] = []
        kw = {"privacy": "central", "dpsgd": True, "dpsgd-noise-multiplier": 1.1, "sample-rate": 0.3,
              "num-server-rounds": 4, "run-name": f"s{seed}", "seed": seed}
        # Act
        res = run_federated(_cfg(tmp_path, **kw), population=N, exchange=exchange, hooks=hooks, log=lines.append)
        journal = _dpsgd_journal(tmp_path / f"s{seed}")
        cohorts.append([sorted(p for p, _, _ in ln["spends"]) for ln in journal if ln["kind"] == "planned"])
        # Assert: no row and no round line carries the worst client's figure; the private log does
        assert all("dpsgd_epsilon" not in row for row in res["rounds"])
        assert not any("DP-SGD" in ln for ln in lines if ln.startswith("round"))
        assert all("dpsgd_epsilon" in r for r in read_participation(tmp_path / f"s{seed}"))
        # every client's actual ledger (replayed from the private journal) is below the published bound
        for pid in range(N):
            times = sum(pid in c for c in cohorts[-1])
            if times:
                steps, rate = schedule(pid)
                actual = epsilon_for(noise_multiplier=1.1, sample_rate=rate, steps=steps * times, delta=1e-5,
                                     backend="pld", neighbouring="replace-one")
                assert res["dpsgd"]["epsilon"] >= actual * (1 - 1e-9)
        published.append(res["dpsgd"])
    assert cohorts[0] != cohorts[1] and len(cohorts[0]) == len(cohorts[1]) == 4
    # the published figure: the worst class composed over the 4 planned rounds, whoever was sampled
    ref = max(epsilon_for(noise_multiplier=1.1, sample_rate=rate, steps=steps * 4, delta=1e-5, backend="pld",
                          neighbouring="replace-one") for steps, rate in ((3, 1 / 3), (5, 0.2)))
    assert published[0]["epsilon"] == published[1]["epsilon"] == pytest.approx(ref, rel=1e-6)
    assert "cohort-independent" in published[0]["epsilon_basis"]
    # the bound composes one event of count steps x rounds; a client's ledger composes per round: same ε
    from fedprivacy.accounting import Accountant, PoissonSampling, PrivacyEvent

    per_round, at_once = (Accountant(backend="pld", neighbouring="replace-one", unit="example") for _ in range(2))
    step = PrivacyEvent(mechanism=GaussianEvent(noise_multiplier=1.1), sampling=PoissonSampling(rate=1 / 3), count=3)
    for rnd in range(1, 5):
        per_round.spend(step, round=rnd)
    at_once.spend(step.with_count(12), round=4)
    assert per_round.epsilon(delta=1e-5) == at_once.epsilon(delta=1e-5)


def test_ledgers_restored_without_an_attempt_count_publish_no_cohort_independent_bound(tmp_path: Path) -> None:
    # A checkpoint's DP-SGD ledgers from before the journal existed say nothing of how many rounds were
    # planned: a bound over the new rounds only would be below those ledgers, so none is published.
    from fedprivacy.fl.dpsgd_ledger import DpsgdLedger

    cfg = _cfg(tmp_path, privacy="central", dpsgd=True)
    old = DpsgdLedger(cfg)
    for rnd in (1, 2, 3):
        old.spend(0, steps=5, rate=0.1, round=rnd)
    restored = DpsgdLedger(cfg)
    restored.load(old.to_json())
    restored.open_journal(tmp_path / "dpsgd.jsonl")  # a new journal: its snapshot keeps "unknown"
    restored.plan_round([0], lambda pid: (5, 0.1), round=4)
    replayed = DpsgdLedger(cfg)
    replayed.open_journal(tmp_path / "dpsgd.jsonl")
    for ledger in (restored, replayed):
        assert ledger.attempts is None
        summary = ledger.summary(counts_private=True, schedule=lambda pid: (5, 0.1), population=N)
        assert summary["epsilon"] is None and "not published" in summary["epsilon_basis"]
    # a fresh run's journal counts every planned round, empty cohorts included
    fresh = DpsgdLedger(cfg)
    fresh.open_journal(tmp_path / "fresh.jsonl")
    fresh.plan_round([], lambda pid: (5, 0.1), round=1)
    fresh.plan_round([3], lambda pid: (5, 0.1), round=2)
    again = DpsgdLedger(cfg)
    again.open_journal(tmp_path / "fresh.jsonl")
    assert fresh.attempts == again.attempts == 2
