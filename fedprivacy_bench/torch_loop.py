"""Single-process torch loop: the same local training as the federated rows, without any framework.

Each round samples ``clients_per_round`` clients without replacement, trains a copy of the global
model on each client's partition with the same local SGD (``fedprivacy.ml.train_local``), takes the
example-weighted average (FedAvg) and evaluates on the server's test set. This is the floor every
engine is compared against ("each mode against a single-process torch loop doing the same
local training"). A round's time includes its central evaluation, as fedprivacy's and the Flower
baselines' round times do.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from fedprivacy_bench import task
from fedprivacy_bench.spec import BenchSpec, make_record


def run_torch_loop(spec: BenchSpec) -> dict[str, Any]:
    if spec.mode != "none":
        raise ValueError(f"the torch loop is the non-private reference; mode must be 'none', "
                         f"got {spec.mode!r}")
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    model = task.model_for(spec)
    test = task.test_split(spec)
    for pid in range(spec.num_clients):  # load (and cache) the partitions before timing rounds
        task.client_split(spec, pid)
    global_weights = task.get_weights(model)
    gen = np.random.default_rng(spec.seed + 1)  # cohort sampling only, not privacy noise
    startup = time.perf_counter() - t_start
    round_seconds: list[float] = []
    accuracy: list[float] = []
    for rnd in range(1, spec.rounds + 1):
        t0 = time.perf_counter()
        cohort = gen.choice(spec.num_clients, size=spec.clients_per_round, replace=False)
        acc_sum = [np.zeros(w.shape, dtype=np.float64) for w in global_weights]
        total = 0
        for cid in cohort:
            task.set_weights(model, global_weights)
            n, _ = task.train_client(model, spec, int(cid), server_round=rnd)
            for a, w in zip(acc_sum, task.get_weights(model), strict=True):
                a += n * w
            total += n
        global_weights = [(a / max(total, 1)).astype(np.float32) for a in acc_sum]
        task.set_weights(model, global_weights)
        accuracy.append(task.evaluate(model, test)[1])
        round_seconds.append(time.perf_counter() - t0)
    return make_record(
        spec,
        params=task.params_for(spec),
        test_accuracy=accuracy[-1] if accuracy else None,
        accuracy_by_round=accuracy,
        rounds=len(round_seconds),
        round_seconds=round_seconds,
        startup_seconds=startup + (round_seconds[0] if round_seconds else 0.0),
        epsilon=None,
        epsilon_note="no privacy",
        note="single process, no Flower",
    )
