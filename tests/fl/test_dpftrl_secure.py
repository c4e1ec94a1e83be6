"""privacy = "dpftrl" over secure aggregation: the correlated noise on the unmasked sum against C^{-1} z
recomputed densely, the horizon charged at the first release, the ε against plain dpftrl's and the matrix
mechanism's own, and the sample-rate refusal."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedprivacy.accounting.events import ChargedAhead
from fedprivacy.config import RunConfig
from fedprivacy.dp.matrix import MatrixMechanism, MinSeparation, Workload, bsr
from fedprivacy.dp.rng import RandomSource
from fedprivacy.errors import ConfigError
from fedprivacy.fl.modes import Transport, get_mode
from fedprivacy.fl.secure import make_encoding
from fedprivacy.fl.types import RoundOutcome
from server.engine import run_inprocess
from tests.fl.test_secure_round import DirectTransport, _clipped_sum, _instr, _updates

APP_DIR = Path(__file__).resolve().parents[2]
DELTA = 1e-5


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _setup(n: int, dim: int, rounds: int, band: int) -> tuple[RunConfig, Any, Any, dict, list[np.ndarray]]:
    cfg = RunConfig(privacy="dpftrl", secagg=True, clip_norm=0.5, num_server_rounds=rounds, noise_multiplier=1.5,
                    dpftrl_band=band, dpftrl_groups=1, target_delta=DELTA)
    like = [np.zeros(dim, np.float32)]
    updates = _updates(n, like)
    mode = get_mode("dpftrl")
    plan = mode.plan(cfg, population=n, dim=dim)
    round_fn = mode.round_fn(cfg, plan, Transport(secure=DirectTransport(cfg, updates)), log=lambda _: None)
    return cfg, plan, round_fn, updates, like


def _encoding(cfg: RunConfig, strategy: Any, sens: float, *, n: int, dim: int, threshold: int) -> Any:
    """The encoding whose scale leaves room for the largest round's noise, ``z sens max_t |(C^{-1})_t|``."""
    rows = float(np.max(np.linalg.norm(np.linalg.inv(strategy.matrix()), axis=1)))
    return make_encoding(cfg, population=n, dim=dim, threshold=threshold,
                         server_noise_multiplier=cfg.noise_multiplier * sens * rows)


def _added(outcome: RoundOutcome, updates: dict, plan: Any) -> np.ndarray:
    """The released sum minus the survivors' exact clipped sum: the server's noise (real units)."""
    got = np.concatenate([a.astype(np.float64).ravel() for a in outcome.aggregate.mean_update]) * plan.denominator
    return got - _clipped_sum(updates, outcome.aggregate.aggregated, 0.5)


def test_the_noise_on_the_unmasked_sum_is_c_inverse_z_with_the_encodings_bound() -> None:
    # Arrange: 6 clients, every client every round (one group), band 3 over 4 rounds, real client steps
    n, dim, rounds = 6, 3000, 4
    cfg, plan, round_fn, updates, like = _setup(n, dim, rounds, band=3)
    # Act: the stream is seeded by the first round's source
    outcomes = [round_fn(_instr(t, privacy="dpftrl"), list(range(n)), like, RandomSource.seeded(7 if t == 1 else t))
                for t in range(1, rounds + 1)]
    # Assert: w = C^{-1} Z recomputed densely from the same source, innovations of std z sens Delta
    strategy = bsr(Workload(num_rounds=rounds), 3)
    sens = float(np.linalg.norm(strategy.matrix() @ np.ones(rounds)))  # C >= 0, every round: |C 1|
    enc = _encoding(cfg, strategy, sens, n=n, dim=dim, threshold=round_fn.threshold)
    bound = 0.5 + math.sqrt(dim) / enc.scale
    std = 1.5 * sens * bound
    source = RandomSource.seeded(7).child("dpftrl-noise")
    z = np.stack([np.asarray(source.normal(std=std * enc.scale, size=dim)) for _ in range(rounds)])
    expected = np.linalg.solve(strategy.matrix(), z) / enc.scale
    added = np.stack([_added(o, updates, plan) for o in outcomes])
    # stochastic rounding moves each of the n inputs by < 1/s; float32 weights by < 1e-6 relative
    assert np.allclose(added, expected, rtol=1e-6, atol=n / enc.scale)
    assert float(np.std(strategy.matrix() @ added)) == pytest.approx(std, rel=0.05)
    for t, o in enumerate(outcomes, start=1):
        agg = o.aggregate
        assert agg.noise_std == pytest.approx(std, rel=1e-12)
        assert agg.sensitivity_ratio == pytest.approx(bound / 0.5, rel=1e-12) and agg.sensitivity_ratio > 1.0
        assert agg.correlated_draw is not None and agg.correlated_draw.index == t
        assert agg.correlated_draw.covers == plan.event
    # the horizon's event at round 1, then the zero-loss charge that it covers
    assert outcomes[0].event == plan.event
    assert all(isinstance(o.event.mechanism, ChargedAhead) and o.event.mechanism.covers == plan.event
               for o in outcomes[1:])
    assert plan.central_noise_std == pytest.approx(1.5 * sens * 0.5, rel=1e-12)  # what the plan charged per C


