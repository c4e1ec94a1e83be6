"""The public's view of a Poisson-sampled secure round whose completion depends on the cohort size.

Mechanism (privacy mode ``distributed``, ``privacy-audience = observers``). Each client of a
population of ``N`` takes part in a round independently with probability ``q``. The round completes
only when its cohort size ``n`` is in the set ``G`` of sizes the secure aggregation accepts
(``n >= t``, ``n >= 3`` and the round's degree safe for ``n``: :func:`fedprivacy.fl.secure.params.completes`);
otherwise it aborts before anything is released. The public sees, per round, whether it completed
(the model moves or not) and, if it did, the sum of the cohort's clipped updates plus Gaussian
noise of std ``z Delta`` (the dominating Gaussian of the distributed discrete Gaussian,
:mod:`fedprivacy.accounting.release`). Which rounds complete is therefore part of the release,
and a completed round is more likely to contain a given client than ``q``.

Neighbouring relation (the one distributed mode claims, :mod:`fedprivacy.accounting.kls`):
zero-out, i.e. datasets ``D`` and ``D'`` differ in the *update* of one client ``i`` (``x_i`` with
``||x_i|| <= Delta`` against ``0``), while ``i`` stays in the population, is sampled with
probability ``q`` and adds its noise share in both. Hence the cohort size has the same law under
``D`` and ``D'``: the abort atom has the same probability in both worlds. (Under the relation that
removes ``i`` from the population, which distributed mode does not claim, the atom's probability
differs: see "Not claimed" below.)

The dominating pair (proved here)
---------------------------------
Let ``B ~ Bin(N_o, q)`` be the number of *other* clients sampled (``N_o = N - 1``; both ``N - 1`` and
``N`` are evaluated and the worse taken, :func:`round_weights`), ``I ~ Bern(q)`` whether ``i`` is, and
``S_o`` the set of others, with their (adversarially chosen, clipped) sum ``mu``. Reveal ``S_o`` to the
observer: that only helps it (the real view is a post-processing), so a pair dominating the revealed
view dominates the real one (Zhu, Dong & Wang 2022, "Optimal accounting of differential privacy via
characteristic function", AISTATS, Definition 7: dominating pairs; post-processing and joint
convexity of the hockey-stick divergence). Given ``S_o`` with ``|S_o| = b`` the round, under
``D`` versus ``D'``, is one of four cases (the shift ``mu`` is a bijection: drop it):

* ``b in G`` and ``b + 1 in G`` (label *s*): it always completes; ``(q N(x_i, s^2) + (1-q) N(0, s^2),
  N(0, s^2))``: the Poisson-subsampled Gaussian of central DP;
* ``b not in G``, ``b + 1 in G`` (label *g*, "i decides the round"): it completes iff ``I = 1``, in
  both worlds; given completion the pair is ``(N(x_i, s^2), N(0, s^2))``: a Gaussian, *not* amplified;
* ``b in G``, ``b + 1 not in G`` (label *0*): it completes iff ``I = 0``; given completion ``i`` is not
  in the sum: identical distributions (privacy loss 0);
* neither: the round never completes.

The completion bit has the same law under ``D`` and ``D'`` (it depends on ``b`` and ``I`` only) and,
round by round, is independent of everything before (fresh sampling). So the completion pattern of
a run is data-independent; conditioned on it, an aborted round releases only ``⊥`` (loss 0) and a
completed round is the labelled mixture, with labels of the same law in both worlds,

    P = w_g N(1, z^2) (+) w_s [q N(1, z^2) + (1-q) N(0, z^2)] (+) w_0 R,
    Q = w_g N(0, z^2) (+) w_s N(0, z^2)                     (+) w_0 R     (units of Delta),

``w_g = q P[B = b, b not in G, b+1 in G] / p_c``, ``w_s = P[b in G, b+1 in G] / p_c``, ``w_0 = 1 - w_g - w_s``
and ``p_c = P[round completes] = sum_b P[B = b] (q [b+1 in G] + (1-q) [b in G])``
(:func:`completion_weights`). The privacy loss distribution of a labelled mixture is the mixture of
the components' privacy loss distributions: ``H_{e^eps}(P || Q) = w_g H_g + w_s H_s + w_0 (1 - e^eps)_+``
for every real ``eps``, in both orders. So this pair (:class:`CompletedRoundGaussian`) dominates one
completed round for every choice of the others' data and of ``x_i``: it is exact for the revealed
view and an upper bound for the real one. Forgetting the label gives the pair
``(q' N(1) + (1 - q') N(0), N(0))`` with ``q' = w_g + w_s q = P[i in S | round completes]``, the exact
pair of the adversary whose other updates are 0 (the lower bounds): so the figure is never
below them. Components are ordered (``0`` is a post-processing of *s*, which is a post-processing
of *g*: replace ``⊥`` by a draw of ``N(0)``), so moving weight towards *g* gives a dominating pair;
that is how the worse of ``N_o = N - 1`` and ``N`` is taken (largest ``w_g``, then largest ``w_g + w_s``).
With ``G`` upward closed (the default kinds: no label *0*) the pair dominates central DP's
subsampled Gaussian, so the public's figure is never below central DP's for the same completed
rounds (tested).

Composition against an adaptive adversary. ``D`` is the dataset with ``x_i`` in every round (the
pair is fixed for the run: zero-out never swaps which side carries the mixture), ``x_i``, the
others' data and the model may depend on every earlier output. For each round and each history the
pair above dominates the round's (conditional) output pair, so the composition of the pairs
dominates the adaptive composition (Zhu, Dong & Wang 2022, Theorem 10), and the two orders
``(P, Q)`` and ``(Q, P)`` are composed separately and the larger epsilon reported (their Theorem 11;
valid because the direction cannot switch between rounds under this relation: the pitfall of
Lebeda, Regehr, Kamath & Steinke 2024, "Avoiding pitfalls for privacy accounting of subsampled
mechanisms under composition", concerns relations where it can, e.g. substitution, and
replace-one is not claimed here: :meth:`CompletedRoundGaussian.pld` returns None for it).

Discretisation. One round's privacy loss distribution is built from its exact privacy profile: the
hockey-stick divergence of each Gaussian component in closed form (:func:`_profile`), mixed with the
weights, evaluated on a grid of step ``1e-4`` in ``eps`` over the components' loss range (dp-accounting's
``connect_dots_bounds``, tails beyond it below ``1e-15``), and turned into dp-accounting's pessimistic
connect-the-dots PMF (Doroshenko, Ghazi, Kamath, Kumar & Manurangsi 2022, "Connect the dots: tighter
discrete approximations of privacy loss distributions", PETS, Algorithm 1), whose hockey-stick
divergence is at least the true one for every ``eps``; composition is dp-accounting's FFT of PMFs
(Koskela, Jälkö & Honkela 2020; Koskela et al. 2021, "Tight differential privacy for discrete-valued
mechanisms and for the subsampled Gaussian mechanism using FFT"; Meiser & Mohammadi 2018, "Tight on
budget?", for the pessimistic rounding of privacy buckets), also pessimistic. So the epsilon is an
upper bound. The RDP curve (:meth:`CompletedRoundGaussian.rdp`) is the labelled mixture's
``(alpha - 1) D_alpha = log(w_g e^{(alpha-1) r_g} + w_s e^{(alpha-1) r_s} + w_0)`` (``E_Q[(P/Q)^alpha]`` of a
labelled mixture is the weighted sum) with dp-accounting's both-orders RDP bound of the subsampled
Gaussian (Mironov, Talwar & Zhang 2019).

Discrete noise and slack. The pair is about the dominating continuous Gaussian; the distributed
discrete Gaussian is within ``e^(+-H')`` of it in every component (mixtures keep pointwise density
ratio bounds; ``⊥`` atoms are exact), so :func:`fedprivacy.accounting.audiences.audience_epsilons`
adds its slack exactly as before.

Not claimed. (1) Removing ``i`` from the population: in the revealed view, with ``b + 1 in G`` and
``b not in G``, ``D`` completes with probability ``q`` and ``D'`` never does: an infinite privacy loss
of mass ``q P[B = b]``, larger than any useful delta, so no amplified figure follows from this
argument. (2) Rounds that abort after the cohort was chosen (dropouts, protocol violations): their
cause is not modelled; the summary claims no amplification for such a run. (3) Dropouts in rounds
that complete: the pair models completion by the cohort size. When sampled clients drop out, the
survivor count also decides completion, so client ``i`` can decide it through the survivors, and no
dropout rate can be assumed (a process that knows the cohort can make every completed round contain
``i``; independent dropouts at rate ``p`` give the pair at rate ``q (1 - p)``, above the ``p = 0``
figure for large ``p``). A run in which a completed round lost sampled clients therefore
claims no amplification either (:func:`fedprivacy.fl.modes.distributed.amplification_void`): its
rounds are charged the unamplified Gaussian, which holds for every data-independent dropout pattern
(given the cohort and the survivors each round is a Gaussian or nothing for ``i``). Assumed, for a
run that lost no sampled client: whether a round loses clients does not depend on who was sampled.
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
