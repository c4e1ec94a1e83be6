"""The utility goals on real data: DP-FedAdam vs DP-FedAvg at one ε, adaptive vs fixed clip norms.

Every row is a set of run-config overrides of fedprivacy's own apps, run on the in-process engine
(``server.engine.run_inprocess``), so the rows can be copied into ``scripts/benchmark.py`` as they are.
Central DP, the noise multiplier calibrated to ``--epsilon`` at ``--delta`` (PLD, Poisson sampling at
``--sample-rate``), Fashion-MNIST from Debian's ``dataset-fashion-mnist`` (``--dataset digits`` for a
machine without it). Prints a summary and writes JSON with ``--json PATH``.

    python scripts/methods_bench.py --seeds 0 1 2 --json runs/methods.json
    python scripts/methods_bench.py --quick          # 2 seeds, fewer rounds and clients
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def base_config(args: argparse.Namespace) -> dict[str, Any]:
    """The shared run config of every row (central DP, calibrated to the target ε)."""
    return {
        "dataset": args.dataset, "model": "mlp", "hidden-units": 32, "partitioner": "iid",
        "local-epochs": 2, "learning-rate": 0.1, "batch-size": 10,
        "privacy": "central", "secagg": False, "accountant": "pld", "noise-multiplier": 0.0,
        "target-epsilon": args.epsilon, "target-delta": args.delta, "sampling": "poisson",
        "sample-rate": args.sample_rate, "num-server-rounds": args.rounds, "clip-norm": 0.2,
    }


def rows(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    """(name, overrides) of the benchmark: optimizers at the default clip, then the clip sweep."""
    out: list[tuple[str, dict[str, Any]]] = [
        ("fedavg", {}),
        ("fedadam", {"server-optimizer": "fedadam", "server-learning-rate": args.adam_lr}),
    ]
    base_clip = base_config(args)["clip-norm"]
    out += [(f"fedavg-clip-{c:g}", {"clip-norm": c}) for c in args.clips if c != base_clip]
    out.append(("fedavg-adaptive", {"adaptive-clip": True, "clip-norm": args.adaptive_initial}))
    return out


def run_row(overrides: dict[str, Any], *, clients: int, out: Path) -> dict[str, Any]:
    from server.engine import run_inprocess

    res = run_inprocess(run_config={**overrides, "output-dir": str(out)}, num_supernodes=clients,
                        app_dir=REPO)
    if res.results_path is None:
        raise RuntimeError("the run wrote no results.json")
    results = json.loads(Path(res.results_path).read_text(encoding="utf-8"))
    last = results["rounds"][-1]
    return {"test_accuracy": last["test_accuracy"], "epsilon": results["privacy"]["epsilon"],
            "noise_multiplier": results["privacy"]["noise_multiplier"],
            "clip_norms": [r.get("clip_norm") for r in results["rounds"]],
            "rounds": len(results["rounds"]), "seconds": res.seconds}


def summarise(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    by: dict[str, list[float]] = {}
    for r in records:
        by.setdefault(r["row"], []).append(r["test_accuracy"])
    return {name: {"mean": statistics.fmean(v), "sd": statistics.stdev(v) if len(v) > 1 else 0.0,
                   "n": len(v), "accuracies": v} for name, v in by.items()}


def goals(summary: dict[str, dict[str, Any]], clips: list[float], base_clip: float) -> dict[str, Any]:
    names = {c: "fedavg" if c == base_clip else f"fedavg-clip-{c:g}" for c in clips}
    fixed = {c: summary[n]["mean"] for c, n in names.items() if n in summary}
    best_clip = max(fixed, key=fixed.__getitem__) if fixed else None
    adaptive = summary.get("fedavg-adaptive", {}).get("mean")
    return {
        "fedadam_minus_fedavg": summary["fedadam"]["mean"] - summary["fedavg"]["mean"],
        "fedadam_at_least_fedavg": summary["fedadam"]["mean"] >= summary["fedavg"]["mean"],
        "best_fixed_clip": best_clip,
        "best_fixed_accuracy": fixed.get(best_clip) if best_clip is not None else None,
        "adaptive_minus_best_fixed": (adaptive - fixed[best_clip]
                                      if adaptive is not None and best_clip is not None else None),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="fashion-mnist")
    p.add_argument("--clients", type=int, default=3000)
    p.add_argument("--sample-rate", type=float, default=0.1)
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--epsilon", type=float, default=4.0)
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--adam-lr", type=float, default=0.01)
    p.add_argument("--clips", type=float, nargs="+", default=[0.05, 0.1, 0.2, 0.5, 1.0])
    p.add_argument("--adaptive-initial", type=float, default=0.2,
                   help="the adaptive run starts from the base row's untuned clip norm")
    p.add_argument("--only", nargs="+", default=None, help="run only these row names")
    p.add_argument("--quick", action="store_true", help="2 seeds, 20 rounds, 1000 clients")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.rounds, args.clients = args.seeds[:2], 20, 1000
    records: list[dict[str, Any]] = []
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="methods-bench-") as tmp:
        for name, overrides in rows(args):
            if args.only and name not in args.only:
                continue
            for seed in args.seeds:
                cfg = {**base_config(args), **overrides, "seed": seed, "run-name": f"{name}-s{seed}"}
                rec = {"row": name, "seed": seed, "overrides": overrides,
                       **run_row(cfg, clients=args.clients, out=Path(tmp))}
                records.append(rec)
                print(f"{name:20s} seed {seed}: acc {rec['test_accuracy']:.4f}  eps {rec['epsilon']:.3f}"
                      f"  z {rec['noise_multiplier']:.3f}  {rec['seconds']:.0f} s", flush=True)
    summary = summarise(records)
    report = {"setup": {k: v for k, v in vars(args).items() if k != "json"} | {"base": base_config(args)},
              "summary": summary, "goals": goals(summary, args.clips, base_config(args)["clip-norm"]) if "fedadam" in summary and
              "fedavg" in summary else None, "records": records, "seconds": time.time() - t0}
    for name, s in summary.items():
        print(f"{name:20s} {s['mean']:.4f} ± {s['sd']:.4f} (n={s['n']})")
    print(json.dumps(report["goals"], indent=1))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
