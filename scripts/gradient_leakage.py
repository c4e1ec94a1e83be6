"""Gradient-leakage attacks (DLG, iDLG, Inverting Gradients, analytic) against fedprivacy's defences.

Usage: python scripts/gradient_leakage.py [--dataset digits|fashion-mnist] [--data-dir DIR]
       [--attacks A,B,...] [--images N] [--json PATH] [--png PATH] [--quick] [--seed S] [--threads T]
       python scripts/gradient_leakage.py --render PATH   (the markdown table of a saved --json)

An honest-but-curious server sees one client's update (one image: an 8x8 digit from sklearn's bundled
set by default, or a 28x28 image of the official Fashion-MNIST test set with ``--dataset fashion-mnist``,
read by fedprivacy's data loader) and tries to reconstruct the image and its label; see
fedprivacy/attacks/gradient_leakage.py for the threat model. Prints a table of PSNR/SSIM/MSE/label
accuracy per (attack, defence) and the mean-image baseline. Randomness for noise comes from a seeded
RandomSource (research mode, NOT private) so runs repeat.

docs/ATTACKS.md's Fashion-MNIST table is this script's output:
  nice -n 5 python scripts/gradient_leakage.py --dataset fashion-mnist --threads 1 \\
      --json docs/gradient_leakage_fashion.json --png docs/img/gradient_leakage_fashion_grid.png
  python scripts/gradient_leakage.py --render docs/gradient_leakage_fashion.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

# Per data set: target images, the defence ladder (keywords of default_defences) and the attacks'
# budgets, full and --quick. Fashion-MNIST: the single-client ladder (no FedAvg or secure-aggregation
# row); 1000 L-BFGS iterations reconstruct a noise-free 28x28 update to 62-94 dB (measured on 2 images,
# 2-6 CPU-s each), Inverting Gradients plateaus at 19-27 dB by 2000 steps (4000: +3 dB at 2x the cost).
_SETUPS: dict[str, dict] = {
    "digits": {
        "images": 2, "restarts": 2, "ladder": {},
        "iterations": {"dlg": 200, "idlg": 200, "inverting-gradients": 400},
        "quick": {"dlg": 100, "idlg": 100, "inverting-gradients": 150},
    },
    "fashion-mnist": {
        "images": 8, "restarts": 2, "ladder": {"fedavg_steps": None, "secure_aggregation": False},
        "iterations": {"dlg": 1000, "idlg": 1000, "inverting-gradients": 2000},
        "quick": {"dlg": 50, "idlg": 50, "inverting-gradients": 100},
    },
}


class _Parser(argparse.ArgumentParser):
    """Bad arguments: one line on stderr naming the parameter, exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"error: {message}\n")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _attack_list(text: str) -> list[str]:
    from fedprivacy.attacks.gradient_leakage import ATTACKS

    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ATTACKS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"must be a comma list of {sorted(ATTACKS)}, got {text!r}")
    return names


def _plot(examples: dict, attacks: list[str], defences: list[str], title: str, path: Path) -> None:
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
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


# A noise-free update of one client is reconstructed to 65-97 dB by a converged DLG/iDLG/IG on the
# digits victim (ANCHORS.md, "Attacks") and to 62-94 dB by DLG/iDLG on 28x28 Fashion-MNIST; well below
# that, the attack stopped early.
_CONVERGED_PSNR = 30.0


def _unconverged(row: dict) -> bool:
    """A noise-free single-client row whose reconstruction is far below what a converged attack reaches."""
    return (float(row["noise_multiplier"]) == 0.0 and int(row["clients_in_sum"]) == 1
            and row["attack"] != "analytic" and float(row["psnr"]) < _CONVERGED_PSNR)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = _Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", choices=sorted(_SETUPS), default="digits",
                        help="digits (bundled 8x8, default) or fashion-mnist (28x28)")
    parser.add_argument("--data-dir", default="",
                        help="folder with the Fashion-MNIST IDX files (default: FEDPRIVACY_DATA_DIR, "
                             "then /usr/share/datasets/fashion-mnist, then the Hub)")
    parser.add_argument("--attacks", type=_attack_list, default=None,
                        help="comma list of attacks (default: all registered)")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--png", type=Path, default=None, help="write the reconstruction grid here")
    parser.add_argument(
        "--quick", action="store_true", help="1 image, fewer iterations (smoke run)"
    )
    parser.add_argument("--images", type=_positive, default=None,
                        help="target images per setting (default: digits 2, fashion-mnist 8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--render", type=Path, default=None,
                        help="print the markdown table of a saved --json file (docs/ATTACKS.md) and exit")
    # 1 thread: the victim has ~8k parameters, intra-op parallelism does not help, and on a shared
    # 2-core machine 2 torch threads spin against each other (measured: 8x the CPU time, 5x the wall time).
    parser.add_argument("--threads", type=_positive, default=1)
    return parser.parse_args(argv)


