"""The gradient-leakage attacks (the threat model is in :mod:`fedprivacy.attacks.gradient_leakage`).

Attacks:
- DLG (Zhu, Liu & Han 2019, "Deep Leakage from Gradients", Alg. 1): optimise dummy images and soft
  labels with L-BFGS so that their simulated update matches the observed one in squared L2 distance.
- iDLG (Zhao, Mopuri & Bilen 2020, "iDLG", Sec. 3.1): for cross-entropy with softmax the gradient of
  the last layer's bias is ``softmax(z) - onehot(y)``, negative only at the true label; read the label
  from its sign, then run DLG on the images alone.
- Inverting Gradients (Geiping, Bauermeister, Droege & Moeller 2020, NeurIPS, Eq. 4): minimise
  ``1 - cos(update(x), observed) + alpha TV(x)`` with Adam on signed gradients, projecting x onto the
  box [0, 1] after every step, with several random restarts; keep the restart with the lowest loss.
- Analytic inversion of a first dense layer with bias (Phong et al. 2018, "Privacy-Preserving Deep
  Learning via Additively Homomorphic Encryption", Sec. 3; Geiping et al. 2020, Prop. D.1): for
  ``z = W x + b``, ``dL/dW_i = (dL/db_i) x``, so ``x = (dL/dW_i) / (dL/db_i)`` for every neuron i with
  ``dL/db_i != 0``. For one image we use the least-squares combination over all neurons
  ``x = sum_i g_i G_i / sum_i g_i^2`` (exact without noise, best linear estimate with isotropic noise).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

if TYPE_CHECKING:
    pass

from fedprivacy.attacks.leakage_victims import NUM_CLASSES, image_side, simulate_update


@dataclass(frozen=True, slots=True, kw_only=True)
class Reconstruction:
    """Images in [0, 1] of shape (B, side, side) and guessed labels, plus the attack's final loss."""

    images: np.ndarray
    labels: np.ndarray
    loss: float


def infer_labels(
    model: nn.Module, observed: Sequence[np.ndarray], *, batch_size: int
) -> np.ndarray:
    """iDLG label inference from the last layer's bias update (Zhao et al. 2020, Sec. 3.1).

    ``dL/db = mean_j (softmax(z_j) - onehot(y_j))`` is negative exactly at the labels present (for a
    single image, at the one label). We return the ``batch_size`` most negative classes (cycling if
    the batch is larger than the number of classes).
    """
    names = [k for k, _ in model.named_parameters()]
    bias_name = names[-1]
    if not bias_name.endswith("bias"):
        raise ValueError("the last parameter of the model must be the output layer's bias")
    g = np.asarray(observed[-1], dtype=np.float64).ravel()
    order = np.argsort(g, kind="stable")
    return np.array([order[i % order.size] for i in range(batch_size)], dtype=np.int64)


def _to_tensors(observed: Sequence[np.ndarray]) -> list[torch.Tensor]:
    return [torch.as_tensor(np.asarray(a, dtype=np.float64)) for a in observed]


def _scale_free_l2_match(sim: list[torch.Tensor], obs: list[torch.Tensor]) -> torch.Tensor:
    """``min_{s >= 0} ||s * sim - obs||^2 = ||obs||^2 - max(<sim, obs>, 0)^2 / ||sim||^2``.

    A clipped update is the true update times an unknown factor ``C / ||g||``; an attacker who knows
    the protocol clips matches up to that factor instead of assuming the raw scale.
    """
    dot = sum((s * o).sum() for s, o in zip(sim, obs, strict=True))
    ss = sum((s * s).sum() for s in sim)
    oo = sum((o * o).sum() for o in obs)
    return oo - torch.clamp(dot, min=0.0) ** 2 / (ss + 1e-300)  # type: ignore[operator,return-value,arg-type]


def _l2_match(sim: list[torch.Tensor], obs: list[torch.Tensor]) -> torch.Tensor:
    return sum(((s - o) ** 2).sum() for s, o in zip(sim, obs, strict=True))  # type: ignore[return-value]


def _cosine_match(sim: list[torch.Tensor], obs: list[torch.Tensor]) -> torch.Tensor:
    dot = sum((s * o).sum() for s, o in zip(sim, obs, strict=True))
    ns = torch.sqrt(sum((s * s).sum() for s in sim))  # type: ignore[arg-type]
    no = torch.sqrt(sum((o * o).sum() for o in obs))  # type: ignore[arg-type]
    return 1.0 - dot / (ns * no + 1e-30)  # type: ignore[return-value]


