"""Robust aggregation rules: their declared sensitivities hold against an adversarial search, the
noise scales with them so ε is the plain mean's, a rule that declares none cannot carry a central
release, they follow Flower's own rules on the same updates, and they resist scaled and flipped
updates where the plain mean does not."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.server.strategy.aggregate import aggregate_krum, aggregate_median, aggregate_trimmed_avg
from hypothesis import given, settings
from hypothesis import strategies as st

from fedprivacy.config import RunConfig
from fedprivacy.dp.rng import RandomSource
from fedprivacy.errors import ConfigError
from fedprivacy.fl.aggregation import PlainAggregator
from fedprivacy.fl.mechanisms import MechanismMismatch
from fedprivacy.fl.robust import CoordinateMedian, MultiKrum, TrimmedMean
from fedprivacy.fl.run import run_federated
from fedprivacy.fl.types import AggregateResult, ClientUpdate, ModelHooks, RoundInstructions

LIKE = [np.zeros(3, np.float32), np.zeros((2,), np.float32)]  # d = 5 in two arrays
RNG = RandomSource.seeded(0)


def _updates(rows: Sequence[np.ndarray], start: int = 0) -> list[ClientUpdate]:
    return [ClientUpdate(partition_id=start + i, delta=(r[:3].astype(np.float32), r[3:].astype(np.float32)),
                         num_examples=10, train_loss=0.0) for i, r in enumerate(rows)]


def _out(rule: Any, rows: Sequence[np.ndarray], denominator: float) -> np.ndarray:
    """The rule's output times its denominator: the sum scale its sensitivity ratio is stated on."""
    res = rule.aggregate(_updates(rows), like=LIKE, denominator=denominator, rng=RNG)
    return np.concatenate([np.asarray(a, np.float64).ravel() for a in res.mean_update]) * res.denominator


def _ball(data: st.DataObject, n: int, c: float) -> list[np.ndarray]:
    """n vectors of norm <= c, with mass on the ball's surface and on axes (where the bounds are tight)."""
    out = []
    for _ in range(n):
        v = np.array(data.draw(st.lists(st.floats(-1, 1), min_size=5, max_size=5)), np.float64)
        v = v / max(np.linalg.norm(v), 1e-12) * c * data.draw(st.sampled_from([1.0, 1.0, 0.5, 0.0]))
        out.append(v.astype(np.float32).astype(np.float64))
    return out


RULES = [lambda c: TrimmedMean(trim=1, clip_norm=c, noise_std=0.0),
         lambda c: TrimmedMean(trim=2, clip_norm=c, noise_std=0.0),
         lambda c: CoordinateMedian(clip_norm=c, noise_std=0.0),
         lambda c: MultiKrum(byzantine=1, select=2, clip_norm=c, noise_std=0.0),
         lambda c: MultiKrum(byzantine=0, select=1, clip_norm=c, noise_std=0.0)]


@settings(max_examples=150, deadline=None)
@given(data=st.data(), which=st.integers(0, len(RULES) - 1), n=st.integers(0, 8))
def test_no_neighbouring_pair_moves_a_rule_further_than_its_declared_ratio(data: st.DataObject, which: int,
                                                                          n: int) -> None:
    c, denominator = 1.0, 6.0
    rule = RULES[which](c)
    others = _ball(data, n, c)
    x, y = _ball(data, 2, c)
    # add-remove: with and without x; replace-one: x against y (the clipped sum moves by C and 2C)
    add = np.linalg.norm(_out(rule, [*others, x], denominator) - _out(rule, others, denominator))
    rep = np.linalg.norm(_out(rule, [*others, x], denominator) - _out(rule, [*others, y], denominator))
    assert add <= rule.sensitivity_ratio("add-remove") * c * (1 + 1e-5) + 1e-6
    assert rep <= rule.sensitivity_ratio("replace-one") * 2 * c * (1 + 1e-5) + 1e-6


