"""Data, partitions, models and local training (torch, opacus and flwr-datasets live here).

Heavy libraries load lazily: ``datasets``/``flwr_datasets`` only when partitioning, ``opacus`` only for
DP-SGD. Never imports ``flwr``.
"""

from fedprivacy.ml.data import Split, load_dataset
from fedprivacy.ml.models import MODELS, build_model, get_weights, num_parameters, set_weights
from fedprivacy.ml.partition import (
    PARTITIONERS,
    DataSpec,
    data_spec,
    load_partition,
    load_test_set,
    partition,
)
from fedprivacy.ml.train import DpsgdConfig, TrainResult, dpsgd_epsilon, evaluate, train_local

__all__ = [
    "Split",
    "load_dataset",
    "PARTITIONERS",
    "DataSpec",
    "data_spec",
    "partition",
    "load_partition",
    "load_test_set",
    "MODELS",
    "build_model",
    "get_weights",
    "set_weights",
    "num_parameters",
    "DpsgdConfig",
    "TrainResult",
    "train_local",
    "evaluate",
    "dpsgd_epsilon",
]
