"""The server's update of the global model from the released mean update (the server-optimizer seam).

A :class:`ServerOptimizer` gets the global weights and the round's released mean update ``Δ̄`` (already
clipped, noised and averaged: privacy is spent before this step) and returns the next global weights.
It only post-processes a released value, so it never changes ε (Dwork & Roth 2014, Prop. 2.1).
:class:`FedAvg` is the default, ``w + Δ̄`` (McMahan et al. 2017); adaptive optimizers such as FedAdam or
FedYogi, FedAdagrad (Reddi et al. 2021, Alg. 2) treat ``-Δ̄`` as a pseudo-gradient and keep state, which the run
checkpoints through :meth:`ServerOptimizer.state_dict` / :meth:`ServerOptimizer.load_state_dict`.

The ``server-optimizer`` run-config key picks one from :data:`SERVER_OPTIMIZERS` (factories of the run
config, so hyper-parameters are config keys too); FedAvgM, FedAdagrad, FedAdam and FedYogi live in
:mod:`fedprivacy.fl.server_optimizers`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from fedprivacy.fl.server_optimizers import FedAdagrad, FedAdam, FedAvgM, FedYogi

if TYPE_CHECKING:
    from fedprivacy.config import RunConfig

__all__ = ["SERVER_OPTIMIZERS", "SERVER_OPTIMIZER_KEYS", "FedAvg", "ServerOptimizer", "make_server_optimizer",
           "register_server_optimizer"]


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


def _rate(cfg: RunConfig, default: float) -> float:
    """``server-learning-rate``, or the optimizer's (Flower's) default when it is 0."""
    return cfg.server_learning_rate if cfg.server_learning_rate > 0 else default


def _fedavg(cfg: RunConfig) -> ServerOptimizer:
    if _rate(cfg, 1.0) == 1.0:
        return FedAvg()
    return FedAvgM(learning_rate=cfg.server_learning_rate, momentum=0.0)  # FedAvg with a server rate


def _fedavgm(cfg: RunConfig) -> ServerOptimizer:
    return FedAvgM(learning_rate=_rate(cfg, 1.0), momentum=cfg.server_momentum)


def _fedadam(cfg: RunConfig) -> ServerOptimizer:
    return FedAdam(learning_rate=_rate(cfg, 0.1), beta_1=cfg.server_beta_1, beta_2=cfg.server_beta_2,
                   tau=cfg.server_tau)


def _fedadagrad(cfg: RunConfig) -> ServerOptimizer:
    return FedAdagrad(learning_rate=_rate(cfg, 0.1), tau=cfg.server_tau)  # no β: Flower fixes β1 = 0


def _fedyogi(cfg: RunConfig) -> ServerOptimizer:
    return FedYogi(learning_rate=_rate(cfg, 0.01), beta_1=cfg.server_beta_1, beta_2=cfg.server_beta_2,
                   tau=cfg.server_tau)


#: ``server-optimizer`` name -> factory of the run config (Flower's defaults when a key is left at 0).
SERVER_OPTIMIZERS: dict[str, Callable[[RunConfig], ServerOptimizer]] = {
    "fedavg": _fedavg, "fedavgm": _fedavgm, "fedadagrad": _fedadagrad, "fedadam": _fedadam, "fedyogi": _fedyogi,
}
_RATE, _ADAPTIVE = ("server-learning-rate",), ("server-learning-rate", "server-beta-1", "server-beta-2", "server-tau")
#: ``server-optimizer`` name -> the ``server-*`` keys its factory reads; setting another one is refused
#: (a rule with no β, like FedAdagrad, cannot silently inherit a β meant for another)
SERVER_OPTIMIZER_KEYS: dict[str, frozenset[str]] = {
    "fedavg": frozenset(_RATE), "fedavgm": frozenset((*_RATE, "server-momentum")),
    "fedadagrad": frozenset((*_RATE, "server-tau")), "fedadam": frozenset(_ADAPTIVE), "fedyogi": frozenset(_ADAPTIVE),
}


def register_server_optimizer(name: str, factory: Callable[[RunConfig], ServerOptimizer], *,
                              reads: Sequence[str] = _RATE) -> None:
    """Make ``server-optimizer = name`` select ``factory(cfg)``; ``reads``: the ``server-*`` keys the
    factory reads (a run that sets another is refused). ``FederatedRun(server_optimizer=...)`` takes
    any object, registered or not."""
    if not name:
        raise ValueError("name must not be empty")
    if name in SERVER_OPTIMIZERS:
        raise ValueError(f"server optimizer {name!r} is already registered")
    SERVER_OPTIMIZERS[name] = factory
    SERVER_OPTIMIZER_KEYS[name] = frozenset(reads)


def make_server_optimizer(cfg: RunConfig) -> ServerOptimizer:
    """The optimizer ``cfg.server_optimizer`` names, built with the config's hyper-parameters."""
    try:
        factory = SERVER_OPTIMIZERS[cfg.server_optimizer]
    except KeyError:
        raise ValueError(f"server-optimizer must be one of {', '.join(SERVER_OPTIMIZERS)}, "
                         f"got {cfg.server_optimizer!r}") from None
    return factory(cfg)