def test_the_trimmed_sum_moves_further_than_the_sum_so_its_ratio_must_exceed_one() -> None:
    # four others, each C/sqrt(3) on three of four coordinates: every coordinate's 2nd smallest is
    # C/sqrt(3), so adding ANY x (here 0) moves the trimmed sum by ||(C/sqrt(3)) 1_4|| = 1.155 C > C
    c = 1.0
    others = [np.array([0.0 if j == i else c / math.sqrt(3) for j in range(4)] + [0.0]) for i in range(4)]
    rule = TrimmedMean(trim=2, clip_norm=c, noise_std=0.0)
    moved = np.linalg.norm(_out(rule, [*others, np.zeros(5)], 6.0) - _out(rule, others, 6.0))
    assert moved == pytest.approx(2 / math.sqrt(3), rel=1e-6)
    assert c < moved <= rule.sensitivity_ratio("add-remove") * c


@pytest.mark.parametrize("n", [5, 7, 10])
def test_the_rules_follow_flowers_on_the_same_updates(n: int) -> None:
    rows = [RandomSource.seeded(n).child(i).normal(std=0.1, size=5) for i in range(n)]
    ours = {"trimmed": TrimmedMean(trim=1, clip_norm=0.0, noise_std=0.0),
            "median": CoordinateMedian(clip_norm=0.0, noise_std=0.0),
            "krum": MultiKrum(byzantine=1, select=1, clip_norm=0.0, noise_std=0.0),
            "multikrum": MultiKrum(byzantine=1, select=3, clip_norm=0.0, noise_std=0.0)}
    results = [([r[:3].astype(np.float32), r[3:].astype(np.float32)], 10) for r in rows]
    flower = {"trimmed": aggregate_trimmed_avg(results, proportiontocut=1 / n),
              "median": aggregate_median(results), "krum": aggregate_krum(results, 1, 0),
              "multikrum": aggregate_krum(results, 1, 3)}
    for name, rule in ours.items():
        got = rule.aggregate(_updates(rows), like=LIKE, denominator=float(n), rng=RNG).mean_update
        for a, b in zip(got, flower[name], strict=True):
            np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=1e-5, atol=1e-7)


def test_robust_rules_resist_scaled_and_flipped_updates_that_move_the_mean() -> None:
    honest = [np.array([0.2, 0.1, 0.0, -0.1, 0.05]) + RandomSource.seeded(1).child(i).normal(std=0.01, size=5)
              for i in range(9)]
    attack = [-10.0 * honest[0]]  # one of ten: scaled x10 and sign-flipped, then re-clipped to C
    target = np.mean(honest, axis=0)
    err = {}
    for rule in (PlainAggregator(clip_norm=1.0, noise_std=0.0), TrimmedMean(trim=1, clip_norm=1.0, noise_std=0.0),
                 CoordinateMedian(clip_norm=1.0, noise_std=0.0),
                 MultiKrum(byzantine=1, select=5, clip_norm=1.0, noise_std=0.0)):
        res = rule.aggregate(_updates([*honest, *attack]), like=LIKE, denominator=10.0, rng=RNG)
        got = np.concatenate([np.asarray(a, np.float64).ravel() for a in res.mean_update])
        err[rule.name] = float(np.linalg.norm(got - target))
    assert err["plain"] > 0.05
    assert max(err["trimmed-mean"], err["median"], err["krum"]) < err["plain"] / 3


# ---------------------------------------------------------------------------- in a run
N, C = 8, 1.0
TARGETS = [RandomSource.seeded(4).child(p).normal(std=0.3, size=5) for p in range(N)]


def _exchange(instr: RoundInstructions, cohort: Sequence[int], weights: Sequence[np.ndarray]) -> Any:
    return [_updates([TARGETS[p]], start=p)[0] for p in cohort], {}


def _hooks() -> ModelHooks:
    return ModelHooks(init=lambda seed: [np.zeros(3, np.float32), np.zeros(2, np.float32)],
                      evaluate=lambda w: (float(sum(np.sum(np.asarray(a) ** 2) for a in w)), 0.5), num_classes=2)


