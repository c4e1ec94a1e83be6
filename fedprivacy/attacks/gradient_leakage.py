"""Gradient leakage: reconstructing a client's training images from the update it sends.

Threat model: an honest-but-curious server. It follows the protocol, knows the global model it sent
(white-box), the loss, the number of local steps and the learning rate, and sees one update: a FedSGD
gradient (one step, learning rate 1) or a FedAvg model difference ``w_0 - w_K`` after K local
full-batch SGD steps. Under secure aggregation it sees only the sum of n clients' updates; under DP it
sees the clipped (and noised) update.

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

Defences are the shipped client steps: :func:`apply_defence` is
:func:`fedprivacy.fl.client.privatize_update` (clipping, Gaussian noise from a ``RandomSource``), and a
distributed-DP share goes through the ``ddgauss`` encoder (:func:`encoded_share`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

if TYPE_CHECKING:
    from fedprivacy.dp.rng import RandomSource

__all__ = [
    "ATTACKS",
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

NUM_CLASSES = 10
IMAGE_SIDE = 8  # the default victims' input: 8x8 digits; side=28 for Fashion-MNIST


def _side(model: nn.Module) -> int:
    """Side of the square grayscale images the victim takes."""
    return int(getattr(model, "side", IMAGE_SIDE))


class VictimLeNet(nn.Module):
    """The sigmoid LeNet of Zhu et al. 2019 (DLG, Fig. 3) on 1 x side x side inputs (side 8: 8,026
    parameters; side 28, Fashion-MNIST: 13,426).

    Smooth (sigmoid) activations make gradient matching well posed; ReLU networks are harder for DLG.
    """

    def __init__(self, side: int = IMAGE_SIDE) -> None:
        super().__init__()
        self.side = int(side)
        out = math.ceil(math.ceil(self.side / 2) / 2)  # two 5x5 stride-2 convolutions, padding 2
        self.body = nn.Sequential(
            nn.Conv2d(1, 12, kernel_size=5, padding=2, stride=2),
            nn.Sigmoid(),
            nn.Conv2d(12, 12, kernel_size=5, padding=2, stride=2),
            nn.Sigmoid(),
            nn.Conv2d(12, 12, kernel_size=5, padding=2, stride=1),
            nn.Sigmoid(),
        )
        self.fc = nn.Linear(12 * out * out, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(-1, 1, self.side, self.side)
        return self.fc(self.body(x).flatten(1))


class VictimMLP(nn.Module):
    """A two-layer ReLU MLP whose first layer is dense with a bias (target of the analytic attack)."""

    def __init__(self, hidden: int = 256, side: int = IMAGE_SIDE) -> None:
        super().__init__()
        self.side = int(side)
        self.fc1 = nn.Linear(self.side * self.side, hidden)
        self.fc2 = nn.Linear(hidden, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x.reshape(x.shape[0], -1))))


VICTIMS = ("lenet", "mlp")


def build_victim(name: str, *, seed: int, side: int = IMAGE_SIDE) -> nn.Module:
    """A float64 victim model for side x side images. "lenet": weights uniform in [-0.5, 0.5] as in
    the DLG reference code; "mlp": PyTorch's default initialisation."""
    gen = torch.Generator().manual_seed(seed)
    model: nn.Module
    if name == "lenet":
        model = VictimLeNet(side)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.rand(p.shape, generator=gen) - 0.5)
    elif name == "mlp":
        torch.manual_seed(seed)
        model = VictimMLP(side=side)
    else:
        raise ValueError(f"victim must be one of {VICTIMS}, got {name!r}")
    return model.double()