def _print_table(rows: list[dict], quick: bool) -> None:
    if quick:
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
              "single-client update, which a converged DLG/iDLG reconstructs (60-97 dB); so none "
              "of its rows is evidence that a defence stops it"
              + ("; run without --quick" if quick else "; raise the iterations"))


def _machine() -> dict[str, object]:
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "load_average_start": list(os.getloadavg()),
            "torch": torch.__version__}


def _render(path: Path) -> int:
    from fedprivacy.attacks.gradient_leakage import leakage_markdown

    try:
        rows = json.loads(path.read_text())["rows"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"error: --render {path}: not a saved --json file ({type(exc).__name__}: {exc})",
              file=sys.stderr)
        return 2
    print(leakage_markdown(rows))
    return 0


def _write_png(args: argparse.Namespace, examples: Any, attacks: list[str], defences: list[str], *,
               side: int) -> None:
    args.png.parent.mkdir(parents=True, exist_ok=True)
    title = f"Reconstructions of one {side}x{side} {args.dataset} image from the update the server sees"
    _plot(examples, attacks, defences, title, args.png)
    print(f"wrote {args.png}")


def _write_json(args: argparse.Namespace, argv: list[str] | None, fields: dict[str, Any]) -> None:
    args.json.parent.mkdir(parents=True, exist_ok=True)
    command = "python scripts/gradient_leakage.py " + " ".join(sys.argv[1:] if argv is None else argv)
    args.json.write_text(json.dumps({"script": "gradient_leakage", "command": command, **fields}, indent=2))
    print(f"wrote {args.json}")


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.render is not None:
        return _render(args.render)
    torch.set_num_threads(args.threads)

    from fedprivacy.attacks.gradient_leakage import (
        ATTACKS,
        baseline_psnr,
        default_defences,
        evaluate_leakage,
        leakage_pool,
    )
    from fedprivacy.dp.rng import RandomSource

    setup = _SETUPS[args.dataset]
    machine = _machine()
    try:
        images, labels = leakage_pool(args.dataset, data_dir=args.data_dir)
    except (RuntimeError, ValueError) as exc:
        print(f"error: --dataset {args.dataset}: {exc}", file=sys.stderr)
        return 2
    n_targets = args.images or (1 if args.quick else setup["images"])
    # targets spread over the data set so that the labels differ
    targets = [int(t) for t in np.linspace(0, len(images) - 1, n_targets + 2, dtype=int)[1:-1]]
    iterations = setup["quick" if args.quick else "iterations"]
    restarts = 1 if args.quick else setup["restarts"]
    attacks = args.attacks or list(ATTACKS)
    defences = default_defences(**setup["ladder"])
    rng = RandomSource.seeded(args.seed)
    started, cpu_started = time.perf_counter(), time.process_time()
    rows, examples = evaluate_leakage(
        images, labels, targets=targets, attacks=attacks, defences=defences, rng=rng, seed=args.seed,
        iterations=iterations, restarts=restarts,
        progress=lambda r: print(f"  done {r['attack']} / {r['defence']} in {r['seconds']:.1f} s",
                                 file=sys.stderr, flush=True),
    )
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    machine["load_average_end"] = list(os.getloadavg())
    base = baseline_psnr(images, targets)
    side = images.shape[-1]

    print(f"gradient leakage on {args.dataset} ({side}x{side}), {n_targets} target image(s) "
          f"{targets}, rng {rng.describe()}")
    print(f"baseline (mean image) PSNR: {base:.1f} dB; wall {elapsed:.0f} s, CPU {cpu:.0f} s, "
          f"{args.threads} torch thread(s), {machine['cpu_count']} cores, "
          f"load {machine['load_average_start'][0]:.1f} -> {machine['load_average_end'][0]:.1f}")
    _print_table(rows, args.quick)
    if args.png is not None:
        _write_png(args, examples, attacks, [d.name for d in defences], side=side)
    if args.json is not None:
        _write_json(args, argv, {
            "dataset": args.dataset, "image_side": side, "pool_size": len(images),
            "randomness": rng.describe(), "targets": targets,
            "target_labels": [int(labels[t]) for t in targets],
            "iterations": iterations, "restarts": restarts, "attacks": attacks,
            "baseline_psnr": base, "seconds": elapsed, "cpu_seconds": cpu, "threads": args.threads,
            "machine": machine, "quick": bool(args.quick), "rows": rows,
        })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
