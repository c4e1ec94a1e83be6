"""Streaming correlated noise: round t's ``(C^{-1} z)_t`` without ever holding the T x d matrix.

The server adds ``w_t = (C^{-1} z)_t`` (z i.i.d. N(0, noise_std^2), shape d per round) to round t's
aggregated gradient, so its optimizer releases ``A x + B z`` for ``B = A C^{-1}`` (Denisov et al. 2022,
Sec. 2). Forward substitution in ``C w = z``:

* banded C (band b): ``w_t = (z_t - sum_{j=1..b-1} c_j w_{t-j}) / c_0``: the last b - 1 outputs are held,
  at most b arrays of d floats with the current one (Choquette-Choo et al. 2023, arXiv 2306.08153, Sec. 4).
* BLT C: ``w_t = z_t - sum_i omega_i s_{i,t}``, ``s_{i,t+1} = theta_i s_{i,t} + w_t``: one buffer per
  theta (Dvijotham, McMahan et al. 2024, arXiv 2404.16706, Sec. 5).

The held state is as secret as the noise itself: never log it; ``state_dict`` is for checkpoints.
Every z comes from the :class:`~fedprivacy.dp.rng.RandomSource` passed in (secure by default).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from fedprivacy.dp.matrix.strategies import BandedToeplitz, Blt
from fedprivacy.dp.rng import RandomSource, default_source

__all__ = ["StreamingNoise"]


class StreamingNoise:
    """Yields ``(C^{-1} z)_t`` for t = 0, 1, ..., num_rounds - 1, one d-vector per call."""

    def __init__(self, strategy: BandedToeplitz | Blt, *, dim: int, noise_std: float,
                 rng: RandomSource | None = None) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be an integer >= 1, got {dim!r}")
        if not np.isfinite(noise_std) or noise_std <= 0:
            raise ValueError(f"noise_std must be finite and > 0, got {noise_std!r}")
        self._strategy = strategy
        self._dim = dim
        self._std = float(noise_std)
        self._rng = rng if rng is not None else default_source()
        self._round = 0
        self._past: deque[np.ndarray] = deque()  # banded: w_{t-1}, w_{t-2}, ... (newest first)
        self._buffers = (np.zeros((strategy.num_buffers, dim)) if isinstance(strategy, Blt)
                         else np.zeros((0, dim)))

    @property
    def noise_std(self) -> float:
        """The std of every z_t this stream draws."""
        return self._std

    @property
    def round(self) -> int:
        """Rounds already drawn."""
        return self._round

    def held_floats(self) -> int:
        """Floats of state held between rounds (the memory the O(b d) / O(buffers d) claim is about)."""
        return sum(a.size for a in self._past) + self._buffers.size

    def next(self) -> np.ndarray:
        """Draw z_t and return w_t (float64, shape (dim,)). Raises after num_rounds draws."""
        if self._round >= self._strategy.num_rounds:
            raise ValueError(f"the strategy covers num_rounds={self._strategy.num_rounds} rounds; all drawn")
        z = np.asarray(self._rng.normal(std=self._std, size=self._dim), dtype=np.float64)
        w = self._banded(z) if isinstance(self._strategy, BandedToeplitz) else self._blt(z)
        self._round += 1
        return w

    def _banded(self, z: np.ndarray) -> np.ndarray:
        c = self._strategy.coefs  # type: ignore[union-attr]
        w, scratch = z, np.empty_like(z)
        for j, prev in enumerate(self._past, start=1):
            w -= np.multiply(prev, c[j], out=scratch)
        w /= c[0]
        if len(c) > 1:
            # the oldest held array is recycled as the copy of w once the band is full (no new d-array)
            held = self._past.pop() if len(self._past) == len(c) - 1 else np.empty_like(w)
            np.copyto(held, w)
            self._past.appendleft(held)
        return w

    def _blt(self, z: np.ndarray) -> np.ndarray:
        blt: Blt = self._strategy  # type: ignore[assignment]
        w, scratch = z, np.empty_like(z)
        for omega, buf in zip(blt.output_scale, self._buffers, strict=True):  # row loops: no BLAS threads
            w -= np.multiply(buf, omega, out=scratch)
        for theta, buf in zip(blt.buf_decay, self._buffers, strict=True):
            buf *= theta
            buf += w
        return w

    def state_dict(self) -> dict[str, Any]:
        """Round counter and held arrays (secret: as sensitive as the noise)."""
        return {"round": self._round, "past": [a.copy() for a in self._past],
                "buffers": self._buffers.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`; validates every field before changing anything."""
        rnd, past, bufs = int(state["round"]), list(state["past"]), np.asarray(state["buffers"], float)
        want_past = min(rnd, self._strategy.band - 1) if isinstance(self._strategy, BandedToeplitz) else 0
        if not 0 <= rnd <= self._strategy.num_rounds:
            raise ValueError(f"round must be in [0, {self._strategy.num_rounds}], got {rnd}")
        if len(past) != want_past or any(np.shape(a) != (self._dim,) for a in past):
            raise ValueError(f"past must hold {want_past} arrays of shape ({self._dim},)")
        if bufs.shape != self._buffers.shape:
            raise ValueError(f"buffers must have shape {self._buffers.shape}, got {bufs.shape}")
        self._round, self._past, self._buffers = rnd, deque(np.array(a, float) for a in past), bufs.copy()
