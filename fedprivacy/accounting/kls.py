"""The legacy distributed-DP bound and the rounding bounds (Kairouz, Liu & Steinke 2021, arXiv:2102.06387).

Each client clips to L2 norm ``C``, scales by ``s``, rotates, rounds conditionally on the norm
(:func:`rounded_l2_norm_bound`, KLS Sec. 4.1) and adds discrete Gaussian noise; secure aggregation
releases the sum mod ``2^b`` (:mod:`fedprivacy.secagg.ddp`). The rounding bounds serve every release.

Legacy share (:func:`distributed_round`): each of the ``n`` honest survivors adds ``N_Z(0, sigma_c^2)``.
KLS Theorem 1 with Proposition 14 (Eq. 17), with ``sigma = sqrt(n) sigma_c`` and
``tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma_c^2 k/(k+1))``, gives the rigorous zCDP parameter

    rho = 1/2 * min( Delta_2^2/sigma^2 + 2 tau Delta_1/sigma + tau^2 d, (Delta_2/sigma + tau sqrt(d))^2 )

(rho-zCDP, Bun & Steinke 2016), converted by Canonne, Kamath & Steinke 2020, Cor. 13
(:func:`zcdp_epsilon`). :func:`round_event` carries it as a
:class:`~fedprivacy.accounting.events.DiscreteGaussianEvent` for the ``rdp`` backend.

Neighbouring: one client's update is replaced by 0 (zero-out, ``add-remove``) while every
participating client's noise is present in both datasets; replace-one doubles the sensitivities.
The derivation is in docs/DISTRIBUTED_DP.md ("Proofs").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedprivacy.accounting.events import (
    DiscreteGaussianEvent,
    Neighbouring,
    NoSampling,
    PrivacyEvent,
)

__all__ = [
    "DistributedRound",
    "distributed_round",
    "round_event",
    "rounded_l1_norm_bound",
    "rounded_l2_norm_bound",
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

