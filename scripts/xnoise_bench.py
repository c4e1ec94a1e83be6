"""Cost of exact noise (XNoise) against the legacy share: client noise and server removal, per round.

Rows (interleaved, median of ``--repeats``): for roster ``n``, threshold ``t`` and padded dimension
``m``, the client's noise draw (legacy: one ``N_Z(0, sigma^2/t)`` vector with the float rejection
sampler; XNoise: the base and the seeded components with the tabulated sampler) and the server's
regeneration of the excess of ``s`` survivors (XNoise only; legacy has none). Reported with the
ratio XNoise / legacy for the client, and the server time per survivor.

Usage: ``python scripts/xnoise_bench.py [--dims 17 20] [--rosters 10:6 100:51] [--json PATH]``
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from typing import Any

from fedprivacy.accounting.xnoise_design import XNoiseDesign
from fedprivacy.dp.discrete import sample_discrete_gaussian
from fedprivacy.dp.rng import RandomSource
from fedprivacy.secagg.xnoise import ComponentSeeds, client_noise, excess_noise


def _time(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _measure(*, n: int, t: int, m: int, sigma: float, repeats: int,
             rng: RandomSource) -> dict[str, Any]:
    design = XNoiseDesign(total_variance=sigma**2, roster=n, min_survivors=t)
    comps = ComponentSeeds.fresh(design, round=1, node_id=0, rng=rng)
    survivors = list(range(n))
    seeds = {i: ComponentSeeds.fresh(design, round=1, node_id=i, rng=rng) for i in survivors}
    revealed = {i: seeds[i].reveal(survivors=n, rank=r) for r, i in enumerate(survivors)}
    client_noise(comps, size=1024, rng=rng)  # build the tables once (cached per variance)
    legacy, xn, server = [], [], []
    for _ in range(repeats):
        legacy.append(_time(lambda: sample_discrete_gaussian(sigma=sigma / math.sqrt(t), size=m,
                                                             rng=rng)))
        xn.append(_time(lambda: client_noise(comps, size=m, rng=rng)))
        server.append(_time(lambda: excess_noise(design, revealed, survivors=survivors, round=1,
                                                 size=m)))
    med = statistics.median
    return {"m": m, "n": n, "t": t, "seeded_components": design.num_seeded,
            "client_legacy_s": med(legacy), "client_xnoise_s": med(xn),
            "client_ratio": med(xn) / med(legacy), "server_removal_all_survive_s": med(server),
            "server_removal_per_survivor_s": med(server) / n}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dims", nargs="+", type=int, default=[17, 20], help="log2 of m")
    p.add_argument("--rosters", nargs="+", default=["10:6", "100:51"], help="n:t pairs")
    p.add_argument("--sigma", type=float, default=16384.0, help="target std of the sum (integer units)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    try:
        rosters = [tuple(int(v) for v in r.split(":")) for r in a.rosters]
    except ValueError:
        print("rosters must be n:t pairs", file=sys.stderr)
        return 2
    rows = []
    rng = RandomSource.secure()
    for logm in a.dims:
        for n, t in rosters:
            row = _measure(n=n, t=t, m=1 << logm, sigma=a.sigma, repeats=a.repeats, rng=rng)
            rows.append(row)
            print(f"m=2^{logm} n={n} t={t} comps={row['seeded_components']}: client legacy "
                  f"{row['client_legacy_s']:.3f}s xnoise {row['client_xnoise_s']:.3f}s "
                  f"(x{row['client_ratio']:.2f}); server removal (all {n} survive) "
                  f"{row['server_removal_all_survive_s']:.3f}s", flush=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"benchmark": "xnoise", "sigma": a.sigma, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
