"""Partition a training split among simulated clients, with flwr-datasets' partitioners.

Partitioners (``partitioner=``):

* ``"iid"``: the training indices are permuted with the seed, then split into ``num_partitions``
  contiguous, near-equal shards (``flwr_datasets.partitioner.IidPartitioner``); any
  ``num_partitions <= len(train)`` works.
* ``"dirichlet"``: per class, proportions ~ Dirichlet(alpha) across partitions (Hsu et al. 2019,
  "Measuring the Effects of Non-Identical Data Distribution"), via ``DirichletPartitioner`` with
  ``self_balancing=False``. Every partition gets at least ``min_partition_size`` examples (default 1:
  a client with no data cannot train); flwr-datasets resamples up to 10 times and then raises.
* ``"pathological"``: each partition holds examples of ``classes_per_partition`` classes
  (McMahan et al. 2017's non-IID split), via ``PathologicalPartitioner``; every class is used.
* ``"natural"``: the data set's own clients (``Split.groups``, e.g. Synthetic's client k is partition
  k); ``num_partitions`` must equal the number of groups. :func:`load_partition` always uses it for
  ``"synthetic"`` (see :class:`DataSpec`).

Every training index lands in exactly one partition; a configuration that would leave an example out
or leave a partition empty raises ValueError. The result is deterministic given the seed (it is data
splitting, not privacy noise) and cached per process: a simulation asks for partition i many times.

A data set generated lazily (``DatasetEntry.client_loader``, e.g. ``"synthetic-lazy"``) has no split to
partition: partition k is its client k, made when asked for (a bounded per-process cache), never all
of them up front. Otherwise the partitioning is cached on disk (:mod:`fedprivacy.ml.diskcache`), keyed by a hash of everything the result
depends on; an entry is used only when its indices are a valid partition of the training split, else
it is recomputed and rewritten. Only indices are stored, never data.

Rationale: docs/CONFIGURATION.md, section "Shapes, seeds and partitions".
"""

from __future__ import annotations

import functools
import hashlib
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedprivacy.ml import diskcache
from fedprivacy.ml.data import Split, dataset_entry, load_dataset

__all__ = ["PARTITIONERS", "partition", "load_partition", "load_test_set", "partition_size", "partition_sizes",
           "DataSpec", "data_spec"]

PARTITIONERS = ("iid", "dirichlet", "pathological", "natural")


def _label_dataset(y: np.ndarray) -> Any:
    """A tiny ``datasets.Dataset`` with the labels and the original index of every example."""
    import datasets

    idx = np.arange(len(y), dtype=np.int64)
    # Arrow format: reading a partition's "idx" column as Arrow is ~3x faster than as Python lists
    # (600 Dirichlet partitions of Fashion-MNIST: 6.5 s against 18 s on a loaded machine).
    return datasets.Dataset.from_dict({"label": y[idx].tolist(), "idx": idx.tolist()}).with_format("arrow")


def _collect(partitioner: Any, num_partitions: int) -> list[np.ndarray]:
    out = []
    for pid in range(num_partitions):
        part = partitioner.load_partition(partition_id=pid)
        out.append(np.asarray(part["idx"].to_numpy(), dtype=np.int64))
    return out


def _natural_partition(groups: np.ndarray | None, num_partitions: int) -> list[np.ndarray]:
    """Partition k = the examples of the k-th natural client id (sorted), as ``NaturalIdPartitioner``."""
    if groups is None:
        raise ValueError(
            "partitioner 'natural' needs a data set with client ids (e.g. synthetic, or a Hugging Face "
            "data set with a writer_id column such as FEMNIST)"
        )
    ids = np.unique(groups)
    if len(ids) != num_partitions:
        raise ValueError(
            f"num_partitions must equal the data set's {len(ids)} natural clients for "
            f"partitioner 'natural', got {num_partitions}"
        )
    # flwr-datasets' NaturalIdPartitioner numbers the sorted unique ids 0..K-1 and gives partition k the
    # examples of id k in data order; this is the same partition (tests/ml/test_partition.py checks it
    # against NaturalIdPartitioner), computed with one stable argsort: NaturalIdPartitioner builds a
    # ``Dataset.select`` per partition, 12 s for Synthetic's 1000 clients against 5 ms here.
    order = np.argsort(groups, kind="stable").astype(np.int64)
    bounds = np.searchsorted(groups[order], ids[1:])
    return list(np.split(order, bounds))


