"""Several clients' rounds with their local training as one computation (``batched-training``).

Each client's round is :func:`fedprivacy.fl.client.client_update`, unchanged: its own
:func:`~fedprivacy.fl.client.client_rng`, the torch seed drawn from it, Δ, clipping, its own local noise,
what its mode discloses. Only the ML step is shared: the seeds of all clients are drawn first (the same
draw ``client_update`` makes: in the seeded research mode it is a function of (seed, partition, round),
checked again per client), then :func:`fedprivacy.fl.task.local_training_batched` trains the cohort, and
every client's ``client_update`` receives its own result. In the secure mode the seed comes from a fresh
secure source either way; the shuffling it drives is not privacy-relevant.

The clients of one call share the training instructions (epochs, learning rate, batch size, classes) and
the starting weights; the caller groups them (:func:`training_key`). A model that cannot be batched
(buffers) trains per client, said once in the log.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from fedprivacy.fl.client import LocalTrainer, client_rng, client_update, train_client
from fedprivacy.fl.task import LocalResult
from fedprivacy.fl.types import ClientUpdate, RoundInstructions

if TYPE_CHECKING:
    from fedprivacy.config import RunConfig

__all__ = ["train_clients", "training_key"]

_WARNED: set[str] = set()


def training_key(instructions: RoundInstructions) -> tuple[int, float, int, int]:
    """What local training reads from a client's instructions: clients with equal keys (and equal
    starting weights) can train as one computation."""
    return (instructions.local_epochs, instructions.learning_rate, instructions.batch_size,
            instructions.num_classes)


def _train_seed(instructions: RoundInstructions, partition_id: int) -> int:
    rng = client_rng(seed=instructions.seed, partition_id=partition_id, round=instructions.round)
    return int(rng.child("train").integers(0, 2**31 - 1))


def train_clients(
    cfg: RunConfig,
    *,
    partition_ids: Sequence[int],
    num_partitions: int,
    weights: Sequence[np.ndarray],
    instructions: Sequence[RoundInstructions],
) -> list[ClientUpdate]:
    """:func:`~fedprivacy.fl.client.train_client` of each ``(partition_ids[i], instructions[i])``, the
    local training of all of them batched (:mod:`fedprivacy.ml.batched`).

    Raises:
        ValueError: the instructions differ in what local training reads (:func:`training_key`).
    """
    if len(partition_ids) != len(instructions):
        raise ValueError(f"instructions must hold one entry per partition id ({len(partition_ids)}), "
                         f"got {len(instructions)}")
    if not partition_ids:
        return []
    if len({training_key(i) for i in instructions}) != 1:
        raise ValueError("instructions must agree on local-epochs, learning-rate, batch-size and classes")
    from fedprivacy.fl import task

    seeds = [_train_seed(i, int(pid)) for i, pid in zip(instructions, partition_ids, strict=True)]
    results = task.local_training_batched(cfg, partition_ids=partition_ids, num_partitions=num_partitions,
                                          weights=weights, instructions=instructions[0], seeds=seeds)
    if results is None:
        if cfg.model not in _WARNED:
            _WARNED.add(cfg.model)
            logging.getLogger(__name__).warning(
                "model %r has buffers (batch norm) and cannot be trained batched: per client", cfg.model)
        return [train_client(cfg, partition_id=int(pid), num_partitions=num_partitions, weights=weights,
                             instructions=i) for pid, i in zip(partition_ids, instructions, strict=True)]
    updates = []
    for pid, instr, seed, result in zip(partition_ids, instructions, seeds, results, strict=True):
        updates.append(client_update(partition_id=int(pid), weights=weights, instructions=instr,
                                     train=_trained(result, seed, seeded=instr.seed >= 0)))
    return updates


def _trained(result: LocalResult, seed: int, *, seeded: bool) -> LocalTrainer:
    def train(_weights: Sequence[np.ndarray], drawn: int) -> LocalResult:
        if seeded and drawn != seed:  # the batch drew another seed than client_update: never in order
            raise RuntimeError(f"batched training used seed {seed}, the client's round draws {drawn}")
        return result

    return train
