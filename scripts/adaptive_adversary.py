"""Fixed cohorts under replace-one: the old figure, the adaptive adversary, and the accountant.

For each case prints three epsilons at delta: ``two_directions`` (dp-accounting's remove and add PLDs
composed separately, the larger one: what a direction-by-direction accountant prints, invalid against an
adaptive adversary), ``adversary`` (what an adversary that switches direction round by round provably
attains, ``fedprivacy.accounting.adversary``: a lower bound on the true epsilon) and ``accountant``
(the "pld" backend: one pair for both directions, a valid upper bound). The true epsilon lies in
[adversary, accountant].

``--monte-carlo PATHS`` also plays the adversary's strategy at the README example's old figure with
real Gaussian samples (importance-sampled) and prints the delta it measures against the claimed 1e-5.

Usage: python scripts/adaptive_adversary.py [--json PATH] [--grid G] [--quick] [--monte-carlo N]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from fedprivacy.accounting import (
    Accountant,
    FixedCohortSampling,
    GaussianEvent,
    LaplaceEvent,
    Neighbouring,
    PrivacyEvent,
)
from fedprivacy.accounting.adversary import (
    adaptive_epsilon,
    adaptive_strategy,
    fixed_cohort_orientations,
    monte_carlo_delta,
)

#: (mechanism, noise multiplier or Laplace epsilon, cohort, population, rounds, delta); the first two
#: are the reported cases (the first is the README's example).
CASES = [
    ("gaussian", 2.0, 100, 1000, 50, 1e-5),
    ("gaussian", 1.0, 10, 100, 100, 1e-5),
    ("gaussian", 1.0, 10, 100, 20, 1e-5),
    ("gaussian", 2.0, 5, 100, 40, 1e-5),
    ("gaussian", 4.0, 100, 1000, 100, 1e-5),
    ("laplace", 0.5, 10, 100, 30, 1e-5),
    ("laplace", 1.0, 5, 100, 50, 1e-5),
]


def _figures(case: tuple[str, float, int, int, int, float], grid: float) -> dict[str, object]:
    mechanism, param, m, n, rounds, delta = case
    gamma = m / n
    if mechanism == "gaussian":
        mech: GaussianEvent | LaplaceEvent = GaussianEvent(noise_multiplier=param)
        old_pld = pld_lib.from_gaussian_mechanism(
            standard_deviation=param, sensitivity=2.0, sampling_prob=gamma
        )
        orientations = fixed_cohort_orientations(
            mechanism=mechanism, noise_multiplier=param, sample_rate=gamma, grid=grid
        )
    else:
        mech = LaplaceEvent(epsilon=param)
        old_pld = pld_lib.from_laplace_mechanism(parameter=1.0 / param, sampling_prob=gamma)
        orientations = fixed_cohort_orientations(
            mechanism=mechanism, epsilon=param, sample_rate=gamma, grid=grid
        )
    old = float(old_pld.self_compose(rounds).get_epsilon_for_delta(delta))
    t0 = time.perf_counter()
    event = PrivacyEvent(
        mechanism=mech, sampling=FixedCohortSampling(cohort=m, population=n), count=rounds
    )
    new = Accountant(neighbouring=Neighbouring.REPLACE_ONE).epsilon_if(event, delta=delta)
    seconds = time.perf_counter() - t0
    adversary = adaptive_epsilon(
        orientations, rounds=rounds, delta=delta, lower=0.9 * old, upper=new, tolerance=grid * 10
    )
    return {
        "mechanism": mechanism,
        "noise_multiplier" if mechanism == "gaussian" else "release_epsilon": param,
        "cohort": m,
        "population": n,
        "rounds": rounds,
        "delta": delta,
        "two_directions": old,
        "adversary": adversary,
        "accountant": new,
        "accountant_seconds": seconds,
        "price_vs_two_directions": new / old - 1.0,
        "accountant_over_adversary": new / adversary - 1.0,
        "two_directions_beaten": adversary > old,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    parser.add_argument("--grid", type=float, default=2e-4, help="adversary loss grid")
    parser.add_argument("--quick", action="store_true", help="only the README's example")
    parser.add_argument("--monte-carlo", type=int, default=0, metavar="N", help="paths (0: off)")
    parser.add_argument("--seed", type=int, default=20261201, help="Monte-Carlo seed")
    args = parser.parse_args(argv)
    rows = [_figures(case, args.grid) for case in (CASES[:1] if args.quick else CASES)]
    out: dict[str, object] = {"grid": args.grid, "cases": rows}
    if args.monte_carlo:
        _, z, m, n, rounds, delta = CASES[0]
        old = float(rows[0]["two_directions"])  # type: ignore[arg-type]
        orientations = fixed_cohort_orientations(
            mechanism="gaussian", noise_multiplier=z, sample_rate=m / n, grid=args.grid
        )
        strategy = adaptive_strategy([orientations] * rounds, epsilon=old)
        mc, se = monte_carlo_delta(
            strategy,
            noise_multiplier=z,
            sample_rate=m / n,
            paths=args.monte_carlo,
            rng=np.random.default_rng(args.seed),
            tilted_rate=0.25,
            mean_shift=0.3,
        )
        out["monte_carlo"] = {
            "epsilon": old,
            "claimed_delta": delta,
            "programme_delta": strategy.delta,
            "measured_delta": mc,
            "standard_error": se,
            "paths": args.monte_carlo,
            "seed": args.seed,
        }
        print(
            f"Monte Carlo at the old figure eps={old:.4f}: measured delta {mc:.4g} +- {se:.2g} "
            f"(programme {strategy.delta:.4g}, claimed {delta:g}, {args.monte_carlo} paths)"
        )
    for r in rows:
        print(
            f"{r['mechanism']:8s} {r['cohort']:>4}/{r['population']:<5} T={r['rounds']:<4} "
            f"two-directions {r['two_directions']:.4f}  adversary >= {r['adversary']:.4f}  "
            f"accountant {r['accountant']:.4f}  (+{100 * r['price_vs_two_directions']:.1f}% vs old, "
            f"+{100 * r['accountant_over_adversary']:.1f}% vs adversary)"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)
    else:
        json.dump(out, sys.stdout, indent=1)
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