def _partition_indices(
    y: np.ndarray,
    groups: np.ndarray | None,
    *,
    num_partitions: int,
    partitioner: str,
    seed: int,
    alpha: float,
    classes_per_partition: int,
    min_partition_size: int,
) -> list[np.ndarray]:
    if partitioner == "natural":
        return _natural_partition(groups, num_partitions)
    if partitioner == "iid":
        # IidPartitioner gives partition i the i-th contiguous shard (``Dataset.shard(contiguous=True)``)
        # of the permuted indices, which is ``np.array_split`` (tests/ml/test_partition.py checks it
        # against IidPartitioner); done in numpy because one ``shard`` per partition costs ~5 ms, 14 s
        # for Fashion-MNIST's 3000 clients in every process of a simulation.
        rng = np.random.Generator(np.random.PCG64(seed))
        return list(np.array_split(rng.permutation(len(y)).astype(np.int64), num_partitions))
    if partitioner == "dirichlet":
        p = _dirichlet(num_partitions=num_partitions, alpha=alpha, min_partition_size=min_partition_size,
                       seed=seed)
    elif partitioner == "pathological":
        p = _pathological(y, num_partitions=num_partitions, classes_per_partition=classes_per_partition,
                          seed=seed)
    else:
        raise ValueError(f"partitioner must be one of {PARTITIONERS}, got {partitioner!r}")
    p.dataset = _label_dataset(y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # flwr-datasets' resampling chatter
        parts = _collect(p, num_partitions)
    _check_covers(parts, n=len(y), partitioner=partitioner)
    return parts


# flwr_datasets is imported inside the two builders, not above: it (datasets, pandas, matplotlib) costs
# ~2.7 s of CPU, which the default IID partitioning never needs (command to the end of round 1)
def _dirichlet(*, num_partitions: int, alpha: float, min_partition_size: int, seed: int) -> Any:
    from flwr_datasets.partitioner import DirichletPartitioner

    if not alpha > 0:
        raise ValueError(f"alpha must be > 0 for partitioner 'dirichlet', got {alpha}")
    return DirichletPartitioner(
        num_partitions=num_partitions,
        partition_by="label",
        alpha=float(alpha),
        min_partition_size=min_partition_size,
        self_balancing=False,
        shuffle=True,
        seed=seed % (2**32),
    )


def _pathological(y: np.ndarray, *, num_partitions: int, classes_per_partition: int, seed: int) -> Any:
    from flwr_datasets.partitioner import PathologicalPartitioner

    num_classes = len(np.unique(y))
    if not 1 <= classes_per_partition <= num_classes:
        raise ValueError(
            f"classes_per_partition must be in [1, {num_classes}], got {classes_per_partition}"
        )
    if num_partitions >= num_classes:
        mode = "first-deterministic"
    elif num_partitions + classes_per_partition - 1 >= num_classes:
        mode = "deterministic"
    else:
        raise ValueError(
            f"pathological partitioning of {num_classes} classes into {num_partitions} partitions "
            f"of {classes_per_partition} classes would drop classes: need num_partitions + "
            f"classes_per_partition - 1 >= {num_classes}"
        )
    return PathologicalPartitioner(
        num_partitions=num_partitions,
        partition_by="label",
        num_classes_per_partition=classes_per_partition,
        class_assignment_mode=mode,
        shuffle=True,
        seed=seed % (2**32),
    )


def _check_covers(parts: list[np.ndarray], *, n: int, partitioner: str) -> None:
    """Every partition non-empty and every one of the ``n`` examples in exactly one partition."""
    sizes = np.array([len(q) for q in parts])
    if sizes.min(initial=1) < 1:
        raise ValueError(
            f"partitioner {partitioner!r} left {int((sizes == 0).sum())} of {len(parts)} "
            "partitions empty; use fewer partitions or a larger alpha / classes_per_partition"
        )
    covered = np.concatenate(parts) if parts else np.empty(0, np.int64)
    if len(covered) != n or len(np.unique(covered)) != n:
        raise ValueError(
            f"partitioner {partitioner!r} covered {len(np.unique(covered))} of {n} training examples"
        )


def partition(
    train: Split,
    *,
    num_partitions: int,
    partitioner: str = "iid",
    seed: int = 0,
    alpha: float = 0.5,
    classes_per_partition: int = 2,
    min_partition_size: int = 1,
) -> list[np.ndarray]:
    """Split the indices of ``train`` into ``num_partitions`` disjoint index arrays.

    Args:
        train: the training split.
        num_partitions: number of partitions, in [1, len(train)].
        partitioner: ``"iid"``, ``"dirichlet"``, ``"pathological"`` or ``"natural"`` (module docstring).
        seed: partitioning seed (deterministic; not privacy randomness).
        alpha: Dirichlet concentration (dirichlet only); small alpha = more skew.
        classes_per_partition: classes per partition (pathological only).
        min_partition_size: minimum examples per partition (dirichlet only), >= 1.

    Returns:
        A list of ``num_partitions`` int64 arrays of indices into ``train``; together they hold every
        index exactly once.
    """
    if isinstance(num_partitions, bool) or not isinstance(num_partitions, int | np.integer):
        raise TypeError(f"num_partitions must be an int, got {type(num_partitions).__name__}")
    if not 1 <= num_partitions <= len(train):
        raise ValueError(
            f"num_partitions must be in [1, {len(train)}] (one example each at most), "
            f"got {num_partitions}"
        )
    if min_partition_size < 1:
        raise ValueError(f"min_partition_size must be >= 1, got {min_partition_size}")
    return _partition_indices(
        train.y,
        train.groups,
        num_partitions=int(num_partitions),
        partitioner=partitioner,
        seed=int(seed),
        alpha=float(alpha),
        classes_per_partition=int(classes_per_partition),
        min_partition_size=int(min_partition_size),
    )


# ----------------------------------------------------------------------------- config-level helpers


@dataclass(frozen=True, slots=True, kw_only=True)
class DataSpec:
    """The data part of a run config (hashable: the cache key of the partitioning).

    ``partitioner`` applies to data sets without a natural partition; a data set registered with
    ``natural_partition=True`` (``"synthetic"``: partition k = generated client k) always uses it,
    whatever ``partitioner`` says, because pooling and re-splitting it would destroy the heterogeneity
    it exists for. ``options`` is the data set's own options value (see
    :func:`fedprivacy.ml.data.register_dataset`); None = its defaults.
    """

    dataset: str = "digits"
    seed: int = 0
    test_fraction: float = 0.2
    partitioner: str = "iid"
    dirichlet_alpha: float = 0.5
    classes_per_partition: int = 2
    min_partition_size: int = 1
    options: Any = None

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {self.seed!r}")
        entry = dataset_entry(self.dataset)
        if self.options is None:
            object.__setattr__(self, "options", entry.options())
        elif not isinstance(self.options, entry.options):
            raise TypeError(
                f"options must be {entry.options.__name__} for dataset {self.dataset!r}, "
                f"got {type(self.options).__name__}"
            )
        if self.min_partition_size < 1:
            raise ValueError(f"min_partition_size must be >= 1, got {self.min_partition_size}")


def data_spec(cfg: Any) -> DataSpec:
    """Extract a :class:`DataSpec` from a run config (any object with the attributes below).

    Reads ``dataset``, ``data_seed`` (else ``seed``), ``test_fraction``, ``partitioner``,
    ``dirichlet_alpha``, ``classes_per_partition``, ``min_partition_size`` and the data set's own
    option keys (snake_case attributes of their ``config_key``, e.g. ``synthetic_alpha``,
    ``data_dir``); a missing attribute takes the default. A seed that is None or negative
    (RunConfig's ``seed = -1``, secure mode) becomes data seed 0: every client process must derive the
    *same* split and partition, and the data split is not privacy randomness.
    """
    if isinstance(cfg, DataSpec):
        return cfg
    defaults = DataSpec()
    seed = getattr(cfg, "data_seed", None)
    if seed is None:
        seed = getattr(cfg, "seed", None)
    dataset = str(getattr(cfg, "dataset", defaults.dataset))
    entry = dataset_entry(dataset)
    return DataSpec(
        dataset=dataset,
        seed=0 if seed is None or int(seed) < 0 else int(seed),
        test_fraction=float(getattr(cfg, "test_fraction", defaults.test_fraction)),
        partitioner=str(getattr(cfg, "partitioner", defaults.partitioner)),
        dirichlet_alpha=float(getattr(cfg, "dirichlet_alpha", defaults.dirichlet_alpha)),
        classes_per_partition=int(
            getattr(cfg, "classes_per_partition", defaults.classes_per_partition)
        ),
        min_partition_size=int(getattr(cfg, "min_partition_size", defaults.min_partition_size)),
        options=entry.options_from(lambda key, default: getattr(cfg, key.replace("-", "_"), default)),
    )


def _splits(spec: DataSpec, num_partitions: int) -> tuple[Split, Split]:
    return load_dataset(
        spec.dataset,
        seed=spec.seed,
        test_fraction=spec.test_fraction,
        num_clients=num_partitions,
        options=spec.options,
    )


_CACHE_FORMAT = b"fedprivacy/partitions/v1"


def _partition_key(spec: DataSpec, num_partitions: int, partitioner: str, train: Split) -> str:
    h = hashlib.sha256(_CACHE_FORMAT)
    fields = (spec.dataset, spec.seed, spec.test_fraction, partitioner, spec.dirichlet_alpha,
              spec.classes_per_partition, spec.min_partition_size, repr(spec.options), num_partitions,
              np.__version__, diskcache.package_version("flwr-datasets")
              if partitioner in ("dirichlet", "pathological") else "")
    h.update(repr(fields).encode())
    h.update(np.ascontiguousarray(train.y).tobytes())
    if train.groups is not None:
        h.update(b"groups" + np.ascontiguousarray(train.groups).tobytes())
    return h.hexdigest()


def _valid_partition(stored: dict[str, np.ndarray] | None, *, num_partitions: int,
                     size: int) -> list[np.ndarray] | None:
    """The partitions in a cache entry, if they are ``num_partitions`` disjoint index sets of ``size``."""
    if stored is None or set(stored) != {"lengths", "flat"}:
        return None
    lengths, flat = stored["lengths"], stored["flat"]
    if (lengths.shape != (num_partitions,) or lengths.dtype.kind not in "iu" or flat.ndim != 1
            or flat.dtype.kind not in "iu" or int(lengths.sum()) != flat.size
            or int(lengths.min(initial=0)) < 0
            or (flat.size and (int(flat.min()) < 0 or int(flat.max()) >= size))
            or np.unique(flat).size != flat.size):
        return None
    return [p.astype(np.int64) for p in np.split(flat, np.cumsum(lengths)[:-1])]


@functools.lru_cache(maxsize=8)
def _partitions_cached(spec: DataSpec, num_partitions: int) -> tuple[np.ndarray, ...]:
    train, _ = _splits(spec, num_partitions)
    partitioner = "natural" if dataset_entry(spec.dataset).natural_partition else spec.partitioner
    key = _partition_key(spec, num_partitions, partitioner, train)
    parts = _valid_partition(diskcache.read("partitions", key), num_partitions=num_partitions,
                             size=len(train))
    if parts is None:
        parts = partition(
            train,
            num_partitions=num_partitions,
            partitioner=partitioner,
            seed=spec.seed,
            alpha=spec.dirichlet_alpha,
            classes_per_partition=spec.classes_per_partition,
            min_partition_size=spec.min_partition_size,
        )
        diskcache.write("partitions", key, {
            "lengths": np.array([len(p) for p in parts], dtype=np.int64),
            "flat": np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)})
    for part in parts:
        part.setflags(write=False)
    return tuple(parts)


