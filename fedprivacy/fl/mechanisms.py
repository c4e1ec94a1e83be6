"""The noise mechanisms a privacy mode names: what a client adds to its clipped update, what a trusted
server adds to the sum, and the checks that the ledger charges what ran.

A client mechanism travels by name in the round's instructions; the client resolves the name in its
own registry (:data:`CLIENT_MECHANISMS`) and refuses one it does not know. Each mechanism states its
privacy loss as an accounting event (:mod:`fedprivacy.accounting.events`); the client's floor bounds
and charges any registered mechanism through that event (:func:`zcdp_rho`), and the server's ledger
charges the event the same object produced. Adding a client-side mechanism is one class with
``privatize`` and ``event`` plus :func:`register_client_mechanism`; see docs/DESIGN.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from fedprivacy.accounting.events import Mechanism, PrivacyEvent
    from fedprivacy.dp.rng import RandomSource
    from fedprivacy.fl.privacy import PrivacyPlan
    from fedprivacy.fl.types import RoundOutcome

__all__ = ["CLIENT_MECHANISMS", "GAUSSIAN", "GAUSSIAN_SUM", "XNOISE", "ClientMechanism", "GaussianNoise", "GaussianSumNoise",
           "MechanismMismatch", "SecureAggregationNoise", "ServerMechanism", "UnknownMechanism", "check_plan", "check_release",
           "get_client_mechanism", "register_client_mechanism", "zcdp_rho"]


class UnknownMechanism(ValueError):
    """The instructions name a client mechanism this process has not registered."""


class MechanismMismatch(RuntimeError):
    """A mode's plan charges another event than its mechanisms produce, or a round ran less noise than
    was charged: the run refuses it before anything is applied or shown."""


@runtime_checkable
class ClientMechanism(Protocol):
    """What a client does to its clipped update before it leaves (local DP).

    ``noise_multiplier`` z is the noise scale over the clip norm C, in the mechanism's own units (the
    Gaussian's std is zC). Any two clipped updates are at most 2C apart in L2 (the replace-one
    relation local accounting uses), which ``event`` must account for.
    """

    @property
    def name(self) -> str:
        """The name the round's instructions carry."""
        ...

    def privatize(self, arrays: Sequence[np.ndarray], *, clip_norm: float, noise_multiplier: float,
                  rng: RandomSource) -> list[np.ndarray]:
        """The released update: ``arrays`` (already clipped to ``clip_norm``) with this noise added."""
        ...

    def event(self, *, noise_multiplier: float, dim: int | None) -> Mechanism:
        """One release's accounting event under replace-one adjacency of one client's clipped update
        (``dim``: the number of coordinates, for mechanisms whose L1 sensitivity depends on it)."""
        ...


@runtime_checkable
class ServerMechanism(Protocol):
    """What a trusted server adds to the sum of clipped updates (central DP).

    A mechanism whose per-round noise is not the plan's ``central_noise_std`` (correlated noise:
    :class:`fedprivacy.fl.modes.dpftrl.CorrelatedNoise`) also defines ``required_noise_std(plan)``,
    the std its charged event needs on the round's aggregate; :func:`check_release` compares with it.
    """

    @property
    def name(self) -> str:
        ...

    def noise_std(self, *, clip_norm: float, noise_multiplier: float) -> float:
        """The per-coordinate std of the noise on the sum."""
        ...

    def event(self, *, noise_multiplier: float, clip_norm: float, dim: int | None) -> Mechanism:
        """One release's accounting event (the sum's sensitivity is one clip norm per client)."""
        ...


@dataclass(frozen=True, slots=True)
class GaussianNoise:
    """``N(0, (zC)^2)`` per coordinate on the client's clipped update (Dwork & Roth 2014, Thm. A.1;
    McMahan et al. 2018, Alg. 1 with the noise moved to the client)."""

    name: str = "gaussian"

    def privatize(self, arrays: Sequence[np.ndarray], *, clip_norm: float, noise_multiplier: float,
                  rng: RandomSource) -> list[np.ndarray]:
        std = noise_multiplier * clip_norm
        if not std > 0:
            raise ValueError(f"Gaussian client noise needs clip_norm * noise_multiplier > 0, got {std}")
        return [a + rng.normal(std=std, size=a.shape) for a in arrays]

    def event(self, *, noise_multiplier: float, dim: int | None) -> Mechanism:
        from fedprivacy.accounting.events import GaussianEvent

        return GaussianEvent(noise_multiplier=noise_multiplier)


