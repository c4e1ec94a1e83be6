"""Data, partitions, models and local training (torch, opacus and flwr-datasets live here).

Heavy libraries load lazily: the names below are imported on first use (so the data-set registry,
:mod:`fedprivacy.ml.data`, can be read without torch), ``datasets``/``flwr_datasets`` only when
partitioning, ``opacus`` only for DP-SGD. Never imports ``flwr``.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "Split": "data",
    "load_dataset": "data",
    "register_dataset": "data",
    "dataset_entry": "data",
    "dataset_names": "data",
    "PARTITIONERS": "partition",
    "DataSpec": "partition",
    "data_spec": "partition",
    "load_partition": "partition",
    "load_test_set": "partition",
    "MODELS": "models",
    "register_model": "models",
    "model_entry": "models",
    "model_names": "models",
    "build_model": "models",
    "get_weights": "models",
    "set_weights": "models",
    "num_parameters": "models",
    "DpsgdConfig": "train",
    "TrainResult": "train",
    "train_local": "train",
    "evaluate": "train",
    "dpsgd_epsilon": "train",
}

__all__ = list(_NAMES)


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
