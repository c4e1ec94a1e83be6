"""Small models for federated simulations, the model registry, and weights as numpy arrays.

All models are Opacus-compatible (only ``Linear``, ``Conv2d``, ReLU and pooling: no BatchNorm, whose
statistics mix examples and break per-example gradients) and deterministic given ``seed``.

Models are registered by name (:func:`register_model`); the run config validates ``model`` against the
registry, and a new model is one decorated builder ``(input_shape, num_classes, hidden) -> nn.Module``.

Parameter counts (10 classes):

=====================  ===================================================  =========  ==========
name                   layers                                               input      parameters
=====================  ===================================================  =========  ==========
``mlp``, hidden=128    flatten -> 128 -> 10                                 1x8x8      9,610
``mlp-large``, h=288   flatten -> 288 -> 288 -> 10                          1x8x8      104,842
``mlp-large``, h=256   flatten -> 256 -> 256 -> 10                          1x8x8      85,002
``cnn``, c=32          conv3x3(16) -> conv3x3(32) -> maxpool2 -> fc         1x8x8      9,930
``convnet``, c=32      conv5x5(16) -> pool2 -> conv5x5(32) -> pool2 -> fc   1x28x28    28,938
``convnet``, c=16      conv5x5(8) -> pool2 -> conv5x5(16) -> pool2 -> fc    1x28x28    11,274
``convnet``, c=32      (same)                                               3x32x32    34,538
=====================  ===================================================  =========  ==========

``convnet`` is the shape of the FedAvg paper's CNN (McMahan et al. 2017, "Communication-Efficient
Learning of Deep Networks from Decentralized Data", section 3: two 5x5 conv + 2x2 max-pool blocks),
narrowed (16/32 channels, no 512-unit hidden layer: 29k instead of 1.66M parameters), because under DP
the noise grows with the square root of the dimension. It is the model of the Fashion-MNIST benchmark
(28x28) and works on CIFAR-10 (32x32x3).

Weights travel as ``list[np.ndarray]`` (float32, copies) in ``state_dict`` order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

__all__ = [
    "MODELS",
    "DEFAULT_HIDDEN",
    "ModelEntry",
    "register_model",
    "model_entry",
    "model_names",
    "build_model",
    "get_weights",
    "set_weights",
    "num_parameters",
]

ModelBuilder = Callable[[tuple[int, ...], int, int], nn.Module]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelEntry:
    """One registered model: ``builder(input_shape, num_classes, hidden) -> nn.Module``.

    Attributes:
        name: the ``model`` value.
        builder: builds an untrained model; raises ValueError naming ``input_shape`` if it cannot take it.
        default_hidden: the width used when ``hidden-units``/``hidden`` is not given.
        description: one line for listings.
        batched: the engine's ``batched-training=auto`` trains a cohort of this model as one
            computation (:mod:`fedprivacy.ml.batched`): set where that measured faster than per client.
    """

    name: str
    builder: ModelBuilder
    default_hidden: int
    description: str = ""
    batched: bool = False


_MODELS: dict[str, ModelEntry] = {}


def register_model(
    name: str, *, default_hidden: int, description: str = "", batched: bool = False
) -> Callable[[ModelBuilder], ModelBuilder]:
    """Register a model builder under ``name`` (a decorator; returns the builder unchanged).

    Raises:
        ValueError: ``name`` is empty or taken, or ``default_hidden`` < 1.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty str, got {name!r}")
    if default_hidden < 1:
        raise ValueError(f"default_hidden must be >= 1, got {default_hidden}")

    def decorator(builder: ModelBuilder) -> ModelBuilder:
        if name in _MODELS:
            raise ValueError(f"model {name!r} is already registered")
        _MODELS[name] = ModelEntry(
            name=name, builder=builder, default_hidden=default_hidden, description=description,
            batched=bool(batched),
        )
        return builder

    return decorator


def model_names() -> tuple[str, ...]:
    """The registered model names, in registration order."""
    return tuple(_MODELS)


