"""A plain Flower app for the accountant tests: Flower's DP strategy around FedAvg, real clients.

The ClientApp trains softmax regression on an equal-size slice of scikit-learn's digits for one epoch
and sits behind Flower's ``fixedclipping_mod``; the ServerApp runs ``strategy.start`` of a strategy
the test builds. Nothing here is fedprivacy's own FL code: this is what a Flower user writes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import fixedclipping_mod
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Strategy
from sklearn.datasets import load_digits

FEATURES, CLASSES = 64, 10
LR = 0.1


def _partition(pid: int, num_partitions: int) -> tuple[np.ndarray, np.ndarray]:
    x, y = load_digits(return_X_y=True)
    per = len(y) // num_partitions  # equal sizes: Flower's accounted FedAvg needs equal weights
    sl = slice(pid * per, (pid + 1) * per)
    return x[sl].astype(np.float64) / 16.0, y[sl]


def _epoch(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
    for i in range(len(y)):
        logits = x[i] @ w + b
        p = np.exp(logits - logits.max())
        p /= p.sum()
        p[y[i]] -= 1.0
        w -= LR * np.outer(x[i], p)
        b -= LR * p


def make_client_app(*, clip_on_client: bool = True) -> ClientApp:
    """The ClientApp; with ``clip_on_client`` it clips behind Flower's ``fixedclipping_mod``."""
    app = ClientApp(mods=[fixedclipping_mod] if clip_on_client else [])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        arrays = msg.content["arrays"]
        w, b = (a.copy() for a in arrays.to_numpy_ndarrays())
        x, y = _partition(int(context.node_config["partition-id"]),
                          int(context.node_config["num-partitions"]))
        _epoch(w, b, x, y)
        reply = RecordDict({
            "arrays": ArrayRecord({k: Array(v) for k, v in zip(arrays.keys(), (w, b), strict=True)}),
            "metrics": MetricRecord({"num-examples": len(y)}),
        })
        return Message(reply, reply_to=msg)

    return app


def initial_arrays() -> ArrayRecord:
    return ArrayRecord({"w": Array(np.zeros((FEATURES, CLASSES))), "b": Array(np.zeros(CLASSES))})


def make_server_app(build: Callable[[], Strategy], num_rounds: int, out: dict[str, Any]) -> ServerApp:
    """A ServerApp running ``build()``'s strategy; puts it and its ``Result`` into ``out``."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = build()
        out["strategy"] = strategy
        out["result"] = strategy.start(grid=grid, initial_arrays=initial_arrays(),
                                       num_rounds=num_rounds, timeout=120)

    return app
