"""The gradient-leakage victims: small models of the data the attacks reconstruct, and the update one
client sends (a FedSGD gradient or a FedAvg model difference after K local steps).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

if TYPE_CHECKING:
    pass

NUM_CLASSES = 10
IMAGE_SIDE = 8  # the default victims' input: 8x8 digits; side=28 for Fashion-MNIST


def image_side(model: nn.Module) -> int:
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


def simulate_update(
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
    upd = simulate_update(model, x, y, local_steps=local_steps, lr=lr, create_graph=False)
    return [u.detach().numpy().copy() for u in upd]
