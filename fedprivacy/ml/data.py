"""Data sets for federated simulations: bundled digits, generated Synthetic(alpha, beta), Hugging Face.

Every loader returns ``(train, test)``: two :class:`Split` objects. The test split is the held-out set the
*server* keeps for evaluation; clients only ever see partitions of ``train`` (see
:mod:`fedprivacy.ml.partition`).

Canonical stored shapes: images are ``(N, C, H, W)`` float32 in ``[0, 1]`` (digits: ``(N, 1, 8, 8)``);
vector data is ``(N, D)`` float32 (synthetic: ``(N, 60)``). Labels are int64 in ``[0, num_classes)``.
Models reshape as they need (the MLP flattens).

Randomness here is *data generation and splitting*, not privacy noise: it uses numpy's
``Generator(PCG64(seed))`` seeded explicitly, never numpy's global RNG, so every process of a simulation
derives the same data from the same seed. Nothing in this module needs to be secret.

Data sets:

* ``"digits"``: scikit-learn's bundled handwritten digits (1797 8x8 images, 10 classes, pixel values
  0..16 scaled to [0, 1]). Held-out test split: stratified, ``test_fraction``, seeded.
* ``"synthetic"``: FedProx's Synthetic(alpha, beta) (Li et al. 2020, "Federated Optimization in
  Heterogeneous Networks", MLSys, section 5.1 and appendix C.1), generated per client; ``num_clients``
  clients, 60 features, 10 classes. Each client keeps ``test_fraction`` of its samples for the pooled
  server test set. ``Split.groups`` holds each example's client id (the natural partition).
* ``"hf:<name>"``: any Hugging Face image-classification data set through
  ``flwr_datasets.FederatedDataset`` (e.g. ``"hf:mnist"``, ``"hf:uoft-cs/cifar10"``). Needs internet
  access; offline it fails with a RuntimeError that says so. Not tested here.
"""

from __future__ import annotations

import functools
import os
import socket
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "Split",
    "load_dataset",
    "load_digits_split",
    "make_synthetic",
    "SYNTHETIC_DIM",
    "SYNTHETIC_CLASSES",
]

SYNTHETIC_DIM = 60
SYNTHETIC_CLASSES = 10


@dataclass(frozen=True, slots=True, kw_only=True)
class Split:
    """Examples and labels of one split or partition.

    Attributes:
        x: float32 features, ``(N, C, H, W)`` for images or ``(N, D)`` for vectors.
        y: int64 labels, ``(N,)``.
        groups: optional int64 ``(N,)`` id of the client that owns each example (natural partition of
            a federated data set such as Synthetic); None for centralised data.
    """

    x: np.ndarray
    y: np.ndarray
    groups: np.ndarray | None = None

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

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def feature_shape(self) -> tuple[int, ...]:
        """Shape of one example, e.g. ``(1, 8, 8)`` or ``(60,)``."""
        return tuple(int(s) for s in self.x.shape[1:])

    def subset(self, indices: np.ndarray) -> Split:
        """A new Split with the examples at ``indices`` (copies)."""
        idx = np.asarray(indices, dtype=np.int64)
        return Split(
            x=self.x[idx],
            y=self.y[idx],
            groups=None if self.groups is None else self.groups[idx],
        )


def _readonly(split: Split) -> Split:
    """Freeze the arrays of a cached split so that callers cannot corrupt the cache."""
    for arr in (split.x, split.y, split.groups):
        if arr is not None:
            arr.setflags(write=False)
    return split


def _check_fraction(test_fraction: float) -> None:
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")


