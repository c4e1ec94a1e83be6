"""Small models for federated simulations, and their weights as numpy arrays.

All models are Opacus-compatible (only ``Linear``, ``Conv2d``, ReLU and pooling: no BatchNorm, whose
statistics mix examples and break per-example gradients) and deterministic given ``seed``.

Parameter counts for digits (input ``(1, 8, 8)``, 10 classes):

======================  ===========================================  ==========
name                    layers                                       parameters
======================  ===========================================  ==========
``mlp``, hidden=128     64 -> 128 -> 10                              9,610
``mlp-large``, h=288    64 -> 288 -> 288 -> 10                       104,842
``mlp-large``, h=256    64 -> 256 -> 256 -> 10                       85,002
``cnn``                 conv3x3(16) -> conv3x3(32) -> maxpool2 -> fc 9,930
======================  ===========================================  ==========

Weights travel as ``list[np.ndarray]`` (float32, copies) in ``state_dict`` order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

__all__ = [
    "MODELS",
    "DEFAULT_HIDDEN",
    "build_model",
    "get_weights",
    "set_weights",
    "num_parameters",
]

MODELS = ("mlp", "mlp-large", "cnn")
DEFAULT_HIDDEN = {"mlp": 128, "mlp-large": 288, "cnn": 32}


class MLP(nn.Module):
    """Flatten, then Linear+ReLU layers of width ``hidden``, then a linear classifier."""

    def __init__(self, *, in_features: int, num_classes: int, hidden: int, depth: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CNN(nn.Module):
    """conv3x3(c/2) -> ReLU -> conv3x3(c) -> ReLU -> maxpool 2x2 -> linear classifier (c = ``channels``)."""

    def __init__(
        self, *, input_shape: tuple[int, int, int], num_classes: int, channels: int
    ) -> None:
        super().__init__()
        c_in, h, w = input_shape
        c1 = max(1, channels // 2)
        self.features = nn.Sequential(
            nn.Conv2d(c_in, c1, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv2d(c1, channels, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.classifier = nn.Linear(channels * (h // 2) * (w // 2), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def build_model(
    name: str,
    *,
    input_shape: Sequence[int],
    num_classes: int,
    hidden: int | None = None,
    seed: int | None = None,
) -> nn.Module:
    """Build a model by name.

    Args:
        name: ``"mlp"`` (one hidden layer), ``"mlp-large"`` (two hidden layers; ~100k parameters at the
            default width on digits) or ``"cnn"`` (needs image input ``(C, H, W)`` with H, W >= 2).
        input_shape: shape of one example, e.g. ``(1, 8, 8)`` or ``(60,)``.
        num_classes: number of output classes (>= 2).
        hidden: hidden width (MLPs) or channels of the second conv (CNN); None = ``DEFAULT_HIDDEN``.
        seed: torch seed of the initialisation (the global torch RNG state is left untouched); None
            draws from the global torch RNG.

    Returns:
        A ``torch.nn.Module`` mapping ``(N, *input_shape)`` float32 to ``(N, num_classes)`` logits.
    """
    if name not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {name!r}")
    shape = tuple(int(s) for s in input_shape)
    if not shape or min(shape) < 1:
        raise ValueError(f"input_shape must be non-empty and positive, got {input_shape}")
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    width = DEFAULT_HIDDEN[name] if hidden is None else int(hidden)
    if width < 1:
        raise ValueError(f"hidden must be >= 1, got {hidden}")

    def make() -> nn.Module:
        if name == "cnn":
            if len(shape) != 3 or shape[1] < 2 or shape[2] < 2:
                raise ValueError(
                    f"model 'cnn' needs image input (C, H, W), got input_shape {shape}"
                )
            return CNN(
                input_shape=(shape[0], shape[1], shape[2]), num_classes=num_classes, channels=width
            )
        depth = 1 if name == "mlp" else 2
        return MLP(in_features=math.prod(shape), num_classes=num_classes, hidden=width, depth=depth)

    if seed is None:
        return make()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()


def num_parameters(model: nn.Module) -> int:
    """Number of trainable scalar parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def get_weights(model: nn.Module) -> list[np.ndarray]:
    """The model's ``state_dict`` as float32 numpy copies, in ``state_dict`` order."""
    return [
        t.detach().cpu().numpy().astype(np.float32, copy=True) for t in model.state_dict().values()
    ]


def set_weights(model: nn.Module, weights: Sequence[np.ndarray]) -> None:
    """Load float arrays (``state_dict`` order) into the model, checking count and shapes.

    Raises:
        ValueError: wrong number of arrays, a shape mismatch or a non-finite value.
    """
    state = model.state_dict()  # detached tensors sharing storage with the model's parameters
    if len(weights) != len(state):
        raise ValueError(f"weights must hold {len(state)} arrays, got {len(weights)}")
    sources = []
    for (key, ref), arr in zip(state.items(), weights, strict=True):
        a = np.asarray(arr)
        if tuple(a.shape) != tuple(ref.shape):
            raise ValueError(
                f"weights for {key!r} must have shape {tuple(ref.shape)}, got {a.shape}"
            )
        if not np.all(np.isfinite(a)):
            raise ValueError(f"weights for {key!r} contain NaN or Inf")
        sources.append(torch.from_numpy(np.array(a, copy=True)).to(ref.dtype))
    with torch.no_grad():  # checked everything first: a rejected call leaves the model unchanged
        for ref, src in zip(state.values(), sources, strict=True):
            ref.copy_(src)
