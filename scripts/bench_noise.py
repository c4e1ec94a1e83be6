"""Benchmark noise generation for 1M coordinates: secure vs seeded RandomSource vs numpy.

Measured (median of ``--repeats`` runs, interleaved so machine load hits all rows alike):

- ``numpy_normal``: ``np.random.Generator(PCG64).normal`` (the reference);
- ``secure_normal`` / ``seeded_normal``: ``RandomSource.normal`` (secure: AES-256-CTR keystream +
  Marsaglia polar method);
- ``secure_laplace``, ``secure_uniform``, ``secure_integers`` (exact, range 3·2^20);
- ``secure_discrete_gaussian`` / ``seeded_discrete_gaussian``: the vectorised sampler
  (σ = 20) used by secure aggregation;
- ``exact_discrete_gaussian``: the exact CKS 2020 sampler, per draw (on ``--exact-draws`` draws).

The headline is ``ratio_secure_vs_numpy_normal`` (target: <= 3). Compare ratios within one run, not
absolute times (the machine is shared).

Usage: ``python scripts/bench_noise.py [--size N] [--repeats R] [--json PATH]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from fedprivacy.dp.discrete import sample_discrete_gaussian, sample_discrete_gaussian_exact
from fedprivacy.dp.rng import RandomSource


def _time(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--exact-draws", type=int, default=2000)
    parser.add_argument("--json", type=str, default=None, help="write the results here")
    return parser


def _cases(n: int, secure: RandomSource) -> dict[str, Callable[[], Any]]:
    """The samplers timed, each drawing ``n`` values."""
    gen = np.random.Generator(np.random.PCG64(0))
    seeded = RandomSource.seeded(0)
    return {
        "numpy_normal": lambda: gen.normal(0.0, 1.0, n),
        "secure_normal": lambda: secure.normal(std=1.0, size=n),
        "seeded_normal": lambda: seeded.normal(std=1.0, size=n),
        "secure_laplace": lambda: secure.laplace(scale=1.0, size=n),
        "secure_uniform": lambda: secure.uniform(n),
        "secure_integers": lambda: secure.integers(0, 3 * 2**20, size=n),
        "secure_discrete_gaussian": lambda: sample_discrete_gaussian(sigma=20.0, size=n, rng=secure),
        "seeded_discrete_gaussian": lambda: sample_discrete_gaussian(sigma=20.0, size=n, rng=seeded),
    }


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    n = args.size
    if n < 1 or args.repeats < 1 or args.exact_draws < 1:
        print("size, repeats and exact-draws must be >= 1", file=sys.stderr)
        return 2

    secure = RandomSource.secure()
    cases = _cases(n, secure)
    for fn in cases.values():  # warm-up (page faults, lazy imports)
        fn()
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.repeats):
        for name, fn in cases.items():
            times[name].append(_time(fn))
    med = {k: statistics.median(v) for k, v in times.items()}
    exact_s = _time(
        lambda: sample_discrete_gaussian_exact(sigma_sq=400, size=args.exact_draws, rng=secure)
    )

    result: dict[str, Any] = {
        "size": n,
        "repeats": args.repeats,
        "seconds": {k: round(v, 6) for k, v in med.items()},
        "ratio_secure_vs_numpy_normal": round(med["secure_normal"] / med["numpy_normal"], 3),
        "ratio_seeded_vs_numpy_normal": round(med["seeded_normal"] / med["numpy_normal"], 3),
        "ratio_secure_dgauss_vs_numpy_normal": round(
            med["secure_discrete_gaussian"] / med["numpy_normal"], 3
        ),
        "exact_discrete_gaussian_us_per_draw": round(exact_s / args.exact_draws * 1e6, 2),
        "target_ratio": 3.0,
        "secure_source": secure.describe(),
    }
    result["meets_target"] = result["ratio_secure_vs_numpy_normal"] <= result["target_ratio"]

    print(f"noise for {n} coordinates, median of {args.repeats} (ms):")
    for k, v in med.items():
        print(f"  {k:26s} {v * 1e3:9.2f}")
    print(
        f"  secure/numpy normal ratio {result['ratio_secure_vs_numpy_normal']} (target <= 3); "
        f"exact CKS discrete Gaussian {result['exact_discrete_gaussian_us_per_draw']} us/draw"
    )
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
