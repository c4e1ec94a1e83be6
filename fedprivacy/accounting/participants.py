"""A participating client's view of Poisson-sampled secure rounds: amplified where it is not in the round.

Mechanism (privacy mode ``distributed``, exact XNoise without colluders, Poisson rate ``q``, the
cohort-size abort rule public; :mod:`fedprivacy.accounting.completion`). Adversary: one client ``j``
(``max(c, 1)`` with ``c = 0``), without the server, against a target ``i``. ``j`` is itself sampled
with probability ``q``; in a round it takes part in it is sent the roster and the survivors (XNoise
needs them), so it *sees* whether ``i`` is in the sum, and it knows its own kept noise (at most
``sigma^2 share`` of it, :func:`fedprivacy.accounting.distributed.worst_case_release`,
``participant=True``); in the other rounds it is the public. Adjacency: zero-out (``i``'s update
against 0, ``i`` stays in the population, its noise in both worlds), passed as ``add-remove``.

Dominating pair of one completed round (docs/DISTRIBUTED_DP.md, "Participants under sampling"). Reveal to
``j`` whether it is sampled, whether ``i`` is (when ``j`` is), and the number ``B ~ Bin(N_o, q)`` of the
other clients sampled (``N_o = N - 2``; ``N - 1`` is evaluated too and the worse taken). Given the
completion pattern (the same law in both worlds) a completed round is the labelled mixture
``w_p N(1, z_p^2) (+) w_g N(1, z^2) (+) w_s [q N(1, z^2) + (1-q) N(0, z^2)] (+) w_0 R`` against the
same with ``N(0, .)``: ``p``: ``j`` and ``i`` both in (``q^2 [B+2 in G]``); ``g``, ``s``, ``0``: ``j`` out,
labelled as in :mod:`fedprivacy.accounting.completion` (``(1-q) q [B not in G, B+1 in G]``,
``(1-q) [B, B+1 in G]``, ``(1-q)^2 [B in G, B+1 not in G]``, plus ``j`` in and ``i`` out:
``q (1-q) [B+1 in G]``, loss 0), each divided by ``P[complete]``. ``z_p <= z``: ``p`` dominates ``g``,
which dominates ``s``, which dominates ``0``. The labels are independent of the data and of earlier
rounds, so the composition of the pairs dominates the adaptive composition (Zhu, Dong & Wang 2022,
"Optimal accounting of differential privacy via characteristic function", Theorem 10); the two
orders are composed separately (zero-out: the direction cannot switch, Lebeda et al. 2024).
Under replace-one, with colluders or with published counts no amplification is claimed.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld import privacy_loss_mechanism as plm
from scipy import special, stats

from fedprivacy.accounting.completion import GRID, _profile
from fedprivacy.accounting.events import (
    Neighbouring,
    NoSampling,
    PrivacyEvent,
    Sampling,
    _check_int,
    _check_positive,
    _check_real,
    register_mechanism,
)

__all__ = ["ParticipantRoundGaussian", "ParticipantSampling", "participant_weights"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ParticipantSampling:
    """The label weights of a completed round against one participating client (module docstring):
    ``seen`` (``w_p``: both in, ``i`` seen), ``gaussian`` (``w_g``), ``subsampled`` (``w_s``); the rest
    is loss 0."""

    rate: float
    seen: float
    gaussian: float
    subsampled: float

    def __post_init__(self) -> None:
        rate = _check_real("rate", self.rate)
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"rate must be in (0, 1], got {rate}")
        ws = [_check_real(n, getattr(self, n)) for n in ("seen", "gaussian", "subsampled")]
        if not (min(ws) >= 0.0 and sum(ws) <= 1.0 + 1e-12):
            raise ValueError(f"seen, gaussian and subsampled must be >= 0 with sum <= 1, got {ws}")

    def event_for(self, *, noise_multiplier: float, participant_noise_multiplier: float) -> PrivacyEvent:
        mech = ParticipantRoundGaussian(noise_multiplier=noise_multiplier,
                                        participant_noise_multiplier=participant_noise_multiplier,
                                        sample_rate=self.rate, seen_weight=self.seen,
                                        gaussian_weight=self.gaussian, subsampled_weight=self.subsampled)
        return PrivacyEvent(mechanism=mech, sampling=NoSampling())


def _weights(others: int, q: float, good: np.ndarray) -> tuple[float, float, float]:
    pmf = stats.binom.pmf(np.arange(others + 1), others, q)
    g0, g1, g2 = good[:others + 1], good[1:others + 2], good[2:others + 3]
    seen = q * q * math.fsum(pmf[g2])
    unseen = q * (1.0 - q) * math.fsum(pmf[g1])  # j in, i out: j sees that i is not in the sum
    w_g = (1.0 - q) * q * math.fsum(pmf[~g0 & g1])
    w_s = (1.0 - q) * math.fsum(pmf[g0 & g1])
    w_0 = (1.0 - q) ** 2 * math.fsum(pmf[g0 & ~g1])
    p_c = seen + unseen + w_g + w_s + w_0
    if not p_c > 0:
        raise ValueError(f"no round can complete (others={others}, sample_rate={q})")
    return seen / p_c, w_g / p_c, w_s / p_c


def participant_weights(*, population: int, sample_rate: float,
                        completes: Callable[[int], bool]) -> ParticipantSampling:
    """Weights dominating a completed round against one participant, whether ``population`` counts
    ``i`` and ``j`` or only one of them (``N_o = N - 2`` and ``N - 1``): the largest ``w_p``, then
    ``w_p + w_g``, then ``w_p + w_g + w_s`` (moving weight up the order dominates)."""
    n = _check_int("population", population, 2)
    q = _check_real("sample_rate", sample_rate)
    if not 0.0 < q <= 1.0:
        raise ValueError(f"sample_rate must be in (0, 1], got {q}")
    good = np.array([bool(completes(k)) for k in range(n + 2)])
    cands = [_weights(o, q, good) for o in (n - 2, n - 1)]
    top = max(c[0] for c in cands)
    two = max(c[0] + c[1] for c in cands)
    three = min(1.0, max(sum(c) for c in cands))
    return ParticipantSampling(rate=q, seen=top, gaussian=two - top, subsampled=max(0.0, three - two))


@register_mechanism
@dataclass(frozen=True, slots=True, kw_only=True)
class ParticipantRoundGaussian:
    """One completed round against one participating client: the labelled mixture of the module
    docstring, ``z = noise_multiplier`` (all the noise) and ``z_p = participant_noise_multiplier``
    (the noise the participant does not know), sensitivity 1. Zero-out (``add-remove``) only."""

    kind: ClassVar[str] = "participant_round_gaussian"
    noise_multiplier: float
    participant_noise_multiplier: float
    sample_rate: float
    seen_weight: float
    gaussian_weight: float
    subsampled_weight: float

    def __post_init__(self) -> None:
        z = _check_positive("noise_multiplier", self.noise_multiplier)
        zp = _check_positive("participant_noise_multiplier", self.participant_noise_multiplier)
        if zp > z:
            raise ValueError(f"participant_noise_multiplier must be <= noise_multiplier={z}, got {zp}")
        ParticipantSampling(rate=self.sample_rate, seen=self.seen_weight, gaussian=self.gaussian_weight,
                            subsampled=self.subsampled_weight)
        for name in ("noise_multiplier", "participant_noise_multiplier", "sample_rate", "seen_weight",
                     "gaussian_weight", "subsampled_weight"):
            object.__setattr__(self, name, float(getattr(self, name)))

    @property
    def _parts(self) -> tuple[tuple[float, float, float], ...]:
        """``(weight, noise multiplier, sampling rate)`` of each Gaussian component."""
        z, zp, q = self.noise_multiplier, self.participant_noise_multiplier, self.sample_rate
        return tuple(p for p in ((self.seen_weight, zp, 1.0), (self.gaussian_weight, z, 1.0),
                                 (self.subsampled_weight, z, q)) if p[0] > 0)

    @property
    def sampling_description(self) -> str:
        return (f"poisson(q={self.sample_rate:g}) against a participant: a completed round is a Gaussian "
                f"it sees with weight {self.seen_weight:.4g}, else the public's pair")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "noise_multiplier": self.noise_multiplier,
                "participant_noise_multiplier": self.participant_noise_multiplier,
                "sample_rate": self.sample_rate, "seen_weight": self.seen_weight,
                "gaussian_weight": self.gaussian_weight, "subsampled_weight": self.subsampled_weight}

    def profile(self, epsilons: Any, *, remove: bool) -> np.ndarray:
        """Exact hockey-stick divergence of the pair (``remove``: ``(P, Q)``, else ``(Q, P)``)."""
        eps = np.asarray(epsilons, dtype=np.float64)
        null = 1.0 - sum(w for w, _, _ in self._parts)
        out = null * np.maximum(0.0, -np.expm1(eps))
        for w, z, q in self._parts:
            out = out + w * _profile(eps, sigma=z, q=q, remove=remove)
        return np.clip(out, 0.0, 1.0)

    def pld(self, *, neighbouring: Neighbouring, sampling: Sampling) -> Any | None:
        """dp-accounting PLD (pessimistic connect-the-dots of :meth:`profile`), both orders; None for
        replace-one or an outer sampling."""
        if Neighbouring.parse(neighbouring) is not Neighbouring.ADD_REMOVE or not isinstance(sampling, NoSampling):
            return None
        return _pld(self)

    def rdp(self, orders: Any, *, neighbouring: Neighbouring, sampling: Sampling) -> Any | None:
        """RDP of the labelled mixture, ``log(sum_l w_l e^{(a-1) r_l(a)})/(a-1)`` (``E_Q[(P/Q)^a]`` of a
        labelled mixture is the weighted sum; ``r_l`` dp-accounting's RDP of each component)."""
        if Neighbouring.parse(neighbouring) is not Neighbouring.ADD_REMOVE or not isinstance(sampling, NoSampling):
            return None
        from dp_accounting import dp_event
        from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

        a = np.asarray(orders, dtype=np.float64)
        null = max(0.0, 1.0 - sum(w for w, _, _ in self._parts))
        terms = [np.full_like(a, math.log(null)) if null > 0 else np.full_like(a, -np.inf)]
        for w, z, q in self._parts:
            acc = rdp_lib.RdpAccountant(orders=[float(x) for x in a])
            acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)))
            terms.append(math.log(w) + (a - 1.0) * np.asarray(acc.rdp, dtype=np.float64))
        mixed = special.logsumexp(np.vstack(terms), axis=0)
        return np.where(a > 1.0, np.maximum(mixed, 0.0) / np.where(a > 1.0, a - 1.0, 1.0), np.inf)


@functools.lru_cache(maxsize=64)
def _pld(mech: ParticipantRoundGaussian) -> Any:
    lo, hi = 0.0, 0.0
    for _, z, q in mech._parts:
        for adj in (plm.AdjacencyType.REMOVE, plm.AdjacencyType.ADD):
            b = plm.GaussianPrivacyLoss(z, sensitivity=1.0, sampling_prob=q,
                                        adjacency_type=adj).connect_dots_bounds()
            lo, hi = min(lo, b.epsilon_lower), max(hi, b.epsilon_upper)
    lower, upper = math.floor(lo / GRID), math.ceil(hi / GRID)
    eps = np.arange(lower, upper + 1, dtype=np.float64) * GRID
    pmfs = []
    for remove in (True, False):
        deltas = np.maximum.accumulate(mech.profile(eps, remove=remove)[::-1])[::-1]
        pmfs.append(pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(GRID, lower, upper, deltas))
    return pld_lib.PrivacyLossDistribution(pmfs[0], pmfs[1])
