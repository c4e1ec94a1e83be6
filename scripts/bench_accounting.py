"""Benchmark: epsilon of DP-SGD on MNIST-sized data (Abadi et al. 2016 setting) with each accountant.

T = 14,062 Poisson-sampled Gaussian steps at q = 256/60,000, sigma = 1.1, delta = 1e-5 (60 epochs of
batch 256). Reports epsilon and wall time for PLD (target <= 1 s), RDP and PRV, plus the incremental
cost of a per-round ledger (one spend + one epsilon query per round). Run once; timings are noisy on a
shared machine.

Usage: python scripts/bench_accounting.py [--json PATH] [--rounds R]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from fedprivacy.accounting import (
    Accountant,
    GaussianEvent,
    PoissonSampling,
    PrivacyEvent,
    epsilon_for,
)
from fedprivacy.accounting.pld_backend import _pld_single

Q, SIGMA, STEPS, DELTA = 256 / 60000, 1.1, 14062, 1e-5


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    parser.add_argument(
        "--rounds", type=int, default=50, help="rounds for the incremental ledger timing"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    results: dict[str, object] = {
        "setting": {
            "sample_rate": Q,
            "noise_multiplier": SIGMA,
            "steps": STEPS,
            "delta": DELTA,
            "sampling": "poisson",
            "neighbouring": "add-remove",
        },
    }
    for backend in ("pld", "rdp", "prv"):
        _pld_single.cache_clear()  # time a cold start
        t0, c0 = time.perf_counter(), time.process_time()
        eps = epsilon_for(
            noise_multiplier=SIGMA, sample_rate=Q, steps=STEPS, delta=DELTA, backend=backend
        )
        results[backend] = {
            "epsilon": eps,
            "seconds": time.perf_counter() - t0,
            "cpu_seconds": time.process_time() - c0,
        }

    _pld_single.cache_clear()
    acc = Accountant()
    event = PrivacyEvent(
        mechanism=GaussianEvent(noise_multiplier=SIGMA), sampling=PoissonSampling(rate=Q)
    )
    t0 = time.perf_counter()
    for r in range(args.rounds):
        acc.spend(event, round=r)
        acc.epsilon(delta=DELTA)
    elapsed = time.perf_counter() - t0
    results["pld_ledger"] = {
        "rounds": args.rounds,
        "seconds_total": elapsed,
        "seconds_per_round": elapsed / args.rounds,
        "epsilon": acc.epsilon(delta=DELTA),
    }
    pld = results["pld"]["epsilon"]  # type: ignore[index]
    results["ratios_to_pld"] = {b: results[b]["epsilon"] / pld for b in ("rdp", "prv")}  # type: ignore[index]

    for b in ("pld", "rdp", "prv"):
        r = results[b]
        print(
            f"{b:4s} epsilon={r['epsilon']:.4f}  wall={r['seconds']:.3f}s  cpu={r['cpu_seconds']:.3f}s"
        )  # type: ignore[index]
    led = results["pld_ledger"]
    print(
        f"pld ledger: {led['rounds']} rounds, {led['seconds_per_round'] * 1000:.1f} ms/round (spend + epsilon)"
    )  # type: ignore[index]
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=1)
    else:
        json.dump(results, sys.stdout, indent=1)
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
