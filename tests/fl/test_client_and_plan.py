"""Client-side clipping/noise and the privacy plan (events, calibration, refusals)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fedprivacy.accounting import GaussianEvent, NoSampling, PoissonSampling, epsilon_for
from fedprivacy.accounting.events import FixedCohortSampling
from fedprivacy.config import RunConfig
from fedprivacy.dp.rng import RandomSource
from fedprivacy.fl.client import client_rng, privatize_update
from fedprivacy.fl.mechanisms import GAUSSIAN
from fedprivacy.fl.modes import plan_privacy
from fedprivacy.fl.privacy import make_accountant
from fedprivacy.fl.types import RoundInstructions


@settings(max_examples=60, deadline=None)
@given(a=arrays(np.float64, 5, elements=st.floats(-1e6, 1e6)), b=arrays(np.float64, (2, 3), elements=st.floats(-1e6, 1e6)),
       c=st.floats(1e-3, 100))
def test_clipped_update_norm_is_at_most_c(a: np.ndarray, b: np.ndarray, c: float) -> None:
    out = privatize_update([a, b], clip_norm=c, mechanism=None, noise_multiplier=0.0, private=True,
                           rng=RandomSource.seeded(0))
    norm = np.sqrt(sum(np.sum(x**2) for x in out))
    assert norm <= c * (1 + 1e-9)
    if np.sqrt(np.sum(a**2) + np.sum(b**2)) <= c:
        np.testing.assert_array_equal(out[0], a)  # small updates pass unchanged


def test_local_mode_adds_noise_of_the_stated_std() -> None:
    delta = [np.zeros(100_000)]
    out = privatize_update(delta, clip_norm=1.0, mechanism=GAUSSIAN, noise_multiplier=0.3, private=True, rng=RandomSource.seeded(1))
    assert out[0].std() == pytest.approx(0.3, rel=0.01)


def test_non_finite_update_is_not_released_without_privacy() -> None:
    with pytest.raises(ValueError, match="NaN"):
        privatize_update([np.array([1.0, np.nan])], clip_norm=1.0, mechanism=None, noise_multiplier=0.0, private=False,
                         rng=RandomSource.seeded(0))


def test_a_diverged_update_in_central_mode_is_a_zero_update() -> None:
    # a failure would reach the published console and stop reason (a data-dependent bit)
    out = privatize_update([np.array([1.0, np.inf, 2.0])], clip_norm=1.0, mechanism=None, noise_multiplier=0.0, private=True,
                           rng=RandomSource.seeded(0))
    np.testing.assert_array_equal(out[0], np.zeros(3))


@settings(max_examples=25, deadline=None)
@given(bad=st.sampled_from([np.nan, np.inf, -np.inf]), where=st.integers(0, 5), seed=st.integers(0, 2**31 - 1))
def test_a_diverged_update_in_local_mode_is_released_as_a_zero_update(bad: float, where: int, seed: int) -> None:
    # The server (the adversary in local / distributed mode) must not learn that training diverged:
    # the reply is bit-identical to the one of a client whose update is 0, noise included.
    diverged = [np.arange(6.0)]
    diverged[0][where] = bad
    got = privatize_update(diverged, clip_norm=1.0, mechanism=GAUSSIAN, noise_multiplier=0.5, private=True, rng=RandomSource.seeded(seed))
    zero = privatize_update([np.zeros(6)], clip_norm=1.0, mechanism=GAUSSIAN, noise_multiplier=0.5, private=True,
                            rng=RandomSource.seeded(seed))
    np.testing.assert_array_equal(got[0], zero[0])
    assert np.isfinite(got[0]).all()


def test_client_randomness_derives_from_seed_partition_and_round() -> None:
    a = client_rng(seed=3, partition_id=2, round=5).uniform(size=4)
    b = client_rng(seed=3, partition_id=2, round=5).uniform(size=4)
    c = client_rng(seed=3, partition_id=2, round=6).uniform(size=4)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert client_rng(seed=-1, partition_id=0, round=1).mode == "secure"


def test_round_instructions_round_trip_through_a_flat_record() -> None:
    instr = RoundInstructions(round=3, privacy="local", clip_norm=1.0, client_mechanism="gaussian", noise_multiplier=0.5, private=True, learning_rate=0.1,
                              local_epochs=2, batch_size=16, num_classes=10, seed=-1)
    assert RoundInstructions.from_record(instr.to_record()) == instr
    with pytest.raises(ValueError, match="noise_multiplier > 0"):
        RoundInstructions(round=1, privacy="local", clip_norm=1.0, client_mechanism="gaussian", noise_multiplier=0.0, private=True, learning_rate=0.1,
                          local_epochs=1, batch_size=1, num_classes=2, seed=0)


def test_central_plan_accounts_poisson_sampling_that_runs() -> None:
    cfg = RunConfig(privacy="central", noise_multiplier=1.1, sample_rate=0.1, clip_norm=2.0)
    plan = plan_privacy(cfg, population=1000)
    assert plan.denominator == pytest.approx(100.0)
    assert plan.central_noise_std == pytest.approx(2.2) and plan.local_noise_std == 0.0
    assert plan.event.sampling == PoissonSampling(rate=0.1)
    assert plan.event.mechanism == GaussianEvent(noise_multiplier=1.1)
    acc = make_accountant(cfg, plan)
    acc.spend(plan.event, round=1)
    assert acc.epsilon(delta=1e-5) == pytest.approx(
        epsilon_for(noise_multiplier=1.1, sample_rate=0.1, steps=1, delta=1e-5), abs=1e-9)


def test_fixed_cohort_plan_is_without_replacement_under_replace_one() -> None:
    cfg = RunConfig(sampling="fixed", cohort_size=10, neighbouring="replace-one", noise_multiplier=1.0)
    plan = plan_privacy(cfg, population=100)
    assert plan.event.sampling == FixedCohortSampling(cohort=10, population=100)
    assert plan.neighbouring == "replace-one" and plan.denominator == 10.0


def test_local_plan_has_no_amplification_and_replace_one() -> None:
    plan = plan_privacy(RunConfig(privacy="local", noise_multiplier=2.0, clip_norm=1.0, sample_rate=0.2),
                        population=50)
    assert plan.event.sampling == NoSampling() and plan.neighbouring == "replace-one"
    assert plan.local_noise_std == 2.0 and plan.central_noise_std == 0.0


def test_calibrated_sigma_meets_the_target() -> None:
    # rdp without sampling keeps this fast; the PLD path is the same call with another backend name
    cfg = RunConfig(noise_multiplier=0.0, target_epsilon=3.0, sample_rate=1.0, num_server_rounds=5,
                    accountant="rdp")
    plan = plan_privacy(cfg, population=100)
    assert plan.calibrated and plan.noise_multiplier > 0
    eps = epsilon_for(noise_multiplier=plan.noise_multiplier, sample_rate=1.0, steps=5, delta=1e-5,
                      backend="rdp")
    assert 2.9 < eps <= 3.0 + 1e-9


@pytest.mark.parametrize(
    ("cfg", "population", "dim", "key"),
    [
        (RunConfig(target_delta=0.2), 10, None, "target-delta"),
        (RunConfig(sampling="fixed", cohort_size=11, neighbouring="replace-one"), 10, None, "cohort-size"),
        (RunConfig(privacy="distributed", secagg=True, accountant="rdp"), 10, None, "dim"),
    ],
)
def test_plans_that_cannot_be_honoured_are_refused(cfg: RunConfig, population: int, dim: int | None,
                                                   key: str) -> None:
    with pytest.raises(ValueError, match=key):
        plan_privacy(cfg, population=population, dim=dim)


def test_distributed_plan_never_builds_a_model(monkeypatch: pytest.MonkeyPatch) -> None:
    # D3: the plan is sized from the dim the run passes in, not from the configured model
    from fedprivacy.ml import models

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("planning built a model")

    monkeypatch.setattr(models, "build_model", refuse)
    cfg = RunConfig(privacy="distributed", secagg=True, accountant="rdp", target_delta=1e-3)
    assert plan_privacy(cfg, population=10, dim=100).mode == "distributed"  # (tests/test_layers.py)


def test_the_distributed_worst_case_depends_on_the_dimension() -> None:
    from fedprivacy.accounting.accountant import Accountant

    cfg = RunConfig(privacy="distributed", secagg=True, accountant="rdp", target_delta=1e-3)
    eps = []
    for dim in (10, 100_000):
        acc = Accountant(backend="rdp")
        acc.spend(plan_privacy(cfg, population=10, dim=dim).event)
        eps.append(acc.epsilon(delta=1e-3))
    assert eps[0] != eps[1]  # rounding enlarges the sensitivity by a dim-dependent amount


def test_a_registered_mode_is_accepted_by_the_config_and_planned(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedprivacy.fl import modes
    from fedprivacy.fl.modes.plain import CentralMode

    class Renamed(CentralMode):
        name = "central-copy"

    monkeypatch.setattr(modes, "MODES", dict(modes.MODES))
    modes.register_mode(Renamed())
    cfg = RunConfig(privacy="central-copy", sample_rate=0.5, accountant="rdp")
    plan = plan_privacy(cfg, population=20)
    assert plan.mode == "central-copy" and plan.denominator == 10.0
    with pytest.raises(ValueError, match="built in"):
        modes.register_mode(CentralMode())
    with pytest.raises(ValueError, match="privacy must be one of"):
        RunConfig(privacy="nonexistent")
