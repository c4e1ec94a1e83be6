"""Check the batched client trainer on a GPU against the CPU, and time both (a few minutes at most).

For each model (the 10k-parameter MLP on 8x8 digits-shaped input, the 28,938-parameter convnet on
28x28), one cohort of clients (2 local epochs, batch 10, ragged partitions) is trained with
:func:`fedprivacy.ml.batched.train_batched` on ``--device`` and on the CPU from the same weights and
seeds, and with the per-client loop (:func:`fedprivacy.ml.train.train_local`) on the CPU. Printed as
JSON: the largest weight difference device vs CPU and whether it is within tolerance, the seconds of
each path (median of ``--repeats``, after one warm-up), and the device's peak memory. Exit 1 when a
model's difference exceeds the tolerance, 2 on bad arguments (e.g. no CUDA device).

Usage: ``python scripts/gpu_check.py [--device cuda] [--clients 300] [--json PATH]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
MODELS = {"mlp": ((1, 8, 8), 128), "convnet": ((1, 28, 28), 32)}
TOLERANCE = {"rtol": 1e-3, "atol": 1e-4}  # float32 kernels of two devices: last bits, summed over steps


def _cohort(shape: tuple[int, ...], clients: int, seed: int) -> list[Any]:
    from fedprivacy.ml.data import Split

    rng = np.random.default_rng(seed)
    sizes = rng.integers(5, 31, clients)
    return [Split(x=rng.standard_normal((int(n), *shape)).astype(np.float32),
                  y=rng.integers(0, 10, int(n)).astype(np.int64), num_classes=10) for n in sizes]


def _timed(fn: Any, repeats: int, sync: Any) -> tuple[Any, float]:
    out = fn()  # warm-up (kernel selection, allocator)
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t0)
    return out, statistics.median(times)


def check_model(name: str, *, device: str, clients: int, repeats: int, loop: bool = True) -> dict[str, Any]:
    """One model's row: device vs CPU difference, timings, peak device memory."""
    import torch

    from fedprivacy.ml.batched import resolve_device, train_batched
    from fedprivacy.ml.models import build_model, get_weights, set_weights
    from fedprivacy.ml.train import train_local

    shape, hidden = MODELS[name]
    dev = resolve_device(device)
    model = build_model(name, input_shape=shape, num_classes=10, hidden=hidden, seed=0)
    splits = _cohort(shape, clients, seed=1)
    seeds = list(range(clients))
    kw = {"epochs": 2, "lr": 0.05, "batch_size": 10}
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    on_dev, t_dev = _timed(lambda: train_batched(model, splits, seeds=seeds, device=dev, **kw), repeats, sync)
    on_cpu, t_cpu = _timed(lambda: train_batched(model, splits, seeds=seeds, device="cpu", **kw), repeats,
                           lambda: None)
    diff = max(float(np.max(np.abs(a - b))) for d, c in zip(on_dev, on_cpu, strict=True)
               for a, b in zip(d.weights, c.weights, strict=True))
    close = all(np.allclose(a, b, **TOLERANCE) for d, c in zip(on_dev, on_cpu, strict=True)
                for a, b in zip(d.weights, c.weights, strict=True))
    row: dict[str, Any] = {"model": name, "clients": clients, "device": str(dev), "max_abs_diff": diff,
                           "within_tolerance": bool(close), "tolerance": TOLERANCE,
                           "batched_device_seconds": t_dev, "batched_cpu_seconds": t_cpu,
                           "device_peak_memory_mb": torch.cuda.max_memory_allocated() / 2**20 if cuda else None}
    if loop:
        start = get_weights(model)

        def per_client() -> None:
            for split, seed in zip(splits, seeds, strict=True):
                set_weights(model, start)
                train_local(model, split, seed=seed, **kw)
            set_weights(model, start)

        row["per_client_cpu_seconds"] = _timed(per_client, max(1, repeats // 2), lambda: None)[1]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda | cpu | auto (cpu: a dry run of the logic)")
    parser.add_argument("--clients", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default="mlp,convnet")
    parser.add_argument("--no-loop", action="store_true", help="skip the per-client CPU loop")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    import torch

    from fedprivacy.ml.batched import resolve_device

    names = [m for m in args.models.split(",") if m]
    try:
        resolve_device(args.device)
        unknown = [m for m in names if m not in MODELS]
        if unknown or args.clients < 1 or args.repeats < 1:
            raise ValueError(f"models must be among {', '.join(MODELS)} (got {unknown}); clients and "
                             "repeats must be >= 1")
    except ValueError as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rows = [check_model(m, device=args.device, clients=args.clients, repeats=args.repeats,
                        loop=not args.no_loop) for m in names]
    out = {"torch": torch.__version__, "cuda": torch.version.cuda, "rows": rows}
    text = json.dumps(out, indent=1)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0 if all(r["within_tolerance"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
