"""``"digits"``: scikit-learn's bundled handwritten digits (offline, no download).

1797 8x8 images, 10 classes, pixel values 0..16 scaled to [0, 1]. Held-out test split: stratified,
``test_fraction``, seeded.
"""

from __future__ import annotations

import numpy as np

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
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    check_fraction(test_fraction)
    bunch = load_digits()
    x = (np.asarray(bunch.images, dtype=np.float32) / np.float32(16.0)).reshape(-1, 1, 8, 8)
    y = np.asarray(bunch.target, dtype=np.int64)
    idx_train, idx_test = train_test_split(
        np.arange(len(y)), test_size=test_fraction, stratify=y, random_state=seed % (2**32)
    )
    idx_train = np.sort(idx_train)
    idx_test = np.sort(idx_test)
    return (
        Split(x=np.ascontiguousarray(x[idx_train]), y=y[idx_train], num_classes=10),
        Split(x=np.ascontiguousarray(x[idx_test]), y=y[idx_test], num_classes=10),
    )


@register_dataset("digits", description="scikit-learn handwritten digits, 8x8, bundled")
def _load(
    opts: NoOptions, /, *, name: str, seed: int, test_fraction: float, num_clients: int
) -> tuple[Split, Split]:
    del opts, name, num_clients
    return load_digits_split(seed=seed, test_fraction=test_fraction)

