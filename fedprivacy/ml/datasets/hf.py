"""``"hf:<name>"``: Hugging Face image-classification data sets, from the Hub or from local files.

``<name>`` is either

* a Hub name (``hf:ylecun/mnist``, ``hf:uoft-cs/cifar10``, ``hf:flwrlabs/femnist``,
  ``hf:zalando-datasets/fashion_mnist``), loaded through ``flwr_datasets.FederatedDataset`` (needs
  internet access, or ``HF_DATASETS_OFFLINE=1`` / ``HF_HUB_OFFLINE=1`` with a copy in the local
  Hugging Face cache); offline it fails within seconds (a TCP probe of huggingface.co) with a
  RuntimeError that says so, instead of ~45 s of retries; or
* a local path in the Hub's schema: a folder written by ``datasets.Dataset.save_to_disk`` /
  ``DatasetDict.save_to_disk`` (read with ``datasets.load_from_disk``), or a folder of data files in the
  Hub's layout (``data/train-*.parquet``, ``data/test-*.parquet``), which goes through the very same
  ``FederatedDataset`` path as a Hub name (``datasets.load_dataset`` reads local folders offline).

Conversion: the image column (``image``, ``img`` or ``pixels``) becomes ``(N, C, H, W)`` float32 in
[0, 1] (bytes / 255); the label column (``label``, ``labels``, ``fine_label`` or ``character``, the
FEMNIST label) int64, with ``num_classes`` from its ``ClassLabel`` feature when it has one (FEMNIST: 62,
whatever a split contains). A natural client id column (``writer_id`` for FEMNIST, ``user_id``,
``client_id``) becomes ``Split.groups`` (ids numbered in sorted order), so ``partitioner = "natural"``
gives every writer its own client (through flwr-datasets' ``NaturalIdPartitioner``, see
:mod:`fedprivacy.ml.partition`). The data set's ``test`` split is the server's test set; without one,
``test_fraction`` of ``train`` is held out (seeded).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedprivacy.ml.data import Split, holdout_split, register_dataset

__all__ = ["HfOptions", "hf_to_split", "load_hf_split", "NATURAL_ID_COLUMNS"]

IMAGE_COLUMNS = ("image", "img", "pixels")
LABEL_COLUMNS = ("label", "labels", "fine_label", "character")
NATURAL_ID_COLUMNS = ("writer_id", "user_id", "client_id")
_CHUNK = 8192  # examples decoded at a time (bounds the memory of the uint8 copy)


@dataclass(frozen=True, slots=True, kw_only=True)
class HfOptions:
    """Options of ``"hf:<name>"``.

    Attributes:
        natural_id: column holding each example's client id; "" = the first of
            :data:`NATURAL_ID_COLUMNS` present, "none" = ignore any.
    """

    natural_id: str = ""


def _column(cols: list[str], wanted: tuple[str, ...], what: str) -> str:
    col = next((c for c in wanted if c in cols), None)
    if col is None:
        raise ValueError(f"cannot find the {what} column (one of {wanted}) among {cols}")
    return col


def _images(ds: Any, col: str) -> np.ndarray:
    """Decode the image column to ``(N, C, H, W)`` float32 in [0, 1], a chunk at a time."""
    n = len(ds)
    if n == 0:
        raise ValueError("the data set has no examples")
    fmt = ds.with_format("numpy")
    out: np.ndarray | None = None
    for start in range(0, n, _CHUNK):
        chunk = np.asarray(fmt[start : start + _CHUNK][col])
        if chunk.dtype == object:
            raise ValueError(f"images in column {col!r} do not all have the same shape")
        if chunk.ndim == 3:  # (N, H, W) grayscale
            chunk = chunk[:, None, :, :]
        elif chunk.ndim == 4 and chunk.shape[-1] in (1, 3, 4):  # (N, H, W, C) -> (N, C, H, W)
            chunk = np.transpose(chunk, (0, 3, 1, 2))
        else:
            raise ValueError(f"images in column {col!r} have unsupported shape {chunk.shape[1:]}")
        scale = np.float32(255.0) if np.issubdtype(chunk.dtype, np.integer) else np.float32(1.0)
        if out is None:
            out = np.empty((n, *chunk.shape[1:]), dtype=np.float32)
        out[start : start + len(chunk)] = chunk.astype(np.float32) / scale
    return out  # type: ignore[return-value]  # n > 0, so the loop ran


def hf_to_split(ds: Any, *, natural_id: str = "") -> Split:
    """Convert a ``datasets.Dataset`` of images and labels to a :class:`Split`.

    Args:
        ds: the Dataset.
        natural_id: see :class:`HfOptions`; its ids become ``Split.groups`` numbered in sorted order.
    """
    cols = list(ds.column_names)
    image_col = _column(cols, IMAGE_COLUMNS, "image")
    label_col = _column(cols, LABEL_COLUMNS, "label")
    num_classes = getattr(ds.features.get(label_col), "num_classes", None)
    y = np.asarray(ds[label_col], dtype=np.int64)
    groups = None
    id_col = _natural_id_column(cols, natural_id)
    if id_col is not None:
        _, inverse = np.unique(np.asarray(ds[id_col]), return_inverse=True)
        groups = inverse.astype(np.int64).reshape(-1)
    x = _images(ds, image_col)
    return Split(x=x, y=y, groups=groups, num_classes=0 if num_classes is None else int(num_classes))


def _natural_id_column(cols: list[str], natural_id: str) -> str | None:
    if natural_id == "none":
        return None
    if natural_id:
        if natural_id not in cols:
            raise ValueError(f"natural_id column {natural_id!r} is not among {cols}")
        return natural_id
    return next((c for c in NATURAL_ID_COLUMNS if c in cols), None)


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether a TCP connection to huggingface.co:443 opens (fails fast instead of ~45 s of retries)."""
    try:
        with socket.create_connection(("huggingface.co", 443), timeout=timeout):
            return True
    except OSError:
        return False


