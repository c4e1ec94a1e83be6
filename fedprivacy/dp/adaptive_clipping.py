"""Adaptive clipping to a private quantile of the update norms (Andrew, Thakkar, McMahan & Ramaswamy 2021).

Each round the clip norm ``C`` is the current estimate of the ``target_quantile`` γ of the clients'
update norms. Every client in the round contributes the bit ``b_i = 1[‖Δ_i‖ ≤ C]``; the server releases
the centred, noised count ``Σ (b_i − ½) + N(0, σ_b²)`` next to the noised sum of clipped updates, turns
it into the fraction ``b̃ = clamp(count / m + ½, 0, 1)`` (m the expected cohort size), and moves the
estimate geometrically: ``C ← C · exp(−η (b̃ − γ))`` (their Alg. 1 with the geometric update of §3).

Privacy (their Theorem 1, §3.1). One unit moves the clipped sum by at most C (L2) and the centred count by
at most ½. Releasing the sum with noise ``N(0, (z_Δ C)²)`` and the count with ``N(0, σ_b²)`` is, after
rescaling each block by its sensitivity, one Gaussian mechanism on a vector of sensitivity 1 whose blocks
have noise multipliers ``z_Δ`` and ``2σ_b``; it is therefore exactly one Gaussian release with
``z = (z_Δ⁻² + (2σ_b)⁻²)^(−½)``. To spend the budget of a plain DP-FedAvg round of multiplier z, the
update noise is raised to ``z_Δ = (z⁻² − (2σ_b)⁻²)^(−½)``, which needs ``2σ_b > z``. The same holds under
replace-one (both sensitivities double), so the ledger's event is ``GaussianEvent(noise_multiplier=z)``
with the round's sampling, whatever the relation. The bit is computed against the clip norm the round
used, so C stays a function of released values only (post-processing).

Recommended (their §4): σ_b = m/20, γ = 0.5, η = 0.2.

Distributed DP (:mod:`fedprivacy.secagg.ddp`, ``count_scale``): the client appends its centred bit as one
more integer coordinate ``k_b (2b − 1)`` of its secure-aggregation vector, noised like every other
coordinate (std ``σ = z_Δ C s`` in integer units, from the client's own XNoise components). In centred-bit
units that is noise ``σ/(2 k_b)``, so :func:`count_scale_for` takes ``k_b = ⌊σ/(2σ_b)⌋`` (at least σ_b).
The release is one discrete Gaussian sum on ``Z^(m+1)`` of L2 sensitivity ``hypot(Δ₂, k_b)``: its zCDP is
``(Δ₂² + k_b²)/(2V)``, the sum of the two blocks' (Canonne, Kamath & Steinke 2020, Thm 14; Bun & Steinke
2016, Lemma 2.3), i.e. Theorem 1's "one Gaussian" in integer units
(:mod:`fedprivacy.accounting.release` bounds the sum of discrete Gaussians, KLS 2021).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedprivacy.dp.mechanisms import _positive
from fedprivacy.dp.mechanisms import _real as _real_number

if TYPE_CHECKING:
    from fedprivacy.dp.rng import RandomSource

__all__ = [
    "UNCLIPPED_TOLERANCE",
    "QuantileClipEstimator",
    "QuantileClipState",
    "composed_noise_multiplier",
    "count_noise_std_for",
    "count_scale_for",
    "reachable_clip_range",
    "update_noise_multiplier",
]

#: Sensitivity of the centred bit ``b − ½`` (add/remove).
BIT_SENSITIVITY = 0.5

#: An update counts as unclipped when its norm is below ``C (1 − tolerance)``: clipping to C and the float32
#: wire format leave a clipped update within ~1e-7 of C. Pre-clip norms in ``[C (1 − 1e-6), C]`` are
#: counted as clipped, a negligible bias of the quantile estimate.
UNCLIPPED_TOLERANCE = 1e-6


def _real(name: str, value: Any) -> float:
    v = _real_number(name, value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {value}")
    return v


def count_noise_std_for(expected_cohort: float) -> float:
    """The paper's recommended count noise σ_b = m / 20 for an expected cohort of m clients."""
    return _positive("expected_cohort", expected_cohort) / 20.0


def count_scale_for(*, noise_std: float, count_noise_std: float) -> int:
    """``k_b = max(1, ⌊σ/(2σ_b)⌋)``: the integer weight of the centred bit ``(2b − 1)/2`` in a vector whose
    coordinates carry noise std ``noise_std`` (integer units), so the count's noise in bit units,
    ``σ/(2 k_b)``, is at least ``count_noise_std`` (module docstring, distributed DP)."""
    sigma = _positive("noise_std", noise_std)
    sb = _positive("count_noise_std", count_noise_std)
    return max(1, math.floor(sigma / (2.0 * sb)))


def reachable_clip_range(*, initial_clip_norm: float, target_quantile: float, learning_rate: float,
                         round: int) -> tuple[float, float]:
    """``[C₀ e^(−η(1−γ)(r−1)), C₀ e^(ηγ(r−1))]``: every clip norm the geometric rule can reach at round r.

    A released fraction lies in [0, 1], so one update multiplies C by ``e^(−η(b̃−γ)) ∈ [e^(−η(1−γ)), e^(ηγ)]``.
    A client uses it to refuse a forged clip norm (a sanity bound: privacy does not depend on C, the noise
    scales with it). The bounds are widened by 1e-9 relative for float rounding.
    """
    c0 = _positive("initial_clip_norm", initial_clip_norm)
    eta = _positive("learning_rate", learning_rate)
    gamma = _real("target_quantile", target_quantile)
    if isinstance(round, bool) or not isinstance(round, int) or round < 1:
        raise ValueError(f"round must be an int >= 1, got {round!r}")
    steps = round - 1
    return (c0 * math.exp(-eta * (1.0 - gamma) * steps) * (1 - 1e-9),
            c0 * math.exp(eta * gamma * steps) * (1 + 1e-9))


