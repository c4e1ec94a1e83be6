"""privacy = "dpftrl": real digits/mlp runs; the ε against dp-accounting and the Gaussian's closed form,
the cohorts against the schema, the noise against C^{-1} z recomputed densely, and the refusals."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dp_accounting
import numpy as np
import pytest
import torch
from scipy import optimize, stats

from fedprivacy.config import RunConfig
from fedprivacy.dp.matrix import (
    CyclicPoisson,
    MatrixMechanism,
    MinSeparation,
    StreamingNoise,
    Workload,
    bsr,
    min_sep_sensitivity,
)
from fedprivacy.dp.matrix.participation import MinSepLedger
from fedprivacy.dp.rng import RandomSource
from fedprivacy.errors import ConfigError
from fedprivacy.fl.aggregation import PlainAggregator
from fedprivacy.fl.client import local_exchange
from fedprivacy.fl.mechanisms import MechanismMismatch, ServerMechanism
from fedprivacy.fl.modes import Transport, get_mode
from fedprivacy.fl.modes.dpftrl import CorrelatedNoise, DpftrlMode
from fedprivacy.fl.modes.plain import CentralMode
from fedprivacy.fl.round_inputs import RoundInputs
from fedprivacy.fl.run import FederatedRun, run_federated
from fedprivacy.fl.task import default_hooks
from fedprivacy.report import privacy_report_md

N, DELTA = 6, 1e-3


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _cfg(tmp_path: Path, **kw: Any) -> RunConfig:
    base = {"num-server-rounds": 4, "seed": 3, "local-epochs": 1, "dataset": "digits", "model": "mlp",
            "secagg": False, "privacy": "dpftrl", "noise-multiplier": 1.5, "target-delta": DELTA,
            "output-dir": str(tmp_path), "run-name": "r"}
    return RunConfig.from_mapping({**base, **kw})


def _run(cfg: RunConfig, **seams: Any) -> dict[str, Any]:
    return run_federated(cfg, population=N, exchange=local_exchange(cfg, population=N), log=lambda _: None,
                         **seams)


def _gaussian_epsilon(mu: float, delta: float) -> float:
    """The exact ε of a Gaussian mechanism with sensitivity/std ``mu`` (Balle & Wang 2018, Theorem 8)."""
    def excess(eps: float) -> float:
        return float(stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)) - delta

    return float(optimize.brentq(excess, 0.0, 100.0, xtol=1e-12))


def test_band_1_one_group_is_one_gaussian_whose_epsilon_the_run_prints(tmp_path: Path) -> None:
    # Arrange: C = I, every client in every round: sensitivity sqrt(T), noise std z C sqrt(T) per round,
    # i.e. T Gaussians of std/sensitivity z sqrt(T), which compose to one Gaussian of z (mu = 1/z)
    z, rounds = 1.5, 4
    cfg = _cfg(tmp_path, **{"num-server-rounds": rounds, "noise-multiplier": z})
    strategy = bsr(Workload(num_rounds=rounds), 1)
    # Act
    privacy = _run(cfg)["privacy"]
    # Assert
    assert min_sep_sensitivity(strategy, min_sep=1, max_participations=rounds).value == pytest.approx(2.0)
    assert privacy["noise_std"] == pytest.approx(z * cfg.clip_norm * math.sqrt(rounds), rel=1e-12)
    pld = dp_accounting.pld.PLDAccountant()
    pld.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z * math.sqrt(rounds)), rounds))
    exact = _gaussian_epsilon(1.0 / z, DELTA)
    assert privacy["epsilon"] == pytest.approx(pld.get_epsilon(DELTA), rel=1e-3)
    assert exact <= privacy["epsilon"] <= exact * 1.01  # never below the closed form, within 1%
    mm = MatrixMechanism(strategy=strategy, schema=MinSeparation(min_separation=1, max_participations=rounds),
                         noise_multiplier=z)
    assert privacy["epsilon"] == pytest.approx(mm.epsilon(DELTA), rel=1e-6)


@pytest.mark.parametrize(("q", "schema"), [
    (1.0, MinSeparation(min_separation=2, max_participations=2)),
    (0.5, CyclicPoisson(num_groups=2, sample_rate=0.5)),
])
def test_every_round_prints_the_whole_horizons_epsilon(tmp_path: Path, q: float, schema: Any) -> None:
    # Arrange
    cfg = _cfg(tmp_path, **{"dpftrl-band": 2, "dpftrl-groups": 2, "sample-rate": q})
    mm = MatrixMechanism(strategy=bsr(Workload(num_rounds=4), 2), schema=schema, noise_multiplier=1.5)
    # Act
    result = _run(cfg)
    # Assert: round 1 already reports ε_T (a prefix is not a share of it)
    eps = [r["epsilon"] for r in result["rounds"]]
    assert eps == pytest.approx([mm.epsilon(DELTA)] * 4, rel=1e-6)
    claim = result["privacy"]["correlated"]
    assert claim["schema"] == schema.describe() and claim["sensitivity"] == mm.sensitivity.value
    report = privacy_report_md(result, covers=get_mode("dpftrl").covers)
    assert "bsr-2 (band 2" in report and mm.sensitivity.basis in report and schema.describe() in report
    assert result["privacy"]["unit"].startswith("user") and result["privacy"]["adjacency"] == "add-remove"


class _Recording:
    """The real in-process exchange, recording each round's cohort."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cohorts: list[list[int]] = []
        self._exchange = local_exchange(cfg, population=N)

    def __call__(self, instr: Any, cohort: Sequence[int], weights: Any) -> Any:
        self.cohorts.append(list(cohort))
        return self._exchange(instr, cohort, weights)


