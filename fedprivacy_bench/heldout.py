"""``fashion-mnist-holdout``: Fashion-MNIST with the last 12,000 official training images held out.

The attacks on the curve's models have no training-split non-members (every training image is some
client's, and all clients are sampled over T rounds), and Fashion-MNIST's official test images are a
little harder than its training images even for a model that saw neither (mia5): the split
difference is a floor under every membership attack. This data set trains on the official training
images ``0 .. 47,999`` only (2400 clients of 20 in the ``fedavgm-c300`` recipe) and keeps images
``48,000 .. 59,999`` out, as non-members drawn from the same split as the members. The test set is the
official one, as for ``fashion-mnist``.
"""

from __future__ import annotations

import numpy as np

from fedprivacy.ml.data import Split, register_dataset
from fedprivacy.ml.datasets.fashion_mnist import FashionMnistOptions, load_fashion_mnist

NAME = "fashion-mnist-holdout"
TRAINED = 48_000  # official training images [0, TRAINED) train; [TRAINED, 60000) are held out

__all__ = ["NAME", "TRAINED", "held_out_split"]


def held_out_split(opts: FashionMnistOptions | None = None) -> Split:
    """The held-out official training images (``TRAINED ..``), for the attacks."""
    train, _ = load_fashion_mnist(data_dir=(opts or FashionMnistOptions()).data_dir)
    return train.subset(np.arange(TRAINED, len(train)))


@register_dataset(NAME, options=FashionMnistOptions,
                  description="Fashion-MNIST, the official training images 0..47,999 only (the rest "
                              "held out as non-members for the attacks)")
def _load(opts: FashionMnistOptions, /, *, name: str, seed: int, test_fraction: float,
          num_clients: int) -> tuple[Split, Split]:
    del name, test_fraction, num_clients
    train, test = load_fashion_mnist(data_dir=opts.data_dir, seed=seed)
    return train.subset(np.arange(TRAINED)), test
