"""Flower 1.42 Message API baselines: plain FedAvg, and FedAvg with central DP (client-side clipping).

Built the way Flower's own examples build them (quickstart-pytorch; the central-DP how-to):

- ``none``: ``flwr.serverapp.strategy.FedAvg`` sampling ``clients_per_round`` of the connected
  nodes each round (a fixed-size cohort without replacement), weighted by ``num-examples``.
- ``central``: the same FedAvg wrapped in ``DifferentialPrivacyClientSideFixedClipping``; each
  client's ``fixedclipping_mod`` clips its update to L2 norm C and the server adds
  N(0, (sigma C / m)^2) to the average of the m updates. With the spec option
  ``flower_clipping="server"`` it is ``DifferentialPrivacyServerSideFixedClipping`` instead (the
  server clips each update, no client mod); same noise, same accountant. Flower's ``RdpAccountant`` tracks epsilon;
  in 1.42 it accepts only ``sampling_method=no-amplification`` with this wrapper, so its epsilon
  gets no credit for sampling (ANCHORS.md). Clients report weight 1 (the accountant requires equal
  weights).

Federated evaluation is off (``fraction_evaluate=0``); the server evaluates the global model on the
held-out test set in ``evaluate_fn`` every ``spec.eval_every`` rounds and after the last (as
fedprivacy's ``eval-every``), which is also where round timestamps are taken. Numpy's global
generator (Flower's noise source) and Python's (Flower's node sampling) are seeded with
``spec.seed``: a row is reproducible, and its noise is predictable, as Flower's always is.
"""

from __future__ import annotations

import functools
import random
from typing import cast

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import fixedclipping_mod
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAvg,
)
from flwr.serverapp.strategy.dp_fixed_clipping import DifferentialPrivacyFixedClippingBase
from flwr.supercore.privacy_accounting import (
    NeighboringRelation,
    PrivacyConfig,
    SamplingMethod,
)
from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

from fedprivacy_bench import task
from fedprivacy_bench.flower_baselines.recorder import RoundRecorder
from fedprivacy_bench.spec import BenchSpec

SUPPORTED_MODES = ("none", "central")
CLIPPING = ("client", "server")  # spec option "flower_clipping": which Flower DP wrapper


def clipping_of(spec: BenchSpec) -> str:
    """Where a ``central`` Flower row clips: ``"client"`` (fixedclipping_mod) or ``"server"``."""
    where = spec.option("flower_clipping", "client")
    if where not in CLIPPING:
        raise ValueError(f"flower_clipping must be one of {CLIPPING}, got {where!r}")
    return str(where)


def _evaluated(spec: BenchSpec, server_round: int) -> bool:
    return server_round == spec.rounds or (server_round > 0 and server_round % spec.eval_every == 0)


@functools.lru_cache(maxsize=2)
def _client_model(spec: BenchSpec) -> torch.nn.Module:
    return task.model_for(spec)


def make_client_app(spec: BenchSpec) -> ClientApp:
    """A ClientApp that trains the benchmark MLP on its partition (``partition-id``)."""
    if spec.mode not in SUPPORTED_MODES:
        raise ValueError(f"mode must be one of {SUPPORTED_MODES}, got {spec.mode!r}")
    app = ClientApp()
    private = spec.mode == "central"
    client_clips = private and clipping_of(spec) == "client"

    @app.train(mods=[fixedclipping_mod] if client_clips else [])
    def train(msg: Message, context: Context) -> Message:
        torch.set_num_threads(1)
        pid = int(context.node_config["partition-id"])
        model = _client_model(spec)
        task.set_weights(model, msg.content.array_records["arrays"].to_numpy_ndarrays())
        server_round = int(cast(int, msg.content.config_records["config"]["server-round"]))
        n, loss = task.train_client(model, spec, pid, server_round=server_round)
        reply = RecordDict({
            "arrays": ArrayRecord(numpy_ndarrays=task.get_weights(model)),
            "metrics": MetricRecord({"train_loss": loss,
                                     "num-examples": 1 if private else n}),
        })
        return Message(content=reply, reply_to=msg)

    return app


def flower_accountant(spec: BenchSpec) -> RdpAccountant:
    """Flower's own RDP accountant, in the only configuration 1.42 accepts for fixed clipping."""
    return RdpAccountant(PrivacyConfig(
        target_delta=spec.delta,
        population_size=spec.num_clients,
        neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
        sampling_method=SamplingMethod.NO_AMPLIFICATION,
    ))


def _spent(dp: DifferentialPrivacyFixedClippingBase | None, server_round: int) -> float | None:
    """Flower's accountant's ε so far (``None`` without DP or before the first release)."""
    if dp is None or server_round == 0:
        return None
    spent = dp.privacy_spent()
    return None if spent is None else float(spent.epsilon)


def make_server_app(spec: BenchSpec, recorder: RoundRecorder) -> ServerApp:
    """A ServerApp running FedAvg (optionally DP-wrapped) and recording per-round figures."""
    if spec.mode not in SUPPORTED_MODES:
        raise ValueError(f"mode must be one of {SUPPORTED_MODES}, got {spec.mode!r}")
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        random.seed(spec.seed)  # Flower's sample_nodes draws from the global `random` module
        np.random.seed(spec.seed)  # noqa: NPY002  (Flower's noise: np.random.normal, global)
        torch.set_num_threads(1)
        model = task.model_for(spec)
        test = task.test_split(spec)
        recorder.params = task.params_for(spec)
        fedavg = FedAvg(fraction_train=spec.sample_rate, fraction_evaluate=0.0,
                        min_train_nodes=spec.clients_per_round,
                        min_available_nodes=spec.num_clients)
        strategy: FedAvg | DifferentialPrivacyFixedClippingBase = fedavg
        dp: DifferentialPrivacyFixedClippingBase | None = None
        if spec.mode == "central":
            wrapper = (DifferentialPrivacyClientSideFixedClipping if clipping_of(spec) == "client"
                       else DifferentialPrivacyServerSideFixedClipping)
            dp = wrapper(fedavg, spec.noise_multiplier, spec.clip_norm, spec.clients_per_round,
                         accountant=flower_accountant(spec))
            strategy = dp
        eval_model = task.model_for(spec)

        def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            recorder.enter(server_round)
            weights = [np.asarray(a) for a in arrays.to_numpy_ndarrays()]
            recorder.check_update(server_round, weights)
            recorder.last_weights = weights
            if not _evaluated(spec, server_round):
                recorder.leave(server_round, accuracy=None, epsilon=_spent(dp, server_round))
                return None
            task.set_weights(eval_model, weights)
            loss, acc = task.evaluate(eval_model, test)
            recorder.leave(server_round, accuracy=acc, epsilon=_spent(dp, server_round))
            return MetricRecord({"accuracy": acc, "loss": loss})

        strategy.start(grid=grid, initial_arrays=ArrayRecord(numpy_ndarrays=task.get_weights(model)),
                       num_rounds=spec.rounds, evaluate_fn=evaluate_fn)

    return app
