"""The ML side of a round, behind one small seam (lazy imports: torch loads only when training).

Everything here calls :mod:`fedprivacy.ml`; the round logic in :mod:`fedprivacy.fl` never touches torch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fedprivacy.fl.types import ModelHooks, RoundInstructions

if TYPE_CHECKING:
    from fedprivacy.config import RunConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalResult:
    weights: list[np.ndarray]
    num_examples: int
    loss: float
    dpsgd_steps: int | None
    dpsgd_sample_rate: float | None
    steps: int = 0  # local optimizer steps (SCAFFOLD's K)


def default_hooks(cfg: RunConfig, *, population: int) -> ModelHooks:
    """Init and central evaluation of the configured model on the configured data's test set."""
    test = test_set(cfg, num_partitions=population)
    k = num_classes_for(cfg, num_partitions=population)
    return ModelHooks(
        init=lambda seed: initial_weights(cfg, input_shape=test.feature_shape, num_classes=k, seed=seed),
        evaluate=lambda w: evaluate_weights(cfg, w, test, num_classes=k),
        num_classes=k,
        dpsgd_schedule=functools.partial(dpsgd_schedule_of, cfg, num_partitions=population) if cfg.dpsgd else None,
    )


def dpsgd_schedule_of(cfg: RunConfig, partition_id: int, *, num_partitions: int) -> tuple[int, float]:
    """``(steps, sample rate)`` of the DP-SGD :func:`local_training` runs for ``partition_id`` in one
    round (:func:`fedprivacy.ml.train.dpsgd_schedule` of its partition's size and the run's
    ``local-epochs`` / ``batch-size``, which the round instructions carry)."""
    from fedprivacy.ml.partition import partition_size
    from fedprivacy.ml.train import dpsgd_schedule

    n = partition_size(cfg, partition_id, num_partitions)
    return dpsgd_schedule(num_examples=int(n), batch_size=cfg.batch_size, epochs=cfg.local_epochs)


def _torch_threads() -> None:
    import torch

    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


def test_set(cfg: RunConfig, *, num_partitions: int) -> Any:
    from fedprivacy.ml.partition import load_test_set

    return load_test_set(cfg, num_partitions)


def num_classes_for(cfg: RunConfig, *, num_partitions: int) -> int:
    """Number of classes of the configured data set (``Split.num_classes`` of its test set)."""
    from fedprivacy.ml.partition import load_test_set

    return int(load_test_set(cfg, num_partitions).num_classes)


def initial_weights(cfg: RunConfig, *, input_shape: Sequence[int], num_classes: int, seed: int) -> list[np.ndarray]:
    """Freshly initialised global model weights (torch init seeded by ``seed``)."""
    from fedprivacy.ml.models import build_model, get_weights

    _torch_threads()
    model = build_model(cfg.model, input_shape=input_shape, num_classes=num_classes,
                        hidden=cfg.hidden_units, seed=seed)
    return get_weights(model)


@functools.lru_cache(maxsize=4)
def _process_model(name: str, input_shape: tuple[int, ...], num_classes: int, hidden: int) -> Any:
    """One model object per process and architecture, reused by every client and evaluation here.

    Its initial weights never matter: every use loads the weights it works on in place first
    (``set_weights`` overwrites every parameter and buffer), and plain training draws only from its
    own seeded generator, so results are bit-identical to building a model per call (golden runs),
    at none of the cost (a build re-initialises every layer and reseeds torch: 3-9 ms per client at
    100k parameters). Not for DP-SGD: Opacus attaches hooks to the module it wraps. One
    client at a time per process (the engines run clients sequentially within a process).
    """
    from fedprivacy.ml.models import build_model

    return build_model(name, input_shape=input_shape, num_classes=num_classes, hidden=hidden, seed=0)


def _model_for(cfg: RunConfig, *, input_shape: Sequence[int], num_classes: int) -> Any:
    return _process_model(cfg.model, tuple(int(d) for d in input_shape), int(num_classes),
                          int(cfg.hidden_units))


def evaluate_weights(cfg: RunConfig, weights: Sequence[np.ndarray], split: Any, *, num_classes: int) -> tuple[float, float]:
    """(loss, accuracy) of ``weights`` on ``split``."""
    from fedprivacy.ml.models import set_weights
    from fedprivacy.ml.train import evaluate

    _torch_threads()
    model = _model_for(cfg, input_shape=split.feature_shape, num_classes=num_classes)
    set_weights(model, weights)
    loss, acc = evaluate(model, split)
    return float(loss), float(acc)