def _cfg(tmp_path: Path, name: str, **kw: Any) -> RunConfig:
    return RunConfig.from_mapping({"output-dir": str(tmp_path), "run-name": name, "seed": 3, "privacy": "central",
                                   "secagg": False, "num-server-rounds": 2, "noise-multiplier": 1.0,
                                   "clip-norm": C, "sample-rate": 0.5, "target-delta": 1e-4, **kw})


class _Recording:
    """Wraps a rule and keeps what it released (the noise std and sensitivity of each round)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.seen = inner, inner.name, []

    def sensitivity_ratio(self, neighbouring: str) -> float:
        return float(self.inner.sensitivity_ratio(neighbouring))

    def aggregate(self, updates: Any, **kw: Any) -> AggregateResult:
        res = self.inner.aggregate(updates, **kw)
        self.seen.append(res)
        return res


def test_a_robust_rule_in_central_mode_adds_noise_scaled_to_its_sensitivity_and_keeps_the_epsilon(
        tmp_path: Path) -> None:
    plain = run_federated(_cfg(tmp_path, "plain"), population=N, exchange=_exchange, hooks=_hooks(),
                          log=lambda _: None)
    trimmed = run_federated(_cfg(tmp_path, "trimmed", aggregation="trimmed-mean", **{"aggregation-trim": 1}),
                            population=N, exchange=_exchange, hooks=_hooks(), log=lambda _: None)
    rec = _Recording(CoordinateMedian(clip_norm=C, noise_std=1.0 * C * 2 * math.sqrt(2)))
    median = run_federated(_cfg(tmp_path, "median"), population=N, exchange=_exchange, hooks=_hooks(),
                           log=lambda _: None, aggregator=rec)
    # the same Gaussian event (multiplier z on each rule's own sensitivity): the same ε
    assert trimmed["privacy"]["epsilon"] == plain["privacy"]["epsilon"] > 0
    assert median["privacy"]["epsilon"] == plain["privacy"]["epsilon"]
    assert [r.noise_std for r in rec.seen] == [pytest.approx(2 * math.sqrt(2) * C)] * 2


class _Undeclared:
    name = "my-median"

    def aggregate(self, updates: Any, **kw: Any) -> AggregateResult:
        return CoordinateMedian(clip_norm=C, noise_std=C).aggregate(updates, **kw)


def test_a_rule_that_declares_no_sensitivity_cannot_carry_a_central_release(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="declares no sensitivity_ratio"):
        run_federated(_cfg(tmp_path, "undeclared"), population=N, exchange=_exchange, hooks=_hooks(),
                      log=lambda _: None, aggregator=_Undeclared())
    assert not (tmp_path / "undeclared" / "results.json").exists()


def test_a_rule_whose_noise_is_short_of_its_declared_sensitivity_is_refused_before_release(tmp_path: Path) -> None:
    short = CoordinateMedian(clip_norm=C, noise_std=1.0 * C)  # the mean's noise on a 2.83x more sensitive rule
    with pytest.raises(MechanismMismatch, match="sensitivity ratio 2.828"):
        run_federated(_cfg(tmp_path, "short"), population=N, exchange=_exchange, hooks=_hooks(),
                      log=lambda _: None, aggregator=short)


@pytest.mark.parametrize(("kw", "key"), [
    ({"aggregation": "median", "secagg": True, "privacy": "distributed"}, "aggregation='median' with secagg=true"),
    ({"aggregation": "krum", "adaptive-clip": True, "adaptive-clip-count-std": 1.0}, "with adaptive-clip=true"),
    ({"aggregation-trim": 2}, "aggregation-trim=2 is read only by aggregation='trimmed-mean'"),
    ({"aggregation": "krum", "krum-select": 0}, "krum-select must be >= 1"),
    ({"aggregation": "mode"}, "aggregation must be one of"),
])
def test_bad_aggregation_settings_are_refused_naming_the_key(tmp_path: Path, kw: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace("(", r"\(").replace(")", r"\)")):
        _cfg(tmp_path, "bad", **kw)


def test_a_trim_that_leaves_nothing_is_refused_before_round_one(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="aggregation-trim=2 cuts 2x2 of an expected cohort of 4"):
        run_federated(_cfg(tmp_path, "trim", aggregation="trimmed-mean", **{"aggregation-trim": 2}),
                      population=N, exchange=_exchange, hooks=_hooks(), log=lambda _: None)
    assert not (tmp_path / "trim" / "results.json").exists()


# ---------------------------------------------------------------------------- q-FedAvg (no DP)
def test_qfedavg_takes_flowers_step_on_the_same_updates() -> None:
    from flwr.serverapp.strategy.qfedavg import compute_delta_and_h

    from fedprivacy.fl.robust import QFedAvg

    g = [np.array([0.5, -0.2, 0.1], np.float64), np.array([0.3, 0.0], np.float64)]
    rows = [RandomSource.seeded(8).child(i).normal(std=0.05, size=5) for i in range(6)]
    losses = [0.2, 1.5, 0.7, 3.0, 0.05, 1.0]
    updates = [ClientUpdate(partition_id=i, delta=(r[:3].astype(np.float32), r[3:].astype(np.float32)),
                            num_examples=10, train_loss=loss) for i, (r, loss) in enumerate(zip(rows, losses, strict=True))]
    for q, lr in ((0.1, 0.3), (1.0, 0.05), (0.0, 0.1)):
        ours = QFedAvg(q=q, client_learning_rate=lr, clip_norm=0.0).aggregate(updates, like=LIKE, denominator=6.0,
                                                                                  rng=RNG)
        sum_delta, sum_h = None, 0.0
        for u in updates:  # Flower's rule on the local weights w + Δ
            local = [gw + np.asarray(d, np.float64) for gw, d in zip(g, u.delta, strict=True)]
            delta, h = compute_delta_and_h([a.copy() for a in g], local, q, 1.0 / lr, float(u.train_loss or 0))
            sum_delta = delta if sum_delta is None else [a + b for a, b in zip(sum_delta, delta, strict=True)]
            sum_h += h
        assert sum_delta is not None
        flower_next = [gw - d / sum_h for gw, d in zip(g, sum_delta, strict=True)]
        for gw, step, want in zip(g, ours.mean_update, flower_next, strict=True):
            np.testing.assert_allclose(gw + np.asarray(step, np.float64), want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("privacy", ["central", "local"])
def test_qfedavg_with_dp_is_refused_naming_why(tmp_path: Path, privacy: str) -> None:
    with pytest.raises(ConfigError, match=f"aggregation='qfedavg' with privacy='{privacy}' is refused"):
        _cfg(tmp_path, "q", aggregation="qfedavg", privacy=privacy)


def test_a_qfedavg_run_without_dp_completes_on_the_real_engine(tmp_path: Path) -> None:
    from server.engine import run_inprocess

    cfg = {"num-server-rounds": 2, "seed": 2, "local-epochs": 1, "dataset": "digits", "privacy": "none",
           "secagg": False, "aggregation": "qfedavg", "qffl-q": 0.5, "output-dir": str(tmp_path), "run-name": "q"}
    run_inprocess(run_config=cfg, num_supernodes=5, app_dir=Path(__file__).resolve().parents[2], node_id_seed=3)
    import json

    rounds = json.loads((tmp_path / "q" / "results.json").read_text(encoding="utf-8"))["rounds"]
    assert len(rounds) == 2 and all(math.isfinite(r["test_loss"]) for r in rounds)


def test_a_rules_own_key_is_accepted_for_that_rule_only(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "q", aggregation="qfedavg", privacy="none", **{"qffl-q": 0.05, "noise-multiplier": 0.0})
    assert cfg.qffl_q == 0.05
    with pytest.raises(ConfigError, match="qffl-q=0.05 is read only by aggregation='qfedavg'"):
        _cfg(tmp_path, "q", **{"qffl-q": 0.05})
    with pytest.raises(ConfigError, match="qffl-q must be >= 0.0"):
        _cfg(tmp_path, "q", aggregation="qfedavg", privacy="none", **{"qffl-q": -1.0, "noise-multiplier": 0.0})
