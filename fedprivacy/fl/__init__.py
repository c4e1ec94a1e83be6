"""The federated middle layer: rounds, privacy modes and the run, with no Flower (see docs/DESIGN.md).

A run in a notebook, clients in this process::

    from fedprivacy.config import RunConfig
    from fedprivacy.fl import FederatedRun, local_exchange

    cfg = RunConfig(privacy="central", noise_multiplier=1.0, num_server_rounds=3, seed=0)
    result = FederatedRun(cfg, population=10, exchange=local_exchange(cfg, population=10),
                          callbacks=[]).run()
    result.weights, result.accountant.epsilon(delta=1e-5), result.records[-1].test_accuracy

The names below are imported lazily (PEP 562), so importing one submodule stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedprivacy.fl.aggregation import Aggregator, PlainAggregator
    from fedprivacy.fl.callbacks import RunCallback
    from fedprivacy.fl.client import client_update, local_exchange
    from fedprivacy.fl.modes import PrivacyMode, Transport, register_mode
    from fedprivacy.fl.run import FederatedRun, RunResult, run_federated
    from fedprivacy.fl.server_opt import FedAvg, ServerOptimizer
    from fedprivacy.fl.types import (
        ClientUpdate,
        ModelHooks,
        RoundInstructions,
        RoundOutcome,
        RoundRecord,
    )

_EXPORTS = {
    "Aggregator": "aggregation", "PlainAggregator": "aggregation", "RunCallback": "callbacks",
    "client_update": "client", "local_exchange": "client", "PrivacyMode": "modes", "Transport": "modes",
    "register_mode": "modes", "FederatedRun": "run", "RunResult": "run", "run_federated": "run",
    "FedAvg": "server_opt", "ServerOptimizer": "server_opt", "ClientUpdate": "types",
    "ModelHooks": "types", "RoundInstructions": "types", "RoundOutcome": "types", "RoundRecord": "types",
}
__all__ = [
    "Aggregator", "ClientUpdate", "FedAvg", "FederatedRun", "ModelHooks", "PlainAggregator", "PrivacyMode",
    "RoundInstructions", "RoundOutcome", "RoundRecord", "RunCallback", "RunResult", "ServerOptimizer",
    "Transport", "client_update", "local_exchange", "register_mode", "run_federated",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fedprivacy.fl' has no attribute {name!r}")
    return getattr(importlib.import_module(f"fedprivacy.fl.{module}"), name)
