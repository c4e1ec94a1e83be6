"""Plain local SGD of many clients as one computation: ``torch.func`` over stacked client parameters.

:func:`train_batched` trains K copies of one model, each from the same starting weights on its own
partition, with ``vmap(grad_and_value(loss))`` over parameters stacked along a leading client axis
(``torch.func.functional_call``). Every client takes exactly the steps :func:`fedprivacy.ml.train.
train_local` takes: its own ``torch.Generator`` seeded as there, one ``randperm`` per epoch, batches of
``min(batch_size, n)`` in that order. Ragged partitions are padded to the largest batch and masked: a
padded example has weight 0, and a client whose steps are over gets a zero gradient, so its weights stay
exactly as its last real step left them. The loss of a step is the mean over its real examples, the
gradient that of :func:`torch.nn.functional.cross_entropy`'s mean. Results equal the per-client
loop's up to float rounding (batched matmuls sum in another order), not bit for bit.

Plain SGD only: DP-SGD clients keep Opacus' per-example clipping (the per-client path). Models with
buffers (batch norm) or without the ``batched`` mark of the model registry are not batched by the
engine's ``auto`` choice (:func:`batching_pays`). Overhead-bound models (the MLPs) gain several times
on CPU; compute-bound ones (the convnet) do not (docs/ENGINE.md gives the measured figures).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedprivacy.ml.data import Split

__all__ = ["BatchedResult", "batching_pays", "can_batch", "resolve_device", "train_batched"]

DEVICES = ("auto", "cpu", "cuda", "mps")


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchedResult:
    """One client's outcome of :func:`train_batched`.

    Attributes:
        weights: the trained weights, float32 numpy copies in ``state_dict`` order.
        num_examples: the client's training examples.
        loss: mean training loss over the client's last epoch.
        steps: SGD steps the client took (``epochs * ceil(n / min(batch_size, n))``).
    """

    weights: list[np.ndarray]
    num_examples: int
    loss: float
    steps: int


def device_available(device: str) -> bool:
    """Whether this torch build and machine have ``device`` (``"cpu"`` always)."""
    if device == "cuda":
        return bool(torch.cuda.is_available())
    if device == "mps":
        backend = getattr(torch.backends, "mps", None)
        return bool(backend is not None and backend.is_available())
    return device == "cpu"


def resolve_device(device: str) -> torch.device:
    """``"cpu"``, ``"cuda"`` or ``"mps"`` (ValueError naming ``device`` when this torch lacks it) or
    ``"auto"`` (CUDA, else MPS, when available; else CPU)."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}; got {device!r}")
    if device == "auto":
        return torch.device(next((d for d in ("cuda", "mps") if device_available(d)), "cpu"))
    if not device_available(device):
        raise ValueError(f"device={device!r} but this torch has no such device; use device='cpu' or 'auto'")
    return torch.device(device)


def can_batch(model: nn.Module) -> bool:
    """True when every parameter trains and the model has no buffers (batch norm statistics mix
    examples and clients; such models stay on the per-client path)."""
    return all(p.requires_grad for p in model.parameters()) and not list(model.buffers())


def batching_pays(model_name: str) -> bool:
    """Whether the registry marks ``model_name`` as faster batched than per client (measured)."""
    from fedprivacy.ml.models import model_entry

    return bool(model_entry(model_name).batched)


