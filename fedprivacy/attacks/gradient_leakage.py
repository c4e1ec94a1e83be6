"""Gradient leakage: reconstructing a client's training images from the update it sends.

Threat model: an honest-but-curious server. It follows the protocol, knows the global model it sent
(white-box), the loss, the number of local steps and the learning rate, and sees one update: a FedSGD
gradient (one step, learning rate 1) or a FedAvg model difference ``w_0 - w_K`` after K local
full-batch SGD steps. Under secure aggregation it sees only the sum of n clients' updates; under DP it
sees the clipped (and noised) update.

The victims are in :mod:`fedprivacy.attacks.leakage_victims`, the attacks in
:mod:`fedprivacy.attacks.leakage_attacks`, the defences in :mod:`fedprivacy.attacks.leakage_defences`.
This module holds the attack registry (one :func:`register_attack` line adds an attack) and the
experiment, and is the public entry point: it names everything a caller needs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from torch import nn

if TYPE_CHECKING:
    from fedprivacy.dp.rng import RandomSource

from fedprivacy.attacks.leakage_attacks import (
    Reconstruction,
    analytic_attack,
    dlg_attack,
    idlg_attack,
    infer_labels,
    inverting_gradients_attack,
)
from fedprivacy.attacks.leakage_defences import (
    Defence,
    apply_defence,
    default_defences,
    encoded_share,
)
from fedprivacy.attacks.leakage_victims import (
    IMAGE_SIDE,
    VICTIMS,
    VictimLeNet,
    VictimMLP,
    build_victim,
    compute_update,
)

__all__ = [
    "ATTACKS",
    "IMAGE_SIDE",
    "Attack",
    "AttackParams",
    "Reconstruction",
    "VictimMLP",
    "VictimLeNet",
    "analytic_attack",
    "apply_defence",
    "Defence",
    "baseline_psnr",
    "build_victim",
    "default_defences",
    "encoded_share",
    "evaluate_leakage",
    "compute_update",
    "dlg_attack",
    "idlg_attack",
    "infer_labels",
    "inverting_gradients_attack",
    "LEAKAGE_DATASETS",
    "leakage_markdown",
    "leakage_pool",
    "register_attack",
    "run_attack",
]

@dataclass(frozen=True, slots=True, kw_only=True)
class AttackParams:
    """What every attack is told about the update it attacks (and its own budget).

    ``clipped``: the server knows updates are clipped, so the L2-matching attacks (DLG, iDLG) match up
    to scale; the cosine (IG) and ratio (analytic) attacks are scale-invariant already.
    """

    batch_size: int
    local_steps: int = 1
    lr: float = 1.0
    seed: int = 0
    iterations: int | None = None
    restarts: int = 2
    clipped: bool = False


AttackFn = Callable[[nn.Module, Sequence[np.ndarray], AttackParams], Reconstruction]


@dataclass(frozen=True, slots=True, kw_only=True)
class Attack:
    """A registered attack: the victim architecture it runs against and the function that runs it."""

    victim: str
    run: AttackFn


def _dlg(model: nn.Module, observed: Sequence[np.ndarray], p: AttackParams) -> Reconstruction:
    return dlg_attack(model, observed, batch_size=p.batch_size, local_steps=p.local_steps, lr=p.lr,
                      iterations=p.iterations or 300, seed=p.seed, scale_free=p.clipped)


def _idlg(model: nn.Module, observed: Sequence[np.ndarray], p: AttackParams) -> Reconstruction:
    return idlg_attack(model, observed, batch_size=p.batch_size, local_steps=p.local_steps, lr=p.lr,
                       iterations=p.iterations or 300, seed=p.seed, scale_free=p.clipped)


def _inverting(model: nn.Module, observed: Sequence[np.ndarray], p: AttackParams) -> Reconstruction:
    return inverting_gradients_attack(model, observed, batch_size=p.batch_size,
                                      local_steps=p.local_steps, lr=p.lr,
                                      iterations=p.iterations or 1000, restarts=p.restarts, seed=p.seed)


def _analytic(model: nn.Module, observed: Sequence[np.ndarray], p: AttackParams) -> Reconstruction:
    return analytic_attack(model, observed, batch_size=p.batch_size)


ATTACKS: dict[str, Attack] = {
    "dlg": Attack(victim="lenet", run=_dlg),
    "idlg": Attack(victim="lenet", run=_idlg),
    "inverting-gradients": Attack(victim="lenet", run=_inverting),
    "analytic": Attack(victim="mlp", run=_analytic),
}
"""Attack name -> :class:`Attack` (victim architecture, function); extend with :func:`register_attack`."""


def register_attack(name: str, *, victim: str, run: AttackFn) -> None:
    """Add an attack; the script and :func:`evaluate_leakage` pick it up by name."""
    if not name:
        raise ValueError("name must not be empty")
    if name in ATTACKS:
        raise ValueError(f"attack {name!r} is already registered")
    if victim not in VICTIMS:
        raise ValueError(f"victim must be one of {VICTIMS}, got {victim!r}")
    ATTACKS[name] = Attack(victim=victim, run=run)


def run_attack(
    name: str,
    model: nn.Module,
    observed: Sequence[np.ndarray],
    *,
    batch_size: int,
    local_steps: int = 1,
    lr: float = 1.0,
    seed: int = 0,
    iterations: int | None = None,
    restarts: int = 2,
    clipped: bool = False,
) -> Reconstruction:
    """Run the registered attack ``name`` (see :data:`ATTACKS` and :class:`AttackParams`)."""
    attack = ATTACKS.get(name)
    if attack is None:
        raise ValueError(f"attack must be one of {sorted(ATTACKS)}, got {name!r}")
    params = AttackParams(batch_size=batch_size, local_steps=local_steps, lr=lr, seed=seed,
                          iterations=iterations, restarts=restarts, clipped=clipped)
    return attack.run(model, observed, params)


# ------------------------------------------------------------------------------------------ experiment
LEAKAGE_DATASETS = ("digits", "fashion-mnist")


def leakage_pool(dataset: str, *, data_dir: str = "") -> tuple[np.ndarray, np.ndarray]:
    """The images the attacks draw their targets from: float64 ``(N, side, side)`` in [0, 1], labels.

    ``"digits"``: all 1,797 8x8 scikit-learn digits (pixel / 16), the pool of the digits table.
    ``"fashion-mnist"``: the official 10,000-image Fashion-MNIST test set, 28x28 (pixel / 255), read
    through fedprivacy's own loader (:func:`fedprivacy.ml.data.load_dataset`: ``data_dir``, then
    ``FEDPRIVACY_DATA_DIR``, then Debian's ``/usr/share/datasets/fashion-mnist``, then the Hub).

    Raises:
        ValueError: unknown ``dataset``.
        RuntimeError: Fashion-MNIST is not found; the message says how to get it.
    """
    if dataset == "digits":
        from sklearn.datasets import load_digits

        d = load_digits()
        return _square_images(d.data / 16.0), d.target.astype(np.int64)
    if dataset == "fashion-mnist":
        from fedprivacy.ml.data import load_dataset

        _, test = load_dataset("fashion-mnist", seed=0, test_fraction=0.2, data_dir=data_dir)
        return _square_images(test.x), np.array(test.y, dtype=np.int64)
    raise ValueError(f"dataset must be one of {LEAKAGE_DATASETS}, got {dataset!r}")


def _observe(
    model: nn.Module,
    images: np.ndarray,
    labels: np.ndarray,
    defence: Defence,
    rng: RandomSource,
) -> list[np.ndarray]:
    """What the server sees: the sum over the defence's clients (one image each) of defended updates."""
    total: list[np.ndarray] | None = None
    for j in range(len(images)):
        upd = compute_update(
            model,
            images[j : j + 1],
            labels[j : j + 1],
            local_steps=defence.local_steps,
            lr=defence.lr,
        )
        if defence.share_of:
            upd = encoded_share(upd, clip_norm=float(defence.clip_norm or 0.0),
                                noise_multiplier=defence.noise_multiplier, threshold=defence.share_of,
                                rng=rng.child(j))
        else:
            noise_std = defence.noise_multiplier * (defence.clip_norm or 0.0)
            upd = apply_defence(upd, clip_norm=defence.clip_norm, noise_std=noise_std, rng=rng.child(j))
        total = upd if total is None else [a + b for a, b in zip(total, upd, strict=True)]
    assert total is not None  # at least one client (checked by Defence)
    return total


