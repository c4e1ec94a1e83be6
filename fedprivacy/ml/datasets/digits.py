"""``"digits"``: scikit-learn's bundled handwritten digits (offline, no download).

1797 8x8 images, 10 classes, pixel values 0..16 scaled to [0, 1]. Held-out test split: stratified,
``test_fraction``, seeded. The split is cached on disk (:mod:`fedprivacy.ml.diskcache`): a later run
loads it without importing scikit-learn.
"""

from __future__ import annotations

import hashlib

import numpy as np

from fedprivacy.ml import diskcache
from fedprivacy.ml.data import NoOptions, Split, check_fraction, register_dataset

__all__ = ["load_digits_split"]


def load_digits_split(*, seed: int, test_fraction: float) -> tuple[Split, Split]:
    """scikit-learn digits, scaled to [0, 1], stratified seeded train/test split.

    Args:
        seed: seed of the split (any int; the same seed gives the same split in every process).
        test_fraction: fraction of examples held out for the server's test set, in (0, 1).

    Returns:
        ``(train, test)`` with x of shape ``(N, 1, 8, 8)``, float32 in [0, 1], y int64 in [0, 10).
    """
    check_fraction(test_fraction)
    key = _cache_key(seed=seed, test_fraction=test_fraction)
    stored = diskcache.read("digits", key)
    if stored is not None and _valid(stored):
        x, y, idx_train, idx_test = stored["x"], stored["y"], stored["train"], stored["test"]
    else:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        bunch = load_digits()
        x = (np.asarray(bunch.images, dtype=np.float32) / np.float32(16.0)).reshape(-1, 1, 8, 8)
        y = np.asarray(bunch.target, dtype=np.int64)
        idx_train, idx_test = train_test_split(
            np.arange(len(y)), test_size=test_fraction, stratify=y, random_state=seed % (2**32)
        )
        idx_train = np.sort(idx_train)
        idx_test = np.sort(idx_test)
        diskcache.write("digits", key, {"x": x, "y": y, "train": idx_train, "test": idx_test})
    return (
        Split(x=np.ascontiguousarray(x[idx_train]), y=y[idx_train], num_classes=10),
        Split(x=np.ascontiguousarray(x[idx_test]), y=y[idx_test], num_classes=10),
    )


def _cache_key(*, seed: int, test_fraction: float) -> str:
    """Everything the split depends on: the arguments and scikit-learn's version (its data file and
    its stratified split). Cached on disk because importing scikit-learn costs ~1.5 s of CPU before
    round 1 of the default run; the cached entry is the same arrays, bit for bit."""
    fields = ("fedprivacy/digits/v1", int(seed) % 2**32, float(test_fraction),
              diskcache.package_version("scikit-learn"), np.__version__)
    return hashlib.sha256(repr(fields).encode()).hexdigest()


def _valid(stored: dict[str, np.ndarray]) -> bool:
    if set(stored) != {"x", "y", "train", "test"}:
        return False
    x, y, train, test = stored["x"], stored["y"], stored["train"], stored["test"]
    n = len(y)
    both = np.concatenate([train, test]) if train.ndim == test.ndim == 1 else np.zeros(0)
    return bool(x.shape == (n, 1, 8, 8) and x.dtype == np.float32 and y.dtype == np.int64 and n > 0
                and both.dtype.kind in "iu" and both.size == n and np.array_equal(np.sort(both), np.arange(n)))


@register_dataset("digits", description="scikit-learn handwritten digits, 8x8, bundled")
def _load(
    opts: NoOptions, /, *, name: str, seed: int, test_fraction: float, num_clients: int
) -> tuple[Split, Split]:
    del opts, name, num_clients
    return load_digits_split(seed=seed, test_fraction=test_fraction)

