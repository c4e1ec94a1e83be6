"""Benchmark a large population: the same cohort drawn from 10,000 and from 1,000,000 clients.

Each population runs in its own child process (this script re-invoked with ``--child``) on the in-process
engine with the real apps, so its peak memory is that of a fresh command: ``ru_maxrss`` of the child and
of the largest of its own children (the forked workers with ``--workers 2``), and the peak of the summed PSS of its process tree sampled every
0.2 s. Workload: ``synthetic-lazy`` (FedProx Synthetic, each client generated when it is sampled), the
``mlp`` model, Poisson sampling at ``q = cohort / N`` with the secure sampler, ``privacy`` none by
default, a few rounds. Reported per population: the partition discovery (one query per node), the
median round time (rounds 2..R from ``results.json``) and the median train exchange; then the ratio
of the largest population's median round to the smallest's (medians over ``--repeats`` runs of each, in
alternating order, as the machine's load drifts), and the two goals (peak <= 2 GB, ratio
<= 1.5).

Usage: ``python scripts/bench_population.py [--populations 10000,1000000] [--cohort 1000] [--rounds 4]
[--repeats 1] [--privacy none] [--workers 1] [--quick] [--json PATH]``
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

PEAK_GOAL_MB = 2048.0
RATIO_GOAL = 1.5


def _run_config(spec: dict[str, Any], out_dir: str) -> dict[str, Any]:
    population, cohort = int(spec["population"]), int(spec["cohort"])
    return {"num-server-rounds": int(spec["rounds"]), "dataset": "synthetic-lazy", "model": "mlp",
            "privacy": spec["privacy"], "secagg": False, "sampling": "poisson",
            "sample-rate": cohort / population, "local-epochs": 1, "batch-size": 32,
            "target-delta": 0.1 / max(int(p) for p in spec["all_populations"]), "seed": int(spec["seed"]),
            "output-dir": out_dir, "run-name": f"pop{population}", "eval-every": int(spec["rounds"])}


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    """One population's run, in this (fresh) process."""
    from fedprivacy.fl.run import round_seconds
    from fedprivacy_bench.memory import PeakMemorySampler
    from server.engine import run_inprocess

    with tempfile.TemporaryDirectory() as out_dir, PeakMemorySampler(
            __import__("os").getpid(), interval=0.2) as pss:
        started = time.perf_counter()
        res = run_inprocess(run_config=_run_config(spec, out_dir), num_supernodes=int(spec["population"]),
                            workers=int(spec["workers"]), app_dir=REPO)
        if res.results_path is None:
            raise RuntimeError("the run wrote no results.json")
        rounds = round_seconds(res.results_path.parent)
    exchanges = res.stats.exchanges
    train = [s for kind, _, s in exchanges if kind == "train"]
    return {
        "population": int(spec["population"]), "sample_rate": int(spec["cohort"]) / int(spec["population"]),
        "rounds": len(rounds), "round_seconds": rounds,
        "median_round_seconds": statistics.median(rounds[1:] or rounds),
        "median_train_exchange_seconds": statistics.median(train[1:] or train) if train else None,
        "train_messages": sum(n for kind, n, _ in exchanges if kind == "train"),
        "discovery_seconds": sum(s for kind, _, s in exchanges if kind == "query"),
        "startup_seconds": res.startup_seconds, "wall_seconds": time.perf_counter() - started,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_rss_children_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        "peak_tree_pss_mb": pss.peak_mb,
    }


def _spawn(spec: dict[str, Any], *, timeout: float) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"population {spec['population']} failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--populations", default="10000,1000000", help="comma-separated client counts N")
    p.add_argument("--cohort", type=int, default=1000, help="expected clients a round (q = cohort / N)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--repeats", type=int, default=1,
                   help="runs of each population, alternating their order (medians over them)")
    p.add_argument("--privacy", default="none", choices=("none", "central", "local"))
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--seed", type=int, default=-1, help="-1: the secure sampler (default); >= 0 seeded")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per population")
    p.add_argument("--quick", action="store_true", help="smoke run: 200 and 2000 clients, 20 a round, 2 rounds")
    p.add_argument("--json", type=Path, default=None, help="also write the JSON here")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return p


def _runs(args: argparse.Namespace, populations: list[int]) -> list[dict[str, Any]]:
    """Every population ``--repeats`` times, the order reversed on every other pass (load drifts)."""
    rows = []
    for rep in range(args.repeats):
        for n in populations if rep % 2 == 0 else populations[::-1]:
            spec = {"population": n, "cohort": args.cohort, "rounds": args.rounds, "privacy": args.privacy,
                    "workers": args.workers, "seed": args.seed, "all_populations": populations}
            row = {**_spawn(spec, timeout=args.timeout), "repeat": rep}
            rows.append(row)
            print(f"N={n:>9,}  q={row['sample_rate']:.3g}  round {row['median_round_seconds']:.3f} s  "
                  f"discovery {row['discovery_seconds']:.1f} s  peak RSS {row['peak_rss_mb']:.0f} MB "
                  f"(largest child {row['peak_rss_children_mb']:.0f} MB, tree PSS "
                  f"{row['peak_tree_pss_mb']:.0f} MB)", file=sys.stderr)
    return rows


def _peak(row: dict[str, Any]) -> float:
    return float(max(row["peak_rss_mb"], row["peak_rss_children_mb"], row["peak_tree_pss_mb"]))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.child is not None:
        print(json.dumps(_child(json.loads(args.child))))
        return 0
    if args.quick:
        args.populations, args.cohort, args.rounds, args.repeats = "200,2000", 20, 2, 1
    populations = [int(p) for p in str(args.populations).split(",")]
    if args.rounds < 2 or args.repeats < 1 or args.cohort < 1 or any(p < args.cohort for p in populations):
        print("bench_population: need --rounds >= 2, --repeats >= 1 and 1 <= --cohort <= every population",
              file=sys.stderr)
        return 2
    rows = _runs(args, populations)
    summary = [{"population": n,
                "median_round_seconds": statistics.median(r["median_round_seconds"] for r in rows
                                                          if r["population"] == n),
                "peak_memory_mb": max(_peak(r) for r in rows if r["population"] == n)} for n in populations]
    small, large = min(summary, key=lambda r: r["population"]), max(summary, key=lambda r: r["population"])
    ratio = large["median_round_seconds"] / small["median_round_seconds"]
    peak = max(r["peak_memory_mb"] for r in summary)
    out = {"workload": {"dataset": "synthetic-lazy", "model": "mlp", "cohort": args.cohort,
                        "rounds": args.rounds, "privacy": args.privacy, "workers": args.workers,
                        "repeats": args.repeats, "sampling": "poisson", "seeded": args.seed >= 0,
                        "quick": bool(args.quick)},
           "populations": rows, "by_population": summary, "round_time_ratio": ratio, "peak_memory_mb": peak,
           "goals": {"peak_memory_mb <= 2048": peak <= PEAK_GOAL_MB,
                     f"round_time_ratio <= {RATIO_GOAL}": ratio <= RATIO_GOAL}}
    text = json.dumps(out, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
