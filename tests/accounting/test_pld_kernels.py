"""The accountant's fast PLD paths give dp-accounting's figures float for float.

``fedprivacy.accounting.pld_kernels`` re-does two dp-accounting 0.6 operations with cached Chernoff
moments and a vectorised epsilon scan, and the ``Accountant`` caches the plan of the next event; no
epsilon may change. Every comparison below is ``==`` on floats (and on whole pmf arrays), against
dp-accounting's own ``self_compose`` / ``get_epsilon_for_delta`` ("the old path": what the accountant
called before, on every round, recomposing the whole history).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from hypothesis import given, settings
from hypothesis import strategies as st

from fedprivacy.accounting import (
    Accountant,
    Budget,
    ExponentialEvent,
    FixedCohortSampling,
    GaussianEvent,
    LaplaceEvent,
    Neighbouring,
    NoSampling,
    PoissonSampling,
    PrivacyBudgetExhausted,
    PrivacyEvent,
)
from fedprivacy.accounting import pld_kernels as K
from fedprivacy.accounting.pld_backend import _pld_single

DELTAS = (1e-5, 1e-3, 1e-9, 0.3, 0.99)


def _event(mech: object, sampling: object) -> PrivacyEvent:
    return PrivacyEvent(mechanism=mech, sampling=sampling)  # type: ignore[arg-type]


# (event, neighbouring): the one-release PLDs the accountant self-composes (dense and asymmetric ones)
CASES = [
    (_event(GaussianEvent(noise_multiplier=1.0), FixedCohortSampling(cohort=100, population=1000)),
     Neighbouring.REPLACE_ONE),
    (_event(GaussianEvent(noise_multiplier=0.8), PoissonSampling(rate=0.1)), Neighbouring.ADD_REMOVE),
    (_event(GaussianEvent(noise_multiplier=2.0, sensitivity=0.5), PoissonSampling(rate=0.02)),
     Neighbouring.REPLACE_ONE),
    (_event(LaplaceEvent(epsilon=0.5), PoissonSampling(rate=0.05)), Neighbouring.ADD_REMOVE),
    (_event(LaplaceEvent(epsilon=0.3), FixedCohortSampling(cohort=10, population=100)),
     Neighbouring.REPLACE_ONE),
    (_event(ExponentialEvent(epsilon=0.2), NoSampling()), Neighbouring.REPLACE_ONE),
]


def _same_pmf(a: object, b: object) -> None:
    assert type(a) is type(b)
    if isinstance(a, pld_pmf.DensePLDPmf):
        assert a._lower_loss == b._lower_loss  # type: ignore[attr-defined]
        assert a._infinity_mass == b._infinity_mass  # type: ignore[attr-defined]
        assert np.array_equal(a._probs, b._probs)  # type: ignore[attr-defined]
    else:
        assert a._loss_probs == b._loss_probs  # type: ignore[attr-defined]
        assert a._infinity_mass == b._infinity_mass  # type: ignore[attr-defined]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("count", [1, 2, 5, 17])
def test_self_compose_and_epsilon_equal_dp_accountings(case: int, count: int) -> None:
    event, nb = CASES[case]
    single = _pld_single(event, nb)
    ours, theirs = K.self_compose(single, count), single.self_compose(count)
    assert ours._symmetric == theirs._symmetric
    _same_pmf(ours._pmf_remove, theirs._pmf_remove)
    _same_pmf(ours._pmf_add, theirs._pmf_add)
    for delta in DELTAS:
        mine, ref = K.epsilon_for_delta(ours, delta), theirs.get_epsilon_for_delta(delta)
        assert mine == ref and type(mine) is type(ref), (delta, mine, ref)


def test_self_compose_refuses_a_count_below_one() -> None:
    single = _pld_single(*CASES[0])
    with pytest.raises(ValueError, match="num_times must be >= 1, got 0"):
        K.self_compose(single, 0)


def _dense(lower_loss: int, probs: list[float], infinity_mass: float, disc: float) -> pld_pmf.DensePLDPmf:
    return pld_pmf.DensePLDPmf(disc, lower_loss, np.asarray(probs, dtype=np.float64), infinity_mass, True)


pmfs = st.builds(
    _dense,
    lower_loss=st.integers(-3000, 3000),
    probs=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=60).map(
        lambda p: [x / (sum(p) or 1.0) for x in p]),
    infinity_mass=st.sampled_from([0.0, 1e-12, 1e-6, 0.01]),
    disc=st.sampled_from([1e-4, 1e-3, 0.01, 0.1]),
)


@settings(max_examples=300, deadline=None)
@given(pmf=pmfs, delta=st.floats(1e-12, 0.999), chunk=st.sampled_from([1, 2, 3, 7, 64, 1 << 16]))
def test_epsilon_scan_is_the_loop_for_any_pmf_and_chunking(
    pmf: pld_pmf.DensePLDPmf, delta: float, chunk: int
) -> None:
    """Any dense pmf, any delta, chunk boundaries anywhere: the same float (or int 0, or inf)."""
    ref = pmf.get_epsilon_for_delta(delta)
    mine = K._dense_epsilon(pmf, delta, chunk_size=chunk)
    assert mine == ref and type(mine) is type(ref)


@pytest.mark.parametrize("chunk", [1, 5, 1 << 16])
def test_epsilon_scan_where_exp_underflows(chunk: int) -> None:
    """Losses near 800 (exp(-loss) is 0): the loop's `mass_lower == 0` early return, and after it."""
    for lower_loss, probs in ((7990, [0.2, 0.3, 0.5]), (7440, [0.1] * 10), (-5, [0.5, 0.0, 0.5])):
        pmf = _dense(lower_loss, probs, 0.0, 0.1)
        for delta in (1e-6, 0.15, 0.25, 0.6):
            ref = pmf.get_epsilon_for_delta(delta)
            mine = K._dense_epsilon(pmf, delta, chunk_size=chunk)
            assert mine == ref and type(mine) is type(ref), (lower_loss, delta, mine, ref)
    assert K._dense_epsilon(_dense(0, [1.0], 0.2, 0.1), 0.1) == math.inf