@pytest.mark.parametrize("q", [1.0, 0.6])
def test_the_cohorts_are_the_groups_the_schema_is_about(tmp_path: Path, q: float) -> None:
    # Arrange
    cfg = _cfg(tmp_path, **{"num-server-rounds": 6, "dpftrl-band": 2, "dpftrl-groups": 3, "sample-rate": q,
                            "local-epochs": 1})
    exchange = _Recording(cfg)
    # Act
    run_federated(cfg, population=N, exchange=exchange, log=lambda _: None)
    # Assert
    ledger = MinSepLedger(MinSeparation(min_separation=3, max_participations=2))
    for t, cohort in enumerate(exchange.cohorts):
        group = [p for p in range(N) if p % 3 == t % 3]
        assert set(cohort) <= set(group) and (q < 1.0 or cohort == group)
        ledger.record(t, cohort)  # raises on a violation
    sampler = DpftrlMode().sample_cohort
    drawn = {tuple(sampler(cfg, population=60, round=1, rng=RandomSource.seeded(s))) for s in range(20)}
    assert all(p % 3 == 0 for c in drawn for p in c)
    assert len(drawn) > 1 if q < 1.0 else drawn == {tuple(range(0, 60, 3))}  # Poisson within the group


def test_the_noise_added_is_c_inverse_z_for_the_z_drawn(tmp_path: Path) -> None:
    # Arrange: the round function itself, on the real exchange, with seeded sources
    cfg = _cfg(tmp_path, **{"dpftrl-band": 3, "dpftrl-groups": 1, "num-server-rounds": 4})
    mode = get_mode("dpftrl")
    weights = [np.asarray(w) for w in default_hooks(cfg, population=N).init(0)]
    dim = int(sum(w.size for w in weights))
    plan = mode.plan(cfg, population=N, dim=dim)
    round_fn = mode.round_fn(cfg, plan, Transport(exchange=local_exchange(cfg, population=N)))
    inputs = RoundInputs(cfg, population=N, root=RandomSource.seeded(1), plan=plan, mode=mode, num_classes=10)
    added = []
    # Act: the stream is seeded by round 1's source
    for rnd in range(1, 5):
        instr, cohort, _ = inputs.take(rnd)
        outcome = round_fn(instr, cohort, weights, RandomSource.seeded(7 if rnd == 1 else rnd))
        clean = PlainAggregator(clip_norm=cfg.clip_norm, noise_std=0.0).aggregate(
            outcome.updates, like=weights, denominator=1.0, rng=RandomSource.seeded(0))
        added.append(np.concatenate([
            (np.asarray(m, np.float64) * plan.denominator - np.asarray(c, np.float64)).ravel()
            for m, c in zip(outcome.aggregate.mean_update, clean.mean_update, strict=True)]))
        assert outcome.aggregate.noise_std == plan.central_noise_std
    # Assert: recompute w = C^{-1} Z with the dense matrix from the same source
    std = plan.central_noise_std
    source = RandomSource.seeded(7).child("dpftrl-noise")
    z = np.stack([np.asarray(source.normal(std=std, size=dim)) for _ in range(4)])
    strategy = bsr(Workload(num_rounds=4), 3)
    expected = np.linalg.solve(strategy.matrix(), z)
    assert np.allclose(np.stack(added), expected, atol=1e-5 * float(np.abs(expected).max()))
    recovered = strategy.matrix() @ np.stack(added)
    assert float(np.std(recovered)) == pytest.approx(std, rel=0.05)
    # every client in every round, C non-negative: the sensitivity is |C 1| (one vector repeated)
    assert std == pytest.approx(1.5 * cfg.clip_norm * float(np.linalg.norm(strategy.matrix() @ np.ones(4))),
                                rel=1e-12)


