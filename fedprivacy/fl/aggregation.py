"""Aggregation of client updates in the clear: the :class:`Aggregator` seam and :class:`PlainAggregator`.

An aggregator turns a round's client updates into the released mean update. The plain privacy modes
(:mod:`fedprivacy.fl.modes.plain`) choose :class:`PlainAggregator` with their clip and noise;
``aggregation`` (or ``FederatedRun(aggregator=...)``) swaps in another rule (:mod:`fedprivacy.fl.robust`:
a median, a trimmed mean, Krum); where the server adds the noise, a rule must declare its
``sensitivity_ratio`` and the noise is scaled by it. Under secure
aggregation (``secagg = true``) the server only ever sees the sum, so there is no aggregator to swap:
:class:`fedprivacy.fl.secure.SecureRound` replaces the whole round. :class:`PlainAggregator`:

1. updates with NaN or Inf are left out (the reason is returned, so the server can log it);
2. each remaining update is clipped to ``clip_norm`` again on the server (idempotent for honest clients;
   it makes the sensitivity ``C`` hold even against a client that skips its own clipping);
3. the updates are summed in ascending partition-id order (float summation order is fixed, so results
   do not depend on message arrival order);
4. in ``central`` mode N(0, (σC)²) is added to every coordinate of the *sum* (Gaussian mechanism,
   Dwork & Roth 2014, Thm. A.1; with sampling, McMahan et al. 2018, Alg. 1);
5. the sum is divided by a fixed denominator (:func:`fedprivacy.fl.sampling.expected_cohort`).

Leaving an update out does not change the accounting: under add-remove adjacency the mechanism is the
noisy sum of whatever set of clipped vectors arrived, and its sensitivity is still ``C``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from fedprivacy.fl.types import AggregateResult, ClientUpdate

if TYPE_CHECKING:
    from fedprivacy.dp.rng import RandomSource


class Aggregator(Protocol):
    """Turns the round's client updates into the released mean update."""

    name: str

    def aggregate(
        self,
        updates: Sequence[ClientUpdate],
        *,
        like: Sequence[np.ndarray],
        denominator: float,
        rng: RandomSource,
    ) -> AggregateResult: ...


def non_finite_reason(delta: Sequence[np.ndarray], like: Sequence[np.ndarray]) -> str | None:
    """Why an update cannot be summed (wrong structure, NaN or Inf), or None if it can."""
    if len(delta) != len(like):
        return f"update has {len(delta)} arrays, expected {len(like)}"
    for i, (a, b) in enumerate(zip(delta, like, strict=True)):
        if a.shape != b.shape:
            return f"array {i} has shape {a.shape}, expected {b.shape}"
        if not np.issubdtype(a.dtype, np.floating):
            return f"array {i} has dtype {a.dtype}, expected a float dtype"
        if not np.all(np.isfinite(a)):
            bad = int(np.size(a) - np.count_nonzero(np.isfinite(a)))
            return f"array {i} contains {bad} NaN/Inf values"
    return None


def clip_to_norm(arrays: Sequence[np.ndarray], *, clip_norm: float) -> list[np.ndarray]:
    """Global L2 clipping via :func:`fedprivacy.dp.clipping.clip_arrays` (float64 copies)."""
    from fedprivacy.dp.clipping import clip_arrays

    clipped, _ = clip_arrays([np.asarray(a, dtype=np.float64) for a in arrays], clip_norm=clip_norm)
    return [np.asarray(a, dtype=np.float64) for a in clipped]


