"""Run a Flower baseline on Flower's simulation engine and return its benchmark record."""

from __future__ import annotations

import logging
import os
import time
import warnings
from typing import Any

from fedprivacy_bench.flower_baselines.recorder import RoundRecorder
from fedprivacy_bench.spec import BenchSpec, make_record

FLOWER_MODES = ("none", "central", "secagg+central")


def ray_backend_config(*, num_cpus: int = 2) -> dict[str, Any]:
    """One CPU per virtual client, ``num_cpus`` actors, no dashboard: Flower's engine at its best
    on this machine."""
    return {
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "init_args": {"num_cpus": num_cpus, "num_gpus": 0, "include_dashboard": False,
                      "log_to_driver": False, "logging_level": logging.ERROR},
    }


def run_flower_baseline(spec: BenchSpec) -> dict[str, Any]:
    """Run ``spec`` (framework ``flower``) with ``flwr.simulation.run_simulation`` on Ray."""
    if spec.framework != "flower":
        raise ValueError(f"framework must be 'flower', got {spec.framework!r}")
    if spec.mode not in FLOWER_MODES:
        raise ValueError(f"Flower baselines run modes {FLOWER_MODES}, got {spec.mode!r}")
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    # Imported here: importing flwr/ray costs seconds and belongs to the measured start-up.
    from flwr.simulation import run_simulation

    if spec.mode == "secagg+central":
        from fedprivacy_bench.flower_baselines import secaggplus as apps
    else:
        from fedprivacy_bench.flower_baselines import message_api as apps  # type: ignore[no-redef]

    recorder = RoundRecorder()
    server_app = apps.make_server_app(spec, recorder)
    client_app = apps.make_client_app(spec)
    t0 = time.perf_counter()
    recorder.t_start = t0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_simulation(server_app=server_app, client_app=client_app,
                       num_supernodes=spec.num_clients,
                       backend_config=ray_backend_config(num_cpus=2))  # type: ignore[arg-type]
    wall = time.perf_counter() - t0
    status = "ok" if len(recorder.accuracy) == spec.rounds else "incomplete"
    if recorder.failed_rounds:
        status = "failed" if len(recorder.failed_rounds) == len(recorder.accuracy) else "partial"
        recorder.notes.append(f"rounds without an aggregate: {recorder.failed_rounds}")
    eps = recorder.epsilon[-1] if recorder.epsilon else None
    note = "; ".join(recorder.notes)
    eps_note = "no privacy"
    if spec.mode == "central":
        eps_note = "Flower RdpAccountant (no amplification by sampling, the only mode it accepts)"
    elif spec.mode == "secagg+central":
        eps_note = ("Flower RdpAccountant applied to the same sigma/rounds (no amplification); "
                    "Flower has no accountant on the SecAgg+ path")
    return make_record(
        spec,
        params=recorder.params,
        test_accuracy=recorder.accuracy[-1] if recorder.accuracy else None,
        accuracy_by_round=list(recorder.accuracy),
        epsilon_by_round=list(recorder.epsilon),
        epsilon=eps,
        epsilon_note=eps_note,
        rounds=len(recorder.accuracy),
        round_seconds=list(recorder.round_seconds),
        startup_seconds=(recorder.first_round_end - t0) if recorder.first_round_end else None,
        wall_seconds=wall,
        status=status,
        note=note,
    )