class _HalfNoise(CorrelatedNoise):
    """The adversary: draws the innovations at half the std its event is charged for."""

    def stream(self, plan: Any, *, dim: int, rng: RandomSource) -> StreamingNoise:
        assert plan.correlated is not None
        return StreamingNoise(plan.correlated.strategy, dim=dim, noise_std=self.required_noise_std(plan) / 2,
                              rng=rng)


class _StingyDpftrl(DpftrlMode):
    name = "test-stingy-dpftrl"
    server_mechanism: ServerMechanism | None = _HalfNoise()


def test_a_round_with_less_noise_than_charged_is_refused_before_it_is_applied(tmp_path: Path) -> None:
    # Arrange
    cfg = _cfg(tmp_path, **{"dpftrl-band": 2, "dpftrl-groups": 2})
    run = FederatedRun(cfg, population=N, exchange=local_exchange(cfg, population=N), mode=_StingyDpftrl(),
                       callbacks=[], log=lambda _: None)
    run.start()
    before = [w.copy() for w in run.weights]
    # Act / Assert
    with pytest.raises(MechanismMismatch, match="noise std"):
        run.step()
    assert all(np.array_equal(a, b) for a, b in zip(before, run.weights, strict=True)) and not run.records


@pytest.mark.parametrize(("overrides", "key"), [
    ({"secagg": True, "sample-rate": 0.5, "dpftrl-groups": 2}, "sample-rate"),
    ({"adaptive-clip": True}, "adaptive-clip"),
    ({"aggregation": "median"}, "aggregation"),
    ({"dpsgd": True}, "dpsgd"),
    ({"sampling": "fixed", "cohort-size": 2, "neighbouring": "replace-one"}, "sampling"),
    ({"neighbouring": "replace-one"}, "neighbouring"),
    ({"resume": True}, "resume"),
    ({"dpftrl-band": 0}, "dpftrl-band"),
    ({"dpftrl-groups": 0}, "dpftrl-groups"),
    ({"dpftrl-factorization": "qr"}, "dpftrl-factorization"),
    ({"dpftrl-factorization": "blt", "dpftrl-groups": 2, "sample-rate": 0.5}, "sample-rate"),
    ({"dpftrl-factorization": "blt", "dpftrl-band": 2}, "dpftrl-band"),
    ({"dpftrl-factorization": "blt", "dpftrl-buffers": 0}, "dpftrl-buffers"),
    ({"dpftrl-band": 3, "dpftrl-groups": 2, "sample-rate": 0.5}, "dpftrl-band"),
    ({"dpftrl-band": 5}, "dpftrl-band"),
    ({"noise-multiplier": 0.0}, "noise-multiplier"),
])
def test_what_cannot_be_accounted_is_refused_in_one_line_naming_the_key(tmp_path: Path, overrides: dict,
                                                                       key: str) -> None:
    with pytest.raises(ConfigError, match=key) as info:
        _cfg(tmp_path, **overrides)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("overrides", "key"), [
    ({"dpftrl-groups": N + 1}, "dpftrl-groups"),
    ({"target-epsilon": 0.5}, "target-epsilon"),
    ({"accountant": "prv"}, "accountant"),
])
def test_what_the_population_or_accountant_cannot_honour_stops_before_round_1(tmp_path: Path, overrides: dict,
                                                                             key: str) -> None:
    cfg = _cfg(tmp_path, **overrides)
    with pytest.raises(ConfigError, match=key) as info:
        _run(cfg)
    assert "\n" not in str(info.value) and not (tmp_path / "r" / "results.json").exists()


def test_target_epsilon_calibrates_z_on_the_runs_accountant_without_overshooting(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, **{"noise-multiplier": 0.0, "target-epsilon": 3.0, "dpftrl-band": 2,
                            "dpftrl-groups": 2, "sample-rate": 0.5})
    privacy = _run(cfg)["privacy"]
    assert privacy["calibrated"] and privacy["epsilon"] <= 3.0
    looser = MatrixMechanism(strategy=bsr(Workload(num_rounds=4), 2),
                             schema=CyclicPoisson(num_groups=2, sample_rate=0.5),
                             noise_multiplier=privacy["noise_multiplier"] / 1.01)
    assert looser.epsilon(DELTA) > 3.0 * 0.99  # and it is close to the target