@dataclass(frozen=True, slots=True)
class GaussianSumNoise:
    """``N(0, (zC)^2)`` per coordinate on the sum of clipped updates (McMahan et al. 2018, Alg. 1)."""

    name: str = "gaussian-sum"

    def noise_std(self, *, clip_norm: float, noise_multiplier: float) -> float:
        return noise_multiplier * clip_norm

    def event(self, *, noise_multiplier: float, clip_norm: float, dim: int | None) -> Mechanism:
        from fedprivacy.accounting.events import GaussianEvent

        return GaussianEvent(noise_multiplier=noise_multiplier)


@dataclass(frozen=True, slots=True)
class SecureAggregationNoise:
    """The distributed mode's XNoise components (:mod:`fedprivacy.secagg.ddp`), which a client adds
    only to its masked, encoded vector in the secure-aggregation stages: on the plain path it refuses."""

    name: str = "xnoise"
    secure_only: bool = True

    def privatize(self, arrays: Sequence[np.ndarray], *, clip_norm: float, noise_multiplier: float,
                  rng: RandomSource) -> list[np.ndarray]:
        raise ValueError("xnoise is added only inside secure aggregation; a plain-path release is refused")

    def event(self, *, noise_multiplier: float, dim: int | None) -> Mechanism:
        raise ValueError("xnoise's event is the secure encoding's (fedprivacy.secagg.ddp), not a plain release's")


GAUSSIAN = GaussianNoise()
GAUSSIAN_SUM = GaussianSumNoise()
XNOISE = SecureAggregationNoise()
CLIENT_MECHANISMS: dict[str, ClientMechanism] = {GAUSSIAN.name: GAUSSIAN, XNOISE.name: XNOISE}
_BUILT_IN = frozenset(CLIENT_MECHANISMS)


def register_client_mechanism(mechanism: ClientMechanism) -> None:
    """Make ``mechanism.name`` resolvable by clients of this process (built-ins cannot be replaced)."""
    name = getattr(mechanism, "name", "")
    if not isinstance(name, str) or not name:
        raise ValueError(f"mechanism.name must be a non-empty string, got {name!r}")
    if name in _BUILT_IN:
        raise ValueError(f"client mechanism {name!r} is built in and cannot be replaced")
    if not isinstance(mechanism, ClientMechanism):
        raise TypeError(f"a client mechanism needs privatize() and event(); {type(mechanism).__name__} lacks one")
    CLIENT_MECHANISMS[name] = mechanism


def get_client_mechanism(name: str) -> ClientMechanism | None:
    """The registered mechanism ``name`` (None for ``""``: the client adds no noise)."""
    if not name:
        return None
    try:
        return CLIENT_MECHANISMS[name]
    except KeyError:
        raise UnknownMechanism(f"client mechanism {name!r} is not registered here (known: "
                               f"{', '.join(CLIENT_MECHANISMS)}); refused") from None


def zcdp_rho(event: Mechanism, *, neighbouring: str) -> float:
    """A zCDP ρ bounding one release of ``event`` under ``neighbouring`` (∞ where none is known).

    Gaussian: ``1/(2 r²)`` for its std/distance ratio r (Bun & Steinke 2016, Prop. 1.6); discrete
    Gaussian: ``Δ²/(2σ²)`` (Canonne, Kamath & Steinke 2020, Thm. 14); a pure ε-DP mechanism (Laplace,
    exponential): ``ε²/2`` (Bun & Steinke 2016, Prop. 1.4). Any other event gets ∞: a client cannot
    bound what it does not understand, so its floor refuses it.
    """
    from fedprivacy.accounting.events import (
        DiscreteGaussianEvent,
        ExponentialEvent,
        GaussianEvent,
        LaplaceEvent,
        Neighbouring,
    )

    if isinstance(event, GaussianEvent):
        r = event.effective_noise_multiplier(Neighbouring.parse(neighbouring))
        return 1.0 / (2.0 * r * r)
    if isinstance(event, DiscreteGaussianEvent):
        return event.rho
    if isinstance(event, LaplaceEvent | ExponentialEvent):
        return event.epsilon * event.epsilon / 2.0
    return math.inf


def _mechanism_of(mode: Any, attr: str) -> Any:
    if not hasattr(mode, attr):
        raise MechanismMismatch(f"privacy mode {getattr(mode, 'name', mode)!r} does not say its {attr} "
                                "(None when it has none); a mode that names no mechanism cannot run")
    return getattr(mode, attr)


