"""Adaptive clipping in a run: the round whose clip norm follows the private quantile estimate.

The maths (the estimator, Theorem 1's noise split) is :mod:`fedprivacy.dp.adaptive_clipping`; this module
puts it into a plain round (privacy ``central``, or ``none`` with a noiseless estimate):

1. the round's clip norm ``C_r`` is the estimate, sent to the clients in the round instructions;
2. the clients clip to ``C_r`` as in any round; the server re-clips, sums, and (``central``) adds
   ``N(0, (z_Δ C_r)²)`` with the raised multiplier ``z_Δ = (z⁻² − (2σ_b)⁻²)^(−½)``;
3. the server derives each summed update's bit ``‖Δ_i‖ ≤ C_r`` from the update it received (a clipped
   update arrives with norm ``C_r``; unclipped ones strictly below, see :data:`UNCLIPPED_TOLERANCE`)
   and releases the centred count with ``N(0, σ_b²)`` next to the sum;
4. only after the run has charged the round (``FederatedRun.charge_before_release``) does the estimate
   move (:meth:`AdaptiveClipRound.after_release`), so a discarded round leaves the clip norm unchanged.

The pair is one Gaussian of multiplier z (Andrew et al. 2021, Theorem 1), so the round's ledger event is
the plan's ``GaussianEvent(z)`` with the round's sampling: adaptive clipping costs no extra ε. The trusted
server sees every update in ``central`` mode anyway; in ``distributed`` mode the bit would have to travel
inside secure aggregation with its own noise, which is not built (the config refuses it).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fedprivacy.dp.adaptive_clipping import (
    QuantileClipEstimator,
    count_noise_std_for,
    update_noise_multiplier,
)
from fedprivacy.fl.aggregation import PlainAggregator
from fedprivacy.fl.charging import before_release
from fedprivacy.fl.types import ClipRoundInfo, Exchange, RoundInstructions, RoundOutcome

if TYPE_CHECKING:
    from fedprivacy.config import RunConfig
    from fedprivacy.dp.rng import RandomSource

__all__ = ["UNCLIPPED_TOLERANCE", "AdaptiveClipRound", "AdaptiveClipSpec", "adaptive_clip_spec"]

#: A received update counts as unclipped when its norm is below ``C (1 − tolerance)``: clipping to C and
#: the float32 wire format leave a clipped update within ~1e-7 of C. Pre-clip norms in
#: ``[C (1 − 1e-6), C]`` are counted as clipped, a negligible bias of the quantile estimate.
UNCLIPPED_TOLERANCE = 1e-6


@dataclass(frozen=True, slots=True, kw_only=True)
class AdaptiveClipSpec:
    """The adaptive-clipping part of a plan: how the round's z is split between update and count."""

    initial_clip_norm: float
    target_quantile: float
    learning_rate: float
    count_noise_std: float  # σ_b on the centred count (0: non-private estimate, privacy none)
    update_noise_multiplier: float  # z_Δ (0 without DP)
    expected_cohort: float

    def to_json(self) -> dict[str, Any]:
        return {"initial_clip_norm": self.initial_clip_norm, "target_quantile": self.target_quantile,
                "learning_rate": self.learning_rate, "count_noise_std": self.count_noise_std,
                "update_noise_multiplier": self.update_noise_multiplier,
                "expected_cohort": self.expected_cohort,
                "reference": "Andrew, Thakkar, McMahan & Ramaswamy 2021, Alg. 1 and Theorem 1"}


def adaptive_clip_spec(cfg: RunConfig, *, noise_multiplier: float, denominator: float) -> AdaptiveClipSpec:
    """The split for the round multiplier ``noise_multiplier`` (0 without DP); ValueError if impossible."""
    if noise_multiplier > 0:
        sb = cfg.adaptive_clip_count_std or count_noise_std_for(denominator)
        zd = update_noise_multiplier(noise_multiplier=noise_multiplier, count_noise_std=sb)
    else:
        sb, zd = 0.0, 0.0
    return AdaptiveClipSpec(initial_clip_norm=cfg.clip_norm, target_quantile=cfg.adaptive_clip_quantile,
                            learning_rate=cfg.adaptive_clip_learning_rate, count_noise_std=sb,
                            update_noise_multiplier=zd, expected_cohort=denominator)


def _norm(arrays: Sequence[np.ndarray]) -> float:
    return math.sqrt(sum(float(np.sum(np.square(np.asarray(a, dtype=np.float64)))) for a in arrays))


class AdaptiveClipRound:
    """A plain round with an adaptive clip norm (module docstring); a ``RoundFn`` with state."""

    def __init__(self, exchange: Exchange, spec: AdaptiveClipSpec, *, denominator: float) -> None:
        self.exchange, self.spec, self.denominator = exchange, spec, float(denominator)
        self.estimator = QuantileClipEstimator(
            initial_clip_norm=spec.initial_clip_norm, target_quantile=spec.target_quantile,
            learning_rate=spec.learning_rate, count_noise_std=spec.count_noise_std,
            expected_cohort=spec.expected_cohort)
        self._pending: float | None = None

    @property
    def clip_norm(self) -> float:
        """The clip norm of the next round."""
        return self.estimator.clip_norm

    def __call__(self, instr: RoundInstructions, cohort: Sequence[int], weights: Sequence[np.ndarray],
                 rng: RandomSource) -> RoundOutcome:
        c = self.estimator.clip_norm
        updates, failures = self.exchange(dataclasses.replace(instr, clip_norm=c), cohort, weights)
        before_release()  # write-ahead charge (issue 11) before the noised sum and count exist
        agg = PlainAggregator(clip_norm=c, noise_std=self.spec.update_noise_multiplier * c).aggregate(
            updates, like=weights, denominator=self.denominator, rng=rng)
        first: dict[int, Any] = {}
        for u in updates:  # the aggregator keeps a partition's first reply, so do the bits
            first.setdefault(u.partition_id, u)
        bits = [_norm(first[pid].delta) < c * (1.0 - UNCLIPPED_TOLERANCE) for pid in agg.aggregated]
        fraction = self.estimator.noisy_fraction(bits, rng=rng.child("clip-count"))
        self._pending = fraction
        return RoundOutcome(aggregate=agg, failures=dict(failures), updates=tuple(updates),
                            clip=ClipRoundInfo(clip_norm=c, unclipped_fraction=fraction))

    def after_release(self, outcome: RoundOutcome) -> None:
        """Move the estimate by the round's released fraction (the run calls this once it is charged)."""
        if self._pending is not None:
            self.estimator.update(self._pending)
            self._pending = None

    def state_dict(self) -> dict[str, Any]:
        return self.estimator.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.estimator.load_state_dict(state)
        self._pending = None
