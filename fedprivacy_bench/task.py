"""Data, partitions, model and local training shared by every benchmark runner.

Every row of a comparison trains the same model on the same clients: the Flower baselines and the
torch loop take their partitions, test set, model and local SGD from ``fedprivacy.ml``, exactly as
fedprivacy's ClientApp does (``load_partition`` / ``load_test_set`` with the same ``DataSpec``,
``build_model(spec.model, ...)``, ``train_local``, ``evaluate``). Digits and Fashion-MNIST are split
by ``spec.partitioner`` (IID or Dirichlet(alpha)); Synthetic(1, 1) (Li et al. 2020, "Federated
Optimization in Heterogeneous Networks", Sec. 5.1) uses its natural per-client split (client k's
generated data is partition k). ``num_classes`` and the input shape come from the data.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from fedprivacy.ml import (
    DataSpec,
    Split,
    build_model,
    evaluate,
    get_weights,
    load_partition,
    load_test_set,
    num_parameters,
    set_weights,
    train_local,
)
from fedprivacy_bench.spec import BenchSpec

TEST_FRACTION = 0.2

__all__ = ["TEST_FRACTION", "data_spec_for", "client_split",
           "test_split", "model_for", "model_shape", "train_client", "evaluate", "get_weights",
           "set_weights", "params_for"]


def data_spec_for(spec: BenchSpec) -> DataSpec:
    return DataSpec(dataset=spec.dataset, seed=spec.seed, test_fraction=TEST_FRACTION,
                    partitioner=spec.partitioner, dirichlet_alpha=spec.dirichlet_alpha,
                    min_partition_size=spec.min_partition_size)


def client_split(spec: BenchSpec, partition_id: int) -> Split:
    """Client ``partition_id``'s training data (cached per process by fedprivacy.ml)."""
    return load_partition(data_spec_for(spec), partition_id, spec.num_clients)


def test_split(spec: BenchSpec) -> Split:
    return load_test_set(data_spec_for(spec), spec.num_clients)


@dataclass(frozen=True, slots=True)
class ModelShape:
    input_shape: tuple[int, ...]
    num_classes: int


@functools.lru_cache(maxsize=8)
def _shape(data: DataSpec, num_clients: int) -> ModelShape:
    test = load_test_set(data, num_clients)
    return ModelShape(test.feature_shape, test.num_classes)


def model_shape(spec: BenchSpec) -> ModelShape:
    return _shape(data_spec_for(spec), spec.num_clients)


def model_for(spec: BenchSpec) -> torch.nn.Module:
    """The benchmark model with its seeded initial weights."""
    shape = model_shape(spec)
    return build_model(spec.model, input_shape=shape.input_shape, num_classes=shape.num_classes,
                       hidden=spec.hidden, seed=spec.seed)


def params_for(spec: BenchSpec) -> int:
    return num_parameters(model_for(spec))


def train_client(model: torch.nn.Module, spec: BenchSpec, partition_id: int, *,
                 server_round: int) -> tuple[int, float]:
    """Local SGD of one client; returns (num_examples, mean training loss)."""
    split = client_split(spec, partition_id)
    result: Any = train_local(model, split, epochs=spec.local_epochs, lr=spec.lr,
                              batch_size=spec.batch_size,
                              seed=spec.seed * 100_003 + server_round * 1009 + partition_id)
    return int(result.num_examples), float(result.loss)