def expected_event(mode: Any, plan: PrivacyPlan, *, dim: int | None) -> Mechanism | None:
    """The per-round mechanism event the mode's named mechanisms produce for ``plan`` (None: no noise).

    Only plain-path mechanisms are derived here; a mode whose noise is added inside secure aggregation
    (``secure_noise``) states its own event and its transport checks the encoding.
    """
    client, server = _mechanism_of(mode, "client_mechanism"), _mechanism_of(mode, "server_mechanism")
    if client is not None and server is not None:
        raise MechanismMismatch(f"privacy mode {mode.name!r} names a client and a server mechanism; one "
                                "round has one release")
    if client is not None:
        return client.event(noise_multiplier=plan.noise_multiplier, dim=dim)
    if server is not None:
        return server.event(noise_multiplier=plan.noise_multiplier, clip_norm=plan.clip_norm, dim=dim)
    return None


def check_plan(mode: Any, plan: PrivacyPlan, *, dim: int | None, completion: Any = None) -> None:
    """Refuse a plan that charges other than what the mode's mechanisms add (before round 1).

    ``completion``: the run's :class:`fedprivacy.accounting.completion.CohortRuleSampling` (a secure run
    whose rounds' completion is public), under which a Gaussian is charged as its completed-round pair.
    """
    if getattr(mode, "secure_noise", False):
        if plan.event is None:
            raise MechanismMismatch(f"privacy mode {mode.name!r} adds noise in secure aggregation but its "
                                    "plan charges no event")
        return
    want = expected_event(mode, plan, dim=dim)
    got = None if plan.event is None else plan.event.mechanism
    if want is None and got is not None:
        raise MechanismMismatch(f"privacy mode {mode.name!r} charges {got!r} but names no mechanism that adds "
                                "noise (client_mechanism and server_mechanism are None): its ε would cover "
                                "updates released without noise; refused")
    if want is not None and got != want and not _completion_form(got, want, completion):
        raise MechanismMismatch(f"privacy mode {mode.name!r} charges {got!r}, but its mechanism adds "
                                f"{want!r}; the ledger must charge what runs")


def _completion_form(got: Any, want: Any, completion: Any) -> bool:
    """``got`` is ``want``'s Gaussian as the public sees a round of this run whose completion is public:
    exactly the pair ``completion`` gives it (its rate and weights; the sampling lives inside)."""
    from fedprivacy.accounting.events import GaussianEvent

    if completion is None or not isinstance(want, GaussianEvent):
        return False
    return bool(got == completion.event_for(want.noise_multiplier).mechanism)


def check_release(mode: Any, plan: PrivacyPlan, outcome: RoundOutcome, *,
                  charged: PrivacyEvent | None = None) -> None:
    """Refuse a round whose server-side noise, per unit of its rule's sensitivity, is less than the plan
    charged, or that was charged as already covered (``charged``: the ledger's charge for the round) but
    whose noise is not a later draw of the covering stream (before it is applied)."""
    if outcome.aborted is not None:
        return
    for event in (charged, outcome.event):
        _check_covered(mode, outcome, event)
    server = getattr(mode, "server_mechanism", None)
    if server is None:
        return
    ratio = outcome.aggregate.sensitivity_ratio
    ran = outcome.aggregate.noise_std / ratio if ratio >= 1.0 else 0.0
    required = getattr(server, "required_noise_std", None)  # a mechanism whose noise is not i.i.d. per round
    want = float(required(plan)) if callable(required) else plan.central_noise_std
    if not ran >= want * (1.0 - 1e-12):
        raise MechanismMismatch(f"privacy mode {mode.name!r}: the round's aggregate carries noise std "
                                f"{outcome.aggregate.noise_std:g} at sensitivity ratio {ratio:g}, its plan charged "
                                f"{want:g} per unit of the clipped sum's; not released")


def _check_covered(mode: Any, outcome: RoundOutcome, event: PrivacyEvent | None) -> None:
    """A :class:`~fedprivacy.accounting.events.ChargedAhead` round's noise must be draw 2..horizon of
    the stream charged as the event it covers: independent noise charged as covered would report one
    round's ε for many releases."""
    from fedprivacy.accounting.events import ChargedAhead

    mech = None if event is None else event.mechanism
    if not isinstance(mech, ChargedAhead):
        return
    draw = outcome.aggregate.correlated_draw
    if draw is None or draw.covers != mech.covers or not 2 <= draw.index <= mech.horizon:
        raise MechanismMismatch(f"privacy mode {getattr(mode, 'name', mode)!r} charges a round as covered by an "
                                "earlier horizon charge, but its aggregate is not a later draw of the correlated "
                                f"noise stream charged as that event (draw {draw!r}); not released")
