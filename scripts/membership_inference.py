"""Membership inference (loss threshold, LiRA) against fedprivacy's federated global model, with and
without central DP.

Usage: python scripts/membership_inference.py [--json PATH] [--png PATH] [--quick] [--models K]
                                              [--epsilons 100,8]

Each setting trains K federated models (fedprivacy.fl.run.run_federated: FedAvg, 5 clients, many local
epochs, a 2-hidden-layer MLP, so the non-DP model overfits) on random halves of a digits subset, attacks
each with the others as shadow models (online and offline LiRA with fixed variance, Carlini et al.
2022) and pools the scores. Prints AUC and TPR at FPR 1% / 0.1%; writes a log-log ROC plot.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch


def _plot(scores: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedprivacy.attacks.membership import roc_points

    attacks = sorted({s.attack for s in scores})
    fig, axes = plt.subplots(1, len(attacks), figsize=(4.2 * len(attacks), 4.0), squeeze=False)
    for ax, attack in zip(axes[0], attacks, strict=True):
        for s in scores:
            if s.attack != attack:
                continue
            fpr, tpr = roc_points(s)
            ax.plot(np.maximum(fpr, 1e-4), np.maximum(tpr, 1e-4), label=s.model)
        grid = np.logspace(-4, 0, 50)
        ax.plot(grid, grid, "k:", linewidth=0.8, label="chance")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(1e-3, 1)
        ax.set_ylim(1e-3, 1)
        ax.set_xlabel("false-positive rate")
        ax.set_ylabel("true-positive rate")
        ax.set_title(attack, fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--png", type=Path, default=None, help="log-log ROC plot")
    parser.add_argument("--quick", action="store_true", help="3 models, 5 rounds, one DP setting")
    parser.add_argument("--models", type=int, default=None, help="models per setting (default 4)")
    parser.add_argument("--epsilons", type=str, default=None, help="comma-separated DP targets")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    from sklearn.datasets import load_digits

    from fedprivacy.attacks.membership import (
        FederatedTargetConfig,
        attack_rows,
        membership_experiment,
    )

    models = args.models or (3 if args.quick else 4)
    try:
        eps_text = args.epsilons or ("8" if args.quick else "100,8")
        epsilons = [float(e) for e in eps_text.split(",") if e.strip()]
    except ValueError:
        print(
            f"error: --epsilons must be comma-separated numbers, got {args.epsilons!r}",
            file=sys.stderr,
        )
        return 2
    if models < 3 or any(e <= 0 for e in epsilons):
        print("error: --models must be >= 3 and every epsilon > 0", file=sys.stderr)
        return 2
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    pool = np.arange(0, len(y), 4)  # 450 candidates; each model trains on a random half
    rounds = 5 if args.quick else 15
    started, cpu0 = time.perf_counter(), time.process_time()
    all_scores, summaries = [], []
    for eps in [None, *epsilons]:
        cfg = FederatedTargetConfig(clients=5, rounds=rounds, local_epochs=20, target_epsilon=eps)
        scores, summary = membership_experiment(
            x[pool],
            y[pool],
            config=cfg,
            models=models,
            seed=args.seed,
            progress=lambda m: print("  " + m, file=sys.stderr, flush=True),
        )
        all_scores += scores
        summaries.append({"model": cfg.label, **summary})
    rows = attack_rows(all_scores)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu0

    print(
        f"membership inference on federated digits models ({models} per setting, {len(pool)} candidates)"
    )
    for s in summaries:
        print(
            f"  {s['model']:<22} train acc {s['train_accuracy']:.3f}  test acc {s['test_accuracy']:.3f}"
            f"  sigma {s['noise_multiplier']:.3g}"
        )
    print(f"{'model':<22} {'attack':<24} {'AUC':>6} {'TPR@1%':>8} {'TPR@0.1%':>9}")
    for r in rows:
        print(
            f"{r['model']:<22} {r['attack']:<24} {r['auc']:>6.3f} {r['tpr_at_fpr_1pct']:>8.4f} "
            f"{r['tpr_at_fpr_01pct']:>9.4f}"
        )
    print(f"wall {elapsed:.0f} s, CPU {cpu:.0f} s")
    if args.png is not None:
        args.png.parent.mkdir(parents=True, exist_ok=True)
        _plot(all_scores, args.png)
        print(f"wrote {args.png}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "script": "membership_inference",
            "target_training": "fedprivacy.fl.run.run_federated (FedAvg; central DP calibrated by the "
            "PLD accountant; privacy unit = client)",
            "lira_variant": "online and offline, fixed (global) variance, leave-one-out shadows",
            "models_per_setting": models,
            "candidates": int(len(pool)),
            "settings": summaries,
            "seconds": elapsed,
            "cpu_seconds": cpu,
            "rows": rows,
        }
        args.json.write_text(json.dumps(payload, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
