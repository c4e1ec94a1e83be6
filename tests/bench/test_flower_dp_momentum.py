"""Flower 1.42's DP wrapper around Flower's FedAvgM, run for real: the released models carry MA(2) noise.

Flower's ``DifferentialPrivacyClientSideFixedClipping`` wraps Flower's ``FedAvgM`` (server lr 1,
momentum 0.9) on fedprivacy's in-process engine; the clients (``fixedclipping_mod``) send known updates
below the clip, so the mean update ``u_t`` is known. From the released arrays ``r_t`` alone the test
recovers ``y_t - u_t = xi_t - beta xi_{t-1} + beta xi_{t-2}`` and checks it draw for draw against
Flower's own noise (numpy's global generator, seeded), then computes what that correlation does to the
privacy loss (fedprivacy_bench.flower_baselines.momentum_noise; docs/DESIGN.md).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import fixedclipping_mod
from flwr.serverapp import (
    Grid,
    NeighboringRelation,
    PrivacyConfig,
    RdpAccountant,
    SamplingMethod,
    ServerApp,
)
from flwr.serverapp.strategy import DifferentialPrivacyClientSideFixedClipping, FedAvg, FedAvgM

from fedprivacy.accounting import NoSampling, epsilon_for
from fedprivacy_bench.flower_baselines.momentum_noise import (
    filter_amplitude,
    mahalanobis_sq,
    mahalanobis_upper_bound,
    noise_filter,
    released_differences,
    worst_pattern,
)
from server.engine import run_inprocess

REPO = Path(__file__).resolve().parents[2]
SHAPES = ((40, 25), (30,))
NODES, ROUNDS, SIGMA, CLIP, BETA, SEED = 4, 8, 1.5, 1.0, 0.9, 1234


def _update(pid: int, server_round: int) -> list[np.ndarray]:
    """Client pid's update in a round: deterministic, L2 norm 0.5 < CLIP (the mod leaves it as is)."""
    rng = np.random.default_rng(1000 * server_round + pid)
    parts = [rng.normal(size=s) for s in SHAPES]
    norm = math.sqrt(sum(float(np.sum(p * p)) for p in parts))
    return [0.5 * p / norm for p in parts]


def _mean_update(pids: list[int], server_round: int) -> np.ndarray:
    return np.mean([np.concatenate([u.ravel() for u in _update(p, server_round)]) for p in pids], axis=0)


def _client_app() -> ClientApp:
    app = ClientApp()

    @app.train(mods=[fixedclipping_mod])
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        server_round = int(cast(int, msg.content.config_records["config"]["server-round"]))
        received = msg.content.array_records["arrays"].to_numpy_ndarrays()
        new = [w + u for w, u in zip(received, _update(pid, server_round), strict=True)]
        return Message(content=RecordDict({"arrays": ArrayRecord(numpy_ndarrays=new),
                                           "metrics": MetricRecord({"num-examples": 1})}), reply_to=msg)

    return app


def _run(inner: FedAvg) -> tuple[np.ndarray, list[np.ndarray]]:
    """Run the wrapped strategy; the initial model and the flat released models r_1..r_T."""
    out: list[np.ndarray] = []
    initial = [np.full(s, 0.25) for s in SHAPES]
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        np.random.seed(SEED)  # noqa: NPY002  (Flower's noise: np.random.normal, global generator)
        dp = DifferentialPrivacyClientSideFixedClipping(inner, SIGMA, CLIP, NODES)

        def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            if server_round > 0:
                out.append(np.concatenate([a.ravel() for a in arrays.to_numpy_ndarrays()]))
            return None

        dp.start(grid=grid, initial_arrays=ArrayRecord(numpy_ndarrays=initial), num_rounds=ROUNDS,
                 evaluate_fn=evaluate_fn)

    run_inprocess(num_supernodes=NODES, app_dir=REPO, server_app=app, client_app=_client_app(),
                  node_id_seed=0)
    return np.concatenate([a.ravel() for a in initial]), out