def model_entry(name: str) -> ModelEntry:
    """The registry entry of ``name``; ValueError naming ``model`` and the registered ones."""
    entry = _MODELS.get(name) if isinstance(name, str) else None
    if entry is None:
        raise ValueError(f"model must be one of {', '.join(_MODELS)}; got {name!r}")
    return entry


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


class _ChannelsLastMaxPool(torch.autograd.Function):
    """``max_pool2d_with_indices`` of a channels-last copy of ``x``; returns a contiguous (NCHW) result.

    Max pooling selects, so the values are the input's own and the format cannot change them; torch's
    channels-last kernel picks the same element of each window as the NCHW kernel (the first maximum
    in row-major window order, or the last NaN: ``val > max || isnan(val)`` in both), and returns
    the same flat ``h * W + w`` indices. The backward is torch's own ``max_pool2d_with_indices_backward``
    on those indices (itself differentiable: the gradient-leakage attacks take second derivatives), so
    forward, gradient and double gradient equal ``F.max_pool2d``'s bit for bit
    (tests/ml/test_models_fast_pool.py). Why: for a batch of 10 at 28x28x16 the NCHW kernel costs
    ~0.7 ms, the copy plus the vectorised channels-last kernel ~0.2 ms; the two pools were ~16% of a
    ``convnet`` SGD step.
    """

    @staticmethod
    def forward(ctx: object, x: torch.Tensor, kernel: list[int], stride: list[int],
                padding: list[int], dilation: list[int], ceil_mode: bool) -> torch.Tensor:
        y, idx = torch.ops.aten.max_pool2d_with_indices(
            x.contiguous(memory_format=torch.channels_last), kernel, stride, padding, dilation, ceil_mode)
        ctx.save_for_backward(x, idx)  # type: ignore[attr-defined]
        ctx.args = (kernel, stride, padding, dilation, ceil_mode)  # type: ignore[attr-defined]
        return y.contiguous()

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, idx = ctx.saved_tensors  # type: ignore[attr-defined]
        grad_x = torch.ops.aten.max_pool2d_with_indices_backward(grad, x, *ctx.args, idx)  # type: ignore[attr-defined]
        return grad_x, None, None, None, None, None


def _pair(v: int | tuple[int, ...]) -> list[int]:
    return [int(v), int(v)] if isinstance(v, int) else [int(i) for i in v]


