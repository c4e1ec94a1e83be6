"""privacy = "central" over secure aggregation: the server's noise on the unmasked sum, on the torus; the
ε against observers from independent references; the clients' refusals; the published rows."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize, stats

from fedprivacy.config import RunConfig
from fedprivacy.dp.rng import RandomSource
from fedprivacy.fl.client_policy import ClientPolicy, PolicyRefusal
from fedprivacy.fl.secure import SecureRound, make_encoding
from fedprivacy.secagg.quantize import from_ring, to_ring, torus_noised
from server.engine import run_inprocess
from tests.fl.test_secure_round import DirectTransport, _clipped_sum, _instr, _updates

APP_DIR = Path(__file__).resolve().parents[2]
DELTA = 1e-5


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _gaussian_epsilon(mu: float, delta: float) -> float:
    """The exact ε of a Gaussian mechanism with sensitivity/std ``mu`` (Balle & Wang 2018, Theorem 8)."""
    def excess(eps: float) -> float:
        return float(stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)) - delta

    return float(optimize.brentq(excess, 0.0, 200.0, xtol=1e-12))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, (1 << 20) - 1), min_size=1, max_size=8), st.data())
def test_one_inputs_contribution_moves_the_torus_release_by_exactly_its_encoding(total: list[int],
                                                                                data: st.DataObject) -> None:
    # Arrange: any other inputs (their ring sum anywhere, next to the wrap included) and one input's encoding
    bits, m = 20, float(1 << 20)
    others = np.asarray(total, dtype=np.uint32)
    e = np.asarray(data.draw(st.lists(st.integers(-4000, 4000), min_size=len(total), max_size=len(total))))
    noise = np.asarray(data.draw(st.lists(st.floats(-1e4, 1e4), min_size=len(total), max_size=len(total))))
    with_e = to_ring(from_ring(others, modulus_bits=bits) + e, modulus_bits=bits)
    # Act
    a, b = torus_noised(others, noise, modulus_bits=bits), torus_noised(with_e, noise, modulus_bits=bits)
    # Assert: b - a is e on the torus (the release is a function of (S + Z) mod 2^b), and lies in its range
    shift = np.mod(b - a - e + m / 2, m) - m / 2
    assert np.allclose(shift, 0.0, atol=1e-6)
    assert np.all(a >= -m / 2) and np.all(a < m / 2)


def _secure_round(cfg: RunConfig, n: int, like: list[np.ndarray], z: float) -> tuple[SecureRound, dict]:
    updates = _updates(n, like)
    return SecureRound(cfg, DirectTransport(cfg, updates), population=n, log=lambda _: None,
                       central_noise_multiplier=z), updates


def test_the_server_adds_z_times_the_encodings_bound_to_the_exact_sum() -> None:
    # Arrange: 8 clients, a 12,000-parameter model, z = 1.3
    z, n = 1.3, 8
    cfg = RunConfig(privacy="central", secagg=True, clip_norm=0.5, num_server_rounds=1, noise_multiplier=z)
    like = [np.zeros((200, 50), np.float32), np.zeros(2000, np.float32)]
    rnd, updates = _secure_round(cfg, n, like, z)
    # Act
    outcome = rnd(_instr(privacy="central"), list(range(n)), like, RandomSource.seeded(5))
    # Assert: std z (C + sqrt(d)/s) of noise on the clipped sum, declared with its sensitivity ratio
    enc = make_encoding(cfg, population=n, dim=12_000, threshold=rnd.threshold)
    bound = 0.5 + math.sqrt(12_000) / enc.scale
    agg = outcome.aggregate
    assert agg.noise_std == pytest.approx(z * bound, rel=1e-12)
    assert agg.sensitivity_ratio == pytest.approx(bound / 0.5, rel=1e-12) and agg.sensitivity_ratio > 1.0
    got = np.concatenate([a.astype(np.float64).ravel() for a in agg.mean_update]) * rnd.denominator
    noise = got - _clipped_sum(updates, range(n), 0.5)
    # 12,000 draws: the sample std is within 3% of sigma with probability > 1 - 1e-9 (chi-square)
    lo, hi = (math.sqrt(stats.chi2.ppf(p, 12_000) / 12_000) for p in (1e-10, 1 - 1e-10))
    assert lo * z * bound * 0.999 <= float(np.std(noise)) <= hi * z * bound * 1.001
    assert outcome.event is None  # the plan's event, charged before the unmask stage


def test_a_client_that_trusts_no_server_with_its_noise_refuses_the_fixed_point_encoding() -> None:
    # Arrange: a central round over secure aggregation, the real client steps in this process
    cfg = RunConfig(privacy="central", secagg=True, clip_norm=0.5, num_server_rounds=1, noise_multiplier=1.0)
    like = [np.zeros(40, np.float32)]
    central_ok = ClientPolicy.for_simulation(cfg, colluders=0, schedule=cfg.secagg_schedule)
    distributed_only = ClientPolicy.resolve({"client-privacy-modes": "distributed"}, {})

    def round_with(policy: ClientPolicy, client_cfg: RunConfig) -> object:
        transport = DirectTransport(client_cfg, _updates(6, like))
        transport.policy = policy
        rnd = SecureRound(cfg, transport, population=6, log=lambda _: None, central_noise_multiplier=1.0)
        return rnd(_instr(privacy="central"), list(range(6)), like, RandomSource.seeded(1))

    # Act / Assert: a client that takes part in central accepts; one that wants client-side noise refuses
    assert round_with(central_ok, cfg).aborted is None  # type: ignore[attr-defined]
    with pytest.raises(PolicyRefusal, match="central"):
        round_with(distributed_only, cfg)
    # a server whose instructions and run config name different modes is refused
    with pytest.raises(PolicyRefusal, match="run config"):
        round_with(central_ok, cfg.replace(privacy="none", noise_multiplier=0.0))


def _run(tmp_path: Path, name: str, **overrides: object) -> dict:
    run_config = {"num-server-rounds": 3, "seed": 2, "output-dir": str(tmp_path), "run-name": name,
                  "local-epochs": 1, "privacy": "central", "secagg": True, "noise-multiplier": 1.0,
                  "target-delta": DELTA, **overrides}
    run_inprocess(run_config=run_config, num_supernodes=12, app_dir=APP_DIR, node_id_seed=3)
    return json.loads((tmp_path / name / "results.json").read_text())


def test_every_client_every_round_is_the_composed_gaussian(tmp_path: Path) -> None:
    # Act: real ClientApps and SecureRound on the in-process engine, q = 1 (no amplification)
    got = _run(tmp_path, "all", **{"sample-rate": 1.0})
    # Assert: 3 Gaussians of multiplier 1 are one of multiplier 1/sqrt(3): the exact ε, from above
    exact = _gaussian_epsilon(math.sqrt(3.0), DELTA)
    eps = got["privacy"]["epsilon"]
    assert exact <= eps <= exact * 1.01
    assert got["status"] == "completed" and len(got["rounds"]) == 3
    assert "torus" in got["privacy"]["mechanism"] and got["privacy"]["accountant_claim"]["steps"] == 3
    # removing a client would change whether a round completes: only zero-out is claimed
    assert got["privacy"]["adjacency"].startswith("zero-out")


def test_sampled_rounds_are_amplified_less_than_central_because_completion_is_public(tmp_path: Path) -> None:
    # Act: the same sampled run in central mode without and with secure aggregation
    secure = _run(tmp_path, "secure", **{"sample-rate": 0.5})
    plain = _run(tmp_path, "plain", **{"sample-rate": 0.5, "secagg": False})
    # Assert: between plain central's amplified ε and the unamplified Gaussian's
    eps = secure["privacy"]["epsilon"]
    exact = _gaussian_epsilon(math.sqrt(3.0), DELTA)
    assert plain["privacy"]["epsilon"] < eps < exact
    assert secure["privacy"]["accountant_claim"]["mechanism"] == "completed_round_gaussian"
    # the completion pair is proved for zero-out only; a participant sees rosters: unamplified for it
    assert secure["privacy"]["adjacency"].startswith("zero-out")
    assert exact <= secure["privacy"]["participants_epsilon"] <= exact * 1.01
    # nothing published depends on the round's counts
    private = {"clients_sampled", "clients_aggregated", "secagg_survivors", "secagg_roster", "secagg_degree",
               "secagg_max_abs_error", "noise_std_sum", "seconds", "train_loss"}
    assert all(not (private & set(row)) for row in secure["rounds"])
    report = (tmp_path / "secure" / "privacy_report.md").read_text()
    assert "Against the server: no differential privacy" in report


def test_a_fixed_cohort_run_that_loses_a_client_voids_its_amplification(tmp_path: Path) -> None:
    from server.engine.faults import FaultPlan, FaultRule

    # Arrange: fixed cohorts of 6 of 12 (replace-one); partition 0 never answers its masked-input message
    faults = FaultPlan(rules=(FaultRule(action="drop", message_type="train.secagg_masked", partition_ids=(0,)),))
    cfg = {"num-server-rounds": 3, "seed": 2, "output-dir": str(tmp_path), "run-name": "lost", "local-epochs": 1,
           "privacy": "central", "secagg": True, "noise-multiplier": 1.0, "target-delta": DELTA,
           "sampling": "fixed", "cohort-size": 6, "neighbouring": "replace-one", "client-timeout": 20.0}
    # Act
    run_inprocess(run_config=cfg, num_supernodes=12, app_dir=APP_DIR, node_id_seed=3, faults=faults)
    got = json.loads((tmp_path / "lost" / "results.json").read_text())
    # Assert: once a sampled client is lost, the ledger holds the unamplified Gaussian for every release
    p = got["privacy"]
    releases = p["rounds"]
    unamplified = _gaussian_epsilon(2.0 * math.sqrt(releases) / 1.0, DELTA)  # replace-one: sensitivity 2
    assert releases >= 1 and p["epsilon"] >= unamplified * 0.999


def test_a_plan_charging_another_completion_pair_than_the_runs_is_refused() -> None:
    import dataclasses

    from fedprivacy.fl.mechanisms import MechanismMismatch
    from fedprivacy.fl.modes import get_mode, plan_privacy

    # Arrange: a sampled central run over secure aggregation, and a copy of central whose plan claims
    # the public's pair at a lower sampling rate than the run's
    cfg = RunConfig(privacy="central", secagg=True, clip_norm=0.5, num_server_rounds=2, noise_multiplier=1.0,
                    sample_rate=0.5)
    honest = plan_privacy(cfg, population=20, dim=100)
    assert honest.event is not None

    class Optimistic(type(get_mode("central"))):  # type: ignore[misc]
        name = "test-optimistic-central"

        def plan(self, cfg: RunConfig, *, population: int, dim: int | None = None) -> object:
            plan = super().plan(cfg, population=population, dim=dim)
            mech = dataclasses.replace(plan.event.mechanism, sample_rate=0.05)
            return dataclasses.replace(plan, event=dataclasses.replace(plan.event, mechanism=mech))

    # Act / Assert
    with pytest.raises(MechanismMismatch, match="charges"):
        plan_privacy(cfg, population=20, dim=100, mode=Optimistic())
