"""The public's view of a Poisson-sampled secure round whose completion depends on the cohort size.

Mechanism (privacy mode ``distributed``, ``privacy-audience = observers``): each of ``N`` clients takes part
with probability ``q``; the round completes only when its cohort size is in the set ``G`` the secure
aggregation accepts (:func:`fedprivacy.fl.secure.params.completes`), else it aborts and releases nothing.
The public sees which rounds complete and each completed round's sum of clipped updates plus Gaussian noise
of std ``z Delta`` (:mod:`fedprivacy.accounting.release`). Relation: zero-out (client ``i``'s ``x_i``
against ``0``, ``i`` sampled with probability ``q`` in both worlds; :mod:`fedprivacy.accounting.kls`).

The pair (:class:`CompletedRoundGaussian`; :func:`completion_weights`, :func:`round_weights`), units of Delta:

    P = w_g N(1, z^2) (+) w_s [q N(1, z^2) + (1-q) N(0, z^2)] (+) w_0 R,
    Q = w_g N(0, z^2) (+) w_s N(0, z^2) (+) w_0 R,

dominates one completed round for every choice of the others' data and of ``x_i`` (revealing the other
cohort members is a post-processing: Zhu, Dong & Wang 2022, Definition 7) and is never below the lower
bounds nor, for upward closed ``G``, central DP's subsampled Gaussian. The two orders are composed
separately against an adaptive adversary (their Theorems 10 and 11; valid because under zero-out the
direction cannot switch, unlike Lebeda, Regehr, Kamath & Steinke 2024's pitfall). PLD: the pessimistic
connect-the-dots PMF of the exact privacy profile (Doroshenko et al. 2022, Algorithm 1), composed by FFT
(Koskela, Jälkö & Honkela 2020; Meiser & Mohammadi 2018), an upper bound; RDP: Mironov, Talwar & Zhang 2019;
:func:`fedprivacy.accounting.audiences.audience_epsilons` adds the discrete slack.

Not claimed: removing ``i`` from the population (an infinite loss of mass ``q P[B = b]``); replace-one
(:meth:`CompletedRoundGaussian.pld` returns None); amplification for a run in which a round aborted after
its cohort was chosen or a completed round lost sampled clients
(:func:`fedprivacy.fl.modes.distributed.amplification_void`). Assumed, for a run that lost no sampled
client: whether a round loses clients does not depend on who was sampled.
Rationale: docs/DISTRIBUTED_DP.md, section "The public's completed-round pair".
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

from fedprivacy.accounting.backend_base import PLD_VALUE_DISCRETIZATION
from fedprivacy.accounting.events import (
    Neighbouring,
    NoSampling,
    Sampling,
    _check_int,
    _check_positive,
    _check_real,
    register_mechanism,
)

__all__ = [
    "CompletedRoundGaussian",
    "CompletionWeights",
    "CohortRuleSampling",
    "completion_weights",
    "epsilon_completed",
    "round_weights",
]

#: PLD discretisation of the privacy loss (the backends').
GRID = PLD_VALUE_DISCRETIZATION


@dataclass(frozen=True, slots=True, kw_only=True)
class CompletionWeights:
    """Weights of one completed round's labelled mixture (module docstring), and ``P[completes]``."""

    gaussian: float
    subsampled: float
    null: float
    completion_probability: float

    def inclusion(self, sample_rate: float) -> float:
        """``q' = w_g + w_s q``: the probability that ``i`` is in a completed round's sum."""
        return self.gaussian + self.subsampled * sample_rate


def completion_weights(*, others: int, sample_rate: float,
                       completes: Callable[[int], bool]) -> CompletionWeights:
    """The labelled mixture of a completed round for ``others`` other clients sampled at ``sample_rate``.

    ``completes(n)`` says whether a round with a cohort of ``n`` clients completes (no dropouts).
    Returns ``w_g = q P[B in E_g] / p_c``, ``w_s = P[B in E_s] / p_c``, ``w_0``, ``p_c`` with
    ``B ~ Bin(others, q)``, ``E_g = {b : b not in G, b+1 in G}``, ``E_s = {b : b, b+1 in G}``.
    Raises ValueError when no round can complete.
    """
    n_o = _check_int("others", others, 0)
    q = _check_real("sample_rate", sample_rate)
    if not 0.0 < q <= 1.0:
        raise ValueError(f"sample_rate must be in (0, 1], got {q}")
    b = np.arange(n_o + 1)
    pmf = stats.binom.pmf(b, n_o, q)
    good = np.array([bool(completes(int(k))) for k in range(n_o + 2)])
    now, nxt = good[:-1], good[1:]
    p_g = math.fsum(pmf[~now & nxt])
    p_s = math.fsum(pmf[now & nxt])
    p_0 = math.fsum(pmf[now & ~nxt])
    p_c = q * (p_g + p_s) + (1.0 - q) * (p_s + p_0)
    if not p_c > 0:
        raise ValueError(f"no round can complete: P[cohort in the accepted sizes] = 0 "
                         f"(others={n_o}, sample_rate={q})")
    w_g, w_0 = q * p_g / p_c, (1.0 - q) * p_0 / p_c
    return CompletionWeights(gaussian=w_g, subsampled=max(0.0, 1.0 - w_g - w_0), null=w_0,
                             completion_probability=p_c)