def _clipped_narrow(delta: Sequence[np.ndarray], like: Sequence[np.ndarray], *,
                    clip_norm: float) -> np.ndarray | None:
    """What :func:`non_finite_reason` then :func:`clip_to_norm` give for an update of float32/float16
    arrays of ``like``'s shapes (a client's reply), raveled into one float64 vector, bit for bit, in a
    few passes over that vector (:func:`fedprivacy.dp.clipping.clip_narrow_flat`: its finite sums of
    squares are the NaN/Inf check); None for anything else (another dtype or shape, a NaN or Inf,
    ``clip_norm`` 0), which takes those two functions themselves."""
    from fedprivacy.dp.clipping import NARROW_FLOATS, clip_narrow_flat

    if clip_norm <= 0 or len(delta) != len(like):
        return None
    for a, b in zip(delta, like, strict=True):
        if type(a) is not np.ndarray or a.dtype not in NARROW_FLOATS or a.shape != np.shape(b):
            return None
    out = clip_narrow_flat(delta, clip_norm=clip_norm)
    return None if out is None else out[0]


def _views(flat: np.ndarray, like: Sequence[np.ndarray]) -> list[np.ndarray]:
    """``like``'s shapes as views of consecutive runs of ``flat`` (C order, as ``ravel``)."""
    views: list[np.ndarray] = []
    pos = 0
    for a in like:
        size = int(np.size(a))
        views.append(flat[pos:pos + size].reshape(np.shape(a)))
        pos += size
    return views


class PlainAggregator:
    """Sum (optionally clipped and noised) updates in the clear, divide by a fixed denominator.

    Args:
        clip_norm: server-side clipping bound ``C`` (0 disables, only for privacy ``none``).
        noise_std: std of the Gaussian noise added to each coordinate of the sum (``σ·C`` in central
            mode, 0 otherwise).
    """

    name = "plain"

    def sensitivity_ratio(self, neighbouring: str) -> float:
        """1: this is the clipped sum itself (see :mod:`fedprivacy.fl.robust` for other rules)."""
        return 1.0

    def __init__(self, *, clip_norm: float, noise_std: float) -> None:
        if clip_norm < 0:
            raise ValueError(f"clip_norm must be >= 0, got {clip_norm}")
        if noise_std < 0:
            raise ValueError(f"noise_std must be >= 0, got {noise_std}")
        self.clip_norm = float(clip_norm)
        self.noise_std = float(noise_std)

    def aggregate(
        self,
        updates: Sequence[ClientUpdate],
        *,
        like: Sequence[np.ndarray],
        denominator: float,
        rng: RandomSource,
    ) -> AggregateResult:
        if not denominator > 0:
            raise ValueError(f"denominator must be > 0, got {denominator}")
        # the running sums, one per array, as views of one vector: a reply in the fast path is added
        # with one call (elementwise: the same sums as array by array)
        flat_total = np.zeros(sum(int(np.size(a)) for a in like), dtype=np.float64)
        total = _views(flat_total, like)
        aggregated: list[int] = []
        dropped: dict[int, str] = {}
        seen: set[int] = set()
        for update in sorted(updates, key=lambda u: u.partition_id):
            pid = update.partition_id
            if pid in seen:
                dropped[pid] = "duplicate reply from this partition"
                continue
            seen.add(pid)
            flat = _clipped_narrow(update.delta, like, clip_norm=self.clip_norm)
            if flat is not None:
                flat_total += flat
            else:  # not float16/float32 of the right shapes, or not finite: the generic checks
                reason = non_finite_reason(update.delta, like)
                if reason is not None:
                    dropped[pid] = reason
                    continue
                delta = (
                    clip_to_norm(update.delta, clip_norm=self.clip_norm)
                    if self.clip_norm > 0
                    else [np.asarray(a, dtype=np.float64) for a in update.delta]
                )
                for acc, d in zip(total, delta, strict=True):
                    acc += d
            aggregated.append(pid)
        if self.noise_std > 0:
            for acc in total:
                acc += rng.normal(std=self.noise_std, size=acc.shape)
        mean = tuple((acc / denominator).astype(np.asarray(ref).dtype) for acc, ref in zip(total, like, strict=True))
        return AggregateResult(
            mean_update=mean,
            aggregated=tuple(aggregated),
            dropped=dropped,
            noise_std=self.noise_std,
            denominator=float(denominator),
        )
