"""The noise a server adds to the unmasked secure-aggregation sum, before decoding (no client noise).

The clients mask fixed-point encodings of their clipped updates; the server unmasks the exact ring sum
``S`` and releases ``(S + Z) mod 2^b`` lifted to the reals (:func:`fedprivacy.secagg.quantize.torus_noised`).
One client's encoding moves that release by exactly itself, wrap or not, and its L2 norm is at most
``C s + sqrt(d)`` (stochastic rounding moves each of the ``d`` coordinates by less than 1), so in real units
the per-round L2 sensitivity is ``Delta = C + sqrt(d)/s`` in place of ``C`` (post-processing of the
mechanism on the integer sum; Dwork & Roth 2014, Prop. 2.1).

* :class:`GaussianSumNoise` (``privacy = "central"``): i.i.d. ``N(0, (z Delta)^2)`` each round: Gaussian(z).
* :class:`CorrelatedSumNoise` (``privacy = "dpftrl"``): round t's ``w_t = (C^{-1} z)_t`` of the matrix
  mechanism, innovations ``z ~ N(0, (z_mult sens Delta)^2)``. The mechanism ``x -> C x + Z`` has L2
  sensitivity ``sens(C, schema) * (per-round L2 bound)``: it is linear in the rows, so scaling every
  round's contribution bound from ``C`` to ``Delta`` scales the sensitivity by ``Delta / C`` (Denisov et
  al. 2022, Thm. 2.1, adaptive streams for lower-triangular C; Choquette-Choo et al. 2023, arXiv
  2306.08153, Sec. 2, the sensitivity under min-separated participation). Innovations of std
  ``z_mult sens Delta`` therefore give the horizon's Gaussian(z_mult), the plain run's event.

A noise object states its event (:meth:`event`, None: the plan's), the std and sensitivity ratio the
aggregate declares (:func:`fedprivacy.fl.mechanisms.check_release` checks them), and draws in ring units.
Threat model: the server is trusted to add the noise, not to see single updates; against it there is no DP.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Protocol

import numpy as np

from fedprivacy.fl.types import CorrelatedDraw

if TYPE_CHECKING:
    from fedprivacy.accounting.events import PrivacyEvent
    from fedprivacy.dp.matrix import BandedToeplitz, Blt, StreamingNoise
    from fedprivacy.dp.rng import RandomSource
    from fedprivacy.secagg.encoding import EncodingSpec

__all__ = ["CorrelatedSumNoise", "GaussianSumNoise", "ServerNoise", "encoded_bound"]


def encoded_bound(enc: EncodingSpec) -> float:
    """``Delta = C + sqrt(d)/s``: one client's encoded contribution, in real units."""
    return enc.clip_norm + math.sqrt(enc.padded_dim) / enc.scale


class ServerNoise(Protocol):
    """Noise the server adds to the unmasked sum of one secure round (module docstring)."""

    @property
    def headroom_multiplier(self) -> float:
        """``h`` with the noise's per-coordinate std at most ``h (C s + sqrt(d))`` ring units (for the
        encoding's no-wrap headroom; a wrap costs accuracy, never privacy)."""
        ...

    def noise_std(self, enc: EncodingSpec) -> float:
        """The std (real units) the aggregate declares: of each draw (i.i.d.) or each innovation."""
        ...

    def sensitivity_ratio(self, enc: EncodingSpec) -> float:
        """``noise_std / (the std the plan charged per unit of C)``: ``Delta / C``."""
        ...

    def event(self, round: int) -> PrivacyEvent | None:
        """The event round ``round`` charges at its release point (None: the plan's)."""
        ...

    def charged(self, round: int) -> None:
        """Round ``round`` passed its release point (its event is in the ledger)."""
        ...

    def draw(self, enc: EncodingSpec, *, round: int, size: int, rng: RandomSource) -> np.ndarray:
        """Round ``round``'s noise in ring units (float64, ``size`` coordinates)."""
        ...

    def correlated_draw(self, round: int) -> CorrelatedDraw | None:
        """Which draw of a correlated stream round ``round`` carries (None: independent noise)."""
        ...


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GaussianSumNoise:
    """``N(0, (z Delta)^2)`` i.i.d. per coordinate and round: Gaussian(z) on the sum (central)."""

    noise_multiplier: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0):
            raise ValueError(f"noise_multiplier must be finite and > 0, got {self.noise_multiplier!r}")

    @property
    def headroom_multiplier(self) -> float:
        return self.noise_multiplier

    def noise_std(self, enc: EncodingSpec) -> float:
        return self.noise_multiplier * encoded_bound(enc)

    def sensitivity_ratio(self, enc: EncodingSpec) -> float:
        return self.noise_std(enc) / (self.noise_multiplier * enc.clip_norm)

    def event(self, round: int) -> PrivacyEvent | None:
        return None

    def charged(self, round: int) -> None:
        return None

    def draw(self, enc: EncodingSpec, *, round: int, size: int, rng: RandomSource) -> np.ndarray:
        return np.asarray(rng.child("central-noise").normal(std=self.noise_std(enc) * enc.scale, size=size))

    def correlated_draw(self, round: int) -> CorrelatedDraw | None:
        return None


