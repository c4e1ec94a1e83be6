"""Hypothesis properties: monotonicity of epsilon and calibrate-then-account round trips."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedprivacy.accounting import (
    FixedCohortSampling,
    Neighbouring,
    NoSampling,
    PoissonSampling,
    calibrate_noise_multiplier,
    epsilon_for,
)

DELTA = 1e-5
FAST = settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(
    z=st.sampled_from([0.8, 1.0, 1.7, 3.0]),
    q=st.sampled_from([0.005, 0.05, 0.3]),
    t1=st.integers(1, 150),
    extra=st.integers(1, 150),
    backend=st.sampled_from(["pld", "rdp"]),
)
def test_epsilon_monotone_in_steps(z: float, q: float, t1: int, extra: int, backend: str) -> None:
    e1 = epsilon_for(noise_multiplier=z, sample_rate=q, steps=t1, delta=DELTA, backend=backend)
    e2 = epsilon_for(
        noise_multiplier=z, sample_rate=q, steps=t1 + extra, delta=DELTA, backend=backend
    )
    assert e1 <= e2


@FAST
@given(
    z1=st.floats(0.6, 4.0),
    ratio=st.floats(1.01, 2.0),
    q=st.sampled_from([0.01, 0.1, 1.0]),
    steps=st.integers(1, 100),
    backend=st.sampled_from(["pld", "rdp"]),
)
def test_epsilon_monotone_in_inverse_sigma(
    z1: float, ratio: float, q: float, steps: int, backend: str
) -> None:
    more_noise = epsilon_for(
        noise_multiplier=z1 * ratio, sample_rate=q, steps=steps, delta=DELTA, backend=backend
    )
    less_noise = epsilon_for(
        noise_multiplier=z1, sample_rate=q, steps=steps, delta=DELTA, backend=backend
    )
    assert more_noise <= less_noise


def check_round_trip(target: float, sampling, steps: int, backend: str, neighbouring) -> None:
    z = calibrate_noise_multiplier(
        target_epsilon=target,
        target_delta=DELTA,
        sampling=sampling,
        steps=steps,
        backend=backend,
        neighbouring=neighbouring,
    )
    eps = epsilon_for(
        noise_multiplier=z,
        sampling=sampling,
        steps=steps,
        delta=DELTA,
        backend=backend,
        neighbouring=neighbouring,
    )
    assert eps <= target  # never overshoots
    assert eps >= target * (1 - 1e-2)  # and wastes little
    smaller = epsilon_for(
        noise_multiplier=z / (1 + 2e-3),
        sampling=sampling,
        steps=steps,
        delta=DELTA,
        backend=backend,
        neighbouring=neighbouring,
    )
    assert smaller > target  # minimal to the stated tolerance


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    target=st.floats(0.3, 10.0),
    q=st.sampled_from([0.001, 0.01, 0.1, 1.0]),
    steps=st.integers(1, 500),
)
def test_calibrate_then_account_round_trips_rdp(target: float, q: float, steps: int) -> None:
    check_round_trip(target, PoissonSampling(rate=q), steps, "rdp", Neighbouring.ADD_REMOVE)


@pytest.mark.parametrize(
    ("target", "sampling", "steps", "neighbouring"),
    [
        (1.0, PoissonSampling(rate=0.01), 100, Neighbouring.ADD_REMOVE),
        pytest.param(
            4.0,
            FixedCohortSampling(cohort=10, population=200),
            30,
            Neighbouring.REPLACE_ONE,
            marks=pytest.mark.slow,
        ),
        (0.5, NoSampling(), 1, Neighbouring.ADD_REMOVE),
    ],
)
def test_calibrate_then_account_round_trips_pld(
    target: float, sampling, steps: int, neighbouring
) -> None:
    check_round_trip(target, sampling, steps, "pld", neighbouring)


def test_calibration_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="target_epsilon"):
        calibrate_noise_multiplier(
            target_epsilon=0.0, target_delta=DELTA, sampling=NoSampling(), steps=1
        )
    with pytest.raises(ValueError, match="delta"):
        calibrate_noise_multiplier(
            target_epsilon=1.0, target_delta=1.5, sampling=NoSampling(), steps=1
        )
    with pytest.raises(ValueError, match="replace-one"):
        calibrate_noise_multiplier(
            target_epsilon=1.0,
            target_delta=DELTA,
            sampling=FixedCohortSampling(cohort=1, population=2),
            steps=1,
        )
