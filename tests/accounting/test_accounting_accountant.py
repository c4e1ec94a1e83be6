"""Ledger, budget and persistence of fedprivacy.accounting.Accountant."""

from __future__ import annotations

import copy
import json

import dp_accounting as dpa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedprivacy.accounting import (
    Accountant,
    Budget,
    DiscreteGaussianEvent,
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

DELTA = 1e-5


def gauss(z: float = 1.0, q: float = 0.01, count: int = 1) -> PrivacyEvent:
    return PrivacyEvent(
        mechanism=GaussianEvent(noise_multiplier=z), sampling=PoissonSampling(rate=q), count=count
    )


def snapshot(acc: Accountant) -> tuple:
    return (acc.ledger, list(acc._runs), acc._prefix, acc._last_state, dict(acc._eps_cache))


def test_empty_accountant_has_zero_epsilon() -> None:
    assert Accountant().epsilon(delta=DELTA) == 0.0


def test_spend_matches_dp_accounting_pld() -> None:
    acc = Accountant()
    for r in range(20):
        acc.spend(gauss(), round=r)
    ref = dpa.pld.PLDAccountant()
    ref.compose(
        dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.0)), 20)
    )
    assert acc.epsilon(delta=DELTA) == pytest.approx(ref.get_epsilon(DELTA), rel=1e-6)
    assert len(acc.ledger) == 20 and acc.steps == 20
    assert [e.round for e in acc.ledger] == list(range(20))
    assert all(e.unit == "user" for e in acc.ledger)


def test_epsilon_if_and_would_exceed_change_nothing() -> None:
    acc = Accountant(budget=Budget(epsilon=1.0, delta=DELTA))
    acc.spend(gauss(count=10))
    before = snapshot(acc)
    eps_next = acc.epsilon_if(gauss(), delta=DELTA)
    acc.would_exceed(gauss(count=10**6))
    assert snapshot(acc)[:4] == before[:4]
    acc.spend(gauss())
    assert acc.epsilon(delta=DELTA) == eps_next


def test_budget_exhausted_raises_before_any_change() -> None:
    acc = Accountant(budget=Budget(epsilon=0.5, delta=DELTA))
    acc.spend(gauss(z=2.0, count=5))
    before = snapshot(acc)
    eps_before = acc.epsilon(delta=DELTA)
    big = gauss(z=1.0, q=0.1, count=30)
    assert acc.would_exceed(big)
    with pytest.raises(PrivacyBudgetExhausted):
        acc.spend(big)
    assert snapshot(acc)[:4] == before[:4]
    assert acc.epsilon(delta=DELTA) == eps_before


def test_unsupported_event_refused_without_change() -> None:
    acc = Accountant(neighbouring=Neighbouring.ADD_REMOVE)
    acc.spend(gauss())
    before = snapshot(acc)
    fixed = PrivacyEvent(
        mechanism=GaussianEvent(noise_multiplier=1.0),
        sampling=FixedCohortSampling(cohort=10, population=100),
    )
    assert not acc.supports(fixed)
    with pytest.raises(ValueError, match="replace-one"):
        acc.spend(fixed)
    dg = PrivacyEvent(mechanism=DiscreteGaussianEvent(sigma=10.0, l2_sensitivity=1.0))
    assert not acc.supports(dg)
    with pytest.raises(ValueError, match="rdp"):
        acc.spend(dg)
    with pytest.raises(TypeError):
        acc.spend("not an event")  # type: ignore[arg-type]
    assert snapshot(acc)[:4] == before[:4]


def test_prv_refuses_non_poisson_gaussian() -> None:
    acc = Accountant(backend="prv")
    lap = PrivacyEvent(mechanism=LaplaceEvent(epsilon=0.1))
    assert not acc.supports(lap)
    with pytest.raises(ValueError, match="prv"):
        acc.spend(lap)
    assert acc.ledger == ()


def test_unknown_backend_and_unit() -> None:
    with pytest.raises(ValueError, match="backend"):
        Accountant(backend="gdp")
    with pytest.raises(ValueError, match="unit"):
        Accountant(unit="client")


def test_claim_is_labelled() -> None:
    acc = Accountant(unit="example", neighbouring="replace-one", backend="rdp")
    acc.spend(
        PrivacyEvent(
            mechanism=GaussianEvent(noise_multiplier=1.3),
            sampling=FixedCohortSampling(cohort=32, population=1000),
            count=7,
        )
    )
    c = acc.claim(delta=DELTA)
    assert c["unit"] == "example" and c["neighbouring"] == "replace-one"
    assert c["accountant"] == "rdp" and c["steps"] == 7 and c["noise_multiplier"] == 1.3
    assert c["mechanism"] == "gaussian" and "32 of 1000" in c["sampling"]
    assert c["epsilon"] == acc.epsilon(delta=DELTA) and c["delta"] == DELTA


