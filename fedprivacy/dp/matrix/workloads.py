"""Workload matrices of the server optimizer: what a DP-FTRL model release is a linear function of.

The server applies SGD with heavy-ball momentum ``m_t = beta m_{t-1} + g_t`` and a step
``theta_t = theta_{t-1} - eta_t m_t`` to the (noisy) aggregated gradients ``g_1..g_n``. Every
iterate is then ``theta_0 - (A g)_t`` for the lower-triangular workload

    A[t, r] = sum_{s=r..t} eta_s * beta**(s - r)          (r <= t, 0-indexed),

the prefix-sum matrix when ``beta = 0`` and ``eta = 1`` (Denisov et al. 2022, "Improved differential
privacy for SGD via optimal private linear operators on adaptive streams", Sec. 2 and App. on
momentum). With a constant learning rate A is Toeplitz: its first column is
``eta * (1 - beta**(k+1)) / (1 - beta)``. A factorization ``A = B C`` is valid for any invertible
``C``; the workload only decides how good it is.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np

__all__ = ["Workload"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """SGD-with-momentum workload over ``num_rounds`` rounds.

    Args:
        num_rounds: n, the number of releases (rounds).
        momentum: beta in [0, 1).
        learning_rates: eta_t per round (length n, each > 0); ``None`` means 1 every round.
    """

    num_rounds: int
    momentum: float = 0.0
    learning_rates: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.num_rounds, bool) or not isinstance(self.num_rounds, int) or self.num_rounds < 1:
            raise ValueError(f"num_rounds must be an integer >= 1, got {self.num_rounds!r}")
        if not 0.0 <= float(self.momentum) < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum!r}")
        if self.learning_rates is not None:
            lrs = tuple(float(x) for x in self.learning_rates)
            if len(lrs) != self.num_rounds:
                raise ValueError(f"learning_rates must have num_rounds={self.num_rounds} entries, got {len(lrs)}")
            if not all(np.isfinite(x) and x > 0 for x in lrs):
                raise ValueError(f"learning_rates must all be finite and > 0, got {lrs[:5]}...")
            object.__setattr__(self, "learning_rates", lrs)

    @property
    def is_toeplitz(self) -> bool:
        """True when the learning rate is constant, so A is lower-triangular Toeplitz."""
        return self.learning_rates is None or len(set(self.learning_rates)) == 1

    def toeplitz_coefs(self) -> np.ndarray:
        """First column of A (length n); raises ValueError when A is not Toeplitz."""
        if not self.is_toeplitz:
            raise ValueError("learning_rates vary per round: the workload is not Toeplitz")
        eta = 1.0 if self.learning_rates is None else self.learning_rates[0]
        return eta * self.momentum_coefs()

    def momentum_coefs(self) -> np.ndarray:
        """First column of the constant-rate (eta = 1) momentum workload: sum_{j<=k} beta**j."""
        k = np.arange(self.num_rounds, dtype=np.float64)
        if self.momentum == 0.0:
            return np.ones(self.num_rounds)
        return (1.0 - self.momentum ** (k + 1.0)) / (1.0 - self.momentum)

    def matrix(self) -> np.ndarray:
        """The dense n x n workload A (for checks and small n)."""
        n = self.num_rounds
        eta = np.ones(n) if self.learning_rates is None else np.asarray(self.learning_rates)
        lag = np.subtract.outer(np.arange(n), np.arange(n))
        decay = np.where(lag >= 0, float(self.momentum) ** np.maximum(lag, 0), 0.0)  # M[s, r]
        prefix = np.tril(np.ones((n, n)))
        return prefix @ (eta[:, None] * decay)

    def key(self) -> str:
        """A stable hash of the workload, for on-disk caches."""
        spec = {"n": self.num_rounds, "momentum": float(self.momentum),
                "learning_rates": None if self.learning_rates is None else list(self.learning_rates)}
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:32]
