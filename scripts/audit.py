"""Empirical privacy audit: epsilon lower bounds next to the claimed epsilon.

Usage: python scripts/audit.py [--json PATH] [--quick] [--trials N] [--confidence C] [--broken-demo]

Targets: the analytically calibrated Gaussian mechanism (white-box worst-case canary, Clopper-Pearson
bounds over many trials, and the one-run audit with many canaries), and DP-FedAvg's aggregation with a
canary client (the library's clipping and central noise; claimed epsilon from fedprivacy.accounting).
If any epsilon_lower exceeds its epsilon_claimed at the stated confidence, the claim is broken: the
script says so and exits with status 1. ``--broken-demo`` adds targets that add half the noise they
claim, to show what a caught violation looks like.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="fewer trials (looser bounds)")
    parser.add_argument("--trials", type=int, default=None, help="Gaussian-mechanism trials")
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--broken-demo", action="store_true", help="also audit a noise-x0.5 bug")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def _gaussian_audits(args: argparse.Namespace, rng: Any, scale: float) -> list[Any]:
    from fedprivacy.attacks.audit import audit_gaussian_mechanism, one_run_audit_gaussian

    trials = args.trials or (400_000 if args.quick else 4_000_000)
    canaries = 10_000 if args.quick else 100_000
    out = []
    for eps in (1.0, 2.0, 4.0):
        out.append(audit_gaussian_mechanism(epsilon=eps, delta=args.delta, trials=trials, confidence=args.confidence,
                                            rng=rng.child("gauss", f"{eps:g}", f"{scale:g}"), noise_scale=scale))
        out.append(one_run_audit_gaussian(epsilon=eps, delta=args.delta, canaries=canaries,
                                          confidence=args.confidence,
                                          rng=rng.child("gauss-one-run", f"{eps:g}", f"{scale:g}"), noise_scale=scale))
    return out


def _fedavg_audits(args: argparse.Namespace, rng: Any, scale: float) -> list[Any]:
    from fedprivacy.attacks.audit import audit_dp_fedavg, one_run_audit_dp_fedavg

    trials = 2_000 if args.quick else 20_000
    canaries = 1_000 if args.quick else 4_000
    out = [audit_dp_fedavg(noise_multiplier=sigma, delta=args.delta, trials=trials, rounds=1, num_clients=4, dim=64,
                           confidence=args.confidence, rng=rng.child("fedavg", f"{sigma:g}", f"{scale:g}"),
                           noise_scale=scale)
           for sigma in (4.0, 2.0, 1.0)]
    out.append(one_run_audit_dp_fedavg(noise_multiplier=1.0, delta=args.delta, canaries=canaries, rounds=1,
                                       num_clients=4, confidence=args.confidence,
                                       rng=rng.child("fedavg-one-run", f"{scale:g}"), noise_scale=scale))
    return out


def _print_table(results: list[Any], *, rng: Any, args: argparse.Namespace, elapsed: float) -> None:
    print(f"privacy audit, delta={args.delta:g}, confidence={args.confidence:g}, rng {rng.describe()}")
    print(f"{'target':<24} {'method':<16} {'eps_claimed':>11} {'eps_lower':>9} {'ratio':>6} {'trials':>9}")
    for r in results:
        print(f"{r.target:<24} {r.method:<16} {r.epsilon_claimed:>11.3f} {r.epsilon_lower:>9.3f} "
              f"{r.epsilon_lower / r.epsilon_claimed:>6.2f} {r.trials:>9d}"
              + ("   <-- CLAIM BROKEN" if r.broken else ""))
    print(f"wall {elapsed:.0f} s")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not 0 < args.confidence < 1 or not 0 < args.delta < 1:
        print("error: --confidence and --delta must be in (0, 1)", file=sys.stderr)
        return 2
    from fedprivacy.dp.rng import RandomSource

    rng = RandomSource.seeded(args.seed)
    started = time.perf_counter()
    results = []
    for scale in ([1.0, 0.5] if args.broken_demo else [1.0]):
        results += _gaussian_audits(args, rng, scale) + _fedavg_audits(args, rng, scale)
    elapsed = time.perf_counter() - started
    _print_table(results, rng=rng, args=args, elapsed=elapsed)
    broken = [r for r in results if r.broken]
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {"script": "audit", "randomness": rng.describe(), "delta": args.delta, "seconds": elapsed,
                   "broken": bool(broken), "rows": [r.to_row() for r in results]}
        args.json.write_text(json.dumps(payload, indent=2))
        print(f"wrote {args.json}")
    if broken:
        names = ", ".join(f"{r.target}/{r.method} (eps_claimed {r.epsilon_claimed:.3g})" for r in broken)
        print(f"PRIVACY CLAIM BROKEN: epsilon_lower > epsilon_claimed at confidence {args.confidence:g} for {names}",
              file=sys.stderr)
        return 1
    print("no claim refuted: every epsilon_lower <= epsilon_claimed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
