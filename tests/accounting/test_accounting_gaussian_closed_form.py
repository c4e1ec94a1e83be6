"""The PLD backend keeps unsampled Gaussian compositions in closed form (exact), see pld_backend.py."""

import dp_accounting
import pytest

from fedprivacy.accounting import (
    Accountant,
    GaussianEvent,
    NoSampling,
    PoissonSampling,
    PrivacyEvent,
)


def _reference(events: list[tuple[float, float | None, int]], delta: float) -> float:
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    for z, q, count in events:
        ev: dp_accounting.DpEvent = dp_accounting.GaussianDpEvent(z)
        if q is not None:
            ev = dp_accounting.PoissonSampledDpEvent(q, ev)
        acc.compose(ev, count)
    return float(acc.get_epsilon(delta))


@pytest.mark.parametrize(
    "events",
    [
        [(1.0, None, 20)],
        [(0.7, None, 3), (2.0, None, 5)],
        [(1.0, None, 4), (1.1, 0.1, 10), (1.5, None, 2)],
    ],
)
def test_unsampled_gaussians_match_dp_accounting_pld(events: list[tuple[float, float | None, int]]) -> None:
    acc = Accountant(backend="pld")
    for z, q, count in events:
        sampling = NoSampling() if q is None else PoissonSampling(rate=q)
        acc.spend(PrivacyEvent(mechanism=GaussianEvent(noise_multiplier=z), sampling=sampling, count=count))

    ours, ref = acc.epsilon(delta=1e-5), _reference(events, 1e-5)

    # Closed form is exact; dp-accounting's pessimistic PLD sits at or just above it.
    assert ours == pytest.approx(ref, rel=1e-4)
    assert ours <= ref * (1 + 1e-9)