def update_noise_multiplier(*, noise_multiplier: float, count_noise_std: float) -> float:
    """``z_Δ = (z⁻² − (2σ_b)⁻²)^(−½)``: the update's multiplier that makes the pair one Gaussian of z.

    Andrew et al. 2021, Theorem 1. Raises ValueError when ``2·count_noise_std <= noise_multiplier``
    (the count alone would already spend more than the whole round's budget).
    """
    z = _positive("noise_multiplier", noise_multiplier)
    sb = _positive("count_noise_std", count_noise_std)
    rest = z**-2 - (sb / BIT_SENSITIVITY) ** -2
    if rest <= 0:
        raise ValueError(
            f"count_noise_std must be > noise_multiplier / 2 = {z / 2:g} for adaptive clipping, got "
            f"{sb:g} (use a larger cohort: the recommended count_noise_std is m/20)"
        )
    return rest**-0.5


def composed_noise_multiplier(*, update_noise_multiplier: float, count_noise_std: float) -> float:
    """``z = (z_Δ⁻² + (2σ_b)⁻²)^(−½)``: the one Gaussian the (update, count) pair is equal to."""
    zd = _positive("update_noise_multiplier", update_noise_multiplier)
    sb = _positive("count_noise_std", count_noise_std)
    return (zd**-2 + (sb / BIT_SENSITIVITY) ** -2) ** -0.5


@dataclass(frozen=True, slots=True, kw_only=True)
class QuantileClipState:
    """The estimator's state after a round: the next clip norm and the last released fraction."""

    clip_norm: float
    rounds: int = 0
    last_fraction: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"clip_norm": self.clip_norm, "rounds": self.rounds,
                "last_fraction": self.last_fraction}


class QuantileClipEstimator:
    """The private quantile estimate that sets each round's clip norm (module docstring).

    Args:
        initial_clip_norm: C of the first round (> 0).
        target_quantile: γ in (0, 1); the fraction of updates meant to be unclipped.
        learning_rate: η (> 0) of the geometric update.
        count_noise_std: σ_b (> 0) of the Gaussian noise on the centred count, or 0 for the
            non-private estimator (privacy mode ``none``, not to be combined with a DP claim).
        expected_cohort: m (> 0), the fixed denominator of the fraction.
    """

    def __init__(self, *, initial_clip_norm: float, target_quantile: float = 0.5,
                 learning_rate: float = 0.2, count_noise_std: float, expected_cohort: float) -> None:
        self._c = _positive("initial_clip_norm", initial_clip_norm)
        gamma = _real("target_quantile", target_quantile)
        if not 0.0 < gamma < 1.0:
            raise ValueError(f"target_quantile must be in (0, 1), got {target_quantile}")
        self.target_quantile = gamma
        self.learning_rate = _positive("learning_rate", learning_rate)
        sb = _real("count_noise_std", count_noise_std)
        if sb < 0:
            raise ValueError(f"count_noise_std must be >= 0, got {count_noise_std}")
        self.count_noise_std = sb
        self.expected_cohort = _positive("expected_cohort", expected_cohort)
        self._rounds = 0
        self._last: float | None = None

    @property
    def clip_norm(self) -> float:
        """The clip norm the next round uses."""
        return self._c

    def state(self) -> QuantileClipState:
        return QuantileClipState(clip_norm=self._c, rounds=self._rounds, last_fraction=self._last)

    def below(self, norm: float) -> bool:
        """The client's bit ``‖Δ‖ ≤ C`` for an update of L2 norm ``norm`` (before clipping)."""
        return _real("norm", norm) <= self._c

    def noisy_fraction(self, bits: Sequence[bool], *, rng: RandomSource) -> float:
        """``clamp((Σ (b_i − ½) + N(0, σ_b²)) / m + ½, 0, 1)``; draws the noise, changes nothing."""
        centred = sum((1.0 if bool(b) else 0.0) - 0.5 for b in bits)
        noise = float(rng.normal(std=self.count_noise_std)) if self.count_noise_std > 0 else 0.0
        return min(1.0, max(0.0, (centred + noise) / self.expected_cohort + 0.5))

    def next_clip_norm(self, fraction: float) -> float:
        """``C · exp(−η (b̃ − γ))`` for a released fraction ``b̃``; changes nothing."""
        f = _real("fraction", fraction)
        if not 0.0 <= f <= 1.0:
            raise ValueError(f"fraction must be in [0, 1], got {fraction}")
        return self._c * math.exp(-self.learning_rate * (f - self.target_quantile))

    def update(self, fraction: float) -> float:
        """Move the estimate after a released round; returns the new clip norm."""
        new = self.next_clip_norm(fraction)
        self._c, self._last, self._rounds = new, float(fraction), self._rounds + 1
        return new

    def state_dict(self) -> dict[str, Any]:
        return self.state().to_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output (validated before anything changes)."""
        if not isinstance(state, Mapping) or set(state) != {"clip_norm", "rounds", "last_fraction"}:
            raise ValueError("adaptive clipping state must have keys clip_norm, rounds, last_fraction")
        c = _positive("clip_norm", state["clip_norm"])
        rounds = state["rounds"]
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
            raise ValueError(f"rounds must be an int >= 0, got {rounds!r}")
        last = state["last_fraction"]
        if last is not None:
            last = _real("last_fraction", last)
            if not 0.0 <= last <= 1.0:
                raise ValueError(f"last_fraction must be in [0, 1], got {last}")
        self._c, self._rounds, self._last = c, rounds, last