def _square_images(pool_images: np.ndarray) -> np.ndarray:
    """The pool as float64 ``(N, side, side)`` (grayscale: 8x8 digits, 28x28 Fashion-MNIST)."""
    flat = np.asarray(pool_images, dtype=np.float64).reshape(len(pool_images), -1)
    side = math.isqrt(flat.shape[1])
    if side * side != flat.shape[1]:
        raise ValueError(f"pool_images must be square grayscale images, got {flat.shape[1]} pixels each")
    return flat.reshape(-1, side, side)


def evaluate_leakage(
    pool_images: np.ndarray,
    pool_labels: np.ndarray,
    *,
    targets: Sequence[int],
    attacks: Sequence[str],
    defences: Sequence[Defence],
    rng: RandomSource,
    seed: int = 0,
    iterations: dict[str, int] | None = None,
    restarts: int = 2,
    progress: Callable[[dict[str, object]], None] | None = None,
) -> tuple[list[dict[str, object]], dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]]:
    """Run every attack against every defence on the target images (each a one-image client).

    Under secure aggregation the target's update is summed with those of the next ``clients - 1``
    images of the pool, and the scores are over the whole matched batch. Returns the table rows
    (means over targets) and, per (attack, defence), the first target's (original, reconstruction).
    """
    images = _square_images(pool_images)
    labels = np.asarray(pool_labels, dtype=np.int64)
    rows: list[dict[str, object]] = []
    examples: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
    side = images.shape[-1]
    victims = {arch: build_victim(arch, seed=seed, side=side)
               for arch in sorted({ATTACKS[a].victim for a in attacks})}
    for defence in defences:
        for attack in attacks:
            row, example = _score(attack, victims[ATTACKS[attack].victim], defence, images, labels,
                                  targets=targets, rng=rng, seed=seed,
                                  iterations=(iterations or {}).get(attack), restarts=restarts)
            rows.append(row)
            examples[(attack, defence.name)] = example
            if progress is not None:
                progress(row)
    return rows, examples