def load_digits_split(*, seed: int, test_fraction: float) -> tuple[Split, Split]:
    """scikit-learn digits, scaled to [0, 1], stratified seeded train/test split.

    Args:
        seed: seed of the split (any int; the same seed gives the same split in every process).
        test_fraction: fraction of examples held out for the server's test set, in (0, 1).

    Returns:
        ``(train, test)`` with x of shape ``(N, 1, 8, 8)``, float32 in [0, 1], y int64 in [0, 10).
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    _check_fraction(test_fraction)
    bunch = load_digits()
    x = (np.asarray(bunch.images, dtype=np.float32) / np.float32(16.0)).reshape(-1, 1, 8, 8)
    y = np.asarray(bunch.target, dtype=np.int64)
    idx_train, idx_test = train_test_split(
        np.arange(len(y)), test_size=test_fraction, stratify=y, random_state=seed % (2**32)
    )
    idx_train = np.sort(idx_train)
    idx_test = np.sort(idx_test)
    return (
        Split(x=np.ascontiguousarray(x[idx_train]), y=y[idx_train]),
        Split(x=np.ascontiguousarray(x[idx_test]), y=y[idx_test]),
    )


def make_synthetic(
    *,
    num_clients: int,
    seed: int,
    test_fraction: float,
    alpha: float = 1.0,
    beta: float = 1.0,
    iid: bool = False,
    lognormal_mean: float = 4.0,
    lognormal_sigma: float = 2.0,
    min_samples: int = 50,
    max_samples: int | None = 1000,
) -> tuple[Split, Split]:
    """Generate FedProx's Synthetic(alpha, beta) federated data set.

    Li et al. 2020, "Federated Optimization in Heterogeneous Networks" (MLSys), section 5.1: for client
    k, ``u_k ~ N(0, alpha)``, ``W_k ~ N(u_k, 1)`` (10x60), ``b_k ~ N(u_k, 1)`` (10); ``B_k ~ N(0, beta)``,
    ``v_k ~ N(B_k, 1)`` (60); ``x ~ N(v_k, Sigma)`` with diagonal ``Sigma_jj = j^-1.2``; label
    ``y = argmax(softmax(W_k x + b_k))``. As in the authors' generator, ``N(0, alpha)`` uses alpha as
    the standard deviation, and the number of samples of client k is ``floor(LogNormal(4, 2)) + 50``
    (a power law). ``iid=True`` gives the paper's Synthetic-IID: one shared W, b and ``v = 0``.

    Deviation from the paper: client sizes are capped at ``max_samples`` (default 1000; None = no cap)
    so that a 1000-client set stays small; the paper's draw has a heavy tail (e^10 at 3 sigma).

    Args:
        num_clients: number of clients (>= 1).
        seed: generation seed; the same seed gives the same data in every process.
        test_fraction: fraction of *each client's* samples pooled into the server's test set.
        alpha: how much client models differ (std of u_k), >= 0.
        beta: how much client input distributions differ (std of B_k), >= 0.
        iid: Synthetic-IID variant (alpha and beta ignored).
        lognormal_mean, lognormal_sigma, min_samples, max_samples: client-size distribution.

    Returns:
        ``(train, test)``; x is ``(N, 60)`` float32, y int64 in [0, 10), ``groups`` the client id.
        Every client has at least one training and one test example.
    """
    if isinstance(num_clients, bool) or not isinstance(num_clients, int):
        raise TypeError(f"num_clients must be an int, got {type(num_clients).__name__}")
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    _check_fraction(test_fraction)
    if alpha < 0 or beta < 0:
        raise ValueError(f"alpha and beta must be >= 0, got alpha={alpha}, beta={beta}")
    if min_samples < 2:
        raise ValueError(f"min_samples must be >= 2, got {min_samples}")
    if max_samples is not None and max_samples < min_samples:
        raise ValueError(f"max_samples must be >= min_samples, got {max_samples}")

    rng = np.random.Generator(np.random.PCG64(seed))
    dim, classes = SYNTHETIC_DIM, SYNTHETIC_CLASSES
    sizes = (
        rng.lognormal(lognormal_mean, lognormal_sigma, num_clients).astype(np.int64) + min_samples
    )
    if max_samples is not None:
        sizes = np.minimum(sizes, max_samples)
    cov_sqrt = np.power(np.arange(1, dim + 1, dtype=np.float64), -1.2 / 2.0)  # sqrt(Sigma_jj)

    if iid:
        w_shared = rng.normal(0.0, 1.0, (classes, dim))
        b_shared = rng.normal(0.0, 1.0, classes)
    xs_tr, ys_tr, gs_tr, xs_te, ys_te, gs_te = [], [], [], [], [], []
    for k in range(num_clients):
        if iid:
            w, b, v = w_shared, b_shared, np.zeros(dim)
        else:
            u_k = rng.normal(0.0, alpha)
            w = rng.normal(u_k, 1.0, (classes, dim))
            b = rng.normal(u_k, 1.0, classes)
            b_k = rng.normal(0.0, beta)
            v = rng.normal(b_k, 1.0, dim)
        n_k = int(sizes[k])
        x = v + rng.standard_normal((n_k, dim)) * cov_sqrt
        y = np.argmax(x @ w.T + b, axis=1).astype(np.int64)  # argmax of softmax == argmax of logits
        n_test = min(max(1, int(round(test_fraction * n_k))), n_k - 1)
        perm = rng.permutation(n_k)
        te, tr = perm[:n_test], np.sort(perm[n_test:])
        te = np.sort(te)
        xs_tr.append(x[tr])
        ys_tr.append(y[tr])
        gs_tr.append(np.full(len(tr), k, dtype=np.int64))
        xs_te.append(x[te])
        ys_te.append(y[te])
        gs_te.append(np.full(len(te), k, dtype=np.int64))
    train = Split(
        x=np.concatenate(xs_tr).astype(np.float32),
        y=np.concatenate(ys_tr),
        groups=np.concatenate(gs_tr),
    )
    test = Split(
        x=np.concatenate(xs_te).astype(np.float32),
        y=np.concatenate(ys_te),
        groups=np.concatenate(gs_te),
    )
    return train, test


def _hf_to_split(ds: Any) -> Split:
    """Convert a Hugging Face image-classification Dataset to a Split (images scaled to [0, 1])."""
    cols = list(ds.column_names)
    label_col = next((c for c in ("label", "labels", "fine_label", "character") if c in cols), None)
    image_col = next((c for c in ("image", "img", "pixels") if c in cols), None)
    if label_col is None or image_col is None:
        raise ValueError(f"cannot find image and label columns among {cols}")
    ds = ds.with_format("numpy")
    x = np.asarray(ds[image_col], dtype=np.float32)
    if x.ndim == 3:  # (N, H, W) grayscale
        x = x[:, None, :, :]
    elif x.ndim == 4 and x.shape[-1] in (1, 3, 4):  # (N, H, W, C) -> (N, C, H, W)
        x = np.transpose(x, (0, 3, 1, 2))
    if x.max(initial=0.0) > 1.0:
        x = x / np.float32(255.0)
    y = np.asarray(ds[label_col], dtype=np.int64)
    return Split(x=np.ascontiguousarray(x, dtype=np.float32), y=y)


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether a TCP connection to huggingface.co:443 opens (fails fast instead of ~45 s of retries)."""
    try:
        with socket.create_connection(("huggingface.co", 443), timeout=timeout):
            return True
    except OSError:
        return False