class MaxPool2d(nn.MaxPool2d):
    """``nn.MaxPool2d`` (same arguments, no state) that pools 4-d contiguous CPU float batches through a
    channels-last copy (:class:`_ChannelsLastMaxPool`): equal outputs and gradients, ~3-4x faster.
    Under ``torch.func`` transforms (the batched trainer) it is torch's own pool."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (self.return_indices or x.dim() != 4 or x.device.type != "cpu" or not x.is_contiguous()
                or x.dtype not in (torch.float32, torch.float64)
                or torch._C._are_functorch_transforms_active()):  # vmap/grad: torch's own pool
            return super().forward(x)
        stride = self.stride if self.stride is not None else self.kernel_size
        out: torch.Tensor = _ChannelsLastMaxPool.apply(
            x, _pair(self.kernel_size), _pair(stride), _pair(self.padding), _pair(self.dilation),
            bool(self.ceil_mode))
        return out


class ConvClassifier(nn.Module):
    """Convolutional ``features`` (ending in Flatten), then one linear classifier of ``features_dim`` inputs."""

    def __init__(self, *, features: nn.Sequential, features_dim: int, num_classes: int) -> None:
        super().__init__()
        self.features = features
        self.classifier = nn.Linear(features_dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def CNN(*, input_shape: tuple[int, int, int], num_classes: int, channels: int) -> ConvClassifier:
    """conv3x3(c/2) -> ReLU -> conv3x3(c) -> ReLU -> maxpool 2x2 -> linear classifier (c = ``channels``)."""
    c_in, h, w = input_shape
    features = nn.Sequential(
        nn.Conv2d(c_in, max(1, channels // 2), kernel_size=3, padding=1),
        nn.ReLU(),
        nn.Conv2d(max(1, channels // 2), channels, kernel_size=3, padding=1),
        nn.ReLU(),
        MaxPool2d(2),
        nn.Flatten(),
    )
    return ConvClassifier(
        features=features, features_dim=channels * (h // 2) * (w // 2), num_classes=num_classes
    )


def ConvNet(*, input_shape: tuple[int, int, int], num_classes: int, channels: int) -> ConvClassifier:
    """conv5x5(c/2) -> ReLU -> maxpool2 -> conv5x5(c) -> ReLU -> maxpool2 -> linear (c = ``channels``)."""
    c_in, h, w = input_shape
    features = nn.Sequential(
        nn.Conv2d(c_in, max(1, channels // 2), kernel_size=5, padding=2),
        nn.ReLU(),
        MaxPool2d(2),
        nn.Conv2d(max(1, channels // 2), channels, kernel_size=5, padding=2),
        nn.ReLU(),
        MaxPool2d(2),
        nn.Flatten(),
    )
    return ConvClassifier(
        features=features, features_dim=channels * (h // 4) * (w // 4), num_classes=num_classes
    )


def _image_shape(name: str, shape: tuple[int, ...], min_side: int) -> tuple[int, int, int]:
    if len(shape) != 3 or shape[1] < min_side or shape[2] < min_side:
        raise ValueError(
            f"model {name!r} needs image input (C, H, W) with H, W >= {min_side}, "
            f"got input_shape {shape}"
        )
    return shape[0], shape[1], shape[2]


@register_model("mlp", default_hidden=128, description="one hidden layer", batched=True)
def _mlp(shape: tuple[int, ...], num_classes: int, hidden: int) -> nn.Module:
    return MLP(in_features=math.prod(shape), num_classes=num_classes, hidden=hidden, depth=1)


@register_model("mlp-large", default_hidden=288, description="two hidden layers", batched=True)
def _mlp_large(shape: tuple[int, ...], num_classes: int, hidden: int) -> nn.Module:
    return MLP(in_features=math.prod(shape), num_classes=num_classes, hidden=hidden, depth=2)


@register_model("cnn", default_hidden=32, description="two 3x3 convs and one pool (8x8 digits)")
def _cnn(shape: tuple[int, ...], num_classes: int, hidden: int) -> nn.Module:
    return CNN(input_shape=_image_shape("cnn", shape, 2), num_classes=num_classes, channels=hidden)


@register_model(
    "convnet", default_hidden=32, description="two 5x5 conv + pool blocks (28x28, 32x32x3)"
)
def _convnet(shape: tuple[int, ...], num_classes: int, hidden: int) -> nn.Module:
    return ConvNet(
        input_shape=_image_shape("convnet", shape, 4), num_classes=num_classes, channels=hidden
    )


MODELS = model_names()  # the built-in models (kept for callers of the old constant)
DEFAULT_HIDDEN = {name: e.default_hidden for name, e in _MODELS.items()}


def build_model(
    name: str,
    *,
    input_shape: Sequence[int],
    num_classes: int,
    hidden: int | None = None,
    seed: int | None = None,
) -> nn.Module:
    """Build a registered model by name.

    Args:
        name: a registered model (:func:`model_names`): ``"mlp"``, ``"mlp-large"``, ``"cnn"``,
            ``"convnet"`` (see the module docstring).
        input_shape: shape of one example, e.g. ``(1, 28, 28)`` or ``(60,)``.
        num_classes: number of output classes (>= 2).
        hidden: hidden width (MLPs) or channels of the last conv (CNNs); None = the model's default.
        seed: torch seed of the initialisation (the global torch RNG state is left untouched); None
            draws from the global torch RNG.

    Returns:
        A ``torch.nn.Module`` mapping ``(N, *input_shape)`` float32 to ``(N, num_classes)`` logits.
    """
    entry = model_entry(name)
    shape = tuple(int(s) for s in input_shape)
    if not shape or min(shape) < 1:
        raise ValueError(f"input_shape must be non-empty and positive, got {input_shape}")
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    width = entry.default_hidden if hidden is None else int(hidden)
    if width < 1:
        raise ValueError(f"hidden must be >= 1, got {hidden}")
    if seed is None:
        return entry.builder(shape, int(num_classes), width)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return entry.builder(shape, int(num_classes), width)


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