def round_weights(*, population: int, sample_rate: float,
                  completes: Callable[[int], bool]) -> CompletionWeights:
    """Weights that dominate a completed round whether ``population`` counts client ``i`` or not.

    The code's ``population`` is every client, ``i`` included (``N_o = N - 1``); the worse of
    ``N_o = N - 1`` and ``N`` is taken anyway: the largest ``w_g``, then the largest ``w_g + w_s``
    (module docstring: moving weight towards the Gaussian component dominates).
    """
    n = _check_int("population", population, 1)
    cands = [completion_weights(others=o, sample_rate=sample_rate, completes=completes)
             for o in (n - 1, n)]
    w_g = max(c.gaussian for c in cands)
    w_0 = min(c.null for c in cands)  # the largest w_g + w_s
    return CompletionWeights(gaussian=w_g, subsampled=max(0.0, 1.0 - w_g - w_0), null=w_0,
                             completion_probability=min(c.completion_probability for c in cands))


@dataclass(frozen=True, slots=True, kw_only=True)
class CohortRuleSampling:
    """Poisson sampling at ``rate`` whose rounds complete only for accepted cohort sizes, as the
    public sees it: a completed round is :class:`CompletedRoundGaussian` with these weights.

    Not a :data:`fedprivacy.accounting.events.Sampling`: the sampling lives inside the mechanism
    (:meth:`event_for`), so an event built from it carries ``NoSampling``.
    """

    rate: float
    gaussian_weight: float
    null_weight: float = 0.0

    def __post_init__(self) -> None:
        rate = _check_real("rate", self.rate)
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"rate must be in (0, 1], got {rate}")
        _check_weights(self.gaussian_weight, self.null_weight)

    @classmethod
    def of(cls, weights: CompletionWeights, *, rate: float) -> CohortRuleSampling:
        return cls(rate=rate, gaussian_weight=weights.gaussian, null_weight=weights.null)

    @property
    def inclusion_rate(self) -> float:
        """``q' = w_g + w_s q``: the inclusion rate given completion (the label forgotten)."""
        return self.gaussian_weight + (1.0 - self.gaussian_weight - self.null_weight) * self.rate

    def mechanism(self, noise_multiplier: float) -> CompletedRoundGaussian:
        return CompletedRoundGaussian(noise_multiplier=noise_multiplier, sample_rate=self.rate,
                                      gaussian_weight=self.gaussian_weight, null_weight=self.null_weight)

    def event_for(self, noise_multiplier: float) -> Any:
        from fedprivacy.accounting.events import PrivacyEvent

        return PrivacyEvent(mechanism=self.mechanism(noise_multiplier), sampling=NoSampling())

    def describe(self) -> str:
        return (f"poisson(q={self.rate:g}) with the cohort-size abort rule public: a completed round "
                f"is a Gaussian with weight {self.gaussian_weight:.4g}, else subsampled at q "
                f"(inclusion rate given completion {self.inclusion_rate:.5g})")


def _check_weights(gaussian: float, null: float) -> None:
    g, z = _check_real("gaussian_weight", gaussian), _check_real("null_weight", null)
    if not (0.0 <= g <= 1.0 and 0.0 <= z <= 1.0 and g + z <= 1.0 + 1e-12):
        raise ValueError(f"gaussian_weight and null_weight must be in [0, 1] with sum <= 1, got "
                         f"{gaussian} and {null}")