def _total_variation(x: torch.Tensor, side: int) -> torch.Tensor:
    img = x.reshape(-1, side, side)
    return (img[:, 1:, :] - img[:, :-1, :]).abs().mean() + (
        img[:, :, 1:] - img[:, :, :-1]
    ).abs().mean()


def _lbfgs(variables: list[torch.Tensor], iterations: int) -> torch.optim.LBFGS:
    """The L-BFGS of the DLG reference code (strong Wolfe line search, tight tolerances)."""
    return torch.optim.LBFGS(variables, lr=1.0, max_iter=iterations, max_eval=int(iterations * 1.25),
                             history_size=100, tolerance_grad=1e-14, tolerance_change=1e-16,
                             line_search_fn="strong_wolfe")


def dlg_attack(
    model: nn.Module,
    observed: Sequence[np.ndarray],
    *,
    batch_size: int,
    local_steps: int = 1,
    lr: float = 1.0,
    iterations: int = 300,
    seed: int = 0,
    labels: np.ndarray | None = None,
    scale_free: bool = False,
) -> Reconstruction:
    """DLG (Zhu et al. 2019, Alg. 1): L-BFGS on dummy images (and soft labels unless ``labels`` given)
    minimising ``||update(x', y') - observed||^2``. With ``scale_free`` (the server knows updates are
    clipped) the distance is minimised over an unknown positive scale of the update as well."""
    match = _scale_free_l2_match if scale_free else _l2_match
    gen = torch.Generator().manual_seed(seed)
    obs = _to_tensors(observed)
    dummy_x = torch.rand((batch_size, image_side(model) ** 2), generator=gen, dtype=torch.float64)
    dummy_x.requires_grad_(True)
    variables = [dummy_x]
    dummy_y: torch.Tensor | None = None
    if labels is None:
        dummy_y = torch.randn((batch_size, NUM_CLASSES), generator=gen, dtype=torch.float64)
        dummy_y.requires_grad_(True)
        variables.append(dummy_y)
    fixed_y = None if labels is None else torch.as_tensor(np.asarray(labels, dtype=np.int64))
    opt = _lbfgs(variables, iterations)

    def target() -> torch.Tensor:
        if dummy_y is not None:
            return torch.softmax(dummy_y, dim=1)
        assert fixed_y is not None  # internal invariant, not an input check
        return fixed_y

    def closure() -> torch.Tensor:
        opt.zero_grad()
        sim = simulate_update(
            model, dummy_x, target(), local_steps=local_steps, lr=lr, create_graph=True
        )
        loss = match(sim, obs)
        loss.backward()
        return loss

    try:
        opt.step(closure)
    except RuntimeError:  # pragma: no cover - L-BFGS line search can fail on NaN; keep the iterate
        pass
    sim = simulate_update(
        model, dummy_x, target(), local_steps=local_steps, lr=lr, create_graph=True
    )
    final = float(match(sim, obs).detach())
    guessed = (
        np.asarray(labels, dtype=np.int64)
        if dummy_y is None
        else torch.argmax(dummy_y.detach(), dim=1).numpy()
    )
    images = np.clip(dummy_x.detach().numpy().reshape(batch_size, image_side(model), image_side(model)), 0.0, 1.0)
    return Reconstruction(
        images=images, labels=guessed, loss=final if math.isfinite(final) else math.inf
    )


def idlg_attack(
    model: nn.Module,
    observed: Sequence[np.ndarray],
    *,
    batch_size: int,
    local_steps: int = 1,
    lr: float = 1.0,
    iterations: int = 300,
    seed: int = 0,
    scale_free: bool = False,
) -> Reconstruction:
    """iDLG (Zhao et al. 2020): labels from the sign of the last-layer gradient, then DLG on images."""
    labels = infer_labels(model, observed, batch_size=batch_size)
    return dlg_attack(
        model,
        observed,
        batch_size=batch_size,
        local_steps=local_steps,
        lr=lr,
        iterations=iterations,
        seed=seed,
        labels=labels,
        scale_free=scale_free,
    )


