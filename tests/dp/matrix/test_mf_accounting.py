"""Matrix-mechanism accounting: band 1 is DP-SGD, min-sep is one analytic Gaussian, refusals, samplers."""

import math

import dp_accounting
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedprivacy.dp.matrix import (
    Blt,
    CyclicPoisson,
    MatrixMechanism,
    MinSeparation,
    SingleParticipation,
    Workload,
    bsr,
)
from fedprivacy.dp.matrix.participation import MinSepLedger, cyclic_poisson_cohort
from fedprivacy.dp.mechanisms import analytic_gaussian_epsilon
from fedprivacy.dp.rng import RandomSource


def _dpsgd_epsilon(*, sample_rate: float, noise_multiplier: float, steps: int, delta: float) -> float:
    acc = dp_accounting.pld.PLDAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(
        sampling_probability=sample_rate,
        event=dp_accounting.GaussianDpEvent(noise_multiplier=noise_multiplier)), steps)
    return acc.get_epsilon(delta)


@pytest.mark.parametrize("rate,nm,rounds", [(0.01, 1.0, 200), (0.1, 1.5, 50), (0.5, 4.0, 20)])
def test_band_one_with_cyclic_poisson_is_dp_sgd_exactly(rate: float, nm: float, rounds: int) -> None:
    mech = MatrixMechanism(strategy=bsr(Workload(num_rounds=rounds), 1),
                           schema=CyclicPoisson(num_groups=1, sample_rate=rate), noise_multiplier=nm)
    assert mech.epsilon(1e-5) == _dpsgd_epsilon(sample_rate=rate, noise_multiplier=nm, steps=rounds,
                                                delta=1e-5)
    assert mech.noise_std(clip_norm=2.0) == pytest.approx(2.0 * nm)


def test_b_banded_cyclic_poisson_composes_ceil_n_over_b_dp_sgd_steps() -> None:
    mech = MatrixMechanism(strategy=bsr(Workload(num_rounds=30), 4),
                           schema=CyclicPoisson(num_groups=4, sample_rate=0.2), noise_multiplier=1.2)
    assert mech.epsilon(1e-6) == _dpsgd_epsilon(sample_rate=0.2, noise_multiplier=1.2, steps=8, delta=1e-6)
    # noise is scaled by the max column norm of C (columns normalised, Theorem 4)
    assert mech.sensitivity.value == pytest.approx(np.linalg.norm(mech.strategy.matrix(), axis=0).max())


@pytest.mark.parametrize("nm", [0.8, 2.0, 5.0])
def test_min_separation_is_one_gaussian_release(nm: float) -> None:
    mech = MatrixMechanism(strategy=bsr(Workload(num_rounds=64, momentum=0.9), 8),
                           schema=MinSeparation(min_separation=8, max_participations=4), noise_multiplier=nm)
    closed = analytic_gaussian_epsilon(noise_std=nm, sensitivity=1.0, delta=1e-5)  # Balle & Wang 2018
    assert mech.epsilon(1e-5) == pytest.approx(closed, rel=2e-3)
    assert mech.epsilon(1e-5) >= closed * (1 - 1e-4)


@settings(max_examples=20)
@given(k=st.integers(1, 7), nm=st.floats(0.5, 5.0))
def test_noise_grows_with_participations_at_equal_epsilon(k: int, nm: float) -> None:
    c = bsr(Workload(num_rounds=64), 4)
    eps = [MatrixMechanism(strategy=c, schema=MinSeparation(min_separation=4, max_participations=j),
                           noise_multiplier=nm).noise_std(1.0) for j in (k, k + 1)]
    assert eps[0] <= eps[1]  # same epsilon for the same multiplier: the std must grow instead


def test_the_claim_names_factorization_band_schema_and_sensitivity() -> None:
    mech = MatrixMechanism(strategy=bsr(Workload(num_rounds=32), 4),
                           schema=MinSeparation(min_separation=4, max_participations=2), noise_multiplier=1.0)
    claim = mech.claim()
    assert claim["factorization"] == "bsr-4" and claim["band"] == 4
    assert claim["schema"] == "4-min-separation, <= 2 participations"
    assert claim["sensitivity"] == mech.sensitivity.value and "Theorem 2" in claim["sensitivity_basis"]
    single = MatrixMechanism(strategy=bsr(Workload(num_rounds=32), 4), schema=SingleParticipation(),
                             noise_multiplier=1.0)
    assert single.sensitivity.value == pytest.approx(math.sqrt(sum(x * x for x in bsr(Workload(num_rounds=32), 4).coefs)))


def test_amplification_is_refused_when_the_band_exceeds_the_groups() -> None:
    with pytest.raises(ValueError, match="band <= num_groups"):
        MatrixMechanism(strategy=bsr(Workload(num_rounds=32), 5),
                        schema=CyclicPoisson(num_groups=4, sample_rate=0.1), noise_multiplier=1.0)
    with pytest.raises(ValueError, match="band <= num_groups"):
        MatrixMechanism(strategy=Blt(num_rounds=32, buf_decay=(0.5,), output_scale=(0.2,)),
                        schema=CyclicPoisson(num_groups=4, sample_rate=0.1), noise_multiplier=1.0)


@pytest.mark.parametrize("kwargs,match", [
    ({"num_groups": 0, "sample_rate": 0.1}, "num_groups"), ({"num_groups": 2, "sample_rate": 0.0}, "sample_rate")])
def test_bad_cyclic_schemas_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        CyclicPoisson(**kwargs)


def test_cyclic_poisson_samples_only_the_round_group_at_the_reported_rate() -> None:
    schema = CyclicPoisson(num_groups=4, sample_rate=0.25)
    clients, rng, counts = list(range(4000)), RandomSource.seeded(3), np.zeros(4000)
    for t in range(40):
        cohort = cyclic_poisson_cohort(clients, schema=schema, round_index=t, rng=rng)
        assert all(c % 4 == t % 4 for c in cohort)
        counts[cohort] += 1
    rate = counts.sum() / (40 * 1000)  # each round draws from 1000 clients
    assert abs(rate - 0.25) < 4 * math.sqrt(0.25 * 0.75 / 40000)


def test_the_ledger_refuses_a_cohort_that_breaks_the_schema_and_records_nothing() -> None:
    led = MinSepLedger(MinSeparation(min_separation=3, max_participations=2))
    led.record(0, [1, 2])
    with pytest.raises(ValueError, match="client 1 took part in round 0"):
        led.record(2, [1, 3])
    assert led.eligible(2, [1, 2, 3]) == [3]
    led.record(3, [1, 3])
    led.record(6, [2, 4])
    assert "client 1 already took part 2 times" in led.violations(9, [1])