@register_mechanism
@dataclass(frozen=True, slots=True, kw_only=True)
class CompletedRoundGaussian:
    """One completed round as the public sees it: the labelled mixture (module docstring)

    ``P = w_g N(1, r^2) (+) w_s [q N(1, r^2) + (1-q) N(0, r^2)] (+) w_0 R`` against
    ``Q = w_g N(0, r^2) (+) w_s N(0, r^2) (+) w_0 R``, ``r = noise_multiplier / sensitivity``,
    ``w_s = 1 - w_g - w_0``. Zero-out (passed as ``add-remove``) only; carries ``NoSampling`` (its
    sampling is inside).
    """

    kind: ClassVar[str] = "completed_round_gaussian"
    noise_multiplier: float
    sample_rate: float
    gaussian_weight: float
    null_weight: float = 0.0
    sensitivity: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "noise_multiplier", _check_positive("noise_multiplier", self.noise_multiplier))
        object.__setattr__(self, "sensitivity", _check_positive("sensitivity", self.sensitivity))
        rate = _check_real("sample_rate", self.sample_rate)
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"sample_rate must be in (0, 1], got {rate}")
        _check_weights(self.gaussian_weight, self.null_weight)
        for name in ("sample_rate", "gaussian_weight", "null_weight"):
            object.__setattr__(self, name, float(getattr(self, name)))

    @property
    def subsampled_weight(self) -> float:
        return max(0.0, 1.0 - self.gaussian_weight - self.null_weight)

    @property
    def sampling_description(self) -> str:
        """The sampling inside the mechanism (the ledger's claim prints it instead of ``NoSampling``)."""
        return (f"poisson(q={self.sample_rate:g}), which rounds completed public: a completed round is an "
                f"unamplified Gaussian with weight {self.gaussian_weight:.4g}")

    @property
    def ratio(self) -> float:
        """Noise std over the L2 distance of neighbouring sums (zero-out)."""
        return self.noise_multiplier / self.sensitivity

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "noise_multiplier": self.noise_multiplier,
                "sample_rate": self.sample_rate, "gaussian_weight": self.gaussian_weight,
                "null_weight": self.null_weight, "sensitivity": self.sensitivity}

    def profile(self, epsilons: Any, *, remove: bool) -> np.ndarray:
        """Exact hockey-stick divergence ``H_{e^eps}`` of the pair (``remove``: ``(P, Q)``, else ``(Q, P)``)."""
        eps = np.asarray(epsilons, dtype=np.float64)
        r, q = self.ratio, self.sample_rate
        out = self.gaussian_weight * _profile(eps, sigma=r, q=1.0, remove=remove)
        if self.subsampled_weight:
            out = out + self.subsampled_weight * _profile(eps, sigma=r, q=q, remove=remove)
        if self.null_weight:
            out = out + self.null_weight * np.maximum(0.0, -np.expm1(eps))
        return np.clip(out, 0.0, 1.0)

    def pld(self, *, neighbouring: Neighbouring, sampling: Sampling) -> Any | None:
        """dp-accounting PLD of one release (pessimistic connect-the-dots of :meth:`profile`), both orders;
        None for replace-one or with an outer sampling (not analysed)."""
        if Neighbouring.parse(neighbouring) is not Neighbouring.ADD_REMOVE or not isinstance(sampling, NoSampling):
            return None
        return _pld(self)

    def rdp(self, orders: Any, *, neighbouring: Neighbouring, sampling: Sampling) -> Any | None:
        """RDP of the labelled mixture: ``log(w_g e^{(a-1) a/(2r^2)} + w_s e^{(a-1) r_s(a)} + w_0)/(a-1)``
        with ``r_s`` dp-accounting's RDP of the Poisson-subsampled Gaussian (both orders); None for
        replace-one or an outer sampling."""
        if Neighbouring.parse(neighbouring) is not Neighbouring.ADD_REMOVE or not isinstance(sampling, NoSampling):
            return None
        from dp_accounting import dp_event
        from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

        a = np.asarray(orders, dtype=np.float64)
        acc = rdp_lib.RdpAccountant(orders=[float(x) for x in a])
        acc.compose(dp_event.PoissonSampledDpEvent(self.sample_rate, dp_event.GaussianDpEvent(self.ratio)))
        r_s = np.asarray(acc.rdp, dtype=np.float64)
        r_g = a / (2.0 * self.ratio**2)
        terms = []
        with np.errstate(divide="ignore"):
            for w, r in ((self.gaussian_weight, r_g), (self.subsampled_weight, r_s),
                         (self.null_weight, np.zeros_like(a))):
                terms.append(np.log(w) + (a - 1.0) * r if w > 0 else np.full_like(a, -np.inf))
            mixed = special.logsumexp(np.vstack(terms), axis=0)
        return np.where(a > 1.0, np.maximum(mixed, 0.0) / np.where(a > 1.0, a - 1.0, 1.0), np.inf)


