"""What one sampled client does in a DP-FedAvg round (pure; the ClientApp only decodes and encodes).

1. start from the global weights, train locally (:func:`fedprivacy.ml.train_local`, optionally DP-SGD);
2. Δ = w_local − w_global, clipped to global L2 norm ``C`` (:func:`fedprivacy.dp.clip_arrays`);
3. add the noise of the client mechanism the instructions name (:mod:`fedprivacy.fl.mechanisms`,
   resolved in this process's registry), from its own :class:`RandomSource`;
4. reply with Δ and, only when it adds no noise of its own (the server sees the update as it is), the
   number of examples, the training loss and DP-SGD step counts. Raw update norms are never sent: they
   are not covered by ε.

Randomness: ``RandomSource.seeded(seed).child("client", partition_id, round)`` in research mode, a fresh
secure source otherwise; the torch seed of local training is drawn from it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from fedprivacy.fl.mechanisms import get_client_mechanism
from fedprivacy.fl.task import LocalResult
from fedprivacy.fl.types import ClientUpdate, Exchange, RoundInstructions

if TYPE_CHECKING:
    from fedprivacy.config import RunConfig
    from fedprivacy.dp.rng import RandomSource
    from fedprivacy.fl.byzantine import ByzantineSpec
    from fedprivacy.fl.mechanisms import ClientMechanism
    from fedprivacy.fl.scaffold import ClientControl


LocalTrainer = Callable[..., LocalResult]
"""``train(global weights, seed) -> LocalResult``: the ML step of one client's round (SCAFFOLD rounds
also pass ``correction=c − c_i``)."""


def client_rng(*, seed: int, partition_id: int, round: int) -> RandomSource:
    """The client's randomness for one round (seeded research mode, or secure)."""
    from fedprivacy.dp.rng import RandomSource

    root = RandomSource.seeded(seed) if seed >= 0 else RandomSource.secure()
    return root.child("client", partition_id, round)


def privatize_update(
    delta: Sequence[np.ndarray],
    *,
    clip_norm: float,
    mechanism: ClientMechanism | None,
    noise_multiplier: float,
    private: bool,
    rng: RandomSource,
) -> list[np.ndarray]:
    """Clip Δ to global L2 norm ``clip_norm`` (if > 0) and add ``mechanism``'s noise (if any).

    Clipping bounds any two released updates to ``2C`` apart, the sensitivity the mechanism's event
    accounts for.

    A non-finite Δ (local training diverged on this client's data) is a data-dependent event. Where the
    round is private or the client adds noise, an error reply or a dropout would disclose it outside ε,
    so Δ is replaced by zeros, a valid clipped update, and released with the same noise: the reply then
    has the law of a client whose update is 0. The client logs that locally; nothing in the reply says
    so. Without privacy it raises ValueError instead, so that the run reports the divergence.

    Returns float64 arrays.
    """
    from fedprivacy.dp.clipping import clip_arrays

    arrays = [np.asarray(a, dtype=np.float64) for a in delta]
    if (private or mechanism is not None) and not all(np.all(np.isfinite(a)) for a in arrays):
        logging.getLogger(__name__).warning(
            "this client's local update is not finite (training diverged): releasing a zero update "
            "with the mode's noise, so that the reply does not depend on it")
        arrays = [np.zeros_like(a) for a in arrays]
    if clip_norm > 0:
        clipped, _norm = clip_arrays(arrays, clip_norm=clip_norm)
        arrays = [np.asarray(a, dtype=np.float64) for a in clipped]
    elif not all(np.all(np.isfinite(a)) for a in arrays):
        raise ValueError("update contains NaN/Inf values")
    if mechanism is not None:
        if not clip_norm > 0:
            raise ValueError(f"client mechanism {mechanism.name!r} needs a clip norm > 0, got {clip_norm}")
        arrays = [np.asarray(a, dtype=np.float64)
                  for a in mechanism.privatize(arrays, clip_norm=clip_norm, noise_multiplier=noise_multiplier,
                                               rng=rng)]
    return arrays


