"""Seconds per round on the in-process engine: plain FedAvg vs secure aggregation vs distributed DP.

Usage: ``python scripts/secagg_round_bench.py --clients 10 --rounds 4 [--model mlp-large] --json out.json``.
Each mode runs the real ServerApp/ClientApp (``server.engine.run_inprocess``, one worker) with the
same seed; "seconds per round" is the median over rounds 2..R (round 1 carries one-off warm-up).
Modes: ``plain`` (privacy none), ``central`` (central DP, σ = 1, PLD), ``secure`` (privacy none +
secagg, fixed point), ``distributed`` (secagg + distributed discrete Gaussian, σ = 1, RDP), both on
the default actively secure schedule, and ``secure-semi`` / ``distributed-semi`` on the semi-honest one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
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


def run_mode(mode: str, *, clients: int, rounds: int, model: str, out: Path) -> dict[str, Any]:
    from server.engine import run_inprocess

    cfg = {"num-server-rounds": rounds, "seed": 0, "output-dir": str(out), "run-name": mode,
           "model": model, "target-delta": min(1e-5, 0.1 / clients), **MODES[mode]}
    res = run_inprocess(run_config=cfg, num_supernodes=clients, app_dir=REPO, node_id_seed=1)
    saved = json.loads((out / mode / "results.json").read_text())
    secs = [r["seconds"] for r in saved["rounds"]]
    steady = secs[1:] or secs
    exch = [(t, n, s) for t, n, s in res.stats.exchanges]
    return {
        "mode": mode, "seconds_per_round": statistics.median(steady), "round_seconds": secs,
        "accuracy": saved["rounds"][-1]["test_accuracy"], "epsilon": saved["privacy"].get("epsilon"),
        "exchanges_per_round": saved["rounds"][-1].get("secagg_exchanges", 1),
        "exchange_seconds": exch[-8:],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes.split(","):
            row = run_mode(mode, clients=args.clients, rounds=args.rounds, model=args.model, out=Path(tmp))
            rows.append(row)
            print(f"{mode:12s} {row['seconds_per_round']:.3f} s/round  accuracy {row['accuracy']:.4f}  "
                  f"ε {row['epsilon']}  exchanges/round {row['exchanges_per_round']}", flush=True)
    base = next((r["seconds_per_round"] for r in rows if r["mode"] == "plain"), None)
    summary = {"clients": args.clients, "rounds": args.rounds, "model": args.model, "rows": rows,
               "ratio_to_plain": {r["mode"]: (r["seconds_per_round"] / base if base else None) for r in rows}}
    print(json.dumps(summary["ratio_to_plain"]))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