def _profile(eps: np.ndarray, *, sigma: float, q: float, remove: bool) -> np.ndarray:
    """``H_{e^eps}`` of ``(q N(1, s^2) + (1-q) N(0, s^2), N(0, s^2))`` (``remove``) or its reverse, exact.

    Remove: the loss ``log(1 - q + q e^{(x - 1/2)/s^2})`` increases in ``x``; it is ``>= eps`` iff
    ``x >= c = s^2 log((e^eps - 1 + q)/q) + 1/2`` (every ``x`` when ``e^eps <= 1 - q``), and
    ``H = P[X >= c] - e^eps Q[X >= c]``. Add: the loss ``-log(1 - q + q e^{(x - 1/2)/s^2})`` decreases,
    it is ``>= eps`` iff ``x <= c' = s^2 log((e^-eps - 1 + q)/q) + 1/2`` (no ``x`` when ``e^-eps <= 1 - q``).
    """
    s2 = sigma * sigma
    sf = special.ndtr  # ndtr(-u) = P[N(0,1) >= u], accurate in the tails
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if remove:
            arg = (np.exp(eps) - (1.0 - q)) / q
            c = np.where(arg > 0, s2 * np.log(np.where(arg > 0, arg, 1.0)) + 0.5, -np.inf)
            upper = q * sf((1.0 - c) / sigma) + (1.0 - q) * sf(-c / sigma)
            lower = sf(-c / sigma)
            h = upper - np.exp(eps) * lower
            h = np.where(np.isneginf(c), 1.0 - np.exp(eps), h)
        else:
            arg = (np.exp(-eps) - (1.0 - q)) / q
            c = np.where(arg > 0, s2 * np.log(np.where(arg > 0, arg, 1.0)) + 0.5, -np.inf)
            upper = sf(c / sigma)
            lower = q * sf((c - 1.0) / sigma) + (1.0 - q) * sf(c / sigma)
            h = upper - np.exp(eps) * lower
            h = np.where(np.isneginf(c), 0.0, h)
    return np.clip(np.nan_to_num(h, nan=0.0), 0.0, 1.0)


def _loss_range(mech: CompletedRoundGaussian) -> tuple[int, int]:
    """Grid indices covering every component's privacy loss in both orders (tails < 1e-15)."""
    lo, hi = 0.0, 0.0
    comps = [1.0] + ([mech.sample_rate] if mech.subsampled_weight else [])
    for q in comps:
        for adj in (plm.AdjacencyType.REMOVE, plm.AdjacencyType.ADD):
            b = plm.GaussianPrivacyLoss(mech.ratio, sensitivity=1.0, sampling_prob=q,
                                        adjacency_type=adj).connect_dots_bounds()
            lo, hi = min(lo, b.epsilon_lower), max(hi, b.epsilon_upper)
    return math.floor(lo / GRID), math.ceil(hi / GRID)


@functools.lru_cache(maxsize=64)
def _pld(mech: CompletedRoundGaussian) -> Any:
    lower, upper = _loss_range(mech)
    eps = np.arange(lower, upper + 1, dtype=np.float64) * GRID
    pmfs = []
    for remove in (True, False):
        # non-increasing, as a profile is: round-off is repaired upwards (pessimistic)
        deltas = np.maximum.accumulate(mech.profile(eps, remove=remove)[::-1])[::-1]
        pmfs.append(pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(GRID, lower, upper, deltas))
    return pld_lib.PrivacyLossDistribution(pmfs[0], pmfs[1])


def epsilon_completed(*, noise_multiplier: float, sampling: CohortRuleSampling, steps: int,
                      delta: float, backend: str = "pld") -> float:
    """Epsilon of ``steps`` completed rounds (:class:`CompletedRoundGaussian`), on a fresh accountant."""
    from fedprivacy.accounting.accountant import Accountant

    acc = Accountant(backend=backend, neighbouring=Neighbouring.ADD_REMOVE)
    event = sampling.event_for(noise_multiplier).with_count(_check_int("steps", steps, 1))
    acc._check_event(event)
    return acc.epsilon_if(event, delta=delta)
