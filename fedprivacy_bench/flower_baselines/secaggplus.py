"""Flower's SecAgg+ with central DP: the peer fedprivacy's ``distributed`` mode is measured against.

Built as in Flower's ``fl-dp-sa`` example: the server runs ``DefaultWorkflow`` with a
``SecAggPlusWorkflow`` fit workflow over a ``LegacyContext`` holding a legacy ``FedAvg`` wrapped in
``flwr.server.strategy.DifferentialPrivacyClientSideFixedClipping``; the client is a ``NumPyClient``
behind ``mods=[secaggplus_mod, fixedclipping_mod]`` (clip first, then mask). Flower's SecAgg+ only
runs through this legacy API in 1.42; it is used here as the measured peer, not as fedprivacy code.

With DP, Flower's server unmasks the *un-noised* sum and adds the Gaussian noise itself (central DP
with a trusted server), so its privacy claim is weaker than fedprivacy's distributed DP. Flower has
no accountant on this path; the epsilon reported for the row is Flower's RDP accountant
(no amplification, as the Message API wrapper would use) applied to the same sigma and rounds.

SecAgg+ parameters: each client shares its secrets with ``num_shares = k + 1`` nodes (itself and
k neighbours, k = ceil(log2 m) for a cohort of m unless ``extra`` sets ``secagg_neighbours``,
rounded to an odd ``num_shares`` as Flower's graph construction requires),
reconstruction threshold ``num_shares // 2 + 1``; Flower's defaults otherwise (clipping range +-8,
quantisation range 2^22, modulus 2^32), ``max_weight=1`` as every client reports weight 1.
"""

from __future__ import annotations

import functools
import math
import random
import time
from typing import Any

import numpy as np
import torch
from flwr.client import NumPyClient
from flwr.client.mod import fixedclipping_mod, secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common import Context, ndarrays_to_parameters
from flwr.server import LegacyContext, ServerApp, ServerConfig
from flwr.server.strategy import DifferentialPrivacyClientSideFixedClipping, FedAvg
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.serverapp import Grid
from flwr.supercore.privacy_accounting import GaussianPrivacyEvent

from fedprivacy_bench import task
from fedprivacy_bench.flower_baselines.message_api import flower_accountant
from fedprivacy_bench.flower_baselines.recorder import RoundRecorder
from fedprivacy_bench.spec import BenchSpec


def secagg_shares(spec: BenchSpec) -> tuple[int, int]:
    """(num_shares, reconstruction_threshold) for Flower's SecAggPlusWorkflow."""
    m = spec.clients_per_round
    k = int(spec.option("secagg_neighbours", 0)) or max(2, math.ceil(math.log2(max(m, 2))))
    num_shares = max(3, min(m, k + 1))
    if num_shares % 2 == 0:  # Flower's SecAgg+ graph construction needs an odd share count
        num_shares = num_shares + 1 if num_shares < m else num_shares - 1
    threshold = max(2, num_shares // 2 + 1)
    return num_shares, threshold


@functools.lru_cache(maxsize=2)
def _client_model(spec: BenchSpec) -> torch.nn.Module:
    return task.model_for(spec)


class _BenchClient(NumPyClient):
    def __init__(self, spec: BenchSpec, partition_id: int) -> None:
        self.spec = spec
        self.pid = partition_id

    def fit(self, parameters: list[np.ndarray], config: dict[str, Any]
            ) -> tuple[list[np.ndarray], int, dict[str, Any]]:
        torch.set_num_threads(1)
        spec = self.spec
        model = _client_model(spec)
        task.set_weights(model, parameters)
        rnd = int(config.get("server_round", 0))
        _, loss = task.train_client(model, spec, self.pid, server_round=rnd)
        return task.get_weights(model), 1, {"train_loss": loss}


def make_client_app(spec: BenchSpec) -> ClientApp:
    def client_fn(context: Context) -> Any:
        return _BenchClient(spec, int(context.node_config["partition-id"])).to_client()

    return ClientApp(client_fn=client_fn, mods=[secaggplus_mod, fixedclipping_mod])


def make_server_app(spec: BenchSpec, recorder: RoundRecorder) -> ServerApp:
    if spec.mode != "secagg+central":
        raise ValueError(f"mode must be 'secagg+central', got {spec.mode!r}")
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        random.seed(spec.seed)
        torch.set_num_threads(1)
        model = task.model_for(spec)
        test = task.test_split(spec)
        recorder.params = task.params_for(spec)
        eval_model = task.model_for(spec)
        accountant = flower_accountant(spec)
        event = GaussianPrivacyEvent(noise_multiplier=spec.noise_multiplier,
                                     sample_size=spec.clients_per_round,
                                     population_size=spec.num_clients)

        def evaluate_fn(server_round: int, parameters: list[np.ndarray], config: dict[str, Any]
                        ) -> tuple[float, dict[str, Any]]:
            recorder.enter(server_round)
            recorder.check_update(server_round, parameters)
            task.set_weights(eval_model, parameters)
            loss, acc = task.evaluate(eval_model, test)
            eps = None
            if server_round > 0:
                accountant.compose(event)
                eps = float(accountant.get_epsilon(spec.delta))
            recorder.leave(server_round, accuracy=acc, epsilon=eps)
            return loss, {"accuracy": acc}

        def fit_config(server_round: int) -> dict[str, Any]:
            return {"server_round": server_round}

        fedavg = FedAvg(
            fraction_fit=spec.sample_rate, fraction_evaluate=0.0,
            min_fit_clients=spec.clients_per_round, min_evaluate_clients=0,
            min_available_clients=spec.num_clients,
            initial_parameters=ndarrays_to_parameters(task.get_weights(model)),
            evaluate_fn=evaluate_fn, on_fit_config_fn=fit_config,
        )
        strategy = DifferentialPrivacyClientSideFixedClipping(
            fedavg, noise_multiplier=spec.noise_multiplier, clipping_norm=spec.clip_norm,
            num_sampled_clients=spec.clients_per_round)
        legacy = LegacyContext(context=context, config=ServerConfig(num_rounds=spec.rounds),
                               strategy=strategy)
        num_shares, threshold = secagg_shares(spec)
        recorder.notes.append(f"SecAgg+ num_shares={num_shares} threshold={threshold}")
        workflow = DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(
            num_shares=num_shares, reconstruction_threshold=threshold, max_weight=1.0))
        recorder.last_exit = time.perf_counter()
        workflow(grid, legacy)

    return app
