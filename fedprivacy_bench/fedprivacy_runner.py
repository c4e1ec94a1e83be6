"""Run fedprivacy's own Flower apps (``server.server_app:app``, ``clients.client_app:app``) for a spec.

Engines: ``inprocess`` (``server.engine.run_inprocess``, the fast path) and ``ray`` (the same
apps on Flower's Ray simulation engine via ``server.engine.run_flower_simulation``). The figures
come from the ``results.json`` the ServerApp writes (per round: ``test_accuracy``, ``epsilon``,
``seconds``, where ``seconds`` spans the round and its central evaluation).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from fedprivacy_bench import task
from fedprivacy_bench.spec import BenchSpec, make_record

REPO = Path(__file__).resolve().parents[1]


def run_config_for(spec: BenchSpec, *, output_dir: str) -> dict[str, Any]:
    """fedprivacy run-config overrides (pyproject ``[tool.flwr.app.config]`` keys) for ``spec``."""
    privacy = spec.mode if spec.mode in ("central", "local", "distributed") else "none"
    cfg: dict[str, Any] = {
        "num-server-rounds": spec.rounds,
        "dataset": spec.dataset,
        "partitioner": spec.partitioner,
        "dirichlet-alpha": spec.dirichlet_alpha,
        "min-partition-size": spec.min_partition_size,
        "test-fraction": task.TEST_FRACTION,
        "model": spec.model,
        "hidden-units": spec.hidden,
        "local-epochs": spec.local_epochs,
        "learning-rate": spec.lr,
        "batch-size": spec.batch_size,
        "privacy": privacy,
        "clip-norm": spec.clip_norm,
        "noise-multiplier": spec.noise_multiplier if privacy != "none" else 0.0,
        "target-epsilon": 0.0,
        "target-delta": spec.delta,
        "sampling": "poisson",
        "sample-rate": spec.sample_rate,
        # distributed: each round is the PLD of its dominating Gaussian (RDP cross-check in
        # results.json), like the central rows' PLD
        "accountant": "pld",
        "dpsgd": spec.mode == "dpsgd",
        "secagg": privacy == "distributed" or bool(spec.option("secagg", False)),
        "seed": spec.seed,
        "output-dir": output_dir,
        "run-name": spec.key(),
        "eval-every": spec.eval_every,
        # a benchmark row must not depend on the machine's load: with the default 120 s a loaded round
        # left late clients out silently and the same seed gave another loss (perf)
        "client-timeout": 3600.0,
        "server-optimizer": spec.server_optimizer,
        "server-learning-rate": spec.server_learning_rate,
        "server-momentum": spec.server_momentum,
        "server-beta-1": spec.server_beta_1,
        "server-beta-2": spec.server_beta_2,
        "server-tau": spec.server_tau,
    }
    if spec.mode == "dpsgd":
        cfg["dpsgd-noise-multiplier"] = float(spec.option("dpsgd_noise_multiplier", 1.0))
        cfg["dpsgd-max-grad-norm"] = float(spec.option("dpsgd_max_grad_norm", 1.0))
    return cfg


def distributed_epsilons(privacy: dict[str, Any]) -> dict[str, Any]:
    """A distributed run's ε per audience as its ``results.json`` reports them.

    ``server`` (no amplification: the server sees the cohorts), ``observers`` (the public, with the
    amplification of the sampling that ran), and the central-DP references at the same σ: the PLD of
    the continuous Gaussian σ = z·C with the same sampling and without any. Empty for other modes.
    """
    dist = privacy.get("distributed") or {}
    audiences = dist.get("audiences") or {}
    if not audiences:
        return {}
    return {
        "audience": privacy.get("epsilon_audience", "server"),
        "server": (audiences.get("server") or {}).get("epsilon"),
        "observers": (audiences.get("observers") or {}).get("epsilon"),
        "observers_amplified": (audiences.get("observers") or {}).get("amplification"),
        "central_same_sigma_and_sampling": dist.get("central_dp_epsilon_same_sigma_and_sampling"),
        "central_same_sigma_no_sampling": dist.get("central_dp_epsilon_same_sigma"),
        "noise": dist.get("noise"),
    }


def record_from_results(spec: BenchSpec, results: dict[str, Any], *, round_seconds: list[float] | None = None,
                        **extra: Any) -> dict[str, Any]:
    """Turn a fedprivacy ``results.json`` into a benchmark record (a distributed run's record also
    carries ``epsilon_audiences``: :func:`distributed_epsilons`)."""
    rows = list(results.get("rounds", []))
    privacy = results.get("privacy", {}) or {}
    eps = privacy.get("epsilon")
    note = ""
    audiences = distributed_epsilons(privacy) if spec.mode == "distributed" else {}
    if audiences:
        extra["epsilon_audiences"] = audiences
    if spec.mode == "dpsgd" and rows and rows[-1].get("dpsgd_epsilon") is not None:
        eps = rows[-1]["dpsgd_epsilon"]
        note = "epsilon is per-example (DP-SGD), not per-user"
    status = results.get("status", "completed")
    return make_record(
        spec,
        params=task.params_for(spec),
        test_accuracy=rows[-1]["test_accuracy"] if rows else None,
        accuracy_by_round=[r["test_accuracy"] for r in rows],
        epsilon_by_round=[r.get("epsilon") for r in rows],
        epsilon=eps,
        epsilon_note=("no privacy" if spec.mode == "none" else
                      f"fedprivacy {privacy.get('accountant', 'pld')} accountant, "
                      f"{privacy.get('sampling', 'Poisson')}"),
        rounds=len(rows),
        # a run with private counts keeps each round's wall time in its private log:
        # run_fedprivacy reads it there (fedprivacy.fl.run.round_seconds)
        round_seconds=(list(round_seconds) if round_seconds is not None
                       else [float(r["seconds"]) for r in rows if "seconds" in r]),
        status="ok" if status == "completed" else str(status),
        note=note,
        **extra,
    )


def _keep_final_model(spec: BenchSpec, run_dir: Path, record: dict[str, Any], keep_dir: Path) -> Path:
    """The run's last checkpoint (round T: the global model the row evaluated) into ``keep_dir``."""
    from fedprivacy.fl.checkpoint import load_checkpoint
    from fedprivacy_bench.kept_models import keep_model

    ckpt = load_checkpoint(run_dir / "checkpoint")
    if ckpt is None or ckpt.round != spec.rounds:
        found = None if ckpt is None else ckpt.round
        raise ValueError(f"keep_dir: run {spec.key()} has no checkpoint of its last round "
                         f"{spec.rounds} (found {found})")
    return keep_model(spec, ckpt.weights, record, keep_dir)


