"""Flower 1.42's DP baselines on fedprivacy's in-process engine (Flower's DP strategies at the
same σ in the same run), for real on a tiny configuration: the released model's deviation from the
noiseless clipped mean (recomputed here with the same clients' training) has Flower's std σC/m, and the
row reports Flower's own RdpAccountant's ε for the releases that ran."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest
from flwr.serverapp import GaussianPrivacyEvent

from fedprivacy_bench import task
from fedprivacy_bench.flower_baselines import message_api
from fedprivacy_bench.flower_baselines.recorder import RoundRecorder
from fedprivacy_bench.flower_baselines.run import REPO, run_flower_baseline
from fedprivacy_bench.spec import BenchSpec
from server.engine import run_inprocess

SPEC = BenchSpec(dataset="digits", framework="flower", engine="inprocess", mode="central", num_clients=12,
                 clients_per_round=12, rounds=2, hidden=8, lr=0.1, local_epochs=1, batch_size=16,
                 clip_norm=0.3, noise_multiplier=1.2, target_epsilon=4.0, seed=3)


class _KeepAll(RoundRecorder):
    """The benchmark's recorder, also keeping every released model (round 0 = the initial one)."""

    def __init__(self) -> None:
        super().__init__()
        self.released: list[list[np.ndarray]] = []

    def check_update(self, server_round: int, weights: Any) -> None:
        super().check_update(server_round, weights)
        self.released.append([np.asarray(w, dtype=np.float64) for w in weights])


def _flat(ws: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(w, dtype=np.float64).ravel() for w in ws])


def _clipped_mean(spec: BenchSpec, start: list[np.ndarray], server_round: int) -> np.ndarray:
    """The noiseless mean of every client's clipped update from ``start`` (every node is in the cohort)."""
    updates = []
    for pid in range(spec.num_clients):
        model = task.model_for(spec)
        task.set_weights(model, [w.astype(np.float32) for w in start])
        task.train_client(model, spec, pid, server_round=server_round)
        u = _flat(task.get_weights(model)) - _flat(start)
        updates.append(u * min(1.0, spec.clip_norm / float(np.linalg.norm(u))))
    return np.mean(updates, axis=0)


@pytest.mark.parametrize("clipping", ["client", "server"])
def test_flower_dp_on_inprocess_engine_adds_sigma_c_over_m(clipping: str) -> None:
    spec = dataclasses.replace(SPEC, extra=(("flower_clipping", clipping),))
    recorder = _KeepAll()
    run_inprocess(num_supernodes=spec.num_clients, app_dir=REPO, node_id_seed=spec.seed,
                  server_app=message_api.make_server_app(spec, recorder),
                  client_app=message_api.make_client_app(spec))
    assert len(recorder.released) == spec.rounds + 1
    noise = np.concatenate([
        _flat(recorder.released[t]) - _flat(recorder.released[t - 1])
        - _clipped_mean(spec, recorder.released[t - 1], t) for t in range(1, spec.rounds + 1)])
    std = spec.noise_multiplier * spec.clip_norm / spec.clients_per_round  # 0.03
    # ~1.2k draws: the sample std within 8% of Flower's, the mean within 4 standard errors of 0
    assert float(np.std(noise)) == pytest.approx(std, rel=0.08)
    assert abs(float(np.mean(noise))) < 4 * std / math.sqrt(noise.size)
    # and not the noise of another cohort size (σC/(m/2) or σC/(2m))
    assert not float(np.std(noise)) == pytest.approx(2 * std, rel=0.3)
    assert not float(np.std(noise)) == pytest.approx(std / 2, rel=0.3)


def test_flower_row_reports_flowers_epsilon_for_the_releases_that_ran() -> None:
    record = run_flower_baseline(SPEC)
    assert record["status"] == "ok" and record["rounds"] == 2 and record["engine"] == "inprocess"
    acc = message_api.flower_accountant(SPEC)
    for _ in range(SPEC.rounds):
        acc.compose(GaussianPrivacyEvent(noise_multiplier=SPEC.noise_multiplier,
                                         sample_size=SPEC.clients_per_round,
                                         population_size=SPEC.num_clients))
    assert record["epsilon"] == pytest.approx(acc.get_privacy_spent().epsilon, rel=1e-9)
    assert record["epsilon_by_round"][0] < record["epsilon_by_round"][1] == record["epsilon"]
    assert record["flower_strategy"].startswith("DifferentialPrivacyClientSideFixedClipping")
    fp = record["fedprivacy_epsilon"]  # PLD (tight) below RDP at the same sensitivity; 2C above
    assert fp["zero-out"] < record["epsilon"] < fp["replace-one"]


def test_flower_rows_refuse_a_server_optimizer_they_do_not_run() -> None:
    with pytest.raises(ValueError, match="server_optimizer must be 'fedavg'"):
        run_flower_baseline(dataclasses.replace(SPEC, server_optimizer="fedavgm"))
    with pytest.raises(ValueError, match="flower_clipping must be one of"):
        message_api.make_client_app(dataclasses.replace(SPEC, extra=(("flower_clipping", "both"),)))
