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
server sees every update in ``central`` mode anyway.

``distributed`` (:class:`AdaptiveSecureRound`): the server never sees an update or a bit. The round's
encoding has the clip norm ``C_r``, the raised multiplier ``z_Δ`` and a count coordinate of weight
``k_b = ⌊z_Δ C_r s/(2σ_b)⌋`` (:mod:`fedprivacy.secagg.ddp`): each client appends its centred bit
``k_b (2b − 1)``, noised by its own XNoise components like every coordinate, and the server reads
``Σ (b_i − ½) + N(0, (σ/(2k_b))²)`` from the unmasked sum. The round's event is the dominating Gaussian of
the whole vector (sensitivity ``hypot(Δ₂, k_b)``: the two discrete-Gaussian releases composed), which the
plan makes at least the requested z. The client checks the encoding against its own floor (joint ρ and the
count's own multiplier, :class:`fedprivacy.fl.client_policy.ClientPolicy`) and refuses a clip norm the
rule cannot reach (:func:`fedprivacy.dp.adaptive_clipping.reachable_clip_range`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fedprivacy.dp.adaptive_clipping import (
    UNCLIPPED_TOLERANCE,
    QuantileClipEstimator,
    count_noise_std_for,
    update_noise_multiplier,
)
from fedprivacy.fl.aggregation import PlainAggregator
from fedprivacy.fl.charging import before_release
from fedprivacy.fl.secure.params import make_encoding
from fedprivacy.fl.secure.server import SecureRound
from fedprivacy.fl.types import ClipRoundInfo, Exchange, RoundInstructions, RoundOutcome

if TYPE_CHECKING:
    from fedprivacy.config import RunConfig
    from fedprivacy.dp.rng import RandomSource
    from fedprivacy.fl.secure.server import SecureTransport
    from fedprivacy.fl.types import ClientUpdate
    from fedprivacy.secagg.encoding import EncodingSpec

__all__ = ["UNCLIPPED_TOLERANCE", "AdaptiveClipRound", "AdaptiveClipSpec", "AdaptiveSecureRound",
           "adaptive_clip_spec"]


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
        try:
            zd = update_noise_multiplier(noise_multiplier=noise_multiplier, count_noise_std=sb)
        except ValueError as exc:
            given = ("" if cfg.adaptive_clip_count_std else
                     f" (its default, expected cohort/20 = {denominator:g}/20)")
            raise ValueError(
                f"adaptive-clip-count-std must be > noise-multiplier/2 = {noise_multiplier / 2:g} for adaptive "
                f"clipping, got {sb:g}{given}; set adaptive-clip-count-std above {noise_multiplier / 2:g}, or "
                "sample more clients per round") from exc
    else:
        sb, zd = 0.0, 0.0
    return AdaptiveClipSpec(initial_clip_norm=cfg.clip_norm, target_quantile=cfg.adaptive_clip_quantile,
                            learning_rate=cfg.adaptive_clip_learning_rate, count_noise_std=sb,
                            update_noise_multiplier=zd, expected_cohort=denominator)


def _norm(arrays: Sequence[np.ndarray]) -> float:
    return math.sqrt(sum(float(np.sum(np.square(np.asarray(a, dtype=np.float64)))) for a in arrays))


class _QuantileState:
    """The estimator a round keeps between rounds: its clip norm, the move after release, checkpoints."""

    estimator: QuantileClipEstimator
    _fraction: float | None = None  # the round's released fraction, until the run has charged it

    @property
    def clip_norm(self) -> float:
        """The clip norm of the next round."""
        return self.estimator.clip_norm

    def after_release(self, outcome: RoundOutcome) -> None:
        """Move the estimate by the round's released fraction (the run calls this once it is charged)."""
        if self._fraction is not None:
            self.estimator.update(self._fraction)
            self._fraction = None

    def state_dict(self) -> dict[str, Any]:
        return self.estimator.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.estimator.load_state_dict(state)
        self._fraction = None


class AdaptiveClipRound(_QuantileState):
    """A plain round with an adaptive clip norm (module docstring); a ``RoundFn`` with state."""

    def __init__(self, exchange: Exchange, spec: AdaptiveClipSpec, *, denominator: float) -> None:
        self.exchange, self.spec, self.denominator = exchange, spec, float(denominator)
        self.estimator = _estimator(spec)
        self._fraction = None

    def __call__(self, instr: RoundInstructions, cohort: Sequence[int], weights: Sequence[np.ndarray],
                 rng: RandomSource) -> RoundOutcome:
        c = self.estimator.clip_norm
        updates, failures = self.exchange(dataclasses.replace(instr, clip_norm=c), cohort, weights)
        before_release()  # write-ahead charge before the noised sum and count exist
        agg = PlainAggregator(clip_norm=c, noise_std=self.spec.update_noise_multiplier * c).aggregate(
            updates, like=weights, denominator=self.denominator, rng=rng)
        first: dict[int, Any] = {}
        for u in updates:  # the aggregator keeps a partition's first reply, so do the bits
            first.setdefault(u.partition_id, u)
        bits = [_norm(first[pid].delta) < c * (1.0 - UNCLIPPED_TOLERANCE) for pid in agg.aggregated]
        fraction = self.estimator.noisy_fraction(bits, rng=rng.child("clip-count"))
        self._fraction = fraction
        return RoundOutcome(aggregate=agg, failures=dict(failures), updates=tuple(updates),
                            clip=ClipRoundInfo(clip_norm=c, unclipped_fraction=fraction))


def _estimator(spec: AdaptiveClipSpec) -> QuantileClipEstimator:
    return QuantileClipEstimator(initial_clip_norm=spec.initial_clip_norm, target_quantile=spec.target_quantile,
                                 learning_rate=spec.learning_rate, count_noise_std=spec.count_noise_std,
                                 expected_cohort=spec.expected_cohort)


class AdaptiveSecureRound(_QuantileState, SecureRound):
    """Distributed DP with an adaptive clip norm: the count bit travels inside secure aggregation
    (module docstring). ``cfg`` is the run's config; ``spec`` the plan's split (z_Δ, σ_b)."""

    def __init__(self, cfg: RunConfig, transport: SecureTransport, *, population: int,
                 spec: AdaptiveClipSpec, log: Any = print) -> None:
        if not cfg.mode.secure_noise or not spec.count_noise_std > 0:
            raise ValueError("AdaptiveSecureRound needs a mode whose noise is added in secure aggregation "
                             "(privacy='distributed') and count_noise_std > 0")
        super().__init__(cfg, transport, population=population, log=log)
        self.spec = spec
        self.estimator = _estimator(spec)
        self._fraction = None

    def _encoding(self, instr: RoundInstructions, *, dim: int, threshold: int,
                  rotation_seed: bytes) -> EncodingSpec:
        cfg = self.cfg.replace(clip_norm=self.estimator.clip_norm,
                               noise_multiplier=self.spec.update_noise_multiplier)
        return make_encoding(cfg, population=self.population, dim=dim, threshold=threshold,
                             rotation_seed=rotation_seed, count_noise_std=self.spec.count_noise_std)

    def __call__(self, instr: RoundInstructions, cohort: Sequence[int], weights: Sequence[np.ndarray],
                 rng: RandomSource) -> RoundOutcome:
        self._fraction = None
        return super().__call__(dataclasses.replace(instr, clip_norm=self.estimator.clip_norm), cohort,
                                weights, rng)

    def _released(self, instr: RoundInstructions, weights: Sequence[np.ndarray], enc: EncodingSpec,
                  total: np.ndarray, updates: Mapping[int, ClientUpdate], *, survivors: tuple[int, ...],
                  progress: Any) -> RoundOutcome:
        outcome = super()._released(instr, weights, enc, total, updates, survivors=survivors,
                                    progress=progress)
        centred = enc.decode_count(total)  # Σ (b_i − ½) + noise, from the unmasked sum only
        fraction = min(1.0, max(0.0, centred / self.spec.expected_cohort + 0.5))
        self._fraction = fraction
        return dataclasses.replace(outcome, clip=ClipRoundInfo(clip_norm=enc.clip_norm,
                                                               unclipped_fraction=fraction))


def round_encoding(cfg: RunConfig, spec: AdaptiveClipSpec, *, clip_norm: float, population: int, dim: int,
                   threshold: int, rotation_seed: bytes = b"\x00" * 32) -> EncodingSpec:
    """The encoding of a distributed round with clip norm ``clip_norm``: multiplier z_Δ, count σ_b."""
    return make_encoding(cfg.replace(clip_norm=clip_norm, noise_multiplier=spec.update_noise_multiplier),
                         population=population, dim=dim, threshold=threshold, rotation_seed=rotation_seed,
                         count_noise_std=spec.count_noise_std)


def _worst_release(cfg: RunConfig, spec: AdaptiveClipSpec, *, clip_norms: Sequence[float], population: int,
                   dim: int, threshold: int, roster: int) -> Any:
    rels = [round_encoding(cfg, spec, clip_norm=c, population=population, dim=dim, threshold=threshold)
            .ddp().worst_release(max_roster=roster) for c in clip_norms]
    return min(rels, key=lambda r: r.noise_multiplier)


def distributed_spec(cfg: RunConfig, *, noise_multiplier: float, target: float, population: int, dim: int,
                     threshold: int, roster: int, denominator: float) -> tuple[AdaptiveClipSpec, Any]:
    """Theorem 1's split in distributed DP: ``(spec, worst release)``.

    Starts from ``z_Δ = (z⁻² − (2σ_b)⁻²)^(−½)`` and raises the requested z slightly until the worst
    released vector (update + count coordinate; the run's worst case over rosters <= ``roster`` and
    survivor counts, :meth:`fedprivacy.secagg.ddp.DistributedDPConfig.worst_release`) is dominated by a
    Gaussian of multiplier
    at least ``target`` (the run's release without adaptive clipping at z): the pair costs no more than
    the fixed clip. Every round's ``C_r s_r`` lies within one octave (the scale is the largest power of
    two that fits), so the worst case is taken over clip norms ``C₀ 2^(−j/8)``, j = 0..8 (a planning
    figure for the budget check; each round is charged with the event it really ran).
    """
    norms = [cfg.clip_norm * 2.0 ** (-j / 8) for j in range(9)]
    z = noise_multiplier
    for _ in range(20):
        spec = adaptive_clip_spec(cfg, noise_multiplier=z, denominator=denominator)
        worst = _worst_release(cfg, spec, clip_norms=norms, population=population, dim=dim,
                               threshold=threshold, roster=roster)
        if worst.noise_multiplier >= target:
            return spec, worst
        z *= target / worst.noise_multiplier * (1.0 + 1e-9)
    raise ValueError("adaptive clipping: the update/count split did not converge (raise secagg-bits)")


def worst_cut_off_clip_norm_candidates(spec: AdaptiveClipSpec, clips: Sequence[ClipRoundInfo]) -> list[float]:
    """Clip norms a charged round without a completed record can have run with: the estimate only moves
    after a completed round, so it is one of the completed rounds' clip norms or the one that follows the
    last of them (the initial clip norm when none completed)."""
    if not clips:
        return [spec.initial_clip_norm]
    last = clips[-1]
    est = _estimator(dataclasses.replace(spec, initial_clip_norm=last.clip_norm))
    return [c.clip_norm for c in clips] + [est.next_clip_norm(last.unclipped_fraction)]
