"""Seconds per round on the in-process engine: plain FedAvg vs secure aggregation vs distributed DP.

Usage: ``python scripts/secagg_round_bench.py --clients 10 --rounds 4 [--model mlp-large]
[--set 'dataset="fashion-mnist"' ...] --json out.json``, or ``--setup fedavgm-c300 [--epsilon 4]
[--setup-rounds 120]`` for the real-data workload of docs/BENCHMARKS.md's curve (3000 Fashion-MNIST
clients, Poisson q = 0.1, the convnet of 28,938 parameters, the σ of central ε at T; evaluated once).
Each mode runs the real ServerApp/ClientApp (``server.engine.run_inprocess``, one worker) with the
same seed; "seconds per round" is the median over the steady rounds 2..R-1 (R >= 4; else 2..R): round 1
carries one-off warm-up and its own key stages, and on the secure schedules the last round is cheaper (no
round r+1 key stages ride on its messages: 0.40 against 0.55 CPU s at 100 clients). ``mlp-large`` has
3,466 parameters at the run config's ``hidden-units = 32``; the 100k workload is
``--set hidden-units=288`` (104,842); each row prints and saves its ``dim``.
Modes: ``plain`` (privacy none), ``central`` (central DP, σ = 1, PLD), ``secure`` (privacy none +
secagg, fixed point), ``distributed`` (secagg + distributed discrete Gaussian, σ = 1, RDP), both on
the default actively secure schedule, and ``secure-semi`` / ``distributed-semi`` on the semi-honest one.

The ratios, printed as JSON at the end (from the rows of this one run), each from wall seconds
and, load-robust, from CPU seconds per round (this process: the server and every client):

* ``distributed_over_central``: distributed DP + SecAgg round over the central-DP round (goal <= 2 on
  digits, <= 1.3 on the real-data workload of ``--setup``);
* secure-aggregation overhead per client, ``(secure - plain) / n`` and ``(distributed - central) / n``
  seconds (``n``: clients per round, the median of ``clients_sampled``), over the crypto floor per client that ``scripts/secagg_bench.py`` measures primitive by
  primitive (in this process, for the run's n, k, t and model size; goal <= 1.5); beside it the
  protocol floor and, for distributed DP, the XNoise protocol floor (the protocol floor with XNoise's
  component sampling and the server's regeneration in place of the floor's one Gaussian vector).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MODES: dict[str, dict[str, Any]] = {
    "plain": {"privacy": "none", "secagg": False},  # the pyproject default is secagg=true
    "central": {"privacy": "central", "secagg": False},
    "secure": {"privacy": "none", "secagg": True},
    "distributed": {"privacy": "distributed", "secagg": True, "accountant": "rdp"},
    # the semi-honest opt-in schedule (no consistency stage), for the cost of active security
    "secure-semi": {"privacy": "none", "secagg": True, "secagg-schedule": "semi-honest"},
    "distributed-semi": {"privacy": "distributed", "secagg": True, "accountant": "rdp",
                         "secagg-schedule": "semi-honest"},
}


@functools.cache
def _sibling(name: str) -> Any:
    """``scripts/<name>.py`` as a module (scripts are not a package), loaded once per process."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_{name}", REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def setup_config(name: str, *, epsilon: float, setup_rounds: int | None) -> tuple[dict[str, Any], int]:
    """(run config, population) of ``scripts/benchmark.py --setup NAME``'s central row at target ``epsilon``
    (its data, partitioner, model, local training, clip, Poisson q, server step, seed 0, and the σ
    calibrated for ``setup_rounds`` rounds, the setup's own T by default): the real-data workload of
    the curve, run here for a few rounds per mode. A mode changes only ``privacy`` and ``secagg``
    (the rows' accountant stays the setup's PLD)."""
    from fedprivacy_bench.fedprivacy_runner import run_config_for

    row = _sibling("benchmark").setup_sweep(name, rounds=setup_rounds, epsilons=(epsilon,), modes=("central",))[0]
    cfg = run_config_for(row, output_dir="")
    for key in ("output-dir", "run-name", "num-server-rounds", "eval-every", "privacy", "secagg"):
        cfg.pop(key)
    return cfg, row.num_clients