def test_the_flower_server_app_trains_the_groups_it_accounts_for(tmp_path: Path) -> None:
    # Arrange: the real ServerApp and ClientApps on the in-process engine
    from fedprivacy.fl.run import read_participation
    from server.engine import run_inprocess

    run_config = {"num-server-rounds": 3, "seed": 3, "output-dir": str(tmp_path), "run-name": "apps",
                  "local-epochs": 1, "privacy": "dpftrl", "secagg": False, "dpftrl-band": 2,
                  "dpftrl-groups": 2, "target-delta": DELTA}
    # Act
    run_inprocess(run_config=run_config, num_supernodes=N, app_dir=Path(__file__).resolve().parents[2])
    # Assert: each round trains one group of 3 of the 6 clients, never all of them
    rounds = read_participation(tmp_path / "apps")
    assert [(r["clients_sampled"], r["clients_aggregated"]) for r in rounds] == [(3, 3)] * 3


def test_the_zero_loss_event_only_follows_a_charge_of_the_event_it_covers() -> None:
    from fedprivacy.accounting.accountant import Accountant
    from fedprivacy.accounting.events import ChargedAhead, GaussianEvent, PrivacyEvent

    horizon = PrivacyEvent(mechanism=GaussianEvent(noise_multiplier=1.0))
    covered = PrivacyEvent(mechanism=ChargedAhead(covers=horizon, horizon=3))
    acc = Accountant(backend="pld")
    with pytest.raises(ValueError, match="horizon's charge"):
        acc.spend(covered)  # nothing charged yet: it would claim epsilon 0
    acc.spend(PrivacyEvent(mechanism=GaussianEvent(noise_multiplier=50.0)))
    with pytest.raises(ValueError, match="horizon's charge"):
        acc.spend(covered)  # a cheap charge is not the horizon this event says it is covered by
    acc.spend(horizon)
    acc.spend(covered)
    acc.spend(covered)
    with pytest.raises(ValueError, match="exceed"):
        acc.spend(covered)  # a fourth round of a 3-round horizon
    again = Accountant.from_json(acc.to_json())
    assert acc.steps == 4 and again.epsilon(delta=DELTA) == acc.epsilon(delta=DELTA)
    with pytest.raises(ValueError, match="exceed"):
        again.spend(covered)  # the reloaded ledger still knows what the horizon's charge covered


class _ChargedOnceCentral(CentralMode):
    """The mistake: i.i.d. central noise every round, charged once and then as covered by that charge."""

    name = "test-charged-once-central"

    def round_fn(self, cfg: RunConfig, plan: Any, transport: Transport, *, aggregator: Any = None,
                 log: Any = print) -> Any:
        from fedprivacy.accounting.events import ChargedAhead, PrivacyEvent
        from fedprivacy.fl.charging import before_release

        inner = super().round_fn(cfg, plan, transport, aggregator=aggregator, log=log)
        covered = PrivacyEvent(mechanism=ChargedAhead(covers=plan.event, horizon=cfg.num_server_rounds))
        seen: list[int] = []

        def round_(instr: Any, cohort: Sequence[int], weights: Sequence[np.ndarray], rng: RandomSource) -> Any:
            if seen:
                before_release(covered)  # the ledger takes it: the covered event is in it
            seen.append(1)
            return inner(instr, cohort, weights, rng)

        return round_


def test_a_round_charged_as_covered_without_a_later_correlated_draw_is_refused(tmp_path: Path) -> None:
    # Arrange: the accountant alone would take the zero-loss charge (the covered event is in the ledger)
    cfg = _cfg(tmp_path, privacy="central")
    run = FederatedRun(cfg, population=N, exchange=local_exchange(cfg, population=N), mode=_ChargedOnceCentral(),
                       callbacks=[], log=lambda _: None)
    run.step()
    after_one = [w.copy() for w in run.weights]
    # Act / Assert: round 2's independent noise is not a draw of a stream its charge covered
    with pytest.raises(MechanismMismatch, match="later draw"):
        run.step()
    assert all(np.array_equal(a, b) for a, b in zip(after_one, run.weights, strict=True))
    assert len(run.records) == 1