def load_partition(cfg: Any, partition_id: int, num_partitions: int) -> Split:
    """The training data of client ``partition_id`` out of ``num_partitions`` (cached per process).

    Args:
        cfg: a run config or :class:`DataSpec` (see :func:`data_spec` for the attributes read).
        partition_id: in [0, num_partitions).
        num_partitions: total number of partitions (for synthetic: the number of generated clients).
    """
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition_id must be in [0, {num_partitions}), got {partition_id}")
    spec = data_spec(cfg)
    if dataset_entry(spec.dataset).client_loader is not None:
        cached = _lazy_client(spec, int(partition_id))
        return cached.subset(np.arange(len(cached)))  # a copy, as below: the cache stays intact
    train, _ = _splits(spec, num_partitions)
    return train.subset(_partitions_cached(spec, int(num_partitions))[partition_id])


def partition_sizes(cfg: Any, num_partitions: int) -> tuple[int, ...]:
    """The number of training examples of every partition (what :func:`load_partition` returns).

    For a lazily generated data set this asks every client: ask :func:`partition_size` for one.
    """
    spec = data_spec(cfg)
    if dataset_entry(spec.dataset).client_loader is not None:
        return tuple(partition_size(spec, pid, int(num_partitions)) for pid in range(int(num_partitions)))
    return tuple(len(p) for p in _partitions_cached(spec, int(num_partitions)))