def run_mode(mode: str, *, clients: int, rounds: int, model: str, out: Path,
             extra: dict[str, Any] | None = None, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """One mode's run: the bench's own config (``model``, seed 0) or, with ``base``, a ``--setup``'s
    (:func:`setup_config`: evaluated once, after the last round), then ``extra``, then the mode."""
    from server.engine import run_inprocess

    if base is None:
        cfg = {"seed": 0, "model": model, "target-delta": min(1e-5, 0.1 / clients), **(extra or {}),
               **MODES[mode]}
    else:
        mode_keys = {k: v for k, v in MODES[mode].items() if k in ("privacy", "secagg", "secagg-schedule")}
        cfg = {**base, "eval-every": rounds, **(extra or {}), **mode_keys}
    cfg = {"num-server-rounds": rounds, "output-dir": str(out), "run-name": mode, **cfg}
    marks = _RoundCpu()
    logging.getLogger("flwr").addHandler(marks)
    try:
        res = run_inprocess(run_config=cfg, num_supernodes=clients, app_dir=REPO, node_id_seed=1)
    finally:
        logging.getLogger("flwr").removeHandler(marks)
    saved = json.loads((out / mode / "results.json").read_text())
    from fedprivacy.fl.checkpoint import load_checkpoint

    ckpt = load_checkpoint(out / mode / "checkpoint")
    dim = int(sum(int(w.size) for w in ckpt.weights)) if ckpt is not None else None
    # with private counts the rounds' wall times are in the private log
    from fedprivacy.fl.run import round_seconds

    secs = round_seconds(out / mode)
    cpu = [b - a for a, b in zip(marks.at, marks.at[1:], strict=False)]
    exch = [(t, n, s) for t, n, s in res.stats.exchanges]
    return {
        "mode": mode, "run_config": {k: v for k, v in cfg.items() if k != "output-dir"}, "seconds_per_round": statistics.median(_steady(secs)), "round_seconds": secs,
        "accuracy": saved["rounds"][-1]["test_accuracy"], "epsilon": saved["privacy"].get("epsilon"),
        "exchanges_per_round": saved["rounds"][-1].get("secagg_exchanges", 1),
        "exchange_seconds": exch[-8:], "dim": dim,
        "client_cpu_seconds": res.stats.client_cpu_seconds,
        "round_cpu_seconds": cpu, "cpu_seconds_per_round": statistics.median(_steady(cpu)) if cpu else None,
        # clients in a round (sampling may take fewer than the population): the per-client divisor; where
        # the run keeps its counts private, from its private participation log (the operator's copy)
        "participants": _median_count(saved["rounds"]) or _median_count(_private_counts(out / mode)),
    }


def _steady(per_round: list[float]) -> list[float]:
    """Rounds 2..R-1 when there are at least 4 (module docstring), else 2..R (or the one round)."""
    return per_round[1:-1] if len(per_round) >= 4 else (per_round[1:] or per_round)


def _private_counts(run_dir: Path) -> list[dict[str, Any]]:
    try:
        from fedprivacy.fl.run import read_participation
    except ImportError:  # a baseline tree from before the private log
        return []
    return read_participation(run_dir)


def _median_count(rounds: list[dict[str, Any]]) -> float | None:
    counts = [r["clients_sampled"] for r in rounds if r.get("clients_sampled") is not None]
    return statistics.median(counts[1:] or counts) if counts else None


_ROUND_LINE = re.compile(r"\s*round\s+\d+/\d+")  # a round's log line ("round   1/4  accuracy ...")


class _RoundCpu(logging.Handler):
    """This process's CPU seconds at the start and at every round's log line: one worker runs the
    server and every client here, so their differences are a round's whole CPU cost, which other
    processes on a shared machine do not inflate (unlike its wall time)."""

    def __init__(self) -> None:
        super().__init__()
        self.at: list[float] = [time.process_time()]

    def emit(self, record: logging.LogRecord) -> None:
        if _ROUND_LINE.match(record.getMessage()):
            self.at.append(time.process_time())


def _floor(mode: str, *, clients: int, dim: int, run_config: dict[str, Any] | None = None,
           population: int | None = None) -> dict[str, Any]:
    """``scripts/secagg_bench.py``'s per-client floor for this run's n, k, t and d (and, in distributed
    mode, XNoise's sampling for this run's design: the run's own encoding, as the server sizes it)."""
    bench = _sibling("secagg_bench")
    args = argparse.Namespace(clients=clients, dim=dim, neighbours=0, bits=32, dropout=0.0,
                              stage="masked", active=False)
    p = bench._params(args)
    design = None
    if mode == "distributed" and run_config is not None:
        from fedprivacy.config import RunConfig
        from fedprivacy.fl.secure.params import make_encoding
        from server.engine.appspec import resolve_run_config

        rc = RunConfig.from_mapping(resolve_run_config(run_config, app_dir=REPO))
        enc = make_encoding(rc, population=population or clients, dim=dim, threshold=p["threshold"])
        design = enc.ddp().design(roster=clients)
    return bench.measure_floor(mode, p, 5, design=design)


def goals(rows: list[dict[str, Any]], *, clients: int, real_data: bool = False) -> dict[str, Any]:
    """The ratios from this run's rows (None where a mode did not run); ``real_data``: the rows ran
    a benchmark setup, whose distributed/central goal is 1.3, not digits' 2."""
    by = {r["mode"]: r for r in rows}
    sec = {m: by[m]["seconds_per_round"] for m in by}
    cpu = {m: by[m].get("cpu_seconds_per_round") for m in by}
    out: dict[str, Any] = {}
    if "distributed" in sec and "central" in sec:
        goal = "goal <= 1.3 on the real-data workload" if real_data else "goal <= 2 on digits"
        out[f"distributed_over_central ({goal})"] = sec["distributed"] / sec["central"]
        if cpu["distributed"] and cpu["central"]:
            out["distributed_over_central_cpu (load-robust)"] = cpu["distributed"] / cpu["central"]
    for secure, base, kind in (("secure", "plain", "none"), ("distributed", "central", "distributed"),
                               ("secure-semi", "plain", "none"),
                               ("distributed-semi", "central", "distributed")):
        if secure in sec and base in sec and by[secure].get("dim"):
            # the protocol's n, not the population; a run that keeps its counts private (central,
            # distributed by default) reports none: every mode samples alike, so take another row's
            known = next((r["participants"] for r in rows if r.get("participants")), None)
            n = int(round(by[secure].get("participants") or known or clients))
            floor = _floor(kind, clients=n, dim=by[secure]["dim"], run_config=by[secure].get("run_config"),
                           population=clients)
            per_client = (sec[secure] - sec[base]) / n
            out[secure] = {"participants_per_round": n, "overhead_per_client_seconds": per_client,
                           "floor_per_client_seconds": floor["floor"],
                           "protocol_floor_per_client_seconds": floor["protocol_floor"],
                           "overhead_over_floor (goal <= 1.5)": per_client / floor["floor"],
                           "overhead_over_protocol_floor": per_client / floor["protocol_floor"]}
            c_secure, c_base = cpu[secure], cpu[base]
            if c_secure and c_base:  # the floor is CPU time too
                per_client_cpu = (c_secure - c_base) / n
                out[secure]["overhead_per_client_cpu_seconds"] = per_client_cpu
                out[secure]["overhead_cpu_over_floor (load-robust)"] = per_client_cpu / floor["floor"]
                out[secure]["overhead_cpu_over_protocol_floor"] = per_client_cpu / floor["protocol_floor"]
            if "xnoise_protocol_floor" in floor:  # beside the others, never instead of them
                xfloor = floor["xnoise_protocol_floor"]
                out[secure]["xnoise_protocol_floor_per_client_seconds"] = xfloor
                out[secure]["xnoise_sampling_floor"] = floor["xnoise"]
                out[secure]["overhead_over_xnoise_protocol_floor"] = per_client / xfloor
                if c_secure and c_base:
                    out[secure]["overhead_cpu_over_xnoise_protocol_floor"] = per_client_cpu / xfloor
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help='a run-config override for every mode (repeatable, flwr syntax), e.g. dataset="fashion-mnist"')
    ap.add_argument("--setup", default=None,
                    help="run scripts/benchmark.py's named setup (e.g. fedavgm-c300: its population, cohort, "
                         "data, model and σ) instead of --clients/--model")
    ap.add_argument("--epsilon", type=float, default=4.0, help="with --setup: the central ε whose σ every row uses")
    ap.add_argument("--setup-rounds", type=int, default=None,
                    help="with --setup: the T the σ is calibrated for (default: the setup's own)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    from server.engine.appspec import parse_overrides

    extra = parse_overrides(" ".join(args.set))
    base = None
    if args.setup is not None:
        base, args.clients = setup_config(args.setup, epsilon=args.epsilon, setup_rounds=args.setup_rounds)
        args.model = base["model"]
    import torch

    torch.set_num_threads(1)
    rows = []
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes.split(","):
            row = run_mode(mode, clients=args.clients, rounds=args.rounds, model=args.model, out=Path(tmp),
                           extra=extra, base=base)
            rows.append(row)
            print(f"{mode:12s} d={row['dim']}  {row['seconds_per_round']:.3f} s/round  "
                  f"{row['cpu_seconds_per_round'] or float('nan'):.3f} CPU s/round  accuracy {row['accuracy']:.4f}  "
                  f"ε {row['epsilon']}  exchanges/round {row['exchanges_per_round']}", flush=True)
    base = next((r["seconds_per_round"] for r in rows if r["mode"] == "plain"), None)
    base_cpu = next((r["cpu_seconds_per_round"] for r in rows if r["mode"] == "plain"), None)
    summary = {"clients": args.clients, "rounds": args.rounds, "model": args.model, "overrides": extra,
               "setup": args.setup, "setup_epsilon": args.epsilon if args.setup else None,
               "steady_rounds": "2..R-1 (R >= 4), else 2..R",
               "load_at_start": load_start, "load_at_end": os.getloadavg(), "rows": rows,
               "ratio_to_plain": {r["mode"]: (r["seconds_per_round"] / base if base else None) for r in rows},
               "cpu_ratio_to_plain": {r["mode"]: (r["cpu_seconds_per_round"] / base_cpu
                                                  if base_cpu and r["cpu_seconds_per_round"] else None)
                                      for r in rows},
               "goals": goals(rows, clients=args.clients, real_data=args.setup is not None)}
    print(json.dumps({k: summary[k] for k in ("ratio_to_plain", "cpu_ratio_to_plain", "goals")}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