def _schedule(splits: Sequence[Split], *, seeds: Sequence[int], epochs: int, batch_size: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """Index (K, S, B) into the concatenated examples, example mask (K, S, B), last-epoch step mask
    (K, S) and steps per client: each client's batches exactly as ``train_local`` draws them."""
    plans: list[list[torch.Tensor]] = []
    last: list[tuple[int, int]] = []
    offset = 0
    for split, seed in zip(splits, seeds, strict=True):
        n = len(split)
        bs = min(batch_size, n)
        gen = torch.Generator()
        gen.manual_seed(int(seed) % (2**63))
        batches: list[torch.Tensor] = []
        for _ in range(epochs):
            perm = torch.randperm(n, generator=gen) + offset
            batches += [perm[s : s + bs] for s in range(0, n, bs)]
        per_epoch = math.ceil(n / bs)
        last.append(((epochs - 1) * per_epoch, epochs * per_epoch))
        plans.append(batches)
        offset += n
    k, s_max = len(plans), max(len(p) for p in plans)
    b_max = max(len(b) for p in plans for b in p)
    index = torch.zeros((k, s_max, b_max), dtype=torch.int64)
    mask = torch.zeros((k, s_max, b_max), dtype=torch.float32)
    last_epoch = torch.zeros((k, s_max), dtype=torch.float64)
    for c, batches in enumerate(plans):
        for s, b in enumerate(batches):
            index[c, s, : len(b)] = b
            mask[c, s, : len(b)] = 1.0
        last_epoch[c, last[c][0] : last[c][1]] = 1.0
    return index, mask, last_epoch, [len(p) for p in plans]


def _check(model: nn.Module, splits: Sequence[Split], seeds: Sequence[int], epochs: int, lr: float,
           batch_size: int) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not can_batch(model):
        raise ValueError("model has buffers or frozen parameters: train it per client (train_local)")
    if not splits:
        raise ValueError("splits must hold at least one client")
    if len(seeds) != len(splits):
        raise ValueError(f"seeds must hold one seed per split ({len(splits)}), got {len(seeds)}")
    for split in splits:
        if not isinstance(split, Split) or len(split) == 0:
            raise ValueError("every split must be a non-empty Split")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be an int >= 1, got {epochs}")
    if not (isinstance(lr, int | float) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be > 0, got {lr}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size}")


def train_batched(
    model: nn.Module,
    splits: Sequence[Split],
    *,
    seeds: Sequence[int],
    epochs: int = 1,
    lr: float = 0.1,
    batch_size: int = 32,
    device: str | torch.device = "cpu",
) -> list[BatchedResult]:
    """Train one copy of ``model`` per split with plain SGD, all clients in one vectorised computation.

    Args:
        model: the starting point of every client (left unchanged); no buffers (:func:`can_batch`).
        splits: each client's training examples.
        seeds: each client's shuffling seed, as ``train_local``'s ``seed``.
        epochs, lr, batch_size: as :func:`fedprivacy.ml.train.train_local` (plain SGD).
        device: where the computation runs (``"cpu"``, ``"cuda"``, ``"auto"`` or a ``torch.device``).

    Returns:
        One :class:`BatchedResult` per split, in order.
    """
    from torch.func import functional_call, grad_and_value, vmap

    _check(model, splits, seeds, epochs, lr, batch_size)
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    index, mask, last_epoch, steps = _schedule(splits, seeds=seeds, epochs=epochs, batch_size=batch_size)
    x = torch.from_numpy(np.concatenate([np.asarray(s.x) for s in splits])).to(dev)
    y = torch.from_numpy(np.concatenate([np.asarray(s.y) for s in splits])).to(dev)
    index, mask = index.to(dev), mask.to(dev)
    k = len(splits)
    names = [name for name, _ in model.named_parameters()]
    params = {name: p.detach().to(dev).unsqueeze(0).expand(k, *p.shape).clone()
              for name, p in model.named_parameters()}

    def loss_of(p: dict[str, torch.Tensor], xb: torch.Tensor, yb: torch.Tensor, mb: torch.Tensor
                ) -> torch.Tensor:
        per_example = nn.functional.cross_entropy(functional_call(model, p, (xb,)), yb, reduction="none")
        return (per_example * mb).sum() / mb.sum().clamp(min=1.0)

    step = vmap(grad_and_value(loss_of))
    losses = torch.zeros(last_epoch.shape, dtype=torch.float64)
    was_training = model.training
    model.train()
    try:
        for s in range(index.shape[1]):
            rows = index[:, s]
            grads, loss = step(params, x[rows], y[rows], mask[:, s])
            params = {name: params[name].add(grads[name], alpha=-lr) for name in names}
            losses[:, s] = loss.detach().to("cpu", torch.float64)
    finally:
        model.train(was_training)
    counts = mask.sum(dim=2).to("cpu", torch.float64)
    seen = (counts * last_epoch).sum(dim=1)
    loss_sums = (losses * counts * last_epoch).sum(dim=1)
    host = {name: t.detach().to("cpu") for name, t in params.items()}
    return [BatchedResult(
        weights=[host[name][c].numpy().astype(np.float32, copy=True) for name in names],
        num_examples=len(splits[c]), loss=float(loss_sums[c] / seen[c]), steps=steps[c],
    ) for c in range(k)]
