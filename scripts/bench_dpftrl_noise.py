"""Benchmark correlated-noise generation per round against a secure Gaussian draw of the same size.

Times one round of :class:`fedprivacy.dp.matrix.StreamingNoise` (``w_t = (C^{-1} z)_t`` with z from the
secure :class:`~fedprivacy.dp.rng.RandomSource`) for banded BSR strategies (Kalinin & Lampert 2024) of
band b and for a BLT strategy (Dvijotham, McMahan et al. 2024) with a few buffers, against
``RandomSource.normal`` of the same d (the draw independent DP-FedAvg noise costs). Each stream is
warmed up past its band so the timed rounds run the full recurrence. Memory is the floats held between
rounds plus the current output, as reported by ``held_floats``.

Goals: BLT <= 1.5x the secure draw, banded <= (1 + b/8)x; memory <= (buffers + 1)·d or (b + 1)·d
floats. Compare ratios within one run, not absolute times (the machine is shared).

Usage: ``python scripts/bench_dpftrl_noise.py [--dim D] [--rounds R] [--bands 2,4,8,16] [--json PATH]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from fedprivacy.dp.matrix import BandedToeplitz, Blt, StreamingNoise, Workload, bsr
from fedprivacy.dp.rng import RandomSource

#: a BLT with 3 buffers (decays and scales in the range the optimized BLTs of McMahan et al. 2024 use)
_BLT_DECAY = (0.99, 0.9, 0.5)
_BLT_SCALE = (0.05, 0.1, 0.15)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=9, help="timed rounds per strategy (median)")
    parser.add_argument("--bands", type=str, default="2,4,8,16")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--json", type=str, default=None, help="write the results here")
    return parser


def _median_round(stream: StreamingNoise, *, warmup: int, rounds: int) -> float:
    for _ in range(warmup):
        stream.next()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        stream.next()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _row(name: str, strategy: BandedToeplitz | Blt, *, dim: int, rounds: int, base: float,
         goal: float, state: int) -> dict[str, Any]:
    stream = StreamingNoise(strategy, dim=dim, noise_std=1.0, rng=RandomSource.secure())
    secs = _median_round(stream, warmup=max(strategy.band if isinstance(strategy, BandedToeplitz) else 2, 2),
                         rounds=rounds)
    held = stream.held_floats() + dim
    return {"strategy": name, "seconds_per_round": round(secs, 6), "ratio_vs_secure_normal": round(secs / base, 3),
            "goal_ratio": goal, "meets_goal": secs / base <= goal, "memory_floats": held,
            "memory_goal_floats": (state + 1) * dim, "meets_memory_goal": held <= (state + 1) * dim}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    bands = [int(b) for b in args.bands.split(",") if b]
    if args.dim < 1 or args.rounds < 1 or not bands or min(bands) < 1:
        print("dim, rounds and every band must be >= 1", file=sys.stderr)
        return 2
    total = max(bands) + args.rounds + 4
    workload = Workload(num_rounds=total, momentum=args.momentum)
    secure = RandomSource.secure()
    secure.normal(std=1.0, size=args.dim)  # warm-up
    base = statistics.median(_draw_time(secure, args.dim) for _ in range(args.rounds))
    rows = [_row(f"bsr-{b}", bsr(workload, b), dim=args.dim, rounds=args.rounds, base=base, goal=1 + b / 8,
                 state=b) for b in bands]
    blt = Blt(num_rounds=total, buf_decay=_BLT_DECAY, output_scale=_BLT_SCALE)
    rows.append(_row(f"blt-{blt.num_buffers}", blt, dim=args.dim, rounds=args.rounds, base=base, goal=1.5,
                     state=blt.num_buffers))
    result = {"dim": args.dim, "rounds": args.rounds, "momentum": args.momentum,
              "secure_normal_seconds": round(base, 6), "rows": rows,
              "meets_all_goals": all(r["meets_goal"] and r["meets_memory_goal"] for r in rows),
              "secure_source": secure.describe()}
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
    return 0


def _draw_time(rng: RandomSource, dim: int) -> float:
    t0 = time.perf_counter()
    rng.normal(std=1.0, size=dim)
    return time.perf_counter() - t0


if __name__ == "__main__":
    raise SystemExit(main())