def _flowers_draws() -> np.ndarray:
    """Flower's noise, drawn again: per round, one np.random.normal per array in order."""
    np.random.seed(SEED)  # noqa: NPY002
    std = SIGMA * CLIP / NODES
    return np.stack([np.concatenate([np.random.normal(0, std, s).ravel() for s in SHAPES])  # noqa: NPY002
                     for _ in range(ROUNDS)])


def _strategy(cls: type[FedAvg], **kw: Any) -> FedAvg:
    return cls(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=NODES,
               min_available_nodes=NODES, **kw)


def test_flowers_accountant_refuses_fedavgm() -> None:
    """Flower guards the accounted path: an accountant with FedAvgM inside is refused."""
    acc = RdpAccountant(PrivacyConfig(target_delta=1e-5, population_size=NODES,
                                      neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                                      sampling_method=SamplingMethod.NO_AMPLIFICATION))
    with pytest.raises(ValueError, match="FedAvg.aggregate_train"):
        DifferentialPrivacyClientSideFixedClipping(_strategy(FedAvgM, server_momentum=BETA), SIGMA, CLIP,
                                                   NODES, accountant=acc)


def test_fedavg_inside_releases_independent_noise() -> None:
    """Control: FedAvg inside, r_t - r_{t-1} - u_t is Flower's draw of round t (standard DP-FedAvg)."""
    x0, releases = _run(_strategy(FedAvg))
    noise = released_differences(releases, x0, 0.0) - np.stack(
        [_mean_update(list(range(NODES)), t) for t in range(1, ROUNDS + 1)])
    np.testing.assert_allclose(noise, _flowers_draws(), atol=1e-9)


def test_fedavgm_inside_releases_ma2_noise() -> None:
    """FedAvgM inside: y_t - u_t = xi_t - beta xi_{t-1} + beta xi_{t-2} with xi Flower's draws, and not
    xi_t alone."""
    x0, releases = _run(_strategy(FedAvgM, server_learning_rate=1.0, server_momentum=BETA))
    noise = released_differences(releases, x0, BETA) - np.stack(
        [_mean_update(list(range(NODES)), t) for t in range(1, ROUNDS + 1)])
    xi = _flowers_draws()
    np.testing.assert_allclose(noise, noise_filter(BETA, ROUNDS) @ xi, atol=1e-9)
    assert np.max(np.abs(noise[2:] - xi[2:])) > SIGMA * CLIP / NODES  # not independent noise
    # lag-1 correlation of the released noise: (-beta - beta^2) / (1 + 2 beta^2) = -0.653
    lag1 = float(np.mean(noise[3:] * noise[2:-1]) / np.mean(noise[2:] ** 2))
    assert lag1 == pytest.approx(-(BETA + BETA**2) / (1 + 2 * BETA**2), abs=0.05)


def test_momentum_noise_privacy_loss() -> None:
    """The worst contribution pattern over T = 120 rounds sees ~9x the privacy-loss mu of independent
    noise (period-6 square wave: |H(pi/3)| = 1 - beta), so the independent-Gaussian epsilon is far too
    low for DP-wrapped FedAvgM; with beta = 0 the two coincide."""
    assert filter_amplitude(BETA, math.pi / 3) == pytest.approx(1 - BETA)
    t = 120
    pattern, val = worst_pattern(BETA, t)
    assert val == pytest.approx(mahalanobis_sq(pattern, BETA))
    assert 80 * t < val <= mahalanobis_upper_bound(BETA, t) + 1e-6
    assert worst_pattern(0.0, t)[1] == pytest.approx(t)
    # at the benchmark's sigma (central eps = 4 at q = 0.1, T = 120) without amplification, zero-out
    sigma = 1.4702
    independent = epsilon_for(noise_multiplier=sigma / math.sqrt(t), sampling=NoSampling(), steps=1,
                              delta=1e-5)
    correlated = epsilon_for(noise_multiplier=sigma / math.sqrt(val), sampling=NoSampling(), steps=1,
                             delta=1e-5)
    assert independent == pytest.approx(
        epsilon_for(noise_multiplier=sigma, sampling=NoSampling(), steps=t, delta=1e-5), rel=1e-3)
    assert correlated > 20 * independent
