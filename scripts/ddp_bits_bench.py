"""Accuracy of distributed DP (exact XNoise) against central DP at the same sigma, by modulus bits.

Every row trains the same model on the same partitions with the same local SGD and the same cohort
draws; only the aggregation differs:

- ``central``: the server adds ``N(0, (zC)^2)`` to the sum of the clipped updates (trusted server);
- ``distributed-<b>``: each client runs the real encoder (:func:`fedprivacy.secagg.ddp.encode_update`:
  clip, scale, rotate, conditional rounding, XNoise components, mod ``2^b``); the ring sum of the
  survivors (what secure aggregation outputs: the masks cancel exactly mod ``2^b``, tested in
  ``tests/secagg``) has the revealed excess removed (:mod:`fedprivacy.secagg.xnoise`) and is decoded;
  the scale is the largest power of two the headroom check accepts for ``b`` bits;
- ``legacy-32``: the old share (each client ``sigma^2/t``; ``n/t`` times the noise when all survive).

Dropouts: each cohort member vanishes before the upload with probability ``--dropout``. The mean
uses the fixed denominator (expected cohort), as the run loop does. Reported per row: final test
accuracy (mean and per seed), the scale, the released noise std relative to the target, and
``Delta_2/(C s)`` (the conditional-rounding inflation of the sensitivity).

Usage: ``python scripts/ddp_bits_bench.py [--seeds 0 1 2] [--bits 12 16 20 32] [--json PATH]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from fedprivacy.dp.clipping import flatten, unflatten
from fedprivacy.dp.rng import RandomSource
from fedprivacy.ml.data import Split, load_dataset
from fedprivacy.ml.models import build_model, get_weights, set_weights
from fedprivacy.ml.partition import partition
from fedprivacy.ml.train import evaluate, train_local
from fedprivacy.secagg.ddp import DistributedDPConfig, decode_sum, encode_update
from fedprivacy.secagg.xnoise import ComponentSeeds, excess_noise, remove_excess


@dataclass(frozen=True, slots=True, kw_only=True)
class Setup:
    name: str
    clients: int
    sample_rate: float
    rounds: int
    threshold: int
    hidden: int = 32
    model: str = "mlp"


SETUPS = {
    # the README default: 10 clients, everyone every round, t = 6 (complete graph)
    "default": Setup(name="default", clients=10, sample_rate=1.0, rounds=20, threshold=6),
    # 100 clients, Poisson q = 0.2 (~20 per round), t = 11 of the expected cohort
    "sampled": Setup(name="sampled", clients=100, sample_rate=0.2, rounds=30, threshold=11),
}


def _largest_scale(*, bits: int, kw: dict[str, Any]) -> DistributedDPConfig:
    s = 2.0**20
    while s > 2.0**-10:
        try:
            return DistributedDPConfig(scale=s, modulus_bits=bits, **kw)
        except ValueError:
            s /= 2.0
    raise ValueError(f"no scale fits {bits} bits")


def _secure_total(cfg: Any, deltas: dict[int, np.ndarray], *, roster: int, alive: list[int], rnd: int,
                  noise: RandomSource, bits: int) -> np.ndarray:
    """The decoded secure sum of the survivors' encoded updates (their excess XNoise removed)."""
    rot = noise.random_bytes(32)
    n = roster
    comps = ({pid: ComponentSeeds.fresh(cfg.design(roster=n), round=rnd, node_id=pid,
                                        rng=noise.child("seed", rnd, pid)) for pid in alive}
             if cfg.xnoise else {})
    ring = np.zeros(cfg.padded_dim, dtype=np.int64)
    for pid, d in deltas.items():
        ring += encode_update(d, config=cfg, rotation_seed=rot,
                              rng=noise.child("enc", rnd, pid),
                              components=comps.get(pid)).astype(np.int64)
    summed = (ring & ((1 << bits) - 1)).astype(np.uint32)
    if cfg.xnoise:
        survivors = sorted(alive)
        revealed = {p: comps[p].reveal(survivors=len(survivors), rank=r)
                    for r, p in enumerate(survivors)}
        summed = remove_excess(summed, excess_noise(cfg.design(roster=n), revealed,
                                                    survivors=survivors, round=rnd,
                                                    size=cfg.padded_dim),
                               modulus_bits=bits)
    return decode_sum(summed, config=cfg, rotation_seed=rot)