# ------------------------------------------------------------------------------------------ updates
def _soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy; ``target`` is either int labels or a (B, C) probability matrix."""
    if target.dtype in (torch.int64, torch.int32):
        return nn.functional.cross_entropy(logits, target)
    return -(target * torch.log_softmax(logits, dim=1)).sum(dim=1).mean()


def _simulate_update(
    model: nn.Module,
    x: torch.Tensor,
    target: torch.Tensor,
    *,
    local_steps: int,
    lr: float,
    create_graph: bool,
) -> list[torch.Tensor]:
    """``w_0 - w_K`` after K full-batch SGD steps on (x, target); differentiable in x and target."""
    start = {k: v.detach() for k, v in model.named_parameters()}
    current = {k: v.clone().requires_grad_(True) for k, v in start.items()}
    for _ in range(local_steps):
        loss = _soft_cross_entropy(functional_call(model, current, (x,)), target)
        grads = torch.autograd.grad(
            loss, list(current.values()), create_graph=create_graph, allow_unused=False
        )
        current = {k: v - lr * g for (k, v), g in zip(current.items(), grads, strict=True)}
    return [start[k] - current[k] for k in start]


def compute_update(
    model: nn.Module,
    images: np.ndarray,
    labels: np.ndarray,
    *,
    local_steps: int = 1,
    lr: float = 1.0,
) -> list[np.ndarray]:
    """The update a client sends: ``w_0 - w_K`` (for K=1, lr=1 this is the FedSGD gradient)."""
    if local_steps < 1:
        raise ValueError(f"local_steps must be >= 1, got {local_steps}")
    if lr <= 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    x = torch.as_tensor(np.asarray(images, dtype=np.float64))
    y = torch.as_tensor(np.asarray(labels, dtype=np.int64))
    upd = _simulate_update(model, x, y, local_steps=local_steps, lr=lr, create_graph=False)
    return [u.detach().numpy().copy() for u in upd]


def apply_defence(
    update: Sequence[np.ndarray],
    *,
    clip_norm: float | None,
    noise_std: float,
    rng: RandomSource | None,
) -> list[np.ndarray]:
    """Clip the whole update to L2 norm ``clip_norm`` (if given) and add N(0, noise_std^2) per coordinate.

    This is the shipped client step, :func:`fedprivacy.fl.client.privatize_update` (global-norm
    clipping, then local-mode Gaussian noise from ``rng``); never numpy's global RNG.
    """
    from fedprivacy.dp.rng import RandomSource
    from fedprivacy.fl.client import privatize_update

    if noise_std < 0:
        raise ValueError(f"noise_std must be >= 0, got {noise_std}")
    if noise_std > 0 and rng is None:
        raise ValueError("rng is required when noise_std > 0")
    clipped = privatize_update(update, clip_norm=clip_norm or 0.0, mechanism=None, noise_multiplier=0.0,
                               private=False, rng=rng if rng is not None else RandomSource.secure())
    if noise_std == 0:
        return clipped
    assert rng is not None
    return [a + rng.normal(std=noise_std, size=a.shape) for a in clipped]


def encoded_share(
    update: Sequence[np.ndarray],
    *,
    clip_norm: float,
    noise_multiplier: float,
    threshold: int,
    rng: RandomSource,
) -> list[np.ndarray]:
    """One client's distributed-DP share as the shipped client encodes it, decoded back to floats.

    The update is clipped to ``clip_norm`` (the client pipeline's
    :func:`fedprivacy.fl.client.privatize_update`) and encoded with the run's ``ddgauss``
    :class:`fedprivacy.secagg.encoding.EncodingSpec` for ``threshold`` survivors (Kairouz, Liu & Steinke
    2021: rotation, scaling, conditional rounding, ``N_Z(0, (zCs)^2/t)``, modular clipping); decoding
    that one vector is what a server that unmasked this client alone would see.
    """
    from fedprivacy.dp.clipping import flatten, unflatten
    from fedprivacy.fl.client import privatize_update
    from fedprivacy.secagg.encoding import largest_scale_encoding

    clipped = privatize_update(update, clip_norm=clip_norm, mechanism=None, noise_multiplier=0.0, private=False,
                               rng=rng)
    flat = flatten(clipped, dtype=np.float64)
    enc = largest_scale_encoding(kind="ddgauss", dim=int(flat.size), clip_norm=clip_norm,
                                 modulus_bits=32, population=threshold, noise_multiplier=noise_multiplier,
                                 threshold=threshold, rotation_seed=rng.child("rotation").random_bytes(32))
    decoded = enc.decode(enc.encode(flat, rng=rng.child("share")))
    return [np.asarray(a, dtype=np.float64) for a in unflatten(decoded, clipped)]


# ------------------------------------------------------------------------------------------ attacks
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
    dummy_x = torch.rand((batch_size, _side(model) ** 2), generator=gen, dtype=torch.float64)
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
        sim = _simulate_update(
            model, dummy_x, target(), local_steps=local_steps, lr=lr, create_graph=True
        )
        loss = match(sim, obs)
        loss.backward()
        return loss

    try:
        opt.step(closure)
    except RuntimeError:  # pragma: no cover - L-BFGS line search can fail on NaN; keep the iterate
        pass
    sim = _simulate_update(
        model, dummy_x, target(), local_steps=local_steps, lr=lr, create_graph=True
    )
    final = float(match(sim, obs).detach())
    guessed = (
        np.asarray(labels, dtype=np.int64)
        if dummy_y is None
        else torch.argmax(dummy_y.detach(), dim=1).numpy()
    )
    images = np.clip(dummy_x.detach().numpy().reshape(batch_size, _side(model), _side(model)), 0.0, 1.0)
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
        x = torch.rand((batch_size, _side(model) ** 2), generator=gen, dtype=torch.float64)
        x.requires_grad_(True)
        opt = torch.optim.Adam([x], lr=step_size)
        milestones = [int(iterations * f) for f in (3 / 8, 5 / 8, 7 / 8)]
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=milestones, gamma=0.1)
        for _ in range(iterations):
            opt.zero_grad()
            sim = _simulate_update(model, x, y, local_steps=local_steps, lr=lr, create_graph=True)
            loss = _cosine_match(sim, obs) + tv_weight * _total_variation(x, _side(model))
            loss.backward()
            with torch.no_grad():
                x.grad.sign_()  # type: ignore[union-attr]
            opt.step()
            sched.step()
            with torch.no_grad():
                x.clamp_(0.0, 1.0)
        sim = _simulate_update(model, x, y, local_steps=local_steps, lr=lr, create_graph=True)
        final = float((_cosine_match(sim, obs) + tv_weight * _total_variation(x, _side(model))).detach())
        if best is None or final < best[0]:
            best = (final, x.detach().numpy().copy())
    assert best is not None  # restarts >= 1 was checked above
    images = best[1].reshape(batch_size, _side(model), _side(model))
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
            images=images.reshape(batch_size, _side(model), _side(model)), labels=labels, loss=math.inf
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
    out = np.clip(images, 0.0, 1.0).reshape(batch_size, _side(model), _side(model))
    return Reconstruction(images=out, labels=labels, loss=0.0)


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
@dataclass(frozen=True, slots=True, kw_only=True)
class Defence:
    """What stands between a client's raw update and the server.

    ``clip_norm`` None means no clipping; the noise std is ``noise_multiplier * clip_norm``; the
    server sees the sum of ``clients`` updates (secure aggregation when > 1); ``local_steps``/``lr``
    describe the update (1 and 1.0: a FedSGD gradient). ``share_of = t > 0``: the update goes through
    the shipped distributed-DP client encoder (:class:`fedprivacy.secagg.encoding.EncodingSpec`,
    ``ddgauss``: rotation, scaling, rounding, discrete Gaussian of std ``noise_multiplier C / sqrt(t)``
    in scaled units) and the attacker sees that one client's decoded share, as a server that unmasked
    it would.
    """

    name: str
    clip_norm: float | None = None
    noise_multiplier: float = 0.0
    clients: int = 1
    local_steps: int = 1
    lr: float = 1.0
    share_of: int = 0

    def __post_init__(self) -> None:
        if self.clip_norm is not None and self.clip_norm <= 0:
            raise ValueError(f"clip_norm must be > 0, got {self.clip_norm}")
        if self.noise_multiplier < 0:
            raise ValueError(f"noise_multiplier must be >= 0, got {self.noise_multiplier}")
        if self.noise_multiplier > 0 and self.clip_norm is None:
            raise ValueError(
                "noise_multiplier > 0 needs a clip_norm (noise std = noise_multiplier * C)"
            )
        if self.share_of and (self.clip_norm is None or self.noise_multiplier <= 0 or self.share_of < 2):
            raise ValueError(f"share_of must be 0 or >= 2 with clip_norm and noise_multiplier > 0, got "
                             f"share_of={self.share_of}, clip_norm={self.clip_norm}, "
                             f"noise_multiplier={self.noise_multiplier}")
        if self.clients < 1 or self.local_steps < 1 or self.lr <= 0:
            raise ValueError(
                f"need clients >= 1, local_steps >= 1, lr > 0, got {self.clients}, "
                f"{self.local_steps}, {self.lr}"
            )


def default_defences(
    *,
    clip_norm: float = 1.0,
    noise_multipliers: Sequence[float] = (0.001, 0.01, 0.1, 1.0),
    distributed_clients: int = 10,
    distributed_central: Sequence[float] = (0.1, 1.0),
    fedavg_steps: int | None = 3,
    fedavg_lr: float = 0.1,
    secure_aggregation: bool = True,
) -> tuple[Defence, ...]:
    """The defence ladder of the script: none, a FedAvg update, clipping, clipping + noise, one
    client's share ``sigma / sqrt(n)`` of distributed-DP noise (through the shipped encoder), and a
    secure-aggregation sum. ``fedavg_steps=None`` leaves out the FedAvg row and
    ``secure_aggregation=False`` the sum of ``distributed_clients`` updates (the single-client ladder
    of the Fashion-MNIST run)."""
    out = [Defence(name="none")]
    if fedavg_steps is not None:
        out.append(Defence(name="none-fedavg", local_steps=fedavg_steps, lr=fedavg_lr))
    out.append(Defence(name="clip", clip_norm=clip_norm))
    out += [
        Defence(name=f"clip+noise(sigma={s:g})", clip_norm=clip_norm, noise_multiplier=s)
        for s in noise_multipliers
    ]
    out += [
        Defence(
            name=f"distributed-dp-share(n={distributed_clients},sigma={s:g})",
            clip_norm=clip_norm,
            noise_multiplier=s,
            share_of=distributed_clients,
        )
        for s in distributed_central
    ]
    if secure_aggregation:
        out.append(Defence(name=f"secagg-sum(n={distributed_clients})", clients=distributed_clients))
    return tuple(out)


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