def run_fedprivacy(spec: BenchSpec, *, keep_dir: Path | None = None) -> dict[str, Any]:
    """Run ``spec`` on fedprivacy's apps in a temporary run folder; its record.

    ``keep_dir``: also keep the final global model there (``fedprivacy_bench.kept_models``: weights,
    partition, sidecar; the record's ``kept_model`` names the sidecar).
    """
    if spec.framework != "fedprivacy":
        raise ValueError(f"framework must be 'fedprivacy', got {spec.framework!r}")
    import server.engine as engine

    with tempfile.TemporaryDirectory(prefix="fedprivacy-bench-") as out:
        run_config = run_config_for(spec, output_dir=out)
        t0 = time.perf_counter()
        if spec.engine == "inprocess":
            res = engine.run_inprocess(run_config=run_config, num_supernodes=spec.num_clients,
                                       workers=spec.workers, app_dir=REPO,
                                       node_id_seed=spec.seed)
            path = res.results_path
            startup = res.startup_seconds
        elif spec.engine == "ray":
            from fedprivacy_bench.flower_baselines.run import ray_backend_config

            engine.run_flower_simulation(run_config=run_config, num_supernodes=spec.num_clients,
                                         app_dir=REPO, backend_config=ray_backend_config())
            found = sorted(Path(out).rglob("results.json"))
            path = found[-1] if found else None
            startup = None
        else:
            raise ValueError(f"engine must be 'inprocess' or 'ray', got {spec.engine!r}")
        wall = time.perf_counter() - t0
        if path is None or not Path(path).is_file():
            return make_record(spec, status="failed", wall_seconds=wall,
                               note="the ServerApp wrote no results.json")
        results = json.loads(Path(path).read_text())
        from fedprivacy.fl.run import round_seconds

        seconds = round_seconds(Path(path).parent)
        rec = record_from_results(spec, results, round_seconds=seconds, wall_seconds=wall)
        if keep_dir is not None:
            try:
                rec["kept_model"] = str(_keep_final_model(spec, Path(path).parent, rec, keep_dir))
            except (OSError, ValueError) as exc:  # the row's figures stand without its model
                rec["kept_model"] = None
                rec["note"] = (rec["note"] + "; " if rec["note"] else "") + f"model not kept: {exc}"[:300]
    first = rec["round_seconds"][0] if rec["round_seconds"] else 0.0
    rec["startup_seconds"] = (startup + first) if startup is not None else None
    if spec.engine == "ray":
        rec["startup_seconds"] = wall - sum(rec["round_seconds"][1:])
    if spec.engine == "inprocess":
        rec["note"] = (rec["note"] + "; " if rec["note"] else "") + f"workers={spec.workers}"
    return rec
