"""The server's update of the global model from the released mean update (the server-optimizer seam).

A :class:`ServerOptimizer` gets the global weights and the round's released mean update ``Δ̄`` (already
clipped, noised and averaged: privacy is spent before this step) and returns the next global weights.
It only post-processes a released value, so it never changes ε (Dwork & Roth 2014, Prop. 2.1).
:class:`FedAvg` is the default, ``w + Δ̄`` (McMahan et al. 2017); adaptive optimizers such as FedAdam or
FedYogi (Reddi et al. 2021, Alg. 2) treat ``-Δ̄`` as a pseudo-gradient and keep state, which the run
checkpoints through :meth:`ServerOptimizer.state_dict` / :meth:`ServerOptimizer.load_state_dict`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

__all__ = ["SERVER_OPTIMIZERS", "FedAvg", "ServerOptimizer", "register_server_optimizer"]


class ServerOptimizer(Protocol):
    """Turns (global weights, released mean update) into the next global weights."""

    name: str

    def step(self, weights: Sequence[np.ndarray], mean_update: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The next global weights (same shapes and dtypes as ``weights``)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state (JSON-ready; ``{}`` if stateless), saved with each checkpoint."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output when a run resumes."""
        ...


class FedAvg:
    """``w_{r+1} = w_r + Δ̄_r`` in float64, cast back to each array's dtype (McMahan et al. 2017)."""

    name = "fedavg"

    def step(self, weights: Sequence[np.ndarray], mean_update: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [(np.asarray(w, dtype=np.float64) + np.asarray(u, dtype=np.float64)).astype(np.asarray(w).dtype)
                for w, u in zip(weights, mean_update, strict=True)]

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state:
            raise ValueError(f"FedAvg is stateless; a saved state must be empty, got keys {sorted(state)}")


SERVER_OPTIMIZERS: dict[str, Callable[[], ServerOptimizer]] = {"fedavg": FedAvg}


def register_server_optimizer(name: str, factory: Callable[[], ServerOptimizer]) -> None:
    """Make ``name`` select ``factory()`` (``FederatedRun(server_optimizer=...)`` takes any object)."""
    if not name:
        raise ValueError("name must not be empty")
    if name in SERVER_OPTIMIZERS:
        raise ValueError(f"server optimizer {name!r} is already registered")
    SERVER_OPTIMIZERS[name] = factory