def local_training(
    cfg: RunConfig,
    *,
    partition_id: int,
    num_partitions: int,
    weights: Sequence[np.ndarray],
    instructions: RoundInstructions,
    seed: int,
    correction: Sequence[np.ndarray] | None = None,
    poison: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None,
) -> LocalResult:
    """Train the global model on this client's partition; DP-SGD when ``cfg.dpsgd``; ``correction``:
    SCAFFOLD's ``c − c_i`` added to every step's gradient (:mod:`fedprivacy.fl.scaffold`); ``poison``:
    a simulated backdoor client's ``(x, y) -> (x', y')`` of its partition (:mod:`fedprivacy.fl.byzantine`)."""
    from fedprivacy.ml.models import build_model, get_weights, set_weights
    from fedprivacy.ml.partition import load_partition
    from fedprivacy.ml.train import DpsgdConfig, train_local

    _torch_threads()
    split = load_partition(cfg, partition_id, num_partitions)
    if poison is not None:
        from fedprivacy.ml.data import Split

        x, y = poison(split.x, split.y)
        split = Split(x=x, y=y, num_classes=split.num_classes)
    if cfg.dpsgd:  # Opacus wraps (and hooks) the module: a fresh one per call
        model = build_model(cfg.model, input_shape=split.feature_shape,
                            num_classes=instructions.num_classes, hidden=cfg.hidden_units, seed=0)
    else:
        model = _model_for(cfg, input_shape=split.feature_shape, num_classes=instructions.num_classes)
    set_weights(model, weights)
    dpsgd = (
        DpsgdConfig(noise_multiplier=cfg.dpsgd_noise_multiplier, max_grad_norm=cfg.dpsgd_max_grad_norm,
                    delta=cfg.target_delta, backend=cfg.accountant)
        if cfg.dpsgd
        else None
    )
    # DP-SGD's noise and Poisson batches come from fedprivacy's RandomSource: a fresh
    # secure source in a secure run, the round's seed only in the seeded research mode.
    from fedprivacy.dp.rng import RandomSource

    rng = RandomSource.seeded(seed) if instructions.seed >= 0 else RandomSource.secure()
    res = train_local(model, split, epochs=instructions.local_epochs, lr=instructions.learning_rate,
                      batch_size=instructions.batch_size, seed=seed, dpsgd=dpsgd, rng=rng,
                      proximal_mu=instructions.proximal_mu, correction=correction)
    n = int(res.num_examples)
    steps = int(res.steps) if cfg.dpsgd else None
    rate = float(res.dpsgd_sample_rate) if (cfg.dpsgd and res.dpsgd_sample_rate is not None) else None
    return LocalResult(weights=get_weights(model), num_examples=n, loss=float(res.loss),
                       dpsgd_steps=steps, dpsgd_sample_rate=rate, steps=int(res.steps))


def batching_chosen(cfg: RunConfig) -> bool:
    """Whether ``batched-training`` asks for this run's plain-SGD clients to train as one computation:
    ``auto`` for the models the registry marks (measured faster batched), ``on`` for any model; never
    with DP-SGD (Opacus' per-example clipping stays per client)."""
    if cfg.batched_training == "off" or cfg.dpsgd or cfg.proximal_mu > 0 or cfg.scaffold:  # per client
        return False
    if cfg.batched_training == "on":
        return True
    from fedprivacy.ml.batched import batching_pays

    return batching_pays(cfg.model)


def local_training_batched(
    cfg: RunConfig,
    *,
    partition_ids: Sequence[int],
    num_partitions: int,
    weights: Sequence[np.ndarray],
    instructions: RoundInstructions,
    seeds: Sequence[int],
) -> list[LocalResult] | None:
    """:func:`local_training` of every client in ``partition_ids`` (plain SGD, one shared set of
    instructions and starting weights) as one vectorised computation on ``cfg.device``
    (:func:`fedprivacy.ml.batched.train_batched`); None when the model cannot be batched (buffers)."""
    from fedprivacy.ml.batched import can_batch, train_batched
    from fedprivacy.ml.models import set_weights
    from fedprivacy.ml.partition import load_partition

    if cfg.dpsgd:
        raise ValueError("dpsgd=true trains per client (Opacus); batched training is plain SGD only")
    _torch_threads()
    splits = [load_partition(cfg, int(pid), num_partitions) for pid in partition_ids]
    model = _model_for(cfg, input_shape=splits[0].feature_shape, num_classes=instructions.num_classes)
    if not can_batch(model):
        return None
    set_weights(model, weights)
    out = train_batched(model, splits, seeds=seeds, epochs=instructions.local_epochs,
                        lr=instructions.learning_rate, batch_size=instructions.batch_size, device=cfg.device)
    return [LocalResult(weights=r.weights, num_examples=r.num_examples, loss=r.loss, dpsgd_steps=None,
                        dpsgd_sample_rate=None) for r in out]
