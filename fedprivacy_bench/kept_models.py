"""A benchmark row's final global model, kept for the attacks (``--keep-models DIR``).

The membership-inference scripts attack the very models on the accuracy-ε curve: a fedprivacy row run
with ``keep_dir`` leaves, per row, three files named by the spec's :meth:`BenchSpec.key` (format
``fedprivacy-bench/model-v1``):

* ``<key>.npz``: the final global model (the run's last checkpoint, round T, after the server step: the
  model whose test accuracy the row reports), arrays ``arr_0 .. arr_{k-1}`` in ``state_dict`` order (the
  convention of ``fedprivacy.fl.checkpoint``; ``fedprivacy.ml.set_weights`` loads them);
* ``<key>.partition.npz``: ``lengths`` (one per client) and ``flat``: client k's example indices into the
  training split are ``flat[sum(lengths[:k]):sum(lengths[:k + 1])]``, the exact partition the run used;
* ``<key>.json``: the sidecar (the row's σ, q, T, ε, seed, accuracy, the model's shapes, the spec, and
  who the members are: :data:`MEMBERS`).

:func:`load_kept_model` rebuilds the torch model with the weights and the partition from the sidecar.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedprivacy_bench.spec import BenchSpec

FORMAT = "fedprivacy-bench/model-v1"
MEMBERS = (
    "every training example belongs to exactly one client (the partition file); each round's cohort is "
    "Poisson(q) and not logged (fedprivacy keeps the counts private), so a client is a member with "
    "probability 1 - (1 - q)^T (sidecar 'p_client_never_sampled' is (1 - q)^T); non-members are the "
    "server's test set (fedprivacy_bench.task.test_split)."
)

HELD_OUT_MEMBERS = MEMBERS.replace(
    "non-members are the server's test set (fedprivacy_bench.task.test_split).",
    "non-members are the held-out official training images 48,000..59,999 "
    "(fedprivacy_bench.heldout.held_out_split) and the server's test set (fedprivacy_bench.task.test_split).")


def members_text(spec: BenchSpec) -> str:
    """Who the members and non-members of ``spec``'s model are (the sidecar's ``members``)."""
    from fedprivacy_bench import heldout

    return HELD_OUT_MEMBERS if spec.dataset == heldout.NAME else MEMBERS


__all__ = ["FORMAT", "HELD_OUT_MEMBERS", "KeptModel", "MEMBERS", "client_partitions", "keep_model",
           "load_kept_model", "members_text"]


@dataclass(frozen=True, slots=True, kw_only=True)
class KeptModel:
    """A kept row: its spec, the torch model with the final weights (eval mode), the clients' example
    indices into the training split, and the sidecar as written."""

    spec: BenchSpec
    model: Any
    partitions: tuple[np.ndarray, ...]
    meta: dict[str, Any]


def client_partitions(spec: BenchSpec) -> tuple[np.ndarray, ...]:
    """Each client's example indices into the training split, as the run's ClientApps load them."""
    from fedprivacy.ml.partition import _partitions_cached
    from fedprivacy_bench import task

    return _partitions_cached(task.data_spec_for(spec), spec.num_clients)


def keep_model(spec: BenchSpec, weights: list[np.ndarray], record: dict[str, Any], keep_dir: Path) -> Path:
    """Write the three files of ``spec``'s row into ``keep_dir``; returns the sidecar's path.

    Raises:
        ValueError: ``weights`` do not fit the spec's model (count or shapes).
    """
    from fedprivacy.ml import get_weights, set_weights
    from fedprivacy_bench import task

    model = task.model_for(spec)
    set_weights(model, weights)  # ValueError naming the mismatch
    keep_dir.mkdir(parents=True, exist_ok=True)
    stem = spec.key()
    np.savez(keep_dir / f"{stem}.npz", *get_weights(model))
    parts = client_partitions(spec)
    np.savez(keep_dir / f"{stem}.partition.npz",
             lengths=np.array([len(p) for p in parts], dtype=np.int64),
             flat=np.concatenate(parts).astype(np.int64))
    shape = task.model_shape(spec)
    meta = {
        "format": FORMAT,
        "weights": f"{stem}.npz",
        "partition": f"{stem}.partition.npz",
        "setup": spec.label,
        **{k: record.get(k) for k in ("mode", "seed", "rounds", "target_epsilon", "epsilon", "epsilon_note",
                                       "noise_multiplier", "clip_norm", "delta", "sample_rate",
                                       "num_clients", "clients_per_round", "test_accuracy",
                                       "accuracy_by_round")},
        "p_client_never_sampled": (1.0 - spec.sample_rate) ** spec.rounds,
        "model": {"name": spec.model, "hidden": spec.hidden, "input_shape": list(shape.input_shape),
                  "num_classes": shape.num_classes, "params": task.params_for(spec),
                  "state_dict_keys": list(model.state_dict()),
                  "shapes": [list(w.shape) for w in weights]},
        "data": {"dataset": spec.dataset, "partitioner": spec.partitioner, "seed": spec.seed,
                 "train_examples": int(sum(len(p) for p in parts)),
                 "test_examples": len(task.test_split(spec))},
        "members": members_text(spec),
        "spec": spec.to_dict(),
    }
    path = keep_dir / f"{stem}.json"
    path.write_text(json.dumps(meta, indent=1, default=str))
    return path


def load_kept_model(sidecar: Path) -> KeptModel:
    """The kept row whose sidecar is ``sidecar`` (see the module docstring).

    Raises:
        ValueError: not a ``fedprivacy-bench/model-v1`` sidecar, or its partition file is not the one
            the spec recomputes.
    """
    from fedprivacy.ml import set_weights
    from fedprivacy_bench import task

    meta = json.loads(Path(sidecar).read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"sidecar {sidecar}: format must be {FORMAT!r}, got {meta.get('format')!r}")
    spec = BenchSpec.from_dict(meta["spec"])
    folder = Path(sidecar).parent
    with np.load(folder / meta["weights"]) as z:
        weights = [z[f"arr_{i}"] for i in range(len(z.files))]
    with np.load(folder / meta["partition"]) as z:
        lengths, flat = z["lengths"], z["flat"]
    partitions = tuple(np.split(flat, np.cumsum(lengths)[:-1]))
    recomputed = client_partitions(spec)
    if len(recomputed) != len(partitions) or any(not np.array_equal(a, b)
                                                 for a, b in zip(recomputed, partitions, strict=True)):
        raise ValueError(f"sidecar {sidecar}: its partition file differs from the spec's partition")
    model = task.model_for(spec)
    set_weights(model, weights)
    model.eval()
    return KeptModel(spec=spec, model=model, partitions=partitions, meta=meta)
