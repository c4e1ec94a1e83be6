"""The event set is open: a registered mechanism carries its own RDP curve / PLD, the
backends ask it and refuse what it cannot bound; the built-ins are untouched."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from fedprivacy.accounting import (
    Accountant,
    GaussianEvent,
    Neighbouring,
    NoSampling,
    PoissonSampling,
    PrivacyEvent,
    event_from_dict,
    register_mechanism,
)
from fedprivacy.accounting import events as events_module

DELTA = 1e-5


@pytest.fixture(autouse=True)
def _own_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events_module, "_MECHANISMS", dict(events_module._MECHANISMS))


def _gaussian_ratio(z: float, neighbouring: Neighbouring) -> float:
    return z / (2.0 if neighbouring is Neighbouring.REPLACE_ONE else 1.0)


def _register_rdp_gaussian() -> type:
    @register_mechanism
    @dataclass(frozen=True, slots=True, kw_only=True)
    class RdpGaussian:
        """The Gaussian again, stated only by its RDP curve alpha / (2 r^2) (Mironov 2017, Prop. 7)."""

        kind: ClassVar[str] = "test-rdp-gaussian"
        noise_multiplier: float

        def to_dict(self) -> dict:
            return {"kind": self.kind, "noise_multiplier": self.noise_multiplier}

        def rdp(self, orders, *, neighbouring, sampling):
            if not isinstance(sampling, NoSampling):
                return None  # no amplification claimed
            r = _gaussian_ratio(self.noise_multiplier, neighbouring)
            return np.asarray(orders, dtype=np.float64) / (2.0 * r * r)

        def pld(self, *, neighbouring, sampling):
            if not isinstance(sampling, NoSampling):
                return None
            return pld_lib.from_gaussian_mechanism(
                standard_deviation=_gaussian_ratio(self.noise_multiplier, neighbouring),
                value_discretization_interval=1e-4)

    return RdpGaussian


@pytest.mark.parametrize("neighbouring", ["add-remove", "replace-one"])
@pytest.mark.parametrize("backend", ["rdp", "pld"])
def test_a_registered_mechanism_is_accounted_by_its_own_conversion(backend: str, neighbouring: str) -> None:
    rdp_gaussian = _register_rdp_gaussian()
    mine, builtin = Accountant(backend=backend, neighbouring=neighbouring), Accountant(
        backend=backend, neighbouring=neighbouring)
    for z, count in ((1.1, 3), (2.0, 5)):
        mine.spend(PrivacyEvent(mechanism=rdp_gaussian(noise_multiplier=z), count=count))
        builtin.spend(PrivacyEvent(mechanism=GaussianEvent(noise_multiplier=z), count=count))
    # same curve as dp-accounting's Gaussian RDP; the PLD against the built-in's exact closed form
    assert mine.epsilon(delta=DELTA) == pytest.approx(builtin.epsilon(delta=DELTA), rel=1e-3 if backend == "pld" else 1e-9)
    assert mine.epsilon(delta=DELTA) >= builtin.epsilon(delta=DELTA) * (1 - 1e-9)  # pessimistic PLD never below


def test_what_the_mechanism_does_not_bound_is_refused_and_nothing_is_spent() -> None:
    rdp_gaussian = _register_rdp_gaussian()
    sampled = PrivacyEvent(mechanism=rdp_gaussian(noise_multiplier=1.0), sampling=PoissonSampling(rate=0.1))
    acc = Accountant(backend="rdp")
    assert not acc.supports(sampled)
    assert "gives no RDP bound" in (acc.unsupported_reason(sampled) or "")
    with pytest.raises(ValueError, match="test-rdp-gaussian"):
        acc.spend(sampled)
    assert acc.steps == 0 and acc.epsilon(delta=DELTA) == 0.0
    prv = Accountant(backend="prv")
    assert not prv.supports(PrivacyEvent(mechanism=rdp_gaussian(noise_multiplier=1.0)))


def test_a_mechanism_without_pld_is_refused_by_pld_naming_rdp() -> None:
    @register_mechanism
    @dataclass(frozen=True, slots=True, kw_only=True)
    class OnlyRdp:
        kind: ClassVar[str] = "test-only-rdp"
        rho: float

        def to_dict(self) -> dict:
            return {"kind": self.kind, "rho": self.rho}

        def rdp(self, orders, *, neighbouring, sampling):
            return None if not isinstance(sampling, NoSampling) else self.rho * np.asarray(orders, float)

    event = PrivacyEvent(mechanism=OnlyRdp(rho=0.1))
    assert "accountant=rdp" in (Accountant(backend="pld").unsupported_reason(event) or "")
    rdp = Accountant(backend="rdp")
    rdp.spend(event.with_count(4))
    # rho-zCDP composed 4 times is 0.4-zCDP; at alpha the RDP is 0.4 alpha, so eps <= 0.4 + 2 sqrt(0.4 ln(1/d))
    assert rdp.epsilon(delta=DELTA) <= 0.4 + 2 * math.sqrt(0.4 * math.log(1 / DELTA))


def test_a_malformed_curve_is_refused_not_used() -> None:
    @register_mechanism
    @dataclass(frozen=True, slots=True, kw_only=True)
    class Broken:
        kind: ClassVar[str] = "test-broken"

        def to_dict(self) -> dict:
            return {"kind": self.kind}

        def rdp(self, orders, *, neighbouring, sampling):
            return [-1.0]  # wrong length and negative

    acc = Accountant(backend="rdp")
    assert "no valid RDP curve" in (acc.unsupported_reason(PrivacyEvent(mechanism=Broken())) or "")
    with pytest.raises(ValueError):
        acc.spend(PrivacyEvent(mechanism=Broken()))
    assert acc.steps == 0


def test_a_ledger_with_a_registered_mechanism_saves_and_restores() -> None:
    rdp_gaussian = _register_rdp_gaussian()
    event = PrivacyEvent(mechanism=rdp_gaussian(noise_multiplier=1.3), count=2)
    assert event_from_dict(event.to_dict()) == event
    acc = Accountant(backend="rdp")
    acc.spend(event, round=1)
    again = Accountant.from_json(acc.to_json())
    assert again.epsilon(delta=DELTA) == acc.epsilon(delta=DELTA) and again.ledger[0].event == event


def test_registration_is_checked() -> None:
    @dataclass(frozen=True, slots=True, kw_only=True)
    class Unregistered:
        kind: ClassVar[str] = "test-unregistered"

        def to_dict(self) -> dict:
            return {"kind": self.kind}

        def rdp(self, orders, *, neighbouring, sampling):
            return None

    with pytest.raises(TypeError, match="register_mechanism"):
        PrivacyEvent(mechanism=Unregistered())
    with pytest.raises(ValueError, match="already registered"):
        register_mechanism(GaussianEvent)

    @dataclass(kw_only=True)
    class NotFrozen:
        kind: ClassVar[str] = "test-not-frozen"

    with pytest.raises(TypeError, match="frozen"):
        register_mechanism(NotFrozen)