def inverting_gradients_attack(
    model: nn.Module,
    observed: Sequence[np.ndarray],
    *,
    batch_size: int,
    local_steps: int = 1,
    lr: float = 1.0,
    iterations: int = 1000,
    restarts: int = 2,
    tv_weight: float = 1e-4,
    step_size: float = 0.1,
    seed: int = 0,
) -> Reconstruction:
    """Inverting Gradients (Geiping et al. 2020, Eq. 4 and Sec. 5): cosine distance plus total
    variation, Adam on the sign of the gradient, step decay by 10x at 3/8, 5/8 and 7/8 of the
    iterations, projection onto [0, 1] after every step, best of ``restarts`` random starts."""
    if restarts < 1:
        raise ValueError(f"restarts must be >= 1, got {restarts}")
    labels = infer_labels(model, observed, batch_size=batch_size)
    y = torch.as_tensor(labels)
    obs = _to_tensors(observed)
    gen = torch.Generator().manual_seed(seed)
    best: tuple[float, np.ndarray] | None = None
    for _ in range(restarts):
        x = torch.rand((batch_size, image_side(model) ** 2), generator=gen, dtype=torch.float64)
        x.requires_grad_(True)
        opt = torch.optim.Adam([x], lr=step_size)
        milestones = [int(iterations * f) for f in (3 / 8, 5 / 8, 7 / 8)]
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=milestones, gamma=0.1)
        for _ in range(iterations):
            opt.zero_grad()
            sim = simulate_update(model, x, y, local_steps=local_steps, lr=lr, create_graph=True)
            loss = _cosine_match(sim, obs) + tv_weight * _total_variation(x, image_side(model))
            loss.backward()
            with torch.no_grad():
                x.grad.sign_()  # type: ignore[union-attr]
            opt.step()
            sched.step()
            with torch.no_grad():
                x.clamp_(0.0, 1.0)
        sim = simulate_update(model, x, y, local_steps=local_steps, lr=lr, create_graph=True)
        final = float((_cosine_match(sim, obs) + tv_weight * _total_variation(x, image_side(model))).detach())
        if best is None or final < best[0]:
            best = (final, x.detach().numpy().copy())
    assert best is not None  # restarts >= 1 was checked above
    images = best[1].reshape(batch_size, image_side(model), image_side(model))
    return Reconstruction(images=images, labels=labels, loss=best[0])


def analytic_attack(
    model: nn.Module, observed: Sequence[np.ndarray], *, batch_size: int
) -> Reconstruction:
    """Closed-form inversion of a first dense layer with bias: ``x = (dL/dW_i) / (dL/db_i)``.

    For one image the least-squares combination over all neurons ``sum_i g_i G_i / sum_i g_i^2``.
    For a sum of several images (secure aggregation) each neuron's ratio is a weighted mixture of the
    images that activate it; we return the ratios of the ``batch_size`` neurons with the largest |g_i|
    that differ from one another (distinct mixtures), the best the single-layer attack can do without
    a malicious model. Labels come from :func:`infer_labels`.
    """
    names = [k for k, _ in model.named_parameters()]
    if len(names) < 2 or not names[1].endswith("bias") or observed[0].ndim != 2:
        raise ValueError("the analytic attack needs a model whose first layer is dense with a bias")
    gw = np.asarray(observed[0], dtype=np.float64)
    gb = np.asarray(observed[1], dtype=np.float64)
    labels = infer_labels(model, observed, batch_size=batch_size)
    denom = float(np.sum(gb**2))
    if denom == 0.0:
        images = np.full((batch_size, gw.shape[1]), 0.5)
        return Reconstruction(
            images=images.reshape(batch_size, image_side(model), image_side(model)), labels=labels, loss=math.inf
        )
    if batch_size == 1:
        x = (gb @ gw) / denom
        images = x[None, :]
    else:
        chosen: list[np.ndarray] = []
        for i in np.argsort(-np.abs(gb)):
            if abs(gb[i]) < 1e-12 * math.sqrt(denom):
                break
            cand = gw[i] / gb[i]
            if all(np.mean((cand - c) ** 2) > 1e-6 for c in chosen):
                chosen.append(cand)
            if len(chosen) == batch_size:
                break
        while len(chosen) < batch_size:
            chosen.append(np.full(gw.shape[1], 0.5))
        images = np.stack(chosen)
    out = np.clip(images, 0.0, 1.0).reshape(batch_size, image_side(model), image_side(model))
    return Reconstruction(images=out, labels=labels, loss=0.0)