@pytest.mark.parametrize("case", range(3))
def test_ledger_epsilons_equal_the_old_recomposition_round_by_round(case: int) -> None:
    """The run loop's calls per round (would_exceed, epsilon_if, spend, epsilon), 12 rounds of one
    event then 3 of another: every figure equals dp-accounting recomposing the whole history."""
    event, nb = CASES[case]
    other = PrivacyEvent(mechanism=GaussianEvent(noise_multiplier=1.7), sampling=event.sampling)
    delta = 1e-5
    acc = Accountant(backend="pld", neighbouring=nb, budget=Budget(epsilon=1e6, delta=delta))
    history: list[PrivacyEvent] = []
    for ev in [event] * 12 + [other] * 3:
        assert not acc.would_exceed(ev)
        projected = acc.epsilon_if(ev, delta=delta)
        acc.spend(ev, round=len(history))
        history.append(ev)
        got = acc.epsilon(delta=delta)
        n_first = min(len(history), 12)
        old = _pld_single(event, nb).self_compose(n_first)
        if len(history) > 12:
            old = old.compose(_pld_single(other, nb).self_compose(len(history) - 12))
        ref = float(old.get_epsilon_for_delta(delta))
        assert got == projected == ref, (len(history), got, projected, ref)
        assert acc.epsilon(delta=1e-3) == float(old.get_epsilon_for_delta(1e-3))


def test_plan_cache_follows_the_event_asked_and_a_refused_spend() -> None:
    """Asking about another event, or a spend refused by the budget, never leaks into the ledger."""
    fixed = FixedCohortSampling(cohort=100, population=1000)
    a = PrivacyEvent(mechanism=GaussianEvent(noise_multiplier=1.0), sampling=fixed)
    b = PrivacyEvent(mechanism=GaussianEvent(noise_multiplier=3.0), sampling=fixed)
    probe = Accountant(backend="pld", neighbouring="replace-one")
    for ev in (b, a):
        probe.spend(ev)
    limit = (probe.epsilon(delta=1e-5) + probe.epsilon_if(a, delta=1e-5)) / 2  # b, a fit; b, a, a not
    acc = Accountant(backend="pld", neighbouring="replace-one", budget=Budget(epsilon=limit, delta=1e-5))
    eps_b = acc.epsilon_if(b, delta=1e-5)
    acc.epsilon_if(a, delta=1e-5)
    acc.spend(b)
    assert acc.epsilon(delta=1e-5) == eps_b
    acc.spend(a)
    with pytest.raises(PrivacyBudgetExhausted):
        acc.spend(a)
    after_refusal = acc.epsilon(delta=1e-5)
    one_b, one_a = (_pld_single(ev, Neighbouring.REPLACE_ONE).self_compose(1) for ev in (b, a))
    ref = one_b.compose(one_a)
    assert after_refusal == float(ref.get_epsilon_for_delta(1e-5))
    assert acc.steps == 2
    fresh = Accountant(backend="pld", neighbouring="replace-one")
    fresh.restore_entries(acc.ledger)
    assert fresh.epsilon(delta=1e-5) == after_refusal


def test_symmetric_pld_of_a_library_is_composed_by_the_library_when_sparse() -> None:
    """A sparse pmf (randomized response) goes to dp-accounting's own code: same object type."""
    single = pld_lib.from_randomized_response(noise_parameter=0.5, num_buckets=2)
    assert not isinstance(single._pmf_remove, pld_pmf.DensePLDPmf)
    for count in (1, 3):
        _same_pmf(K.self_compose(single, count)._pmf_remove, single.self_compose(count)._pmf_remove)


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_a_run_of_compositions_does_not_keep_scipys_fft_plans() -> None:
    # Arrange: the digits benchmark's one-release PLD (z = 1, 100 of 1000, replace-one: 384k points);
    # a run composes it T times at a new transform length every round, ~1.4-2M points, so scipy.fft's
    # 16 cached plans of each kind would hold >= 16 x 16 B x 1.4M = 360 MB per kind after 16 rounds
    event, nb = CASES[0]
    single = _pld_single(event, nb)
    K.self_compose(single, 2)  # warm-up: imports, the cached Chernoff terms, first allocations
    before = _rss_mb()
    # Act
    for count in range(3, 21):
        composed = K.self_compose(single, count)
        del composed
    grown = _rss_mb() - before
    # Assert: the plans are released after each composition (without that, ~700 MB at this point)
    assert grown < 150, f"RSS grew by {grown:.0f} MB over 18 compositions"
