"""Accounting for the distributed discrete Gaussian under secure aggregation (privacy mode ``distributed``).

Mechanism (Kairouz, Liu & Steinke 2021, "The Distributed Discrete Gaussian Mechanism for Federated
Learning with Secure Aggregation", ICML; arXiv:2102.06387v4; implemented in
:mod:`fedprivacy.secagg.ddp`): each client clips to L2 norm ``C``, scales by ``s`` (integer units per
unit), applies a randomised Hadamard rotation, rounds stochastically *conditioned on the norm* (so the
rounded vector has L2 norm at most ``Delta_2``, see :func:`rounded_l2_norm_bound`), adds independent
discrete Gaussian noise and reduces mod ``2^b``. Secure aggregation reveals only the sum mod ``2^b``, a
post-processing of the sum of the noised vectors.

Exact noise whatever the survivors (XNoise, :class:`XNoiseDesign`)
-----------------------------------------------------------------
Dordis (Jiang, Wang & Chen, EuroSys 2024, Sec. 4, "XNoise") lets every client add more noise than it
needs and lets the server remove, from seeds revealed after the survivors are known, the part that
the actual survivors over-provided. Our designs are exact: for every agreed survivor count ``s >= t``
the honest noise left in the released sum has discrete-Gaussian parameters summing to exactly
``sigma^2`` (the target), not ``n/t`` times it (``n`` = roster size, ``t`` = fewest survivors, ``c`` =
clients assumed to collude with the adversary, who know their own noise).

* ``binary`` (``c = 0``): unit ``b = sigma^2/n``; component 0 is ``N_Z(0, b)`` (never removed) and
  components ``j = 1..B``, ``B = bit_length(ceil((n - t)/t))``, are ``N_Z(0, b 2^(j-1))``. The survivor
  of rank ``r`` (by node id) among ``s`` keeps ``k_r = (n-s)//s + [r < (n-s) mod s]`` units: the
  components whose bit ``j-1`` of ``k_r`` is set. ``sum_r (1 + k_r) b = n b = sigma^2``.
* ``levels`` (any ``c``): with colluders exactness forces equal shares ``sigma^2/(s-c)``; components
  telescope (Dordis' "simple" scheme): ``sigma^2/(n-c)`` and ``sigma^2/h - sigma^2/(h+1)`` for
  ``h = t-c .. n-c-1``; at count ``s`` a client keeps the components with ``h >= s-c``, i.e. exactly
  ``sigma^2/(s-c)``, and any ``s-c`` honest survivors hold exactly ``sigma^2``.

Why exact and not Dordis' grouped levels: if the released noise depended on ``s`` (even within 2%),
its level, which an observer estimates from a ``d``-dimensional model to ``~sqrt(2/d)``, would tell
whether a given client was in the sum, and amplification by sampling would be lost for observers.
With an exact design both sampling branches (client in / client out) carry the same noise parameter.

Malicious server. The count ``s`` that selects what is removed must be the survivor set agreed and
authenticated by the consistency check of the secure aggregation (issue 10): a holder reveals shares
of a peer's *removable* component seeds for that one agreed set only (one set per round), never of a
kept component. A server that lies about ``s`` to some clients aborts the round before anything is
revealed; colluders know their own noise, so only the honest survivors' kept noise is counted
(``levels`` for ``c > 0``). The design must also be agreed (:meth:`XNoiseDesign.fingerprint`).

Accounting: a Gaussian domination lemma (proved here)
----------------------------------------------------
The sum of discrete Gaussians of different variances is not a discrete Gaussian. KLS 2021 (Theorem 1,
Proposition 14) bound the iid case with ``tau = 10 sum_k exp(-2 pi^2 sigma^2 k/(k+1))``; we prove what
we use, for any variances, from the Poisson summation formula
``(2 pi u)^(-1/2) sum_{x in Z} exp(-(x-m)^2/(2u)) = 1 + 2 sum_{k>=1} exp(-2 pi^2 u k^2) cos(2 pi k m)``,
i.e. ``sum_x phi_u(x - m) in [1 - e(u), 1 + e(u)]`` with ``e(u) = 2 sum_{k>=1} exp(-2 pi^2 u k^2)``
(:func:`theta_excess`) and ``phi_u`` the ``N(0, u)`` density.

Lemma 1. Let ``Y = Z_1 + ... + Z_N``, ``Z_j ~ N_Z(0, v_j)`` independent, ``V = sum v_j``,
``V_k = v_1 + ... + v_k`` and ``u_k = V_k v_(k+1) / V_(k+1)``. For every integer ``y``,
``L phi_V(y) <= P[Y = y] <= U phi_V(y)`` with
``L = prod_j (1 + e(v_j))^-1 prod_k (1 - e(u_k))`` and ``U = prod_j (1 + e(v_j))^-1 prod_k (1 + e(u_k))``.
Proof: ``P[Z_1 = y] = phi_(v_1)(y) / (1 + e(v_1))`` exactly (the normaliser is the theta sum at
``m = 0``). Induction: ``P[Y_(k+1) = y] = sum_x P[Y_k = x] phi_v(y - x)/(1 + e(v))`` and
``phi_(V_k)(x) phi_v(y - x) = phi_(V_k + v)(y) phi_(u_k)(x - y V_k/(V_k + v))``; summing over ``x`` gives
the factor in ``[1 - e(u_k), 1 + e(u_k)]``.

Lemma 2 (smoothing). Let ``X ~ N(0, V - w)`` (continuous, ``0 < w < V``) and ``K_w`` the kernel that
maps ``x`` to a draw of ``N_Z(x, w)`` (the discrete Gaussian on ``Z`` centred at ``x``). ``W = K_w(X)``
has ``phi_V(y)/(1 + e(w)) <= P[W = y] <= phi_V(y)/(1 - e(w))`` (the kernel's normaliser is
``sqrt(2 pi w)`` times the theta sum, and the two Gaussian densities convolve to ``phi_V``).

Proposition. One round releases ``f + Y`` on ``Z^m`` (``f`` the integer sum of the rounded vectors,
``Y`` the honest kept noise, ``m`` coordinates with the same component variances). With
``eta = m max(log(U (1 + e(w))), -log(L (1 - e(w))), 0)``, the release is within ``e^(+-eta)`` (every
event, both datasets) of ``K_w(f + X)``, ``X ~ N(0, (V - w) I)``, a post-processing of the *continuous*
Gaussian mechanism with std ``sqrt(V - w)`` on the same sum, because ``K_w(f + x) = f + K_w(x)`` for
integer ``f``. Neighbouring sums differ by a rounded vector of norm ``<= Delta_2`` (mixtures over
the rounding are dominated by the worst shift, joint convexity of the hockey-stick divergence), so
each round is dominated, up to ``eta``, by the Gaussian pair ``(N(Delta_2, V - w), N(0, V - w))``,
and under sampling by exactly the central-DP pair for the sampling that ran (zero-out adjacency:
the client's noise is present in both branches, and the exact design makes it the same). Over an
adaptive composition the density ratios multiply: with ``H = sum eta_r``,
``delta(eps) <= e^H delta_Gauss(eps - 2H)``, so we report ``eps_Gauss(delta e^-H) + 2H``
(:func:`audience_epsilons`). The dominating Gaussian is composed by the ``pld`` backend (exact, or
dp-accounting's pessimistic PLD under sampling), the tight conversion that replaces RDP of zCDP.

Cross-check (:meth:`DistributedRelease.rdp`): with ``p <= A p~`` and ``q >= B q~`` (Lemma 1 against
``N_Z(0, V) = phi_V/(1 + e(V))``), ``D_alpha(p || q) <= alpha Delta_2^2/(2V) + alpha/(alpha-1) log A - log B``
(Canonne, Kamath & Steinke 2020, Thm 14 for the multivariate discrete Gaussian), composed as RDP and
converted by dp-accounting; the reported figure is the smaller of two valid bounds.

Sampler. Lemmas 1-2 are about exact ``N_Z(0, v)`` draws. XNoise components come from the
tabulated sampler (:mod:`fedprivacy.dp.tabulated`), whose law ``q`` is an explicit integer table with
``|q/p~ - 1| <= r`` on its support (``p~``: ``N_Z(0, v)`` conditioned on ``|x| <= K``) and
``TV(p~, p) <= tail``. Per round, with ``N`` honest kept components per coordinate,
``A = m sum_j -log(1 - r_j)`` is a density-ratio slack (both ways: convolutions and products keep
pointwise ratio bounds) and ``G = m sum_j tail_j`` a total-variation term. The real release is within
``e^(+-A)`` of the truncated-exact one, which is ``G``-close to the exact one; the chain gives, over
the run, ``H' = sum (eta + A) - log(1 - sum G)`` and
``delta(eps) <= e^H' delta_Gauss(eps - 2H') + e^(eps) sum G``; :func:`audience_epsilons` reserves
``1e-6 delta`` for the last term (which caps the PLD path at ``eps ~ 150``; the RDP cross-check has no
such term: truncation is a conditioning on an event of probability ``>= 1 - G``). The legacy share
uses the float64 rejection sampler, whose deviation is not bounded: its releases carry
``exact_sampler=False`` and the report says so.

Three audiences (:func:`audience_epsilons`). The *server* sees who takes part: no amplification,
adaptive choice of survivors, malicious up to the protocol's guarantees. *Participants* (clients
that take part in rounds) are sent each round's roster and survivor list, which XNoise needs (every
survivor must know ``|U3|`` and its rank), so against them sampling does not amplify either, and
each knows its own kept noise: their figure is unamplified with that noise left out (review F1).
*Observers* are the public: parties that take part in no round and see only the models, which are
a post-processing of the server's view, so their epsilon is at most the server's; if the server
follows the protocol and keeps the cohort secret, sampling amplifies exactly as in central DP (the
same dominating pair). That needs the per-round counts kept private too (a known count ``n`` makes
the round a uniform ``n``-subset, whose rate fluctuates, review F2) and nothing published may depend
on them: runs charge every completed round the same :func:`worst_case_release` (the supremum of the
slack over rosters and survivor counts, review F6), so the figure depends only on how many rounds
completed.

Legacy (:func:`distributed_round`): each client adds ``sigma^2/t``; the sum of ``n`` iid discrete
Gaussians is bounded by KLS 2021 (Theorem 1 with Proposition 14, Eq. 17): with
``sigma = sqrt(n) sigma_c``, ``tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma_c^2 k/(k+1))`` and ``d``
coordinates, for every order ``alpha > 1``

    D_alpha <= min( alpha/2 * Delta_2^2/sigma^2 + tau d,
                    alpha/2 * (Delta_2^2/sigma^2 + 2 tau Delta_1/sigma + tau^2 d),
                    alpha/2 * (Delta_2/sigma + tau sqrt(d))^2 ).

We use the last two terms, which have the zCDP form ``alpha * rho``; dropping a term of a minimum only
makes the bound larger, so

    rho = 1/2 * min( Delta_2^2/sigma^2 + 2 tau Delta_1/sigma + tau^2 d, (Delta_2/sigma + tau sqrt(d))^2 )

is a rigorous zCDP parameter of one round (rho-zCDP, Bun & Steinke 2016). :func:`round_event`
returns a :class:`~fedprivacy.accounting.events.DiscreteGaussianEvent` with ``l2_sensitivity = 1`` and
``sigma = 1/sqrt(2 rho)`` and ``NoSampling``, composed by the ``rdp`` backend.

Neighbouring relation. As in KLS 2021, neighbouring rounds differ in one client's *update* while every
participating client's noise is present in both: "zero-out" (the update replaced by 0) is accounted
with ``Delta_2`` (passed as ``add-remove``), and replace-one with ``2 Delta_2``. The variant where a
removed client's noise also disappears is not claimed. A round that aborts releases nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from fedprivacy.accounting.events import (
    DiscreteGaussianEvent,
    GaussianEvent,
    Neighbouring,
    NoSampling,
    PrivacyEvent,
    Sampling,
)
from fedprivacy.accounting.events import _check_int as _int_arg

if TYPE_CHECKING:
    from fedprivacy.accounting.completion import CohortRuleSampling

__all__ = [
    "AUDIENCES",
    "AudienceEpsilons",
    "DistributedRelease",
    "DistributedRound",
    "GaussianDomination",
    "SMOOTHING_VARIANCE",
    "XNoiseDesign",
    "accounted_noise_multiplier",
    "audience_claim",
    "audience_epsilons",
    "calibrate_distributed",
    "worst_case_release",
    "gaussian_domination",
    "legacy_release",
    "release_privacy",
    "sum_pmf_log_bounds",
    "theta_excess",
    "distributed_round",
    "rounded_l1_norm_bound",
    "rounded_l2_norm_bound",
    "round_event",
    "slack_epsilon",
    "sum_divergence_tau",
    "zcdp_epsilon",
]


def rounded_l2_norm_bound(*, l2_norm: float, dim: int, beta: float) -> float:
    """L2 norm bound after conditional randomised rounding of a vector of norm <= ``l2_norm``.

    KLS 2021, Sec. 4.1 (conditional randomised rounding): rounding is repeated until
    ``||x~||^2 <= ||x||^2 + d/4 + sqrt(2 ln(1/beta)) (||x|| + sqrt(d)/2)``, which a single rounding
    satisfies with probability >= 1 - beta; the trivial bound ``||x|| + sqrt(d)`` always holds
    (every coordinate moves by < 1). Returns the smaller of the two (``beta = 0``: trivial bound).
    """
    if not l2_norm > 0:
        raise ValueError(f"l2_norm must be > 0, got {l2_norm}")
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    if not 0 <= beta < 1:
        raise ValueError(f"beta must be in [0, 1), got {beta}")
    trivial = l2_norm + math.sqrt(dim)
    if beta == 0:
        return trivial
    sq = (
        l2_norm**2
        + dim / 4.0
        + math.sqrt(2.0 * math.log(1.0 / beta)) * (l2_norm + math.sqrt(dim) / 2.0)
    )
    return min(trivial, math.sqrt(sq))


def rounded_l1_norm_bound(*, l2_bound: float, dim: int) -> float:
    """L1 bound of an integer vector of L2 norm <= ``l2_bound``: ``min(sqrt(d), l2) * l2``.

    ``||x||_1 <= sqrt(d) ||x||_2`` (Cauchy-Schwarz) and, for integers, ``||x||_1 <= ||x||_2^2``.
    """
    return l2_bound * min(math.sqrt(dim), l2_bound)


def sum_divergence_tau(*, local_sigma: float, num_clients: int) -> float:
    """``tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma_c^2 k/(k+1))`` (KLS 2021, Theorem 1); 0 for n = 1."""
    if not local_sigma > 0:
        raise ValueError(f"local_sigma must be > 0, got {local_sigma}")
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    c = 2.0 * math.pi**2 * local_sigma**2
    return 10.0 * math.fsum(math.exp(-c * k / (k + 1)) for k in range(1, num_clients))


@dataclass(frozen=True, slots=True, kw_only=True)
class DistributedRound:
    """The privacy of one completed distributed-DP round, in integer (scaled) units."""

    num_noisy_clients: int
    local_sigma: float
    total_sigma: float
    l2_sensitivity: float
    l1_sensitivity: float
    dim: int
    tau: float
    rho: float

    def epsilon(self, *, delta: float) -> float:
        """(epsilon, delta) of this round alone, from its zCDP (:func:`zcdp_epsilon`)."""
        return zcdp_epsilon(rho=self.rho, delta=delta)


def distributed_round(
    *,
    clip_norm: float,
    scale: float,
    dim: int,
    beta: float,
    local_sigma: float,
    num_survivors: int,
    neighbouring: Neighbouring | str = Neighbouring.ADD_REMOVE,
    corrupted: int = 0,
) -> DistributedRound:
    """zCDP of one round whose sum holds the noise of ``num_survivors - corrupted`` clients.

    Args:
        clip_norm: L2 clip norm ``C`` (float units).
        scale: integer units per float unit (``1/gamma`` in KLS).
        dim: padded (rotated) dimension.
        beta: conditional rounding parameter (0: unconditional rounding, trivial norm bound).
        local_sigma: each client's discrete Gaussian std, integer units.
        num_survivors: clients whose noised vectors are in the released sum.
        neighbouring: add-remove (one client's vector) or replace-one (doubles the sensitivities).
        corrupted: clients assumed to collude with the server (their noise is not counted).
    """
    n = num_survivors - corrupted
    if n < 1:
        raise ValueError(
            f"num_survivors - corrupted must be >= 1, got {num_survivors} - {corrupted}"
        )
    if not clip_norm > 0 or not scale > 0:
        raise ValueError(f"clip_norm and scale must be > 0, got {clip_norm} and {scale}")
    factor = 2.0 if Neighbouring.parse(neighbouring) is Neighbouring.REPLACE_ONE else 1.0
    l2 = rounded_l2_norm_bound(l2_norm=clip_norm * scale, dim=dim, beta=beta)
    l1 = rounded_l1_norm_bound(l2_bound=l2, dim=dim)
    l2, l1 = factor * l2, factor * l1
    tau = sum_divergence_tau(local_sigma=local_sigma, num_clients=n)
    sigma = math.sqrt(n) * local_sigma
    term2 = (l2 / sigma) ** 2 + 2.0 * tau * l1 / sigma + tau**2 * dim
    term3 = (l2 / sigma + tau * math.sqrt(dim)) ** 2
    return DistributedRound(
        num_noisy_clients=n,
        local_sigma=local_sigma,
        total_sigma=sigma,
        l2_sensitivity=l2,
        l1_sensitivity=l1,
        dim=dim,
        tau=tau,
        rho=0.5 * min(term2, term3),
    )


def round_event(result: DistributedRound | None) -> PrivacyEvent | None:
    """The accountant's event for a completed round (``None`` for an aborted round: spend nothing).

    A :class:`DiscreteGaussianEvent` with ``l2_sensitivity = 1`` and ``sigma = 1/sqrt(2 rho)`` carries
    exactly ``rho``; compose it with the ``rdp`` backend.
    """
    if result is None:
        return None
    return PrivacyEvent(
        mechanism=DiscreteGaussianEvent(
            sigma=1.0 / math.sqrt(2.0 * result.rho), l2_sensitivity=1.0
        ),
        sampling=NoSampling(),
    )


def zcdp_epsilon(*, rho: float, delta: float) -> float:
    """Smallest epsilon with rho-zCDP => (epsilon, delta)-DP (Canonne, Kamath & Steinke 2020, Cor. 13).

    ``delta = inf_{alpha>1} exp((alpha-1)(alpha rho - eps)) / (alpha - 1) * (1 - 1/alpha)^alpha``;
    solved for eps on a fine grid of alpha (any alpha gives a valid bound, so a grid is safe).
    """
    if not rho >= 0:
        raise ValueError(f"rho must be >= 0, got {rho}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if rho == 0:
        return 0.0
    best = rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))  # Bun & Steinke 2016, Prop. 1.3
    for i in range(1, 4001):
        alpha = 1.0 + 10.0 ** (-3.0 + 7.0 * i / 4000.0)
        eps = alpha * rho + (
            math.log(1.0 / delta) + (alpha - 1) * math.log(1 - 1 / alpha) - math.log(alpha)
        ) / (alpha - 1)
        best = min(best, eps)
    return max(best, 0.0)


# ============================================================================ XNoise (exact designs)
#: Seeded components one client may be asked to draw (a client-side cap; ``levels`` needs n - t).
MAX_SEEDED_COMPONENTS = 64

DESIGNS = ("binary", "levels")


@dataclass(frozen=True, slots=True, kw_only=True)
class XNoiseDesign:
    """The noise components every client of one round adds, and which of them survive removal.

    Exact: for every agreed survivor count ``s`` in ``[min_survivors, roster]`` the honest kept noise
    has parameters summing to exactly ``total_variance`` (module docstring). Component 0 is never
    removed (drawn from the client's own secure source); components ``1..`` are seeded and removable.

    Attributes:
        total_variance: ``sigma^2``, the target variance of the released sum (integer units squared).
        roster: ``n``, clients in the round's roster (the most survivors there can be).
        min_survivors: ``t``, the fewest survivors of a completed round.
        colluders: ``c``, clients assumed to collude with the adversary (their noise is not counted).
        kind: ``"binary"`` (``c = 0`` only) or ``"levels"``; empty picks ``binary`` for ``c = 0``.
        max_components: refuse designs with more seeded components than this (client-side cap).
    """

    total_variance: float
    roster: int
    min_survivors: int
    colluders: int = 0
    kind: str = ""
    max_components: int = MAX_SEEDED_COMPONENTS

    def __post_init__(self) -> None:
        v = self.total_variance
        if isinstance(v, bool) or not isinstance(v, int | float) or not (math.isfinite(v) and v > 0):
            raise ValueError(f"total_variance must be a finite number > 0, got {v!r}")
        object.__setattr__(self, "total_variance", float(v))
        n = _int_arg("roster", self.roster, 1)
        t = _int_arg("min_survivors", self.min_survivors, 1)
        c = _int_arg("colluders", self.colluders, 0)
        _int_arg("max_components", self.max_components, 0)
        if t > n:
            raise ValueError(f"min_survivors must be <= roster={n}, got {t}")
        if c >= t:
            raise ValueError(f"colluders must be < min_survivors={t} (some honest noise must "
                             f"remain), got {c}")
        kind = self.kind or ("binary" if c == 0 else "levels")
        if kind not in DESIGNS:
            raise ValueError(f"kind must be one of {DESIGNS}, got {self.kind!r}")
        if kind == "binary" and c:
            raise ValueError("kind='binary' is exact only without colluders (colluders=0); "
                             "use kind='levels'")
        object.__setattr__(self, "kind", kind)
        if self.num_seeded > self.max_components:
            raise ValueError(
                f"the {kind} design needs {self.num_seeded} seeded noise components "
                f"(roster={n}, min_survivors={t}, colluders={c}), more than max_components="
                f"{self.max_components}; raise min_survivors or max_components")

    # ------------------------------------------------------------------ structure
    @property
    def _bits(self) -> int:
        n, t = self.roster, self.min_survivors
        return (-(-(n - t) // t)).bit_length()  # bit_length(ceil((n - t)/t))

    @property
    def num_seeded(self) -> int:
        """Removable (seeded) components per client."""
        if self.kind == "binary":
            return self._bits
        return self.roster - self.min_survivors

    @property
    def unit(self) -> float:
        """Variance of component 0 (``sigma^2/n`` binary, ``sigma^2/(n-c)`` levels)."""
        return self.total_variance / (self.roster - self.colluders)

    @property
    def variances(self) -> tuple[float, ...]:
        """Variance parameter of each component (index 0: the kept base)."""
        b = self.unit
        if self.kind == "binary":
            return (b,) + tuple(b * float(1 << j) for j in range(self._bits))
        s2, top = self.total_variance, self.roster - self.colluders
        # component j (j >= 1) is the level h = top - j: sigma^2/h - sigma^2/(h+1)
        return (b,) + tuple(s2 / h - s2 / (h + 1) for h in range(top - 1, self.min_survivors
                                                                   - self.colluders - 1, -1))

    @property
    def client_variance(self) -> float:
        """Total variance one client draws (all components)."""
        return math.fsum(self.variances)

    def _check_count(self, survivors: int) -> int:
        s = _int_arg("survivors", survivors, 1)
        if not self.min_survivors <= s <= self.roster:
            raise ValueError(f"survivors must be in [min_survivors={self.min_survivors}, "
                             f"roster={self.roster}], got {s}")
        return s

    def kept(self, *, survivors: int, rank: int) -> tuple[int, ...]:
        """Components the survivor of ``rank`` (0-based, by node id) keeps among ``survivors``."""
        s = self._check_count(survivors)
        r = _int_arg("rank", rank, 0)
        if r >= s:
            raise ValueError(f"rank must be < survivors={s}, got {r}")
        if self.kind == "binary":
            q, rem = divmod(self.roster - s, s)
            k = q + (1 if r < rem else 0)
            return (0,) + tuple(j + 1 for j in range(self._bits) if (k >> j) & 1)
        return tuple(range(0, self.roster - s + 1))  # levels h >= s - c

    def removable(self, *, survivors: int, rank: int) -> tuple[int, ...]:
        """Components whose seeds are revealed for this survivor (the excess; never component 0)."""
        keep = set(self.kept(survivors=survivors, rank=rank))
        return tuple(j for j in range(1, self.num_seeded + 1) if j not in keep)

    def honest_kept_variances(self, *, survivors: int) -> tuple[float, ...]:
        """Component variances of the honest survivors' kept noise (worst case over colluders)."""
        s = self._check_count(survivors)
        var = self.variances
        if self.kind == "binary":  # c = 0: every survivor is honest
            return tuple(var[j] for r in range(s) for j in self.kept(survivors=s, rank=r))
        one = tuple(var[j] for j in self.kept(survivors=s, rank=0))
        return one * (s - self.colluders)  # equal shares: any s - c survivors hold the same

    def honest_variance(self, *, survivors: int) -> float:
        """Sum of the honest kept parameters: ``total_variance`` (up to rounding) for every ``s``."""
        return math.fsum(self.honest_kept_variances(survivors=survivors))

    def released_variance(self, *, survivors: int) -> float:
        """Variance parameter of all noise left in the released sum (colluders' included)."""
        s = self._check_count(survivors)
        var = self.variances
        return math.fsum(var[j] for r in range(s) for j in self.kept(survivors=s, rank=r))

    def fingerprint(self) -> bytes:
        """Canonical bytes of the design, for the survivors' consistency check (all must agree)."""
        return (f"fedprivacy/v1/xnoise|{self.kind}|n={self.roster}|t={self.min_survivors}|"
                f"c={self.colluders}|var={self.total_variance.hex()}").encode()


# ============================================================================ domination lemma
#: Variance ``w`` of the lattice smoothing kernel in Lemma 2 (e(3) ~ 4e-26).
SMOOTHING_VARIANCE = 3.0


def theta_excess(variance: float) -> float:
    """``e(u) = 2 sum_{k>=1} exp(-2 pi^2 u k^2)`` (Poisson summation: ``|sum_x phi_u(x-m) - 1| <= e(u)``)."""
    u = float(variance)
    if not (math.isfinite(u) and u > 0):
        raise ValueError(f"variance must be a finite number > 0, got {variance!r}")
    c = 2.0 * math.pi**2 * u
    total, k = 0.0, 1
    while True:
        term = math.exp(-c * k * k)
        total += term
        if term <= 1e-17 * total or term == 0.0:
            break
        k += 1
    # remaining tail < term * sum_{i>=1} exp(-c(2k+1) i) <= term * e^{-c}/(1-e^{-c}): add it as a bound
    return 2.0 * (total + term * math.exp(-c) / (1.0 - math.exp(-c)))


def sum_pmf_log_bounds(variances: Sequence[float]) -> tuple[float, float]:
    """``(log L, log U)`` of Lemma 1: ``L phi_V(y) <= P[sum_j Z_j = y] <= U phi_V(y)``, ``Z_j ~ N_Z(0, v_j)``.

    The induction runs over the variances in decreasing order (any order is valid; this one keeps
    ``u_k >= v_(k+1)/2``). ``log L = -inf`` when some ``e(u_k) >= 1`` (no lower bound).
    """
    vs = sorted((float(v) for v in variances), reverse=True)
    if not vs:
        raise ValueError("variances must not be empty")
    if any(not (math.isfinite(v) and v > 0) for v in vs):
        raise ValueError(f"variances must be finite and > 0, got {variances!r}")
    common = -math.fsum(math.log1p(theta_excess(v)) for v in vs)
    lo_terms, hi_terms = [], []
    acc = vs[0]
    for v in vs[1:]:
        e = theta_excess(acc * v / (acc + v))
        hi_terms.append(math.log1p(e))
        lo_terms.append(math.log1p(-e) if e < 1.0 else -math.inf)
        acc += v
    return common + math.fsum(lo_terms), common + math.fsum(hi_terms)


@dataclass(frozen=True, slots=True, kw_only=True)
class GaussianDomination:
    """A round's noise as a post-processed continuous Gaussian, up to ``e^(+-eta)`` (Proposition)."""

    total_variance: float
    smoothing_variance: float
    continuous_std: float
    eta: float


def gaussian_domination(variances: Sequence[float], *, dim: int,
                        smoothing_variance: float = SMOOTHING_VARIANCE) -> GaussianDomination:
    """Lemmas 1-2 for ``dim`` coordinates of the noise ``sum_j N_Z(0, v_j)``.

    Returns the std ``sqrt(V - w)`` of the dominating continuous Gaussian and ``eta`` (all ``dim``
    coordinates; ``inf`` if the lemma gives no bound, e.g. components with variance below ~0.04).
    """
    d = _int_arg("dim", dim, 1)
    w = float(smoothing_variance)
    total = math.fsum(float(v) for v in variances)
    if not (math.isfinite(w) and 0 < w < total):
        raise ValueError(f"smoothing_variance must be in (0, total variance={total:g}), got {w!r}")
    log_lo, log_hi = sum_pmf_log_bounds(variances)
    e_w = theta_excess(w)
    up = log_hi + math.log1p(e_w)
    down = log_lo + (math.log1p(-e_w) if e_w < 1.0 else -math.inf)
    eta1 = max(up, -down, 0.0)
    return GaussianDomination(total_variance=total, smoothing_variance=w,
                              continuous_std=math.sqrt(total - w), eta=d * eta1)


# ============================================================================ one released round
@dataclass(frozen=True, slots=True, kw_only=True)
class DistributedRelease:
    """The privacy of one completed round whose sum holds ``honest_variances`` of honest noise.

    ``l2_sensitivity`` is ``Delta_2`` (integer units) of one client's rounded vector under zero-out
    (add-remove); the accountant's neighbouring relation applies the factor 2 of replace-one.
    """

    survivors: int
    honest_survivors: int
    l2_sensitivity: float
    dim: int
    released_variance: float
    honest_variance: float
    min_component_variance: float
    continuous_std: float
    eta: float
    rdp_log_upper: float  # m log A of the RDP cross-check
    rdp_log_lower: float  # m log B (<= 0)
    exact: bool = True  # the released noise does not depend on the survivor count (XNoise)
    sampler_ratio: float = 0.0  # A: m sum_j -log(1 - r_j), the tabulated sampler's law vs N_Z
    sampler_tv: float = 0.0  # m sum_j tail_j: its truncation, in total variation
    exact_sampler: bool = True  # False: the float64 rejection sampler (deviation not bounded)

    @property
    def noise_multiplier(self) -> float:
        """Std of the dominating continuous Gaussian over ``Delta_2``: the accounted ``z``."""
        return self.continuous_std / self.l2_sensitivity

    def event(self, sampling: Sampling | CohortRuleSampling | None = None) -> PrivacyEvent:
        """The dominating Gaussian release (central DP's event) under ``sampling`` (default none);
        under :class:`fedprivacy.accounting.completion.CohortRuleSampling` (Poisson rounds whose
        completion is public) the completed round's pair
        :class:`fedprivacy.accounting.completion.CompletedRoundGaussian`."""
        from fedprivacy.accounting.completion import CohortRuleSampling

        if isinstance(sampling, CohortRuleSampling):
            return sampling.event_for(self.noise_multiplier)
        return PrivacyEvent(mechanism=GaussianEvent(noise_multiplier=self.noise_multiplier),
                            sampling=sampling if sampling is not None else NoSampling())

    def rdp(self, orders: Sequence[float], *, neighbouring: Neighbouring | str) -> list[float]:
        """Cross-check RDP curve: ``alpha D^2/(2V) + alpha/(alpha-1) (m log A + S) - m log B + A_s``.

        ``S = A_s - log(1 - TV)`` carries the sampler (ratio ``A_s`` both ways; the truncation is a
        conditioning on an event of probability ``>= 1 - TV`` under both datasets).
        """
        factor = 2.0 if Neighbouring.parse(neighbouring) is Neighbouring.REPLACE_ONE else 1.0
        base = (factor * self.l2_sensitivity) ** 2 / (2.0 * self.honest_variance)
        # sampler: ratio A both ways, truncation as conditioning on prob >= 1 - TV (no delta term)
        extra = self.sampler_ratio - math.log1p(-self.sampler_tv)
        return [a * base + a / (a - 1.0) * (self.rdp_log_upper + extra) - self.rdp_log_lower
                + self.sampler_ratio if a > 1 else math.inf for a in orders]


def release_privacy(design: XNoiseDesign, *, survivors: int, clip_norm: float, scale: float,
                    dim: int, beta: float,
                    smoothing_variance: float = SMOOTHING_VARIANCE) -> DistributedRelease:
    """Account a completed round from the noise actually left in its sum (``survivors`` agreed).

    Args:
        design: the round's noise design (its ``total_variance`` in integer units).
        survivors: the agreed survivor count ``s`` whose excess the server removed.
        clip_norm: ``C``; scale: ``s`` (integer units per unit); dim: padded dimension ``m``.
        beta: conditional rounding parameter (0: unconditional, trivial norm bound).
    """
    # exact (review F2): the released noise does not depend on s only without colluders; with c > 0
    # the levels design releases sigma^2 s/(s - c) (colluders' kept noise included)
    return _release(design.honest_kept_variances(survivors=survivors), survivors=survivors,
                    colluders=design.colluders,
                    released_variance=design.released_variance(survivors=survivors),
                    exact=design.colluders == 0,
                    clip_norm=clip_norm, scale=scale, dim=dim, beta=beta,
                    smoothing_variance=smoothing_variance, tabulated=True)


def legacy_release(*, local_variance: float, survivors: int, colluders: int = 0, clip_norm: float,
                   scale: float, dim: int, beta: float,
                   smoothing_variance: float = SMOOTHING_VARIANCE) -> DistributedRelease:
    """A round of the legacy share (each survivor adds ``N_Z(0, local_variance)``), same lemma.

    Its noise, ``s local_variance``, depends on the survivor count, so it is not ``exact``: the
    observers' figure claims no amplification for it (:func:`audience_epsilons`).
    """
    s = _int_arg("survivors", survivors, 1)
    c = _int_arg("colluders", colluders, 0)
    if c >= s:
        raise ValueError(f"colluders must be < survivors={s}, got {c}")
    return _release((float(local_variance),) * (s - c), survivors=s, colluders=c,
                    released_variance=s * float(local_variance), exact=False, clip_norm=clip_norm,
                    scale=scale, dim=dim, beta=beta, smoothing_variance=smoothing_variance,
                    tabulated=False)


def _release(variances: Sequence[float], *, survivors: int, colluders: int,
             released_variance: float, exact: bool, clip_norm: float, scale: float, dim: int,
             beta: float, smoothing_variance: float, tabulated: bool) -> DistributedRelease:
    if not clip_norm > 0 or not scale > 0:
        raise ValueError(f"clip_norm and scale must be > 0, got {clip_norm} and {scale}")
    dom = gaussian_domination(variances, dim=dim, smoothing_variance=smoothing_variance)
    log_lo, log_hi = sum_pmf_log_bounds(variances)
    honest = math.fsum(variances)
    # against N_Z(0, V) = phi_V / (1 + e(V)): A = U (1 + e(V)), B = L (1 + e(V)), per coordinate
    shift = math.log1p(theta_excess(honest))
    ratio = tv = 0.0
    if tabulated:  # the sampler's exact law vs N_Z(0, v): ratio on the support, truncation in TV
        from fedprivacy.dp.tabulated import law_bounds

        bounds = {v: law_bounds(v) for v in set(variances)}
        ratio = dim * math.fsum(-math.log1p(-bounds[v][0]) for v in variances)
        tv = dim * math.fsum(bounds[v][1] for v in variances)
    return DistributedRelease(
        survivors=survivors, honest_survivors=survivors - colluders,
        l2_sensitivity=rounded_l2_norm_bound(l2_norm=clip_norm * scale, dim=dim, beta=beta),
        dim=dim, released_variance=released_variance,
        honest_variance=honest, min_component_variance=min(variances),
        continuous_std=dom.continuous_std, eta=dom.eta,
        rdp_log_upper=dim * max(log_hi + shift, 0.0), rdp_log_lower=dim * min(log_lo + shift, 0.0),
        exact=exact, sampler_ratio=ratio, sampler_tv=tv, exact_sampler=tabulated)


# ============================================================================ worst case over rounds
#: Relative margin below ``sigma^2`` at which exact designs are accounted: the component variances are
#: floats, so the honest kept sum equals ``sigma^2`` only up to rounding (``<= ~1e-12`` relative, from
#: ``sigma^2/h - sigma^2/(h+1)``); every round checks that its realised sum is above the accounted one.
VARIANCE_MARGIN = 1e-9


def _design_extent(*, min_survivors: int, colluders: int, max_roster: int) -> tuple[int, int]:
    """``(largest roster a design can have, most honest kept components per coordinate)``.

    ``binary`` (``c = 0``): at ``s`` survivors the kept components number ``s + sum_r popcount(k_r)
    <= s + sum_r k_r = n``, so ``K <= n <= R``. ``levels``: a client keeps ``n - s + 1`` components
    and ``s - c`` honest survivors count, ``K = max_s (s - c)(n - s + 1)``, increasing in ``n``; its
    roster is capped by :data:`MAX_SEEDED_COMPONENTS` (``n - t`` seeded components).
    """
    t, c, r = min_survivors, colluders, max_roster
    if c == 0:
        return r, r
    r = min(r, t + MAX_SEEDED_COMPONENTS)
    return r, max((s - c) * (r - s + 1) for s in range(t, r + 1))


def _smallest_component(total_variance: float, *, min_survivors: int, colluders: int,
                        roster: int) -> float:
    """Smallest component variance of any design with roster ``<= roster`` (default kinds)."""
    s2, t, c = total_variance, min_survivors, colluders
    if c == 0:
        return s2 / roster  # binary: unit sigma^2/n, components b 2^j >= b
    top = roster - c
    return s2 / (top * (top - 1)) if roster > t else s2 / top  # levels: sigma^2/(h(h+1)), h <= top-1


def _largest_share(*, min_survivors: int, roster: int) -> float:
    """Largest fraction of ``sigma^2`` one survivor keeps (binary, ``c = 0``), any ``n <= roster``,
    ``s >= t``: rank 0 keeps ``(1 + ceil((n - s)/s)) sigma^2/n``, largest at ``s = t``."""
    t = min_survivors
    return max((1 + -(-(n - t) // t)) / n for n in range(t, roster + 1))


def worst_case_release(*, total_variance: float, min_survivors: int, colluders: int, max_roster: int,
                       clip_norm: float, scale: float, dim: int, beta: float,
                       participant: bool = False,
                       smoothing_variance: float = SMOOTHING_VARIANCE) -> DistributedRelease:
    """One release that dominates every completed round of the exact XNoise designs (default kinds)
    with roster ``<= max_roster`` and any survivor count ``s`` in ``[t, roster]``.

    Why (review F6 and F2): the amplified argument mixes rounds of different survivor counts, so its
    slack must be the supremum over them, not the realised one; and a figure computed from the
    realised counts (even its last digits) would publish them. This release depends on the run's
    parameters only: every completed round is charged the same event and the same slack.

    * Noise: ``V = sigma^2 (1 - VARIANCE_MARGIN)`` (exact designs keep ``sigma^2`` of honest noise for
      every ``s``; a smaller variance is a valid domination: the real noise is ``V`` plus independent
      noise). With ``participant=True`` and no colluders, the noise one participating client does
      not know: ``V - sigma^2 share`` (:func:`_largest_share`), since it knows its own kept noise.
      (With ``c >= 1`` the server's figure already removes ``c`` clients' noise.)
    * Slack, per coordinate, with ``K`` components (:func:`_design_extent`), smallest variance
      ``v_-`` and ``u_k >= v_-/2`` in Lemma 1's induction: ``log U <= K log(1 + e(v_-/2))``,
      ``-log L <= K log(1 + e(v_-)) - K log(1 - e(v_-/2))``, so ``eta <= m max(up, down)`` as in
      :func:`gaussian_domination`; the sampler's ratio and tail at their suprema over
      ``[v_-, sigma^2/(t - c)]`` (:func:`fedprivacy.dp.tabulated.law_bounds_sup`), ``K`` times.
    """
    from fedprivacy.dp.tabulated import law_bounds_sup

    t = _int_arg("min_survivors", min_survivors, 1)
    c = _int_arg("colluders", colluders, 0)
    r = _int_arg("max_roster", max_roster, t)
    m = _int_arg("dim", dim, 1)
    s2, w = float(total_variance), float(smoothing_variance)
    if not c < t:
        raise ValueError(f"colluders must be < min_survivors={t}, got {c}")
    r, k = _design_extent(min_survivors=t, colluders=c, max_roster=r)
    v_min = _smallest_component(s2, min_survivors=t, colluders=c, roster=r)
    honest = s2 * (1.0 - VARIANCE_MARGIN)
    if participant and c == 0:
        honest -= s2 * _largest_share(min_survivors=t, roster=r)
    if not honest > w:
        raise ValueError(f"no noise is left against {'a participant' if participant else 'the server'} "
                         f"(min_survivors={t}): the honest variance {honest:g} is below the smoothing "
                         f"variance {w:g}")
    e_half, e_min, e_w = theta_excess(v_min / 2.0), theta_excess(v_min), theta_excess(w)
    if not (e_half < 1.0 and e_w < 1.0):
        raise ValueError(f"noise components of variance {v_min:g} are too small to analyse; raise the scale")
    up = k * math.log1p(e_half)
    down = k * (math.log1p(e_min) - math.log1p(-e_half))
    r_sup, tail_sup = law_bounds_sup(min_variance=v_min, max_variance=s2 / (t - c))
    l2 = rounded_l2_norm_bound(l2_norm=clip_norm * scale, dim=m, beta=beta)
    return DistributedRelease(
        survivors=t, honest_survivors=t - c, l2_sensitivity=l2, dim=m,
        released_variance=s2 * t / (t - c), honest_variance=honest, min_component_variance=v_min,
        continuous_std=math.sqrt(honest - w),
        eta=m * max(up + math.log1p(e_w), down - math.log1p(-e_w)),
        rdp_log_upper=m * (up + math.log1p(e_min)), rdp_log_lower=-m * down,
        exact=c == 0, sampler_ratio=m * k * -math.log1p(-r_sup), sampler_tv=m * k * tail_sup,
        exact_sampler=True)


# ============================================================================ two audiences
AUDIENCES = ("server", "observers")
#: RDP orders of the cross-check (dp-accounting's defaults above 1).
RDP_ORDERS: tuple[float, ...] = tuple(float(a) for a in rdp_lib.DEFAULT_RDP_ORDERS if a > 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class AudienceEpsilons:
    """Epsilon of a sequence of released rounds for each audience, at ``delta``.

    ``server``: no amplification (the server sees who takes part and picks the survivors);
    ``observers``: *the public*, parties that take part in no round and see only the released
    models, amplified by the sampling that ran, never above ``server`` (the models are a
    post-processing of the server's view). ``participants``: a participating client (or a coalition
    of ``max(c, 1)`` of them, without the server): it is sent each round's roster and survivors, so
    no amplification, and it knows its own kept noise (review F1); None when not computed.
    ``slack`` is ``H'``. ``server_rdp`` is the RDP cross-check (``server`` is the smaller of it and
    the PLD bound only when the sampler has no truncation term, review F5). ``amplified`` says
    whether the observers' figure claims amplification (only when every round is ``exact``).
    """

    server: float
    observers: float
    server_pld: float
    observers_pld: float
    server_rdp: float
    slack: float
    delta: float
    rounds: int
    amplified: bool = False
    sampler_bounded: bool = True  # False: some round used the float64 sampler (deviation unbounded)
    participants: float | None = None


def _gaussian_epsilon(releases: Sequence[DistributedRelease], sampling: Sampling | CohortRuleSampling, *,
                      delta: float, neighbouring: Neighbouring, backend: str) -> float:
    from fedprivacy.accounting.accountant import Accountant

    acc = Accountant(backend=backend, neighbouring=neighbouring)
    runs: list[list] = []  # consecutive identical events as one self-composed run
    for r in releases:
        ev = r.event(sampling)
        if runs and runs[-1][0] == ev:
            runs[-1][1] += 1
        else:
            runs.append([ev, 1])
    for ev, count in runs:
        acc.spend(ev.with_count(count))
    return acc.epsilon(delta=delta)


@dataclass(frozen=True, slots=True)
class _Composed:
    """The slack terms of a sequence of releases and its Gaussian epsilon under a sampling."""

    releases: Sequence[DistributedRelease]
    delta: float
    neighbouring: Neighbouring
    backend: str

    @property
    def tv(self) -> float:
        return math.fsum(r.sampler_tv for r in self.releases)

    @property
    def slack(self) -> float:
        """``H' = sum (eta + A) - log(1 - sum G)`` (module docstring, "Sampler")."""
        rs = self.releases
        h = math.fsum(r.eta for r in rs) + math.fsum(r.sampler_ratio for r in rs) - math.log1p(-self.tv)
        if not h <= 1e-3:
            raise ValueError(f"the accounting slack H={h:g} is too large (noise components of "
                             "variance below ~1 integer unit, or a huge model); raise the scale or noise")
        return h

    def pld(self, sampling: Sampling | CohortRuleSampling) -> float:
        self.slack  # noqa: B018 -- refuses a slack too large before any composition
        rs = self.releases
        return slack_epsilon(
            lambda d: _gaussian_epsilon(rs, sampling, delta=d, neighbouring=self.neighbouring,
                                        backend=self.backend),
            delta=self.delta, ratio=math.fsum(r.eta for r in rs) + math.fsum(r.sampler_ratio for r in rs),
            tv=self.tv)

    def rdp(self) -> float:
        orders = list(RDP_ORDERS)
        curve = [math.fsum(v) for v in zip(*(r.rdp(orders, neighbouring=self.neighbouring)
                                              for r in self.releases), strict=True)]
        return float(rdp_lib.compute_epsilon(orders, curve, self.delta)[0])

    def unamplified(self) -> tuple[float, float, float]:
        """``(figure, pld, rdp)`` without sampling. The RDP curve counts the sampler's truncation as
        a conditioning, which is not sound (the truncated law's support differs between datasets,
        review F5): it is the figure only when there is no truncation term."""
        pld, rdp = self.pld(NoSampling()), self.rdp()
        return (min(pld, rdp) if not self.tv else pld), pld, rdp


def audience_epsilons(releases: Sequence[DistributedRelease], *, delta: float,
                      sampling: Sampling | CohortRuleSampling | None = None,
                      neighbouring: Neighbouring | str = Neighbouring.ADD_REMOVE,
                      backend: str = "pld",
                      participant_releases: Sequence[DistributedRelease] | None = None,
                      ) -> AudienceEpsilons:
    """Every audience's epsilon: ``eps_Gauss(delta (1 - 1e-6) e^-H') + 2H'`` (Proposition, "Sampler").

    ``sampling`` is the client sampling that ran as the public sees it (None: no amplification,
    e.g. every client every round, or per-round counts published). The observers' figure uses the
    same accountant and event as central DP for that sampling. ``participant_releases``: the same
    rounds against a participating client (:func:`worst_case_release` with ``participant=True``),
    unamplified.
    """
    nb = Neighbouring.parse(neighbouring)
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if not releases:
        return AudienceEpsilons(server=0.0, observers=0.0, server_pld=0.0, observers_pld=0.0,
                                server_rdp=0.0, slack=0.0, delta=delta, rounds=0,
                                participants=0.0 if participant_releases is not None else None)
    comp = _Composed(releases, delta, nb, backend)
    server, server_pld, server_rdp = comp.unamplified()
    if sampling is None or isinstance(sampling, NoSampling) or not all(r.exact for r in releases):
        obs_pld = server_pld  # no amplification claimed (nothing sampled, or noise tied to s)
    else:
        obs_pld = comp.pld(sampling)
    participants = None
    if participant_releases is not None:
        participants = max(_Composed(participant_releases, delta, nb, backend).unamplified()[0], server)
    return AudienceEpsilons(server=server, observers=min(obs_pld, server), server_pld=server_pld,
                            observers_pld=obs_pld, server_rdp=server_rdp, slack=comp.slack,
                            delta=delta, rounds=len(releases), amplified=obs_pld is not server_pld,
                            sampler_bounded=all(r.exact_sampler for r in releases),
                            participants=participants)


#: Share of delta reserved for the tabulated sampler's truncation (``e^eps TV <= share delta``).
_TV_SHARE = 1e-6


def slack_epsilon(gaussian_epsilon: Callable[[float], float], *, delta: float, ratio: float,
                  tv: float) -> float:
    """The module's chain ("Sampler") for any composed dominating Gaussian:
    ``eps_G(delta (1 - 1e-6) e^-H') + 2H'`` with ``H' = ratio - log(1 - tv)``.

    Over an adaptive composition of rounds each within ``e^(+-(eta + A))`` (pointwise, both datasets)
    of a truncated-exact release that is ``G``-close in total variation to a post-processed Gaussian
    mechanism, ``delta(eps) <= e^H' delta_G(eps - 2H') + e^eps sum G``: ``ratio = sum (eta + A)`` and
    ``tv = sum G`` over the rounds. ``gaussian_epsilon(d)`` is the epsilon at delta ``d`` of the composed
    dominating Gaussians (a PLD accountant's, or ρ-zCDP's conversion for the client's own total).
    ``1e-6 delta`` is reserved for the TV term; returns ``inf`` when ``e^eps tv`` would exceed it (not
    certified this way, epsilon above ~150).
    """
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if not (ratio >= 0 and 0 <= tv < 1):
        raise ValueError(f"slack must have ratio >= 0 and tv in [0, 1), got ratio={ratio}, tv={tv}")
    slack = ratio - math.log1p(-tv)
    d_eff = delta * (1.0 - _TV_SHARE if tv else 1.0) * math.exp(-slack)
    eps = gaussian_epsilon(d_eff) + 2.0 * slack
    if tv and eps > math.log(_TV_SHARE * delta / tv):  # e^eps * TV must stay <= share * delta
        return math.inf
    return eps


# ============================================================================ calibration
def accounted_noise_multiplier(*, noise_multiplier: float, clip_scale: float, l2_sensitivity: float,
                               smoothing_variance: float = SMOOTHING_VARIANCE) -> float:
    """``sqrt((z C s)^2 (1 - VARIANCE_MARGIN) - w) / Delta_2``: the Gaussian the ledger composes for a
    run of noise ``z`` (:func:`worst_case_release`)."""
    v = (noise_multiplier * clip_scale) ** 2 * (1.0 - VARIANCE_MARGIN) - smoothing_variance
    if not v > 0:
        raise ValueError(f"noise variance (z C s)^2 = {(noise_multiplier * clip_scale) ** 2:g} must "
                         f"exceed the smoothing variance {smoothing_variance:g}; raise the scale")
    return math.sqrt(v) / l2_sensitivity


def calibrate_distributed(*, target_epsilon: float, target_delta: float, steps: int,
                          audience: str = "server", sampling: Sampling | CohortRuleSampling | None = None,
                          neighbouring: Neighbouring | str = Neighbouring.ADD_REMOVE,
                          encoding_for: Callable[[float], tuple[float, float]],
                          smoothing_variance: float = SMOOTHING_VARIANCE,
                          max_slack: float = 1e-6, rel_tol: float = 1e-3) -> float:
    """Smallest noise multiplier ``z`` whose ``audience`` epsilon over ``steps`` rounds meets the target.

    Exact XNoise makes every completed round the same Gaussian release (:func:`audience_epsilons`),
    so the dominating Gaussian is calibrated like central DP
    (:func:`fedprivacy.accounting.calibration.calibrate_noise_multiplier`, ``pld``, never overshoots)
    for the audience's sampling (``server``: none; ``observers``: ``sampling``), at
    ``(target - 2 max_slack, delta e^-max_slack)`` so that any accepted slack ``H <= max_slack``
    keeps the target. Then ``z`` is solved from ``z_acc = sqrt((z C s)^2 - w)/Delta_2``, where
    ``encoding_for(z) -> (C s, Delta_2)`` gives the encoding the run would use at ``z`` (its scale
    depends on the noise through the headroom check); iterated until the encoding at ``z`` carries
    at least ``z_acc``.
    """
    from fedprivacy.accounting.calibration import calibrate_noise_multiplier

    if audience not in AUDIENCES:
        raise ValueError(f"audience must be one of {AUDIENCES}, got {audience!r}")
    if not target_epsilon > 2 * max_slack:
        raise ValueError(f"target_epsilon must be > {2 * max_slack:g}, got {target_epsilon}")
    from fedprivacy.accounting.completion import CohortRuleSampling, calibrate_completed

    samp = NoSampling() if audience == "server" or sampling is None else sampling
    if isinstance(samp, CohortRuleSampling):  # the public's completed-round pair
        if Neighbouring.parse(neighbouring) is not Neighbouring.ADD_REMOVE:
            raise ValueError("the completed-round pair is proved for zero-out (neighbouring=add-remove) only")
        z_acc = calibrate_completed(target_epsilon=target_epsilon - 2.0 * max_slack,
                                    target_delta=target_delta * math.exp(-max_slack), sampling=samp,
                                    steps=steps, rel_tol=rel_tol)
    else:
        z_acc = calibrate_noise_multiplier(
            target_epsilon=target_epsilon - 2.0 * max_slack,
            target_delta=target_delta * math.exp(-max_slack), sampling=samp, steps=steps,
            backend="pld", neighbouring=neighbouring, rel_tol=rel_tol)
    z = z_acc
    for _ in range(64):
        clip_scale, l2 = encoding_for(z)
        if (z * clip_scale) ** 2 * (1.0 - VARIANCE_MARGIN) > smoothing_variance and accounted_noise_multiplier(
                noise_multiplier=z, clip_scale=clip_scale, l2_sensitivity=l2,
                smoothing_variance=smoothing_variance) >= z_acc:
            return z
        z = max(z * (1 + 1e-12), math.sqrt(((z_acc * l2) ** 2 + smoothing_variance)
                                           / (1.0 - VARIANCE_MARGIN)) / clip_scale)
    raise ValueError("calibration did not converge: the encoding's scale keeps shrinking with the "
                     "noise; raise secagg-bits")


# ============================================================================ the claim
SERVER_THREAT_MODEL = (
    "the server (and anyone it colludes with, up to c clients who know their own noise): it sees who "
    "takes part, picks the survivors, chooses every message; it learns only sums that carry at least "
    "the honest survivors' kept noise (the secure-aggregation guarantee), so no amplification by "
    "sampling is claimed")
OBSERVERS_THREAT_MODEL = (
    "the public: parties that take part in no round of the run and see only the released models "
    "(a participating client is NOT in this audience: it is sent each round's roster and survivor "
    "list, see the participants' figure); the server follows the protocol and keeps the cohort "
    "secret; the per-round counts (clients sampled, roster, survivors, graph degree) are not "
    "published (they are in the server's private log, with each round's wall time, which grows with "
    "the cohort) and every completed round is charged the same worst-case release, so nothing "
    "published depends on them (timing beyond that, e.g. of messages, is not covered); the models are a "
    "post-processing of the server's view, so this epsilon is never above the server's; "
    "amplification by the sampling that ran is claimed only when the released noise does not depend "
    "on the survivors (exact XNoise without colluders) and the counts stay private; which rounds "
    "complete is public, so a completed Poisson round is accounted as the pair in which the public "
    "also learns how many other clients were sampled: with the probability that client i decided "
    "the round's completion it is an unamplified Gaussian, else the subsampled one "
    "(fedprivacy.accounting.completion; zero-out adjacency); rounds aborted by the cohort-size rule "
    "are inside that pair; a run with a round aborted for another reason (dropouts, a protocol "
    "violation) or a completed round that lost sampled clients after its cohort was chosen "
    "(dropouts: completion then also depends on the survivors) claims no amplification: every "
    "round is charged the server's unamplified Gaussian, valid for every dropout pattern that does "
    "not depend on the data (an observers-budgeted run stops there); the amplified figure of a run "
    "that lost no sampled client assumes that whether a round loses clients does not depend on who "
    "was sampled (true without dropouts; independent per-client dropouts that happened not to "
    "occur would tilt the cohorts towards fewer clients: not modelled)")
PARTICIPANTS_THREAT_MODEL = (
    "a client that takes part in rounds (or a coalition of max(c, 1) such clients, without the "
    "server): each round it takes part in tells it the roster and the survivors, so no amplification "
    "by sampling is claimed; it knows its own kept noise, which is not counted (with c = 0 this makes "
    "its figure larger than the server's; with c >= 1 the server's figure already leaves c clients' "
    "noise out and this figure is the server's)")


def audience_claim(eps: AudienceEpsilons, *, sampling_description: str, colluders: int,
                   exact_noise: bool, sampled: bool = True,
                   counts_published: bool = False, aborted: bool = False,
                   lost: bool = False) -> dict[str, Any]:
    """The ``audiences`` block of a distributed run's privacy report (results.json, console, report)."""
    if eps.amplified:
        why = (f"amplified by {sampling_description}, with which rounds completed public (each completed "
               "round: an unamplified Gaussian with the probability that the client decided its "
               "completion, else subsampled; the public only; counts kept private)")
    elif not sampled:
        why = "not amplified: every client takes part in every round"
    elif not exact_noise:
        why = ("not amplified: the released noise depends on how many survived (colluders > 0, or "
               "the legacy share), so its level could reveal whether a client was in the sum")
    elif aborted:
        why = ("not amplified: a round aborted after its cohort was chosen (dropouts or a protocol "
               "violation), which the public sees and whose cause is not modelled (review2 R8)")
    elif lost:
        why = ("not amplified: a completed round lost sampled clients after its cohort was chosen "
               "(dropouts), so its completion also depended on the survivors, which the pair does not "
               "model; every round is charged its unamplified Gaussian, valid for every dropout pattern "
               "(review3 V9)")
    elif counts_published:
        why = ("not amplified: the per-round client counts are published (publish-participation), and "
               "a known count changes the sampling the public faces (review F2)")
    else:
        why = "not amplified"
    sampler = ("tabulated discrete Gaussian: exact integer law, its deviation charged (slack H')"
               if eps.sampler_bounded else
               "float64 rejection sampler (legacy share): its deviation from N_Z (~2^-53 per "
               "decision) is NOT bounded in this epsilon")
    return {
        "server": {"epsilon": eps.server, "delta": eps.delta, "amplification": False,
                   "threat_model": SERVER_THREAT_MODEL, "colluders": colluders,
                   "accountant": ("pld of the dominating continuous Gaussian "
                                  "(fedprivacy.accounting.distributed, Proposition), one worst-case "
                                  "release per completed round; the RDP cross-check is reported, and "
                                  "used only when the sampler has no truncation term"),
                   "pld": eps.server_pld, "rdp_cross_check": eps.server_rdp},
        "observers": {"epsilon": eps.observers, "delta": eps.delta, "amplification": eps.amplified,
                      "who": "the public (takes part in no round)",
                      "sampling": why, "threat_model": OBSERVERS_THREAT_MODEL,
                      "colluders": colluders, "pld": eps.observers_pld},
        "participants": {"epsilon": eps.participants, "delta": eps.delta, "amplification": False,
                         "who": f"a participating client (or up to {max(colluders, 1)} of them)",
                         "threat_model": PARTICIPANTS_THREAT_MODEL, "colluders": colluders},
        "slack": eps.slack, "rounds": eps.rounds, "noise_sampler": sampler,
    }
