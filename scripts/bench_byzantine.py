"""Byzantine clients against each aggregation rule, central DP at one ε (or ``--privacy none``): accuracy
per (rule, attack, seed) on the in-process engine, JSON on stdout (``--json`` also writes it). Each rule's
noise is scaled by its own sensitivity (docs/ROBUST_AGGREGATION.md), so every row is at the same ε. With
the ``backdoor`` attack, its rows and the no-attack rows also report the backdoor accuracy (the run's
owner-only attack metric; the no-attack rows measure the same triggered test set with no attacker).
Compare rows of one run only; ``--quick`` is a smoke test, not a result."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RULES = ("plain", "trimmed-mean", "median", "krum")


def _rule_keys(rule: str, args: argparse.Namespace) -> dict[str, int]:
    """Each rule sized for the expected Byzantine count f of an expected cohort m (trim f per side)."""
    m = args.clients * args.sample_rate
    f = min(max(1, round(args.fraction * m)), max(int((m - 1) // 2), 0))
    return {"trimmed-mean": {"aggregation-trim": f}, "krum": {"krum-byzantine": f,
                                                              "krum-select": max(1, int(m) - 2 * f)}}.get(rule, {})


def _row(out: Path, *, rule: str, attack: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    from server.engine import run_inprocess

    name = f"{rule}-{attack or 'none'}-{seed}"
    sampling = ({"sampling": "fixed", "cohort-size": round(args.clients * args.sample_rate),
                 "neighbouring": "replace-one"} if args.neighbouring == "replace-one"
                else {"sample-rate": args.sample_rate})
    privacy = ({"privacy": "central", "target-epsilon": args.epsilon, "noise-multiplier": 0.0}
               if args.privacy == "central" else {"privacy": "none"})
    cfg = {"dataset": "digits", **privacy, "secagg": False, **sampling, "clip-norm": args.clip_norm, "local-epochs": 2,
           "num-server-rounds": args.rounds, "seed": seed, "client-timeout": 60.0, "aggregation": rule,
           **_rule_keys(rule, args), "output-dir": str(out), "run-name": name}
    probe = attack == "backdoor" or (not attack and "backdoor" in args.attacks.split(","))
    if attack == "backdoor" or probe:  # the no-attack row: the same probe, no attacker
        fraction = args.fraction if attack else 0.0
        cfg["byzantine"] = (f"backdoor:factor={args.backdoor_factor},fraction={fraction},seed={seed},"
                            f"target={args.backdoor_target}")
    elif attack:
        cfg["byzantine"] = f"{attack}:factor=10,fraction={args.fraction},seed={seed}"
    run_inprocess(run_config=cfg, num_supernodes=args.clients, app_dir=REPO, node_id_seed=seed)
    res = json.loads((out / name / "results.json").read_text(encoding="utf-8"))
    row = {"rule": rule, "attack": attack or "none", "seed": seed, "epsilon": res["privacy"]["epsilon"],
           "accuracy": res["rounds"][-1]["test_accuracy"]}
    if probe:
        truth = json.loads((out / name / "private" / "byzantine.json").read_text(encoding="utf-8"))
        row["backdoor_accuracy"] = truth["backdoor_accuracy"][-1]["value"]
    return row


def _summary(rows: list[dict[str, Any]], metric: str = "accuracy") -> dict[str, dict[str, float]]:
    groups: dict[str, list[float]] = {}
    for r in rows:
        if metric in r:
            groups.setdefault(f"{r['rule']}/{r['attack']}", []).append(float(r[metric]))
    return {k: {"mean": statistics.fmean(v), "min": min(v), "max": max(v), "seeds": len(v)}
            for k, v in groups.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--sample-rate", type=float, default=0.3)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--epsilon", type=float, default=4.0)
    ap.add_argument("--privacy", choices=("central", "none"), default="central", help="none: no noise, no ε")
    ap.add_argument("--clip-norm", type=float, default=0.5, help="0 (with --privacy none): no clipping")
    ap.add_argument("--backdoor-factor", type=float, default=1.0, help="the backdoor's boost of its Δ")
    ap.add_argument("--backdoor-target", type=int, default=0)
    ap.add_argument("--fraction", type=float, default=0.1)
    ap.add_argument("--neighbouring", choices=("add-remove", "replace-one"), default="add-remove",
                    help="replace-one: a fixed cohort of clients*sample-rate (the trimmed mean's ratio is 1 there)")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--rules", default=",".join(RULES))
    ap.add_argument("--attacks", default="none,sign-flip,scale", help="of none, sign-flip, scale, random, backdoor")
    ap.add_argument("--quick", action="store_true", help="3 rounds, 20 clients: a smoke test")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.clients = 3, 20
    rules = [r for r in args.rules.split(",") if r]
    unknown = [r for r in rules if r not in RULES]
    if unknown:
        print(f"--rules: unknown {unknown}; known: {', '.join(RULES)}", file=sys.stderr)
        return 2
    attacks = ["" if a == "none" else a for a in args.attacks.split(",") if a]
    with tempfile.TemporaryDirectory(prefix="bench-byzantine-") as tmp:
        rows = [_row(Path(tmp), rule=r, attack=a, seed=s, args=args)
                for r in rules for a in attacks for s in range(args.seeds)]
    report = {"setup": {k: v for k, v in vars(args).items() if k != "json"}, "load": os.getloadavg(),
              "rows": rows, "summary": _summary(rows), "backdoor_summary": _summary(rows, "backdoor_accuracy"),
              "note": "quick: not a result" if args.quick else "accuracy after the last round; one ε for every row"}
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
