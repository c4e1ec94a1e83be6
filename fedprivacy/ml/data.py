"""Data sets for federated simulations: the :class:`Split` value and the data-set registry.

Every data set returns ``(train, test)``: two :class:`Split` objects. The test split is the held-out set the
*server* keeps for evaluation; clients only ever see partitions of ``train`` (see
:mod:`fedprivacy.ml.partition`).

Stored shapes: images ``(N, C, H, W)`` float32 in ``[0, 1]``, vector data ``(N, D)`` float32, labels int64
in ``[0, num_classes)``; models reshape as they need. ``num_classes`` and the input shape of a model come
from the split (:attr:`Split.num_classes`, :attr:`Split.feature_shape`).

**The registry.** A data set is one module in :mod:`fedprivacy.ml.datasets` (or anywhere else) with a
loader decorated by :func:`register_dataset`; its options are a frozen, hashable dataclass (it may have
no fields)::

    @dataclass(frozen=True, slots=True, kw_only=True)
    class MyOptions:
        data_dir: str = field(default="", metadata={"config_key": "data-dir"})

    @register_dataset("my-data", options=MyOptions)
    def load_my_data(opts, *, name, seed, test_fraction, num_clients):
        return train, test

``metadata["config_key"]`` names the run-config key an option is read from
(:meth:`DatasetEntry.options_from`). Every lookup first imports all modules of
:mod:`fedprivacy.ml.datasets` (once), so registration never depends on import order.

Randomness here is *data generation and splitting*, not privacy noise: loaders use an explicitly seeded
``Generator(PCG64(seed))``, never numpy's global RNG. Nothing in this module needs to be secret.
Rationale: docs/CONFIGURATION.md, section "Shapes, seeds and partitions".
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

__all__ = [
    "Split",
    "DatasetEntry",
    "NoOptions",
    "register_dataset",
    "dataset_entry",
    "dataset_names",
    "load_dataset",
    "holdout_split",
    "check_fraction",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Split:
    """Examples and labels of one split or partition.

    Attributes:
        x: float32 features, ``(N, C, H, W)`` for images or ``(N, D)`` for vectors.
        y: int64 labels, ``(N,)``, in ``[0, num_classes)``.
        groups: optional int64 ``(N,)`` id of the client that owns each example (natural partition of
            a federated data set such as Synthetic or FEMNIST's writers); None for centralised data.
        num_classes: number of classes of the *data set* (not only those present in this split); 0 (the
            default) means ``max(y) + 1``, at least 2. Subsets keep it.
    """

    x: np.ndarray
    y: np.ndarray
    groups: np.ndarray | None = None
    num_classes: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.x, np.ndarray) or not isinstance(self.y, np.ndarray):
            raise TypeError(
                f"x and y must be numpy arrays, got {type(self.x).__name__}, {type(self.y).__name__}"
            )
        if self.x.dtype != np.float32:
            raise TypeError(f"x must be float32, got {self.x.dtype}")
        if self.y.dtype != np.int64:
            raise TypeError(f"y must be int64, got {self.y.dtype}")
        if self.y.ndim != 1 or self.x.ndim < 2 or self.x.shape[0] != self.y.shape[0]:
            raise ValueError(
                f"x must be (N, ...) and y (N,) with the same N, got {self.x.shape} and {self.y.shape}"
            )
        if self.groups is not None and (
            self.groups.dtype != np.int64 or self.groups.shape != self.y.shape
        ):
            raise ValueError(
                f"groups must be int64 of shape {self.y.shape}, got {self.groups.shape}"
            )
        if len(self.y) and int(self.y.min()) < 0:
            raise ValueError(f"y must be >= 0, got min {int(self.y.min())}")
        top = int(self.y.max()) + 1 if len(self.y) else 0
        if isinstance(self.num_classes, bool) or not isinstance(self.num_classes, int | np.integer):
            raise TypeError(f"num_classes must be an int, got {type(self.num_classes).__name__}")
        elif self.num_classes == 0:
            object.__setattr__(self, "num_classes", max(2, top))
        elif not max(2, top) <= self.num_classes:
            raise ValueError(
                f"num_classes must be >= 2 and > every label (max label {top - 1}), "
                f"got {self.num_classes}"
            )
        else:
            object.__setattr__(self, "num_classes", int(self.num_classes))

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def feature_shape(self) -> tuple[int, ...]:
        """Shape of one example, e.g. ``(1, 8, 8)`` or ``(60,)``."""
        return tuple(int(s) for s in self.x.shape[1:])

    def subset(self, indices: np.ndarray) -> Split:
        """A new Split with the examples at ``indices`` (copies), same ``num_classes``."""
        idx = np.asarray(indices, dtype=np.int64)
        return Split(
            x=self.x[idx],
            y=self.y[idx],
            groups=None if self.groups is None else self.groups[idx],
            num_classes=self.num_classes,
        )


# ----------------------------------------------------------------------------- the registry


@dataclass(frozen=True, slots=True, kw_only=True)
class NoOptions:
    """Options of a data set that takes none."""


class DatasetLoader(Protocol):
    def __call__(
        self, opts: Any, /, *, name: str, seed: int, test_fraction: float, num_clients: int
    ) -> tuple[Split, Split]: ...


class ClientLoader(Protocol):
    def __call__(
        self, opts: Any, /, *, seed: int, test_fraction: float, client_id: int
    ) -> tuple[Split, Split]: ...


class ClientSize(Protocol):
    def __call__(self, opts: Any, /, *, seed: int, test_fraction: float, client_id: int) -> int: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class DatasetEntry:
    """One registered data set.

    Attributes:
        name: the ``dataset`` value (for a prefix family such as ``"hf:"``, the prefix).
        loader: ``loader(opts, *, name, seed, test_fraction, num_clients) -> (train, test)``; ``name``
            is the full ``dataset`` value (e.g. ``"hf:ylecun/mnist"``).
        options: the frozen options dataclass (its fields' ``metadata["config_key"]`` name run-config
            keys).
        prefix: True if ``name`` is a prefix (``"hf:"`` matches ``"hf:<anything>"``).
        natural_partition: True if the train split's ``groups`` *are* the clients and must be used as
            the partition whatever ``partitioner`` says (Synthetic: generated per client).
        per_client: True if the data are generated per client, so ``num_clients`` changes the data.
        description: one line for ``dataset_names`` listings and errors.
        client_loader: for a data set generated lazily, ``client_loader(opts, *, seed, test_fraction,
            client_id) -> (train, test)`` of one client, a function of the seed and the id alone: a
            partition is made when a client is asked for and nothing exists for the others
            (:func:`fedprivacy.ml.partition.load_partition`). ``loader`` then gives the server's pool.
        client_size: optionally, the number of training examples ``client_loader`` would give, without
            making them (:func:`fedprivacy.ml.partition.partition_size`).
    """

    name: str
    loader: DatasetLoader
    options: type = NoOptions
    prefix: bool = False
    natural_partition: bool = False
    per_client: bool = False
    description: str = ""
    client_loader: ClientLoader | None = None
    client_size: ClientSize | None = None

    def options_from(self, get: Callable[[str, Any], Any] | Mapping[str, Any]) -> Any:
        """Build this data set's options from run-config keys.

        Args:
            get: ``get(config_key, default)`` or a mapping with kebab-case run-config keys. An option
                field whose key is missing takes its default.
        """
        getter = get.get if isinstance(get, Mapping) else get
        kwargs = {}
        for f in dataclasses.fields(self.options):
            key = f.metadata.get("config_key")
            if key is None:
                continue
            default = f.default if f.default is not dataclasses.MISSING else None
            value = getter(key, default)
            if value is not None:
                kwargs[f.name] = type(default)(value) if default is not None else value
        return self.options(**kwargs)


_REGISTRY: dict[str, DatasetEntry] = {}
_BUILTINS_LOADED = False
_BUILTINS_LOCK = threading.Lock()


def register_dataset(
    name: str,
    *,
    options: type = NoOptions,
    prefix: bool = False,
    natural_partition: bool = False,
    per_client: bool = False,
    description: str = "",
    client_loader: ClientLoader | None = None,
    client_size: ClientSize | None = None,
) -> Callable[[DatasetLoader], DatasetLoader]:
    """Register a data-set loader under ``name`` (a decorator; returns the loader unchanged).

    Raises:
        ValueError: ``name`` is empty or already registered, or ``options`` is not a frozen dataclass.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty str, got {name!r}")
    params = getattr(options, "__dataclass_params__", None)
    if params is None or not params.frozen:
        raise ValueError(f"options must be a frozen dataclass, got {options!r}")

    def decorator(loader: DatasetLoader) -> DatasetLoader:
        if name in _REGISTRY:
            raise ValueError(f"dataset {name!r} is already registered")
        _REGISTRY[name] = DatasetEntry(
            name=name,
            loader=loader,
            options=options,
            prefix=prefix,
            natural_partition=natural_partition,
            per_client=per_client,
            description=description,
            client_loader=client_loader,
            client_size=client_size,
        )
        return loader

    return decorator


def _load_builtins() -> None:
    """Import every module of :mod:`fedprivacy.ml.datasets` once (each registers its data set)."""
    global _BUILTINS_LOADED
    if _BUILTINS_LOADED:
        return
    with _BUILTINS_LOCK:
        if _BUILTINS_LOADED:
            return
        package = importlib.import_module("fedprivacy.ml.datasets")
        for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
            if not info.name.startswith("_"):
                importlib.import_module(f"{package.__name__}.{info.name}")
        _BUILTINS_LOADED = True


def dataset_names() -> tuple[str, ...]:
    """The registered ``dataset`` values, sorted (prefix families as ``"<prefix><name>"``)."""
    _load_builtins()
    return tuple(sorted(f"{e.name}<name>" if e.prefix else e.name for e in _REGISTRY.values()))


def dataset_entry(name: str) -> DatasetEntry:
    """The registry entry of ``dataset`` value ``name``.

    Raises:
        TypeError: ``name`` is not a str.
        ValueError: no data set of that name (the message lists the registered ones).
    """
    if not isinstance(name, str):
        raise TypeError(f"dataset must be a str, got {type(name).__name__}")
    _load_builtins()
    entry = _REGISTRY.get(name)
    if entry is not None and not entry.prefix:
        return entry
    for e in _REGISTRY.values():
        if e.prefix and name.startswith(e.name) and len(name) > len(e.name):
            return e
    raise ValueError(f"dataset must be one of {', '.join(dataset_names())}; got {name!r}")


# ----------------------------------------------------------------------------- helpers for loaders


def check_fraction(test_fraction: float) -> None:
    """Raise ValueError unless ``test_fraction`` is in (0, 1)."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")


def holdout_split(split: Split, *, seed: int, test_fraction: float) -> tuple[Split, Split]:
    """Hold out a seeded random ``test_fraction`` of ``split`` (for data sets without a test split)."""
    check_fraction(test_fraction)
    rng = np.random.Generator(np.random.PCG64(seed))
    perm = rng.permutation(len(split))
    n_test = min(max(1, int(round(test_fraction * len(split)))), len(split) - 1)
    return split.subset(np.sort(perm[n_test:])), split.subset(np.sort(perm[:n_test]))


def _readonly(split: Split) -> Split:
    """Freeze the arrays of a cached split so that callers cannot corrupt the cache."""
    for arr in (split.x, split.y, split.groups):
        if arr is not None:
            arr.setflags(write=False)
    return split


@functools.lru_cache(maxsize=8)
def _load_cached(
    name: str, seed: int, test_fraction: float, num_clients: int, opts: Any
) -> tuple[Split, Split]:
    entry = dataset_entry(name)
    train, test = entry.loader(
        opts, name=name, seed=seed, test_fraction=test_fraction, num_clients=num_clients
    )
    if train.num_classes != test.num_classes:
        k = max(train.num_classes, test.num_classes)
        train = Split(x=train.x, y=train.y, groups=train.groups, num_classes=k)
        test = Split(x=test.x, y=test.y, groups=test.groups, num_classes=k)
    return _readonly(train), _readonly(test)


def load_dataset(
    name: str,
    *,
    seed: int,
    test_fraction: float,
    num_clients: int = 1,
    options: Any = None,
    **kw: Any,
) -> tuple[Split, Split]:
    """Load a registered data set as ``(train, test)``; cached per process, arrays read-only.

    Args:
        name: a registered ``dataset`` value (:func:`dataset_names`), e.g. ``"digits"``,
            ``"fashion-mnist"``, ``"synthetic"``, ``"hf:ylecun/mnist"``.
        seed: data seed (split / generation); deterministic across processes.
        test_fraction: fraction held out for the server's test set, in (0, 1) (data sets with an
            official test split, such as Fashion-MNIST, use that instead).
        num_clients: number of clients to generate (``per_client`` data sets only; ignored otherwise).
        options: an instance of the data set's options dataclass; None = defaults updated by ``kw``.
        **kw: option fields by name (e.g. ``alpha=0.5`` for synthetic, ``data_dir=...``).

    Returns:
        ``(train, test)`` Splits with the same ``num_classes``. Their arrays are shared by the cache and
        read-only: copy before modifying.
    """
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    check_fraction(test_fraction)
    entry = dataset_entry(name)
    if options is None:
        try:
            options = entry.options(**kw)
        except TypeError as exc:
            known = [f.name for f in dataclasses.fields(entry.options)]
            raise ValueError(
                f"dataset {name!r} takes the options {known or 'none'}, got {sorted(kw)}"
            ) from exc
    elif kw:
        raise ValueError("pass options= or option keywords, not both")
    elif not isinstance(options, entry.options):
        raise TypeError(
            f"options must be {entry.options.__name__} for dataset {name!r}, "
            f"got {type(options).__name__}"
        )
    if not entry.per_client:
        num_clients = 1
    return _load_cached(name, int(seed), float(test_fraction), int(num_clients), options)


_COMPAT = {
    "SYNTHETIC_DIM": "synthetic",
    "SYNTHETIC_CLASSES": "synthetic",
    "make_synthetic": "synthetic",
    "load_digits_split": "digits",
    "load_hf_split": "hf",
}


def __getattr__(attr: str) -> Any:
    """Names that moved to :mod:`fedprivacy.ml.datasets` modules, still importable from here."""
    module = _COMPAT.get(attr)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
    return getattr(importlib.import_module(f"fedprivacy.ml.datasets.{module}"), attr)