def run(setup: Setup, *, mode: str, bits: int, seed: int, z: float, clip: float, lr: float,
        epochs: int, dropout: float, dataset: str = "digits") -> dict[str, Any]:
    torch.set_num_threads(1)
    train, test = load_dataset(dataset, seed=seed, test_fraction=0.2)
    parts = partition(train, num_partitions=setup.clients, seed=seed)
    splits = [Split(x=train.x[i], y=train.y[i]) for i in parts]
    model = build_model(setup.model, input_shape=tuple(train.x.shape[1:]),
                        num_classes=int(train.y.max()) + 1, hidden=setup.hidden, seed=seed)
    weights = [w.astype(np.float64) for w in get_weights(model)]
    dim = sum(w.size for w in weights)
    denom = max(1.0, setup.sample_rate * setup.clients)
    cohort_gen = np.random.default_rng(10_000 + seed)  # same cohorts and dropouts in every row
    noise = RandomSource.seeded(20_000 + seed)  # research mode: reproducible, NOT private
    cfg = None
    if mode != "central":
        cfg = _largest_scale(bits=bits, kw=dict(
            dim=dim, clip_norm=clip, noise_multiplier=z, min_survivors=setup.threshold,
            max_clients=setup.clients, xnoise=(mode == "distributed")))
    ratios: list[float] = []
    for rnd in range(1, setup.rounds + 1):
        cohort = [i for i in range(setup.clients) if cohort_gen.random() < setup.sample_rate]
        alive = [i for i in cohort if cohort_gen.random() >= dropout]
        if len(cohort) < setup.threshold or len(alive) < setup.threshold:
            continue  # aborted round: nothing released, model unchanged (same in every row)
        deltas = {}
        for pid in alive:
            set_weights(model, [w.astype(np.float32) for w in weights])
            train_local(model, splits[pid], epochs=epochs, lr=lr, batch_size=32,
                        seed=seed * 100_003 + rnd * 1009 + pid)
            new = flatten([np.asarray(w, dtype=np.float64) for w in get_weights(model)])
            deltas[pid] = new - flatten(weights)
        if cfg is None:
            clipped = [d * min(1.0, clip / float(np.linalg.norm(d))) for d in deltas.values()]
            total = np.sum(clipped, axis=0) + noise.normal(std=z * clip, size=dim)
        else:
            total = _secure_total(cfg, deltas, roster=len(cohort), alive=alive, rnd=rnd, noise=noise, bits=bits)
            plain = np.sum([d * min(1.0, clip / float(np.linalg.norm(d))) for d in deltas.values()],
                           axis=0)
            ratios.append(float(np.std(total - plain)) / (z * clip))
        mean = unflatten(total / denom, weights)
        weights = [w + m for w, m in zip(weights, mean, strict=True)]
    set_weights(model, [w.astype(np.float32) for w in weights])
    _, acc = evaluate(model, test)
    out: dict[str, Any] = {"accuracy": acc}
    if cfg is not None:
        out.update(scale=cfg.scale, sensitivity_inflation=cfg.norm_bound / (clip * cfg.scale),
                   noise_std_over_target=statistics.fmean(ratios) if ratios else None)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="digits", help="a registered data set (digits, fashion-mnist)")
    p.add_argument("--setups", nargs="+", default=list(SETUPS), choices=sorted(SETUPS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--bits", nargs="+", type=int, default=[12, 16, 20, 32])
    p.add_argument("--noise-multiplier", type=float, default=1.0)
    p.add_argument("--clip-norm", type=float, default=0.5)
    p.add_argument("--learning-rate", type=float, default=0.3)
    p.add_argument("--local-epochs", type=int, default=2)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--no-legacy", action="store_true")
    p.add_argument("--json", type=str, default=None)
    a = p.parse_args(argv)
    if not 0 <= a.dropout < 1 or a.noise_multiplier <= 0:
        print("dropout must be in [0, 1) and noise-multiplier > 0", file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = []
    modes = [("central", 0)] + [("distributed", b) for b in a.bits]
    if not a.no_legacy:
        modes.append(("legacy", 32))
    t0 = time.perf_counter()
    for name in a.setups:
        setup = SETUPS[name]
        for mode, bits in modes:
            per_seed = []
            for seed in a.seeds:
                try:
                    per_seed.append(run(setup, mode=mode, bits=bits, seed=seed,
                                        z=a.noise_multiplier, clip=a.clip_norm,
                                        lr=a.learning_rate, epochs=a.local_epochs,
                                        dropout=a.dropout, dataset=a.dataset))
                except ValueError as exc:  # headroom refused every scale
                    per_seed.append({"refused": str(exc)})
            accs = [r["accuracy"] for r in per_seed if "accuracy" in r]
            row = {"setup": name, "mode": mode if mode == "central" else f"{mode}-{bits}",
                   "bits": bits or None, "seeds": a.seeds,
                   "accuracy_mean": statistics.fmean(accs) if accs else None,
                   "accuracy_per_seed": accs, "runs": per_seed}
            rows.append(row)
            acc = f"{row['accuracy_mean']:.4f}" if accs else "refused"
            extra = per_seed[0]
            info = (f" scale={extra.get('scale')} infl={extra.get('sensitivity_inflation', 0):.4f}"
                    f" noise/target={extra.get('noise_std_over_target') or 0:.4f}"
                    if "scale" in extra else "")
            print(f"{a.dataset} {name:8s} {row['mode']:16s} acc={acc} per-seed={[round(x, 4) for x in accs]}"
                  f"{info}", flush=True)
    result = {"benchmark": "ddp_bits", "dataset": a.dataset, "noise_multiplier": a.noise_multiplier,
              "clip_norm": a.clip_norm, "dropout": a.dropout, "rows": rows,
              "seconds": time.perf_counter() - t0,
              "setups": {k: asdict(v) for k, v in SETUPS.items() if k in a.setups}}
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