def _score(attack: str, model: nn.Module, defence: Defence, images: np.ndarray, labels: np.ndarray, *,
           targets: Sequence[int], rng: RandomSource, seed: int, iterations: int | None,
           restarts: int) -> tuple[dict[str, object], tuple[np.ndarray, np.ndarray]]:
    """One attack against one defence over all targets: the table row and the first example."""
    import time

    from fedprivacy.attacks.metrics import label_accuracy, match_images, mse, psnr, ssim

    scores: dict[str, list[float]] = {"psnr": [], "ssim": [], "mse": [], "label_accuracy": []}
    started = time.perf_counter()
    example: tuple[np.ndarray, np.ndarray] | None = None
    for t_idx, t in enumerate(targets):
        idx = np.array([(t + j) % len(images) for j in range(defence.clients)])
        x, y = images[idx], labels[idx]
        observed = _observe(model, x.reshape(len(idx), -1), y, defence, rng.child(defence.name, int(t)))
        rec = run_attack(attack, model, observed, batch_size=len(idx), local_steps=defence.local_steps,
                         lr=defence.lr, seed=seed + t_idx, iterations=iterations, restarts=restarts,
                         clipped=defence.clip_norm is not None)
        matched = rec.images[match_images(x, rec.images)]
        scores["psnr"].append(float(np.mean([psnr(a, b) for a, b in zip(x, matched, strict=True)])))
        scores["ssim"].append(ssim(x, matched))
        scores["mse"].append(mse(x, matched))
        scores["label_accuracy"].append(label_accuracy(y.tolist(), rec.labels.tolist()))
        if example is None:
            example = (x[0], matched[0])
    row: dict[str, object] = {
        "attack": attack, "defence": defence.name, "model": ATTACKS[attack].victim,
        "update": "fedsgd" if defence.local_steps == 1 else f"fedavg-{defence.local_steps}-steps",
        "clip_norm": defence.clip_norm,
        # the noise multiplier of what the attacker sees from one client (a share: z / sqrt(t))
        "noise_multiplier": defence.noise_multiplier / math.sqrt(defence.share_of or 1),
        "clients_in_sum": defence.clients, "images": len(targets),
        **{k: float(np.mean(v)) for k, v in scores.items()}, "seconds": time.perf_counter() - started,
    }
    if example is None:
        raise ValueError("targets must not be empty")
    return row, example


def baseline_psnr(pool_images: np.ndarray, targets: Sequence[int]) -> float:
    """PSNR of guessing the data set's mean image for each target: the no-information baseline."""
    from fedprivacy.attacks.metrics import psnr

    images = _square_images(pool_images)
    mean = images.mean(axis=0)
    return float(np.mean([psnr(images[t], mean) for t in targets]))


_ATTACK_TITLES = {"dlg": "DLG", "idlg": "iDLG", "inverting-gradients": "Inverting Gradients",
                  "analytic": "analytic (MLP)"}


def leakage_markdown(rows: Sequence[dict[str, object]]) -> str:
    """The docs' table of :func:`evaluate_leakage` rows: one line per defence (in run order) with the
    noise multiplier one client's update carries, ``PSNR / SSIM`` per attack (``exact`` at the metric's
    200 dB cap, ``*`` when the row's ``converged`` is False) and the label accuracy per attack."""
    attacks = list(dict.fromkeys(str(r["attack"]) for r in rows))
    defences = list(dict.fromkeys(str(r["defence"]) for r in rows))
    by = {(str(r["attack"]), str(r["defence"])): r for r in rows}

    def cell(row: dict[str, object] | None) -> str:
        if row is None:
            return "–"
        value = float(row["psnr"])  # type: ignore[arg-type]
        psnr_text = "exact" if value >= 199.9 else f"{value:.1f}"
        star = "" if row.get("converged", True) else "*"
        return f"{psnr_text}{star} / {float(row['ssim']):.2f}".replace("-", "−")  # type: ignore[arg-type]

    titles = [_ATTACK_TITLES.get(a, a) for a in attacks]
    lines = [f"| defence (server sees) | σ per client | {' | '.join(titles)} | labels "
             f"{' / '.join(t.split(' (')[0] for t in titles)} |", "|---" * (len(attacks) + 3) + "|"]
    for d in defences:
        first = next(by[(a, d)] for a in attacks if (a, d) in by)
        labels = " / ".join(f"{float(by[(a, d)]['label_accuracy']):.2f}" if (a, d) in by else "–"  # type: ignore[arg-type]
                            for a in attacks)
        lines.append(f"| `{d}` | {float(first['noise_multiplier']):.3g} | "  # type: ignore[arg-type]
                     f"{' | '.join(cell(by.get((a, d))) for a in attacks)} | {labels} |")
    return "\n".join(lines)
