"""Run a Flower baseline and return its benchmark record.

Engines (``spec.engine``): ``ray`` (``flwr.simulation.run_simulation``, Flower's own) or ``inprocess``
(fedprivacy's ``server.engine.run_inprocess`` given the same ServerApp and ClientApp objects: it
implements Flower's ``Grid`` and calls the ClientApp per message, so Flower's strategies, mods and
accountant run unmodified; only the engine differs).
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from pathlib import Path
from typing import Any

from fedprivacy_bench.flower_baselines.recorder import RoundRecorder
from fedprivacy_bench.spec import BenchSpec, make_record

FLOWER_MODES = ("none", "central", "secagg+central")
REPO = Path(__file__).resolve().parents[2]


def ray_backend_config(*, num_cpus: int = 2) -> dict[str, Any]:
    """One CPU per virtual client, ``num_cpus`` actors, no dashboard: Flower's engine at its best
    on this machine."""
    return {
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "init_args": {"num_cpus": num_cpus, "num_gpus": 0, "include_dashboard": False,
                      "log_to_driver": False, "logging_level": logging.ERROR},
    }


def fedprivacy_epsilons(spec: BenchSpec, releases: int) -> dict[str, float | None]:
    """What fedprivacy's accountant says for a Flower central row's releases: PLD of ``releases``
    Gaussians of multiplier σ without amplification (Flower's draw earns none:
    server/flower_accountant.py), at sensitivity C (``zero-out``, Flower's own relation) and 2C
    (``replace-one``)."""
    from fedprivacy.accounting import NoSampling, epsilon_for

    if spec.mode != "central" or releases < 1:
        return {"zero-out": None, "replace-one": None}
    return {adj: float(epsilon_for(noise_multiplier=spec.noise_multiplier, sampling=NoSampling(),
                                   steps=releases, delta=spec.delta, neighbouring=rel))
            for adj, rel in (("zero-out", "add-remove"), ("replace-one", "replace-one"))}


_EPSILON_NOTES = {
    "central": ("Flower RdpAccountant (no amplification by sampling, the only mode it accepts; "
                "its figure holds under zero-out adjacency: server/flower_accountant.py)"),
    "secagg+central": ("Flower RdpAccountant applied to the same sigma/rounds (no amplification); "
                       "Flower has no accountant on the SecAgg+ path"),
}


def _check_flower_spec(spec: BenchSpec) -> None:
    if spec.framework != "flower":
        raise ValueError(f"framework must be 'flower', got {spec.framework!r}")
    if spec.mode not in FLOWER_MODES:
        raise ValueError(f"Flower baselines run modes {FLOWER_MODES}, got {spec.mode!r}")
    if spec.engine not in ("ray", "inprocess"):
        raise ValueError(f"engine must be 'ray' or 'inprocess' for Flower rows, got {spec.engine!r}")
    if spec.server_optimizer != "fedavg":
        # the apps run Flower's FedAvg; Flower's DP wrappers noise what a server optimizer returns
        # (after its step), which is not the setup's algorithm (docs/DESIGN.md)
        raise ValueError(f"server_optimizer must be 'fedavg' for Flower rows, got {spec.server_optimizer!r}")


def run_flower_baseline(spec: BenchSpec) -> dict[str, Any]:
    """Run ``spec`` (framework ``flower``) with ``flwr.simulation.run_simulation`` on Ray."""
    _check_flower_spec(spec)
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
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
        if spec.engine == "inprocess":
            import server.engine as engine

            engine.run_inprocess(num_supernodes=spec.num_clients, workers=spec.workers, app_dir=REPO,
                                 server_app=server_app, client_app=client_app, node_id_seed=spec.seed)
        else:
            # Imported here: importing flwr/ray costs seconds and belongs to the measured start-up.
            from flwr.simulation import run_simulation

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
    eps_note = _EPSILON_NOTES.get(spec.mode, "no privacy")
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
        flower_strategy=strategy_name(spec),
        fedprivacy_epsilon=fedprivacy_epsilons(spec, len(recorder.accuracy) - len(recorder.failed_rounds)),
    )


def strategy_name(spec: BenchSpec) -> str:
    """The Flower strategy (and client mod) a row ran."""
    if spec.mode == "none":
        return "FedAvg"
    if spec.mode == "secagg+central":
        return "FedAvg + SecAgg+ (central DP)"
    from fedprivacy_bench.flower_baselines.message_api import clipping_of

    if clipping_of(spec) == "server":
        return "DifferentialPrivacyServerSideFixedClipping(FedAvg)"
    return "DifferentialPrivacyClientSideFixedClipping(FedAvg) + fixedclipping_mod"
