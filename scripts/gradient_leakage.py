"""Gradient-leakage attacks (DLG, iDLG, Inverting Gradients, analytic) against fedprivacy's defences.

Usage: python scripts/gradient_leakage.py [--json PATH] [--png PATH] [--quick] [--images N] [--seed S]

An honest-but-curious server sees one client's update (one 8x8 digit from sklearn's bundled set) and
tries to reconstruct the image and its label; see fedprivacy/attacks/gradient_leakage.py for the threat
model. Prints a table of PSNR/SSIM/MSE/label accuracy per (attack, defence) and the mean-image baseline.
Randomness for noise comes from a seeded RandomSource (research mode, NOT private) so runs repeat.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch


def _load_digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.data / 16.0).astype(np.float64), d.target.astype(np.int64)


def _plot(examples: dict, attacks: list[str], defences: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = len(defences) + 1
    fig, axes = plt.subplots(len(attacks), cols, figsize=(1.3 * cols, 1.45 * len(attacks) + 0.4))
    axes = np.atleast_2d(axes)
    for i, attack in enumerate(attacks):
        for j in range(cols):
            ax = axes[i, j]
            ax.set_xticks([])
            ax.set_yticks([])
            if j == 0:
                orig = examples[(attack, defences[0])][0]
                ax.imshow(orig, cmap="gray_r", vmin=0, vmax=1)
                ax.set_ylabel(attack, fontsize=7)
                if i == 0:
                    ax.set_title("original", fontsize=7)
                continue
            rec = examples[(attack, defences[j - 1])][1]
            ax.imshow(rec, cmap="gray_r", vmin=0, vmax=1)
            if i == 0:
                ax.set_title(defences[j - 1].replace("(", "\n("), fontsize=6)
    fig.suptitle("Reconstructions of one 8x8 digit from the update the server sees", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


# A noise-free update of one client is reconstructed to 65-97 dB by a converged DLG/iDLG/IG on this
# victim (ANCHORS.md, "Attacks"); well below that, the attack stopped early.
_CONVERGED_PSNR = 30.0


def _unconverged(row: dict) -> bool:
    """A noise-free single-client row whose reconstruction is far below what a converged attack reaches."""
    return (float(row["noise_multiplier"]) == 0.0 and int(row["clients_in_sum"]) == 1
            and row["attack"] != "analytic" and float(row["psnr"]) < _CONVERGED_PSNR)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--png", type=Path, default=None, help="write the reconstruction grid here")
    parser.add_argument(
        "--quick", action="store_true", help="1 image, fewer iterations (smoke run)"
    )
    parser.add_argument(
        "--images", type=int, default=None, help="target images per setting (default 2)"
    )
    parser.add_argument("--seed", type=int, default=0)
    # 1 thread: the victim has ~8k parameters, intra-op parallelism does not help, and on a shared
    # 2-core machine 2 torch threads spin against each other (measured: 8x the CPU time, 5x the wall time).
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from fedprivacy.attacks.gradient_leakage import (
        ATTACKS,
        baseline_psnr,
        default_defences,
        evaluate_leakage,
    )
    from fedprivacy.dp.rng import RandomSource

    images, labels = _load_digits()
    n_targets = args.images or (1 if args.quick else 2)
    if n_targets < 1:
        print("error: --images must be >= 1", file=sys.stderr)
        return 2
    # targets spread over the data set so that the labels differ
    targets = [int(t) for t in np.linspace(0, len(images) - 1, n_targets + 2, dtype=int)[1:-1]]
    iterations = (
        {"dlg": 100, "idlg": 100, "inverting-gradients": 150}
        if args.quick
        else {"dlg": 200, "idlg": 200, "inverting-gradients": 400}
    )
    restarts = 1 if args.quick else 2
    attacks = list(ATTACKS)
    defences = default_defences()
    rng = RandomSource.seeded(args.seed)
    started = time.perf_counter()
    cpu_started = time.process_time()
    rows, examples = evaluate_leakage(
        images,
        labels,
        targets=targets,
        attacks=attacks,
        defences=defences,
        rng=rng,
        seed=args.seed,
        iterations=iterations,
        restarts=restarts,
        progress=lambda r: print(
            f"  done {r['attack']} / {r['defence']} in {r['seconds']:.1f} s",
            file=sys.stderr,
            flush=True,
        ),
    )
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    base = baseline_psnr(images, targets)

    print(f"gradient leakage on sklearn digits, {n_targets} target image(s), rng {rng.describe()}")
    print(f"baseline (mean image) PSNR: {base:.1f} dB; wall {elapsed:.0f} s, CPU {cpu:.0f} s")
    if args.quick:
        print("WARNING: --quick runs the attacks for a fraction of their iterations: the figures are a "
              "smoke test, NOT converged, and a low PSNR below does not mean a defence works")
    print(
        f"{'attack':<20} {'defence':<36} {'sigma':>7} {'PSNR':>7} {'SSIM':>6} {'MSE':>8} {'label':>6}"
    )
    stalled = sorted({str(r["attack"]) for r in rows if _unconverged(r)})
    for r in rows:
        r["converged"] = r["attack"] not in stalled
        print(
            f"{r['attack']:<20} {r['defence']:<36} {r['noise_multiplier']:>7.4g} {r['psnr']:>7.1f}"
            f"{' ' if r['converged'] else '*'} {r['ssim']:>6.3f} {r['mse']:>8.2e} {r['label_accuracy']:>6.2f}"
        )
    if stalled:
        print(f"* not converged: {', '.join(stalled)} stayed below {_CONVERGED_PSNR:g} dB on a noise-free "
              "single-client update, which a converged attack reconstructs (ANCHORS: 65-97 dB); so none "
              "of its rows is evidence that a defence stops it"
              + ("; run without --quick" if args.quick else "; raise the iterations"))
    if args.png is not None:
        args.png.parent.mkdir(parents=True, exist_ok=True)
        _plot(examples, attacks, [d.name for d in defences], args.png)
        print(f"wrote {args.png}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "script": "gradient_leakage",
            "randomness": rng.describe(),
            "targets": targets,
            "baseline_psnr": base,
            "seconds": elapsed,
            "cpu_seconds": cpu,
            "threads": args.threads,
            "quick": bool(args.quick),
            "rows": rows,
        }
        args.json.write_text(json.dumps(payload, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