def _offline_cache_requested() -> bool:
    return any(
        os.environ.get(var, "").lower() in ("1", "true", "yes")
        for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
    )


def _is_saved_to_disk(path: Path) -> bool:
    return (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()


def _load_raw(name: str, *, seed: int) -> tuple[Any, Any | None]:
    """The raw ``train`` and (if any) ``test`` Datasets of a local path or a Hub name."""
    path = Path(name).expanduser()
    if path.is_dir() and _is_saved_to_disk(path):
        import datasets

        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if "train" not in loaded:
                raise ValueError(f"saved DatasetDict at {path} has no 'train' split: {list(loaded)}")
            return loaded["train"], loaded.get("test")
        return loaded, None
    if not path.exists():
        if name.startswith((".", "/", "~")):
            raise RuntimeError(f"local data set path {name!r} does not exist")
        if not _offline_cache_requested() and not _hub_reachable():
            raise RuntimeError(
                f"could not load Hugging Face data set {name!r}: huggingface.co is unreachable (no "
                "internet access). Use dataset 'digits' or 'fashion-mnist' offline, give a local copy "
                "as 'hf:/path/to/folder' (save_to_disk or the Hub's parquet layout), or set "
                "HF_DATASETS_OFFLINE=1 to use a copy already in the local Hugging Face cache."
            )
    from flwr_datasets import FederatedDataset

    # One partition of each split: fedprivacy partitions the training data itself (ml.partition), so
    # that every data set, Hub or bundled, goes through the same partitioners and caches.
    fds = FederatedDataset(dataset=str(path) if path.exists() else name,
                           partitioners={"train": 1}, shuffle=False, seed=seed)
    train = fds.load_split("train")
    try:
        test = fds.load_split("test")
    except ValueError:  # flwr-datasets: "The given split: 'test' is not present"
        test = None
    return train, test


def load_hf_split(
    name: str, *, seed: int, test_fraction: float, options: HfOptions | None = None
) -> tuple[Split, Split]:
    """Load ``name`` (Hub name or local path, see the module docstring) as ``(train, test)``.

    Raises:
        RuntimeError: the data set cannot be fetched or read, naming it and saying what to do.
    """
    opts = HfOptions() if options is None else options
    try:
        train_ds, test_ds = _load_raw(name, seed=seed)
        train = hf_to_split(train_ds, natural_id=opts.natural_id)
        test = None
        if test_ds is not None:
            test = hf_to_split(test_ds, natural_id="none")
    except RuntimeError:
        raise
    except Exception as exc:  # network, hub, or format errors: one clear message
        raise RuntimeError(
            f"could not load Hugging Face data set {name!r} (a Hub name needs internet access; a "
            f"local path must be a save_to_disk folder or the Hub's parquet layout): "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if test is None:
        return holdout_split(train, seed=seed, test_fraction=test_fraction)
    return train, test


@register_dataset(
    "hf:",
    options=HfOptions,
    prefix=True,
    description="Hugging Face image classification (Hub name or local save_to_disk/parquet folder)",
)
def _load(
    opts: HfOptions, /, *, name: str, seed: int, test_fraction: float, num_clients: int
) -> tuple[Split, Split]:
    del num_clients
    return load_hf_split(name[len("hf:") :], seed=seed, test_fraction=test_fraction, options=opts)