class CorrelatedSumNoise:
    """Round t's ``(C^{-1} z)_t`` (:class:`fedprivacy.dp.matrix.StreamingNoise`) on the unmasked sum.

    ``innovation_multiplier`` is ``z sens(C, schema)``: the innovations' std per unit of the per-round
    L2 bound. The horizon's event is charged at the first round that reaches its release point, and
    every later round charges ``covered`` (:class:`fedprivacy.accounting.events.ChargedAhead`). Draw
    ``t`` is round ``t``'s: a round that aborted leaves its draw unreleased (the released rows are a
    projection of the mechanism's output, and every client keeps its rounds' separation).
    """

    def __init__(self, strategy: BandedToeplitz | Blt, *, innovation_multiplier: float,
                 horizon: PrivacyEvent, covered: PrivacyEvent) -> None:
        if not (math.isfinite(innovation_multiplier) and innovation_multiplier > 0):
            raise ValueError(f"innovation_multiplier must be finite and > 0, got {innovation_multiplier!r}")
        self.strategy, self.innovation_multiplier = strategy, float(innovation_multiplier)
        self.horizon, self.covered = horizon, covered
        self._first: int | None = None  # the round that charged the horizon
        self._headroom: float | None = None
        self._stream: StreamingNoise | None = None
        self._scale: tuple[float, float] | None = None  # (Delta, s) the stream was drawn for

    @property
    def headroom_multiplier(self) -> float:
        """``z sens max_t ||(C^{-1})_t||``: round t's per-coordinate std is the innovations' times row t's norm."""
        if self._headroom is None:
            c_inv = np.linalg.inv(self.strategy.matrix())
            self._headroom = self.innovation_multiplier * float(np.max(np.linalg.norm(c_inv, axis=1)))
        return self._headroom

    def noise_std(self, enc: EncodingSpec) -> float:
        return self.innovation_multiplier * encoded_bound(enc)

    def sensitivity_ratio(self, enc: EncodingSpec) -> float:
        return self.noise_std(enc) / (self.innovation_multiplier * enc.clip_norm)

    def event(self, round: int) -> PrivacyEvent | None:
        return self.horizon if self._first is None or self._first == round else self.covered

    def charged(self, round: int) -> None:
        if self._first is None:
            self._first = round

    def draw(self, enc: EncodingSpec, *, round: int, size: int, rng: RandomSource) -> np.ndarray:
        """Draw ``round`` of the stream (seeded by the first drawing round's source); earlier draws
        not yet taken (aborted rounds) are drawn and discarded. A round drawn twice is refused."""
        from fedprivacy.dp.matrix import StreamingNoise

        scale = (encoded_bound(enc), enc.scale)
        if self._stream is None:
            self._stream = StreamingNoise(self.strategy, dim=size, noise_std=self.noise_std(enc) * enc.scale,
                                          rng=rng.child("dpftrl-noise"))
            self._scale = scale
        if scale != self._scale:
            raise ValueError(f"the encoding's bound and scale {scale} differ from the stream's {self._scale}")
        if not self._stream.round < round <= self.strategy.num_rounds:
            raise ValueError(f"round {round} cannot take a draw: {self._stream.round} of "
                             f"{self.strategy.num_rounds} drawn")
        while True:
            w = self._stream.next()
            if self._stream.round == round:
                return w

    def correlated_draw(self, round: int) -> CorrelatedDraw | None:
        return CorrelatedDraw(covers=self.horizon, index=round)