def test_an_aborted_first_round_moves_the_horizon_charge_and_leaves_its_draw_unreleased() -> None:
    # Arrange: round 1's cohort is below the threshold (it aborts before anything is sent)
    n, dim, rounds = 6, 500, 3
    cfg, plan, round_fn, updates, like = _setup(n, dim, rounds, band=2)
    # Act
    first = round_fn(_instr(1, privacy="dpftrl"), [0, 1], like, RandomSource.seeded(3))
    second = round_fn(_instr(2, privacy="dpftrl"), list(range(n)), like, RandomSource.seeded(4))
    third = round_fn(_instr(3, privacy="dpftrl"), list(range(n)), like, RandomSource.seeded(5))
    # Assert: round 2 is the first release and charges the horizon; its noise is draw 2 of the stream
    assert first.aborted is not None and first.event is None
    assert second.event == plan.event and isinstance(third.event.mechanism, ChargedAhead)
    assert [second.aggregate.correlated_draw.index, third.aggregate.correlated_draw.index] == [2, 3]
    strategy = bsr(Workload(num_rounds=rounds), 2)
    sens = float(np.linalg.norm(strategy.matrix() @ np.ones(rounds)))
    enc = _encoding(cfg, strategy, sens, n=n, dim=dim, threshold=round_fn.threshold)
    source = RandomSource.seeded(4).child("dpftrl-noise")
    z = np.stack([np.asarray(source.normal(std=second.aggregate.noise_std * enc.scale, size=dim))
                  for _ in range(rounds)])
    expected = np.linalg.solve(strategy.matrix(), z) / enc.scale
    added = np.stack([_added(o, updates, plan) for o in (second, third)])
    assert np.allclose(added, expected[1:], rtol=1e-6, atol=n / enc.scale)
    with pytest.raises(ValueError, match="cannot take a draw"):  # a round's draw is never reused
        round_fn(_instr(3, privacy="dpftrl"), list(range(n)), like, RandomSource.seeded(6))


def _run(tmp_path: Path, name: str, **overrides: object) -> dict:
    run_config = {"num-server-rounds": 4, "seed": 2, "output-dir": str(tmp_path), "run-name": name,
                  "local-epochs": 1, "privacy": "dpftrl", "secagg": True, "noise-multiplier": 1.5,
                  "dpftrl-band": 2, "dpftrl-groups": 2, "sample-rate": 1.0, "target-delta": DELTA, **overrides}
    run_inprocess(run_config=run_config, num_supernodes=12, app_dir=APP_DIR, node_id_seed=3)
    return json.loads((tmp_path / name / "results.json").read_text())


def test_the_secure_runs_epsilon_against_observers_is_plain_dpftrls(tmp_path: Path) -> None:
    # Act: real ClientApps and SecureRound on the in-process engine; the same run without secure aggregation
    secure = _run(tmp_path, "secure")
    plain = _run(tmp_path, "plain", secagg=False)
    # Assert: the matrix mechanism's own ε (dp-accounting), the same as plain dpftrl's, every round
    mm = MatrixMechanism(strategy=bsr(Workload(num_rounds=4), 2),
                         schema=MinSeparation(min_separation=2, max_participations=2), noise_multiplier=1.5)
    assert secure["status"] == "completed" and len(secure["rounds"]) == 4
    assert [r["epsilon"] for r in secure["rounds"]] == pytest.approx([mm.epsilon(DELTA)] * 4, rel=1e-6)
    assert secure["privacy"]["epsilon"] == pytest.approx(plain["privacy"]["epsilon"], rel=1e-12)
    assert secure["privacy"]["correlated"] == plain["privacy"]["correlated"]
    assert "torus" in secure["privacy"]["mechanism"]
    private = {"clients_sampled", "clients_aggregated", "secagg_survivors", "secagg_roster", "secagg_degree",
               "secagg_max_abs_error", "noise_std_sum", "seconds", "train_loss"}
    assert all(not (private & set(row)) for row in secure["rounds"])
    report = (tmp_path / "secure" / "privacy_report.md").read_text()
    assert "Against the server: no differential privacy" in report


def test_poisson_sampling_within_groups_over_secure_aggregation_is_refused_naming_sample_rate() -> None:
    with pytest.raises(ConfigError, match="sample-rate") as info:
        RunConfig.from_mapping({"privacy": "dpftrl", "secagg": True, "sample-rate": 0.5, "dpftrl-groups": 2,
                                "dpftrl-band": 2, "noise-multiplier": 1.0, "num-server-rounds": 4})
    assert "\n" not in str(info.value) and "completed is public" in str(info.value)


def test_a_secure_round_whose_stream_is_below_the_plans_std_is_refused_before_it_is_applied() -> None:
    # Arrange: the plan's mechanism, and a stream at half its innovations' multiplier
    from fedprivacy.fl.mechanisms import MechanismMismatch, check_release
    from fedprivacy.fl.modes.dpftrl_secure import server_noise
    from fedprivacy.fl.secure import SecureRound
    from fedprivacy.fl.secure.noise import CorrelatedSumNoise

    n, dim = 6, 200
    cfg, plan, honest_fn, updates, like = _setup(n, dim, 2, band=2)
    honest = server_noise(plan, num_rounds=2)
    half = CorrelatedSumNoise(honest.strategy, innovation_multiplier=honest.innovation_multiplier / 2,
                              horizon=honest.horizon, covered=honest.covered)
    stingy = SecureRound(cfg, DirectTransport(cfg, updates), population=n, log=lambda _: None, server_noise=half,
                         denominator=plan.denominator)
    mode = get_mode("dpftrl")
    # Act
    ok = honest_fn(_instr(1, privacy="dpftrl"), list(range(n)), like, RandomSource.seeded(1))
    low = stingy(_instr(1, privacy="dpftrl"), list(range(n)), like, RandomSource.seeded(1))
    # Assert: the honest round passes the run's check, the stingy one is refused
    check_release(mode, plan, ok, charged=plan.event)
    with pytest.raises(MechanismMismatch, match="noise std"):
        check_release(mode, plan, low, charged=plan.event)