def partition_size(cfg: Any, partition_id: int, num_partitions: int) -> int:
    """The number of training examples of partition ``partition_id`` (``partition_sizes(...)[id]``)."""
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition_id must be in [0, {num_partitions}), got {partition_id}")
    spec = data_spec(cfg)
    entry = dataset_entry(spec.dataset)
    if entry.client_size is not None:
        return int(entry.client_size(spec.options, seed=spec.seed, test_fraction=spec.test_fraction,
                                     client_id=int(partition_id)))
    if entry.client_loader is not None:
        return len(_lazy_client(spec, int(partition_id)))
    return len(_partitions_cached(spec, int(num_partitions))[partition_id])


LAZY_CACHE_CLIENTS = 1024  # lazily generated clients kept per process (Synthetic: <= 240 kB each)


@functools.lru_cache(maxsize=LAZY_CACHE_CLIENTS)
def _lazy_client(spec: DataSpec, client_id: int) -> Split:
    """Client ``client_id``'s training split of a lazily generated data set (read-only arrays)."""
    client_loader = dataset_entry(spec.dataset).client_loader
    assert client_loader is not None  # callers check
    train, _ = client_loader(spec.options, seed=spec.seed, test_fraction=spec.test_fraction,
                             client_id=client_id)
    for arr in (train.x, train.y, train.groups):
        if arr is not None:
            arr.setflags(write=False)
    return train


def load_test_set(cfg: Any, num_partitions: int = 1) -> Split:
    """The server's held-out test set (synthetic: pooled from ``num_partitions`` generated clients)."""
    spec = data_spec(cfg)
    return _splits(spec, num_partitions)[1]