def client_update(
    *,
    partition_id: int,
    weights: Sequence[np.ndarray],
    instructions: RoundInstructions,
    train: LocalTrainer,
    attack: ByzantineSpec | None = None,
    control: ClientControl | None = None,
) -> ClientUpdate:
    """The one client pipeline: train locally, Δ = w_local − w_global, privatise, disclose what the mode allows.

    ``train(weights, seed)`` is the ML step (:class:`fedprivacy.fl.task.LocalResult`); its seed is drawn
    from the client's :func:`client_rng`, and so is the local noise, so a seeded run repeats exactly.
    Used by the ClientApp (through :func:`train_client`), the in-process :func:`local_exchange`, the
    membership-inference targets and the benchmarks. ``attack``: a simulated Byzantine client
    (:mod:`fedprivacy.fl.byzantine`) sends a corruption of what it would release (``backdoor``: ``train``
    already trained on poisoned data, and Δ is boosted before the clip and the noise). In a SCAFFOLD round
    (``instructions.scaffold``) ``weights`` is ``x ++ c``, ``control`` holds this client's ``c_i`` (set
    to ``c_i+`` here) and the released vector is ``Δy ++ Δc``, clipped and noised as one.
    """
    rng = client_rng(seed=instructions.seed, partition_id=partition_id, round=instructions.round)
    seed = int(rng.child("train").integers(0, 2**31 - 1))
    if instructions.scaffold:
        delta, result = _scaffold_delta(weights, train, seed, instructions, control)
    else:
        result = train(weights, seed)
        delta = [np.asarray(w, dtype=np.float64) - np.asarray(g, dtype=np.float64)
                 for w, g in zip(result.weights, weights, strict=True)]
    byzantine = attack if attack is not None and attack.is_byzantine(partition_id) else None
    if byzantine is not None and byzantine.trains_poisoned:  # boosted, then clipped and noised as ever
        delta = [byzantine.factor * np.asarray(d, dtype=np.float64) for d in delta]
    mechanism = get_client_mechanism(instructions.client_mechanism)
    # a secure-only mechanism's noise goes into the encoded vector (fedprivacy.fl.secure.client), not here
    adds = None if mechanism is None or getattr(mechanism, "secure_only", False) else mechanism
    released = privatize_update(delta, clip_norm=instructions.clip_norm, mechanism=adds,
                                noise_multiplier=instructions.noise_multiplier, private=instructions.private,
                                rng=rng.child("noise"))
    if byzantine is not None and not byzantine.trains_poisoned:
        released = byzantine.corrupt(released, rng.child("byzantine"))
    trusted = mechanism is None  # the server sees this update as it is: its metadata adds little
    metrics: dict[str, float] = {}
    if trusted and result.dpsgd_steps is not None:
        metrics = {"dpsgd_steps": float(result.dpsgd_steps),
                   "dpsgd_sample_rate": float(result.dpsgd_sample_rate or 0.0)}
    return ClientUpdate(
        partition_id=partition_id,
        delta=tuple(a.astype(np.float32) for a in released),
        num_examples=result.num_examples if trusted else None,
        # with DP-SGD the example-level claim covers the noised update only: the un-noised training loss
        # is not sent beside it
        train_loss=result.loss if trusted and result.dpsgd_steps is None else None,
        metrics=metrics,
    )


def _scaffold_delta(arrays: Sequence[np.ndarray], train: LocalTrainer, seed: int,
                    instructions: RoundInstructions, control: ClientControl | None
                    ) -> tuple[list[np.ndarray], LocalResult]:
    """SCAFFOLD's local round (:mod:`fedprivacy.fl.scaffold`): train on ``x`` with ``c − c_i``, then
    ``Δy ++ Δc`` (not yet clipped) and ``control.value = c_i+``."""
    from fedprivacy.fl.scaffold import ClientControl, client_step, split_arrays

    if control is None:
        control = ClientControl()  # a client without state: c_i = 0 each round
    x, c = split_arrays(arrays)
    c_i = control.current(x)
    correction = [np.asarray(cc, dtype=np.float64) - ci for cc, ci in zip(c, c_i, strict=True)]
    result = train(x, seed, correction=correction)
    joint, new = client_step(x, c, c_i, result.weights, steps=result.steps,
                             learning_rate=instructions.learning_rate)
    kept = tuple(a.astype(np.float32) for a in new)
    if all(np.all(np.isfinite(a)) for a in kept):  # beyond float32's range: the old c_i stays
        control.value = kept
    return joint, result


def train_client(
    cfg: RunConfig,
    *,
    partition_id: int,
    num_partitions: int,
    weights: Sequence[np.ndarray],
    instructions: RoundInstructions,
    attack: ByzantineSpec | None = None,
    control: ClientControl | None = None,
) -> ClientUpdate:
    """One client's round on the configured model and data partition (:func:`client_update`)."""
    from fedprivacy.fl import task

    poison = attack.poison if attack is not None and attack.trains_poisoned and attack.is_byzantine(partition_id) \
        else None

    def train(w: Sequence[np.ndarray], seed: int, *, correction: Sequence[np.ndarray] | None = None
              ) -> LocalResult:
        return task.local_training(cfg, partition_id=partition_id, num_partitions=num_partitions,
                                   weights=w, instructions=instructions, seed=seed, correction=correction,
                                   poison=poison)

    return client_update(partition_id=partition_id, weights=weights, instructions=instructions, train=train,
                         attack=attack, control=control)


def local_exchange(cfg: RunConfig, *, population: int) -> Exchange:
    """An :data:`~fedprivacy.fl.types.Exchange` that runs the sampled clients in this process (no
    Flower): the same :func:`train_client` the ClientApp calls, for notebooks, tests and benchmarks.
    Each client's SCAFFOLD ``c_i`` is kept here, per partition id, as a client keeps it in its state."""
    from fedprivacy.fl.scaffold import ClientControl

    controls: dict[int, ClientControl] = {}

    def exchange(instr: RoundInstructions, cohort: Sequence[int], weights: Sequence[np.ndarray]
                 ) -> tuple[list[ClientUpdate], dict[int, str]]:
        updates = [train_client(cfg, partition_id=pid, num_partitions=population, weights=weights,
                                instructions=instr, control=controls.setdefault(pid, ClientControl()))
                   for pid in cohort]
        return updates, {}

    return exchange
