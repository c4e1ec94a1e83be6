"""Wire format of fedprivacy's Flower messages: the one codec the ServerApp and the ClientApp share.

train  (server -> client): ``arrays`` = global weights (ArrayRecord), ``config`` = RoundInstructions.
train  (client -> server): ``update`` = Δ (ArrayRecord), ``metrics`` = MetricRecord with only what the
                           privacy mode lets the client disclose (``num-examples``, ``train-loss``,
                           ``dpsgd-steps``, ``dpsgd-sample-rate``; nothing in local mode).
query  (server -> client): ``config`` = {"ask": "node"}; reply ``node`` = {partition-id, num-partitions}.
results (ServerApp Context state): ``fedprivacy-results`` = {path} of the ``results.json`` it wrote.
Secure-aggregation stages: :mod:`fedprivacy_flwr.secagg_records`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict

from fedprivacy.fl.types import ClientUpdate, RoundInstructions


def error_text(reply: Message) -> str:
    """One line for a Flower Error reply."""
    err = reply.error
    return f"client error (code {err.code}): {err.reason}"


def arrays_to_record(arrays: Sequence[np.ndarray]) -> ArrayRecord:
    return ArrayRecord.from_numpy_ndarrays([np.ascontiguousarray(a) for a in arrays])


def record_to_arrays(record: ArrayRecord) -> list[np.ndarray]:
    return [np.asarray(a) for a in record.to_numpy_ndarrays()]


def train_message(node_id: int, instr: RoundInstructions, weights: ArrayRecord) -> Message:
    """One client's train instruction. ``weights`` is encoded once per round and shared by the cohort's
    messages (as Flower's own strategies share one record); clients only read it."""
    content = RecordDict({"arrays": weights, "config": ConfigRecord(instr.to_record())})
    return Message(content=content, dst_node_id=node_id, message_type=MessageType.TRAIN,
                   group_id=str(instr.round))


def decode_train(msg: Message) -> tuple[RoundInstructions, list[np.ndarray]]:
    return (RoundInstructions.from_record(dict(msg.content.config_records["config"])),
            record_to_arrays(msg.content.array_records["arrays"]))


def metrics_record(update: ClientUpdate) -> MetricRecord:
    """What the client discloses besides Δ: only the fields its privacy mode set (finite values).

    The one encoder of a train reply's metrics, for the plain reply and the SecAgg masked reply alike.
    """
    metrics: dict[str, Any] = {}
    if update.num_examples is not None:
        metrics["num-examples"] = int(update.num_examples)
    if update.train_loss is not None and np.isfinite(update.train_loss):
        metrics["train-loss"] = float(update.train_loss)
    for key, value in update.metrics.items():
        metrics[key.replace("_", "-")] = float(value)
    return MetricRecord(metrics)


def update_metadata(content: RecordDict, partition_id: int, *,
                    delta: tuple[np.ndarray, ...] = ()) -> ClientUpdate:
    """The inverse of :func:`metrics_record` (plus ``delta``, when the reply carries one in the clear)."""
    metrics: Mapping[str, Any] = dict(content.metric_records.get("metrics", MetricRecord({})))
    extra = {k.replace("-", "_"): float(v) for k, v in metrics.items()
             if k not in ("num-examples", "train-loss")}
    n = metrics.get("num-examples")
    loss = metrics.get("train-loss")
    return ClientUpdate(partition_id=partition_id, delta=delta,
                        num_examples=None if n is None else int(n),
                        train_loss=None if loss is None else float(loss), metrics=extra)


def train_reply(msg: Message, update: ClientUpdate) -> Message:
    content = RecordDict({"update": arrays_to_record(update.delta), "metrics": metrics_record(update)})
    return Message(content, reply_to=msg)


def decode_train_reply(reply: Message, partition_id: int) -> ClientUpdate:
    delta = tuple(record_to_arrays(reply.content.array_records["update"]))
    return update_metadata(reply.content, partition_id, delta=delta)


def query_message(node_id: int) -> Message:
    return Message(content=RecordDict({"config": ConfigRecord({"ask": "node"})}), dst_node_id=node_id,
                   message_type=MessageType.QUERY)


def query_reply(msg: Message, *, partition_id: int, num_partitions: int) -> Message:
    node = ConfigRecord({"partition-id": int(partition_id), "num-partitions": int(num_partitions)})
    return Message(RecordDict({"node": node}), reply_to=msg)


def decode_query_reply(reply: Message) -> tuple[int, int]:
    node: Mapping[str, Any] = reply.content.config_records["node"]
    return int(node["partition-id"]), int(node["num-partitions"])


RESULTS_RECORD = "fedprivacy-results"


def results_record(results_path: str) -> ConfigRecord:
    """What the ServerApp leaves in its Context's state: where it wrote ``results.json``."""
    return ConfigRecord({"path": str(results_path)})


def results_path_of(state: RecordDict) -> str | None:
    """The ``results.json`` path a ServerApp reported in its Context's ``state`` (None if none)."""
    record = state.config_records.get(RESULTS_RECORD)
    return None if record is None else str(record["path"])