def load_hf_split(name: str, *, seed: int, test_fraction: float) -> tuple[Split, Split]:
    """Load a Hugging Face data set through ``flwr_datasets.FederatedDataset`` (needs internet).

    The whole ``train`` split is loaded (one partition) and partitioned locally like the bundled data.
    If the data set has a ``test`` split it is the server's test set; otherwise ``test_fraction`` of
    ``train`` is held out (seeded).

    Offline, it fails within seconds (a TCP probe of huggingface.co) unless ``HF_DATASETS_OFFLINE=1``
    or ``HF_HUB_OFFLINE=1`` asks for the local Hugging Face cache.

    Raises:
        RuntimeError: the data set cannot be fetched (e.g. no internet access), naming the data set.
    """
    offline_cache = any(
        os.environ.get(var, "").lower() in ("1", "true", "yes")
        for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
    )
    if not offline_cache and not _hub_reachable():
        raise RuntimeError(
            f"could not load Hugging Face data set {name!r}: huggingface.co is unreachable (no internet "
            "access). Use dataset 'digits' or 'synthetic' offline, or set HF_DATASETS_OFFLINE=1 to "
            "load a copy already in the local Hugging Face cache."
        )
    try:
        from flwr_datasets import FederatedDataset
        from flwr_datasets.partitioner import IidPartitioner

        fds = FederatedDataset(
            dataset=name, partitioners={"train": IidPartitioner(num_partitions=1)}, seed=seed
        )
        train_ds = fds.load_split("train")
        try:
            test_ds = fds.load_split("test")
        except (KeyError, ValueError):
            test_ds = None
        train = _hf_to_split(train_ds)
    except Exception as exc:  # network, hub, or format errors: one clear message
        raise RuntimeError(
            f"could not load Hugging Face data set {name!r} through flwr_datasets.FederatedDataset "
            f"(this needs internet access to the Hugging Face Hub; use dataset 'digits' or "
            f"'synthetic' offline): {type(exc).__name__}: {exc}"
        ) from exc
    if test_ds is not None:
        return train, _hf_to_split(test_ds)
    _check_fraction(test_fraction)
    rng = np.random.Generator(np.random.PCG64(seed))
    perm = rng.permutation(len(train))
    n_test = max(1, int(round(test_fraction * len(train))))
    return train.subset(np.sort(perm[n_test:])), train.subset(np.sort(perm[:n_test]))


@functools.lru_cache(maxsize=8)
def _load_cached(
    name: str,
    seed: int,
    test_fraction: float,
    num_clients: int,
    kw_items: tuple[tuple[str, Any], ...],
) -> tuple[Split, Split]:
    kw = dict(kw_items)
    if name == "digits":
        if kw:
            raise ValueError(f"dataset 'digits' takes no extra options, got {sorted(kw)}")
        train, test = load_digits_split(seed=seed, test_fraction=test_fraction)
    elif name == "synthetic":
        train, test = make_synthetic(
            num_clients=num_clients, seed=seed, test_fraction=test_fraction, **kw
        )
    elif name.startswith("hf:") and len(name) > 3:
        train, test = load_hf_split(name[3:], seed=seed, test_fraction=test_fraction)
    else:
        raise ValueError(f"dataset must be 'digits', 'synthetic' or 'hf:<name>', got {name!r}")
    return _readonly(train), _readonly(test)


def load_dataset(
    name: str, *, seed: int, test_fraction: float, num_clients: int = 1, **kw: Any
) -> tuple[Split, Split]:
    """Load a data set as ``(train, test)``; cached per process, arrays read-only.

    Args:
        name: ``"digits"``, ``"synthetic"`` or ``"hf:<hub name>"`` (see module docstring).
        seed: data seed (split / generation); deterministic across processes.
        test_fraction: fraction held out for the server's test set, in (0, 1).
        num_clients: number of clients to generate (synthetic only; ignored otherwise).
        **kw: extra options of :func:`make_synthetic` (``alpha``, ``beta``, ``iid``, ...).

    Returns:
        ``(train, test)`` Splits. Their arrays are shared by the cache and read-only: copy before
        modifying.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    _check_fraction(test_fraction)
    if name != "synthetic":
        num_clients = 1
    return _load_cached(
        name, int(seed), float(test_fraction), int(num_clients), tuple(sorted(kw.items()))
    )