MIXED = [
    gauss(),
    gauss(),
    PrivacyEvent(mechanism=LaplaceEvent(epsilon=0.2), count=2),
    gauss(z=1.5, q=0.02),
    PrivacyEvent(mechanism=ExponentialEvent(epsilon=0.1)),
    gauss(),
]


@pytest.mark.parametrize("backend", ["pld", "rdp"])
def test_save_load_is_identity_bit_for_bit(tmp_path, backend: str) -> None:
    acc = Accountant(backend=backend, budget=Budget(epsilon=50.0, delta=DELTA))
    for i, ev in enumerate(MIXED):
        acc.spend(ev, round=i)
    path = tmp_path / "ledger.json"
    acc.save(path)
    assert [p.name for p in tmp_path.iterdir()] == ["ledger.json"]  # no temp file left behind
    restored = Accountant.load(path)
    assert restored.ledger == acc.ledger
    assert restored.to_json() == acc.to_json()
    for d in (1e-3, DELTA, 1e-8):
        assert restored.epsilon(delta=d) == acc.epsilon(delta=d)  # bit for bit
    # A restored accountant keeps composing identically.
    acc.spend(gauss())
    restored.spend(gauss())
    assert restored.epsilon(delta=DELTA) == acc.epsilon(delta=DELTA)


def test_load_validates_every_field(tmp_path) -> None:
    acc = Accountant()
    acc.spend(gauss(), round=3)
    good = acc.to_json()
    bad_docs = []
    for mutate in [
        lambda d: d.update(format="v0"),
        lambda d: d.update(backend="gdp"),
        lambda d: d.update(neighbouring="swap"),
        lambda d: d.update(unit="client"),
        lambda d: d.update(budget={"epsilon": -1, "delta": 1e-5}),
        lambda d: d.update(extra=1),
        lambda d: d["entries"][0].update(round=-1),
        lambda d: d["entries"][0].update(unit="example"),
        lambda d: d["entries"][0].update(timestamp="now"),
        lambda d: d["entries"][0]["event"].update(count=0),
        lambda d: d["entries"][0]["event"]["mechanism"].update(noise_multiplier=-1.0),
        lambda d: d["entries"][0]["event"]["mechanism"].update(kind="gdp"),
        lambda d: d["entries"][0]["event"]["sampling"].update(rate=1.5),
        lambda d: d["entries"][0]["event"]["sampling"].update(extra=1),
    ]:
        d = copy.deepcopy(good)
        mutate(d)
        bad_docs.append(d)
    for d in bad_docs:
        with pytest.raises(ValueError):
            Accountant.from_json(d)
    path = tmp_path / "x.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="JSON"):
        Accountant.load(path)
    assert Accountant.from_json(json.loads(json.dumps(good))).ledger == acc.ledger


events_st = st.lists(
    st.builds(
        lambda z, q, c: gauss(z=z, q=q, count=c),
        st.sampled_from([1.0, 2.0]),
        st.sampled_from([0.01, 0.05]),
        st.integers(1, 10),
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=events_st, budget=st.floats(0.2, 3.0))
def test_budget_is_never_exceeded(events: list[PrivacyEvent], budget: float) -> None:
    # The budget logic is backend independent; RDP keeps the property test fast.
    acc = Accountant(backend="rdp", budget=Budget(epsilon=budget, delta=DELTA))
    for ev in events:
        before = acc.ledger
        try:
            acc.spend(ev)
        except PrivacyBudgetExhausted:
            assert acc.ledger == before
        assert acc.epsilon(delta=DELTA) <= budget


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=events_st)
def test_restore_ledger_is_identity(events: list[PrivacyEvent]) -> None:
    acc = Accountant()
    for ev in events:
        acc.spend(ev)
    restored = Accountant.from_json(json.loads(json.dumps(acc.to_json())))
    assert restored.ledger == acc.ledger
    assert restored.epsilon(delta=DELTA) == acc.epsilon(delta=DELTA)


def test_nosampling_default() -> None:
    assert PrivacyEvent(mechanism=LaplaceEvent(epsilon=1.0)).sampling == NoSampling()
