"""Privacy events: small immutable values that state what was released and how.

An event says *what* was released (a mechanism with its noise), *to whom it could have leaked* (the
sampling that chose the participants) and *how often* (a self-composition count). It does not say
which neighbouring relation the guarantee is about: that belongs to the accountant that composes the
events (``fedprivacy.accounting.accountant.Accountant``), so one ledger is read under one relation.

Units (as in Opacus and Flower). A Gaussian release adds ``N(0, std^2 I)`` to a sum of contributions
each clipped to L2 norm ``C`` (the clip norm). Its ``noise_multiplier`` is ``z = std / C``. The L2
distance between the sums on neighbouring inputs is ``sensitivity * C`` under add/remove and
``2 * sensitivity * C`` under replace-one (the replaced record moves from ``+C`` to ``-C``). The
accounted Gaussian therefore has ``std / distance = z / sensitivity`` under add/remove and
``z / (2 * sensitivity)`` under replace-one (google/differential-privacy#378: the factor 2
forgotten). ``effective_noise_multiplier`` computes exactly this ratio.

The pure-DP mechanisms (Laplace, exponential) are given by their privacy parameter ``epsilon`` directly:
the release is ``epsilon``-DP under the neighbouring relation of the accountant they are spent in
(for Laplace: scale ``b = Delta_1 / epsilon`` with ``Delta_1`` the L1 sensitivity under that relation).

All values are frozen, validated dataclasses and serialise to plain JSON dicts (``to_dict`` and
``event_from_dict``), so a ledger can be saved and restored exactly.

The set of mechanisms is open, as in dp-accounting (an accountant asks the event what it is): a new
mechanism is a frozen dataclass registered with :func:`register_mechanism` that carries its own
conversion, :meth:`AccountedMechanism.rdp` (its Renyi-DP curve) and optionally
:meth:`AccountedMechanism.pld` (its privacy loss distribution). A backend supports such an event when
the mechanism gives it what it composes (``Backend.unsupported_reason`` walks the event: mechanism,
sampling, neighbouring); otherwise the event is refused with a reason, never approximated. The four
built-in mechanisms keep their dedicated (tighter or special-cased) code in the backends.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Protocol, runtime_checkable

__all__ = [
    "AccountedMechanism",
    "ChargedAhead",
    "DiscreteGaussianEvent",
    "ExponentialEvent",
    "FixedCohortSampling",
    "GaussianEvent",
    "LaplaceEvent",
    "Mechanism",
    "Neighbouring",
    "NoSampling",
    "PoissonSampling",
    "PrivacyEvent",
    "Sampling",
    "event_from_dict",
    "register_mechanism",
]


class Neighbouring(StrEnum):
    """The neighbouring relation a privacy claim is about.

    ``ADD_REMOVE``: datasets differ by adding or removing one unit (user or example); the number of
    units is private. ``REPLACE_ONE``: datasets have the same size and differ in one unit, replaced
    by an arbitrary other one; the number of units is public.
    """

    ADD_REMOVE = "add-remove"
    REPLACE_ONE = "replace-one"

    @classmethod
    def parse(cls, value: Neighbouring | str) -> Neighbouring:
        """Return ``value`` as a ``Neighbouring``; raises ValueError naming the allowed values."""
        if isinstance(value, Neighbouring):
            return value
        if not isinstance(value, str):
            raise TypeError(
                f"neighbouring must be a Neighbouring or str, got {type(value).__name__}"
            )
        try:
            return cls(value)
        except ValueError:
            allowed = ", ".join(m.value for m in cls)
            raise ValueError(f"neighbouring must be one of {allowed}, got {value!r}") from None


def _check_real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


def _check_positive(name: str, value: Any) -> float:
    value = _check_real(name, value)
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return value


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


# ----------------------------------------------------------------------------------------- sampling
@dataclass(frozen=True, slots=True, kw_only=True)
class NoSampling:
    """Every unit takes part in the release (sampling probability 1)."""

    kind: ClassVar[str] = "none"

    @property
    def rate(self) -> float:
        return 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind}

    def describe(self) -> str:
        return "none (every unit participates)"


@dataclass(frozen=True, slots=True, kw_only=True)
class PoissonSampling:
    """Poisson sampling: each unit takes part independently with probability ``rate`` (q).

    Amplification by Poisson subsampling (Abadi et al. 2016; Mironov, Talwar & Zhang 2019 for RDP;
    Zhu, Dong & Wang 2022 for the PLD / dominating-pair view): under add/remove the release is
    dominated by ``(q*P + (1-q)*Q, Q)`` and its reverse, where ``(P, Q)`` dominates one release.
    """

    kind: ClassVar[str] = "poisson"
    rate: float

    def __post_init__(self) -> None:
        rate = _check_real("rate", self.rate)
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"rate must be in (0, 1], got {rate}")
        object.__setattr__(self, "rate", rate)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "rate": self.rate}

    def describe(self) -> str:
        return f"poisson(q={self.rate:g})"


@dataclass(frozen=True, slots=True, kw_only=True)
class FixedCohortSampling:
    """A uniformly random cohort of exactly ``cohort`` (m) of ``population`` (n) units, no replacement.

    Analysed only under replace-one (the population size n is public): a unit is in the cohort with
    probability ``gamma = m / n``. It must never be accounted as Poisson sampling at rate m/n.
    """

    kind: ClassVar[str] = "fixed"
    cohort: int
    population: int

    def __post_init__(self) -> None:
        _check_int("cohort", self.cohort, 1)
        _check_int("population", self.population, 1)
        if self.cohort > self.population:
            raise ValueError(
                f"cohort must be <= population, got cohort={self.cohort} > population={self.population}"
            )

    @property
    def rate(self) -> float:
        return self.cohort / self.population

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "cohort": self.cohort, "population": self.population}

    def describe(self) -> str:
        return f"fixed cohort {self.cohort} of {self.population}, without replacement"


Sampling = NoSampling | PoissonSampling | FixedCohortSampling


# ---------------------------------------------------------------------------------------- mechanisms
@dataclass(frozen=True, slots=True, kw_only=True)
class GaussianEvent:
    """Gaussian noise ``N(0, (z*C)^2 I)`` added to a sum of L2-clipped contributions.

    ``noise_multiplier`` z is ``std / C``; ``sensitivity`` s is how many clip norms one unit can move
    the sum under add/remove (1 for a plain clipped sum). The accounted ratio std/distance is ``z/s``
    under add/remove and ``z/(2s)`` under replace-one. One release with ratio r is exactly
    characterised by the pair ``(N(0, r^2), N(1, r^2))`` (Balle & Wang 2018, Theorem 8).
    """

    kind: ClassVar[str] = "gaussian"
    noise_multiplier: float
    sensitivity: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "noise_multiplier", _check_positive("noise_multiplier", self.noise_multiplier)
        )
        object.__setattr__(self, "sensitivity", _check_positive("sensitivity", self.sensitivity))

    def effective_noise_multiplier(self, neighbouring: Neighbouring) -> float:
        """Noise std divided by the L2 distance of neighbouring sums under ``neighbouring``."""
        factor = 2.0 if Neighbouring.parse(neighbouring) is Neighbouring.REPLACE_ONE else 1.0
        return self.noise_multiplier / (factor * self.sensitivity)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "noise_multiplier": self.noise_multiplier,
            "sensitivity": self.sensitivity,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class LaplaceEvent:
    """Laplace noise of scale ``Delta_1 / epsilon``: pure ``epsilon``-DP (Dwork et al. 2006).

    One release is characterised by ``(Lap(0, 1/epsilon), Lap(1, 1/epsilon))``; n releases compose
    to at most ``n * epsilon`` (basic composition), and PLD accounting gives a tighter value.
    """

    kind: ClassVar[str] = "laplace"
    epsilon: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", _check_positive("epsilon", self.epsilon))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "epsilon": self.epsilon}


@dataclass(frozen=True, slots=True, kw_only=True)
class ExponentialEvent:
    """The exponential mechanism (McSherry & Talwar 2007) calibrated to be ``epsilon``-DP.

    Pr[r] proportional to ``exp(epsilon * u(r) / (2 * Delta_u))`` (or ``/Delta_u`` for a monotone
    utility). Any epsilon-DP mechanism is a post-processing of binary randomized response with
    parameter epsilon (Kairouz, Oh & Viswanath 2015, Theorem 2.1; Murtagh & Vadhan 2016), so the pair
    ``(Bern(e^eps / (1 + e^eps)), Bern(1 / (1 + e^eps)))`` dominates one release. That is the pair the
    backends compose; the count is composed explicitly, never left to a library.
    """

    kind: ClassVar[str] = "exponential"
    epsilon: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", _check_positive("epsilon", self.epsilon))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "epsilon": self.epsilon}


@dataclass(frozen=True, slots=True, kw_only=True)
class DiscreteGaussianEvent:
    """Multivariate discrete Gaussian noise ``N_Z(0, sigma^2)^d`` added to an integer vector.

    ``l2_sensitivity`` (and optionally ``l1_sensitivity``) are in the same integer units as the
    noise, for the accountant's neighbouring relation. The release is ``rho``-zCDP with
    ``rho = l2_sensitivity^2 / (2 sigma^2)`` (Canonne, Kamath & Steinke 2020, Theorem 14), which the
    RDP backend composes as ``RDP(alpha) = alpha * rho``.
    """

    kind: ClassVar[str] = "discrete_gaussian"
    sigma: float
    l2_sensitivity: float
    l1_sensitivity: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "sigma", _check_positive("sigma", self.sigma))
        object.__setattr__(
            self, "l2_sensitivity", _check_positive("l2_sensitivity", self.l2_sensitivity)
        )
        if self.l1_sensitivity is not None:
            object.__setattr__(
                self, "l1_sensitivity", _check_positive("l1_sensitivity", self.l1_sensitivity)
            )

    @property
    def rho(self) -> float:
        """zCDP parameter ``l2_sensitivity^2 / (2 sigma^2)``."""
        return self.l2_sensitivity**2 / (2.0 * self.sigma**2)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "sigma": self.sigma,
            "l2_sensitivity": self.l2_sensitivity,
            "l1_sensitivity": self.l1_sensitivity,
        }


@runtime_checkable
class AccountedMechanism(Protocol):
    """A mechanism outside the four built-ins: a frozen dataclass that states its own privacy.

    ``kind`` names it in JSON (unique; :func:`register_mechanism`). ``rdp`` returns, for one release
    without amplification claims beyond what it states, an upper bound on the Renyi divergence of
    order ``alpha`` between the outputs on *both orders* of every neighbouring pair under
    ``neighbouring``, for every order in ``orders`` (a bound for both orders is what adaptive
    composition needs: Mironov 2017, Proposition 1); ``None`` if it has no bound for that
    ``sampling`` or ``neighbouring``. The bound must hold at every order given, fractional ones
    included (Renyi divergence is non-decreasing in the order, so a bound proven for integer orders
    holds at ``ceil(alpha)``). ``pld`` (optional) returns a dp-accounting
    ``PrivacyLossDistribution`` of one release that dominates both orders, or ``None``.
    """

    kind: ClassVar[str]

    def to_dict(self) -> dict[str, Any]: ...

    def rdp(
        self, orders: Any, *, neighbouring: Neighbouring, sampling: Sampling
    ) -> Any | None: ...


Mechanism = GaussianEvent | LaplaceEvent | ExponentialEvent | DiscreteGaussianEvent | AccountedMechanism
BUILTIN_MECHANISMS: tuple[type, ...] = (GaussianEvent, LaplaceEvent, ExponentialEvent, DiscreteGaussianEvent)

_MECHANISMS: dict[str, type] = {
    c.kind: c for c in (GaussianEvent, LaplaceEvent, ExponentialEvent, DiscreteGaussianEvent)
}
_SAMPLINGS: dict[str, type] = {
    c.kind: c for c in (NoSampling, PoissonSampling, FixedCohortSampling)
}


def register_mechanism(cls: type) -> type:
    """Register a mechanism class (a decorator): events may carry it, ledgers restore it by ``kind``.

    Raises:
        TypeError: ``cls`` is not a frozen dataclass with a ``kind`` and an ``rdp`` method.
        ValueError: its ``kind`` is empty or already registered.
    """
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen:
        raise TypeError(f"a mechanism must be a frozen dataclass, got {cls!r}")
    kind = getattr(cls, "kind", None)
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"{cls.__name__}.kind must be a non-empty str, got {kind!r}")
    if kind in _MECHANISMS:
        raise ValueError(f"mechanism kind {kind!r} is already registered")
    if not callable(getattr(cls, "rdp", None)) or not callable(getattr(cls, "to_dict", None)):
        raise TypeError(f"{cls.__name__} must define rdp(orders, *, neighbouring, sampling) and to_dict()")
    _MECHANISMS[kind] = cls
    return cls


@register_mechanism
@dataclass(frozen=True, slots=True, kw_only=True)
class ChargedAhead:
    """A release already covered by an earlier charge of the whole horizon: no further privacy loss.

    A matrix-factorization (DP-FTRL) run releases ``C x + z`` over ``horizon`` rounds; its privacy is
    that of the whole release, which is charged in full before its first round (round t's output is a
    post-processing of the whole release, Denisov et al. 2022, Theorem 2.1). Rounds 2..horizon then
    charge this event, whose privacy loss is zero (RDP curve 0, the identity PLD), so the ledger holds
    the horizon's event exactly once. ``covers`` is that horizon event: an accountant takes this one
    only after ``covers`` itself, for at most ``horizon - 1`` rounds per charge of it, and a run only
    for a round whose noise is a later draw of the stream ``covers`` was charged for
    (:func:`fedprivacy.fl.mechanisms.check_release`). Without sampling only.
    """

    kind: ClassVar[str] = "charged_ahead"
    covers: PrivacyEvent
    horizon: int

    def __post_init__(self) -> None:
        _check_int("horizon", self.horizon, 1)
        if isinstance(self.covers, dict):  # rebuilt from to_dict()
            object.__setattr__(self, "covers", event_from_dict(self.covers))
        if not isinstance(self.covers, PrivacyEvent):
            raise ValueError(f"covers must be the horizon's PrivacyEvent, got {type(self.covers).__name__}")
        if isinstance(self.covers.mechanism, ChargedAhead):
            raise ValueError("covers must be the horizon's own event, not another ChargedAhead")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "covers": self.covers.to_dict(), "horizon": self.horizon}

    def rdp(self, orders: Any, *, neighbouring: Neighbouring, sampling: Sampling) -> Any | None:
        import numpy as np

        return np.zeros(np.shape(orders)) if isinstance(sampling, NoSampling) else None

    def pld(self, *, neighbouring: Neighbouring, sampling: Sampling) -> Any | None:
        from dp_accounting.pld import privacy_loss_distribution

        return privacy_loss_distribution.identity() if isinstance(sampling, NoSampling) else None


@dataclass(frozen=True, slots=True, kw_only=True)
class PrivacyEvent:
    """``count`` independent releases of ``mechanism``, each on a fresh ``sampling`` of the units.

    The privacy of the event is the ``count``-fold adaptive composition of the subsampled mechanism;
    ``PrivacyEvent(m, s, count=n)`` and n events ``PrivacyEvent(m, s)`` are the same release and every
    backend must account them identically (tested).
    """

    mechanism: Mechanism
    sampling: Sampling = field(default_factory=NoSampling)
    count: int = 1

    def __post_init__(self) -> None:
        registered = _MECHANISMS.get(str(getattr(self.mechanism, "kind", "")))
        if registered is None or not isinstance(self.mechanism, registered):
            raise TypeError(
                "mechanism must be a GaussianEvent, LaplaceEvent, ExponentialEvent, "
                "DiscreteGaussianEvent or a class registered with register_mechanism, got "
                f"{type(self.mechanism).__name__}"
            )
        if not isinstance(self.sampling, tuple(_SAMPLINGS.values())):
            raise TypeError(
                "sampling must be NoSampling, PoissonSampling or FixedCohortSampling, "
                f"got {type(self.sampling).__name__}"
            )
        _check_int("count", self.count, 1)

    def with_count(self, count: int) -> PrivacyEvent:
        return PrivacyEvent(mechanism=self.mechanism, sampling=self.sampling, count=count)

    def to_dict(self) -> dict[str, Any]:
        return {
            "mechanism": self.mechanism.to_dict(),
            "sampling": self.sampling.to_dict(),
            "count": self.count,
        }


def _build(kind_map: dict[str, type], what: str, d: Any) -> Any:
    if not isinstance(d, dict):
        raise ValueError(f"{what} must be a JSON object, got {type(d).__name__}")
    kind = d.get("kind")
    if kind not in kind_map:
        raise ValueError(f"{what}.kind must be one of {sorted(kind_map)}, got {kind!r}")
    cls = kind_map[kind]
    fields = {k: v for k, v in d.items() if k != "kind"}
    expected = {f.name for f in dataclasses.fields(cls)}
    unknown = set(fields) - expected
    if unknown:
        raise ValueError(f"{what} ({kind}) has unknown fields {sorted(unknown)}")
    try:
        return cls(**fields)
    except TypeError as exc:
        raise ValueError(f"{what} ({kind}) is invalid: {exc}") from None


def event_from_dict(d: Any) -> PrivacyEvent:
    """Rebuild a ``PrivacyEvent`` from ``PrivacyEvent.to_dict()``, validating every field."""
    if not isinstance(d, dict):
        raise ValueError(f"event must be a JSON object, got {type(d).__name__}")
    unknown = set(d) - {"mechanism", "sampling", "count"}
    if unknown:
        raise ValueError(f"event has unknown fields {sorted(unknown)}")
    mechanism = _build(_MECHANISMS, "event.mechanism", d.get("mechanism"))
    sampling = _build(_SAMPLINGS, "event.sampling", d.get("sampling"))
    try:
        return PrivacyEvent(mechanism=mechanism, sampling=sampling, count=d.get("count"))  # type: ignore[arg-type]
    except TypeError as exc:
        raise ValueError(f"event is invalid: {exc}") from None
