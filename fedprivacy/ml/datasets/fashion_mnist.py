"""``"fashion-mnist"``: Zalando's Fashion-MNIST (Xiao, Rasul & Vollgraf 2017, arXiv:1708.07747).

70,000 28x28 grayscale images of 10 clothing classes: the official 60,000 training images are partitioned
among the clients, the official 10,000 test images are the server's test set (``test_fraction`` is not
used). Stored as ``(N, 1, 28, 28)`` float32 in [0, 1] (bytes / 255).

Where the data come from, first match wins:

1. the ``data-dir`` run-config key (``data_dir`` option), if set;
2. the ``FEDPRIVACY_DATA_DIR`` environment variable, if set;
3. ``/usr/share/datasets/fashion-mnist/``, where Debian's ``dataset-fashion-mnist`` package puts it
   (``apt-get install dataset-fashion-mnist``; ``scripts/setup.sh`` does this when apt is available);
4. the Hugging Face Hub (``zalando-datasets/fashion_mnist`` through flwr-datasets), for users with
   internet access.

A folder (1 or 2) must hold the four IDX files ``{train,t10k}-{images-idx3,labels-idx1}-ubyte`` (``.gz``
or not), directly or in a ``fashion-mnist/`` subfolder; a folder that was given but lacks them is an
error (no silent fall-back to other data). If no source has the data, the error says how to get it.

The IDX files are parsed here with numpy (a 16-byte header and raw bytes): none of the installed
libraries reads IDX (torchvision is not a dependency, and scikit-learn's ``fetch_openml`` downloads).
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedprivacy.ml.data import Split, register_dataset

__all__ = [
    "DATA_DIR_ENV",
    "DEBIAN_DIR",
    "HUB_NAME",
    "FashionMnistOptions",
    "find_idx_dir",
    "load_fashion_mnist",
    "read_idx",
]

DATA_DIR_ENV = "FEDPRIVACY_DATA_DIR"
DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
HUB_NAME = "zalando-datasets/fashion_mnist"
NUM_CLASSES = 10
_FILES = {
    ("train", "images"): "train-images-idx3-ubyte",
    ("train", "labels"): "train-labels-idx1-ubyte",
    ("test", "images"): "t10k-images-idx3-ubyte",
    ("test", "labels"): "t10k-labels-idx1-ubyte",
}
_HOW_TO_GET = (
    "install Debian's package (apt-get install dataset-fashion-mnist, which scripts/setup.sh does when "
    f"apt is available; files land in {DEBIAN_DIR}), or set the run-config key data-dir or the "
    f"environment variable {DATA_DIR_ENV} to a folder with the four IDX files "
    "(train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, "
    f"t10k-labels-idx1-ubyte.gz), or connect to the internet for the Hugging Face Hub ({HUB_NAME})"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class FashionMnistOptions:
    """Options of ``"fashion-mnist"`` (run-config key ``data-dir``; "" = look in the usual places)."""

    data_dir: str = field(default="", metadata={"config_key": "data-dir"})


def read_idx(path: Path) -> np.ndarray:
    """Read one IDX file (LeCun et al.'s MNIST format), gzip-compressed or not.

    Format: two zero bytes, a type byte (``0x08`` = unsigned byte, the only one Fashion-MNIST uses), the
    number of dimensions, then each dimension as a big-endian uint32, then the data in C order.

    Raises:
        ValueError: the file is not an unsigned-byte IDX file or its size does not match its header.
    """
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        raw = fh.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08 or not 1 <= raw[3] <= 4:
        raise ValueError(f"{path} is not an unsigned-byte IDX file (magic {raw[:4].hex()})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    shape = tuple(int(s) for s in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    if len(raw) - header != int(np.prod(shape)):
        raise ValueError(
            f"{path}: header says shape {shape} ({int(np.prod(shape))} bytes), file has "
            f"{len(raw) - header} bytes of data"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def _file(folder: Path, stem: str) -> Path | None:
    for name in (stem + ".gz", stem):
        if (folder / name).is_file():
            return folder / name
    return None


def _need(folder: Path, stem: str) -> Path:
    path = _file(folder, stem)
    if path is None:
        raise RuntimeError(f"{folder} has no {stem}[.gz]; to get Fashion-MNIST, {_HOW_TO_GET}")
    return path


def find_idx_dir(folder: Path) -> Path | None:
    """``folder`` or ``folder/fashion-mnist`` if it holds all four IDX files, else None."""
    for candidate in (folder, folder / "fashion-mnist"):
        if all(_file(candidate, stem) is not None for stem in _FILES.values()):
            return candidate
    return None


def _split_from_idx(folder: Path, which: str) -> Split:
    images = read_idx(_need(folder, _FILES[(which, "images")]))
    labels = read_idx(_need(folder, _FILES[(which, "labels")]))
    if images.ndim != 3 or images.shape[1:] != (28, 28) or labels.ndim != 1:
        raise ValueError(
            f"{folder}: expected (N, 28, 28) images and (N,) labels, got {images.shape}, {labels.shape}"
        )
    if len(images) != len(labels):
        raise ValueError(f"{folder}: {len(images)} {which} images but {len(labels)} labels")
    if labels.max(initial=0) >= NUM_CLASSES:
        raise ValueError(f"{folder}: labels must be in [0, {NUM_CLASSES}), got max {labels.max()}")
    x = (images.astype(np.float32) / np.float32(255.0))[:, None, :, :]
    return Split(x=np.ascontiguousarray(x), y=labels.astype(np.int64), num_classes=NUM_CLASSES)


def _given_dir(value: str, what: str) -> Path:
    folder = Path(value).expanduser()
    found = find_idx_dir(folder)
    if found is None:
        raise RuntimeError(
            f"{what} is {value!r}, but that folder does not hold the four Fashion-MNIST IDX files "
            f"({', '.join(s + '[.gz]' for s in _FILES.values())}) directly or in fashion-mnist/; "
            f"to get them, {_HOW_TO_GET}"
        )
    return found


def load_fashion_mnist(
    *, data_dir: str = "", seed: int = 0, debian_dir: Path = DEBIAN_DIR
) -> tuple[Split, Split]:
    """The official Fashion-MNIST train and test splits, from the first source that has them.

    Args:
        data_dir: a folder with the IDX files ("" = the environment variable, Debian's folder, the Hub).
        seed: seed of the Hub loader (only used for the Hub fall-back).
        debian_dir: where the Debian package puts the files (a parameter for tests).

    Raises:
        RuntimeError: no source has the data, or a folder that was given lacks the files; the message
            says how to get the data.
    """
    if data_dir:
        folder: Path | None = _given_dir(data_dir, "data-dir")
    elif os.environ.get(DATA_DIR_ENV):
        folder = _given_dir(os.environ[DATA_DIR_ENV], DATA_DIR_ENV)
    else:
        folder = find_idx_dir(debian_dir)
    if folder is not None:
        return _split_from_idx(folder, "train"), _split_from_idx(folder, "test")

    from fedprivacy.ml.datasets.hf import load_hf_split

    try:
        return load_hf_split(HUB_NAME, seed=seed, test_fraction=0.2)
    except RuntimeError as exc:
        raise RuntimeError(
            f"Fashion-MNIST not found: it is not in {debian_dir}, data-dir and {DATA_DIR_ENV} are not "
            f"set, and the Hub copy could not be loaded ({exc}). To get it, {_HOW_TO_GET}."
        ) from exc


@register_dataset(
    "fashion-mnist",
    options=FashionMnistOptions,
    description="Zalando Fashion-MNIST, 28x28 (Debian dataset-fashion-mnist, data-dir, or the Hub)",
)
def _load(
    opts: FashionMnistOptions, /, *, name: str, seed: int, test_fraction: float, num_clients: int
) -> tuple[Split, Split]:
    del name, test_fraction, num_clients
    return load_fashion_mnist(data_dir=opts.data_dir, seed=seed)
