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

import functools
import io
import math
import operator
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common.constant import SType

from fedprivacy.fl.types import ClientUpdate, RoundInstructions


def error_text(reply: Message) -> str:
    """One line for a Flower Error reply."""
    err = reply.error
    return f"client error (code {err.code}): {err.reason}"


@functools.lru_cache(maxsize=512)
def _npy_header(dtype: str, shape: tuple[int, ...]) -> bytes:
    """The ``.npy`` header ``np.save`` writes for a C-ordered array of ``dtype`` and ``shape``."""
    buf = io.BytesIO()
    np.save(buf, np.zeros(shape, dtype=np.dtype(dtype)), allow_pickle=False)
    data = buf.getvalue()
    return data[: len(data) - int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize]


@functools.lru_cache(maxsize=512)
def _layout(dtype: str, shape: tuple[int, ...]) -> tuple[np.dtype, tuple[int, ...], bytes, int, int] | None:
    """(dtype, shape, ``np.save`` header, element count, payload length) of a record's declared dtype and shape, or None
    when they are not a plain C-ordered numpy array this codec reads itself (then Flower's path)."""
    try:
        dt = np.dtype(dtype)
        dims = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        return None
    if dt.hasobject or dt.fields is not None or not dims:
        return None
    header = _npy_header(dt.str, dims)
    count = int(np.prod(dims, dtype=np.int64))
    return dt, dims, header, count, len(header) + count * dt.itemsize


def _new_array(*, dtype: str, shape: tuple[int, ...], data: bytes) -> Array:
    """``Array(dtype=..., shape=..., stype=SType.NUMPY, data=...)`` without its generic argument
    parsing (~20 µs a call, most of a small model's encoding): the four fields set as its constructor
    sets them, so the object is equal to Flower's (same fields, ``object_id``, dirty flag; tested)."""
    arr = Array.__new__(Array)
    arr.__dict__.update(dtype=dtype, shape=shape, stype=SType.NUMPY, data=data)
    return arr


_SCALARS = (int, float, str, bytes, bool)  # flwr.app.typing.ConfigScalar's members
_EXACT_SCALARS = frozenset(_SCALARS)


def config_record(fields: Mapping[str, Any]) -> ConfigRecord:
    """``ConfigRecord(dict(fields))`` without Flower's per-value ``typing.get_args`` call (~2-3 µs a
    field; a secure round builds ~300 fields per client): when every key is a ``str`` and every value is
    of exactly one of the ConfigScalar types, or a list of one such exact type, the record is filled
    directly (Flower accepts all of these); anything else goes through ``ConfigRecord`` itself, which
    decides (subclasses such as numpy floats) and raises its own errors. Equal record, same value
    objects (tested)."""
    data = dict(fields)
    for k, v in data.items():
        t = type(v)
        if type(k) is not str or (t not in _EXACT_SCALARS and not (
                t is list and (not v or (type(v[0]) in _EXACT_SCALARS and set(map(type, v)) == {type(v[0])})))):
            return ConfigRecord(data)
    record = ConfigRecord()
    record.__dict__["_data"].update(data)
    return record


_RECORD_TYPES = frozenset((ArrayRecord, MetricRecord, ConfigRecord))  # what a RecordDict holds


def record_dict(records: Mapping[str, Any]) -> RecordDict:
    """``RecordDict(dict(records))`` without Flower's per-entry checks (~10 µs an entry: a lookup that
    raises KeyError, two check calls): when every key is a ``str`` and every value is exactly an
    ArrayRecord, MetricRecord or ConfigRecord, the dict is filled directly (Flower accepts all of
    these, and a fresh dict has nothing to overwrite); anything else goes through ``RecordDict``
    itself, which decides and raises its own errors. Equal dict, same record objects (tested)."""
    return _filled(RecordDict, records, _RECORD_TYPES)


_METRIC_SCALARS = frozenset((int, float))  # flwr.app.typing.MetricScalar's members (bool is refused)


def metric_record(fields: Mapping[str, Any]) -> MetricRecord:
    """``MetricRecord(dict(fields))`` without its per-value ``typing.get_args`` check when every key
    is a ``str`` and every value exactly an ``int`` or ``float`` (Flower accepts these); else Flower
    decides (lists, subclasses, bools) and raises its own errors. Equal record (tested)."""
    return _filled(MetricRecord, fields, _METRIC_SCALARS)


_Filled = TypeVar("_Filled", RecordDict, MetricRecord)


def _filled(cls: type[_Filled], fields: Mapping[str, Any], exact: frozenset[type]) -> _Filled:
    """``cls(dict(fields))``, filled directly when every key is a ``str`` and every value's type is in
    ``exact`` (types ``cls`` accepts without further checks); else ``cls`` itself decides."""
    data = dict(fields)
    for k, v in data.items():
        if type(k) is not str or type(v) not in exact:
            return cls(data)
    out = cls()
    out.__dict__["_data"].update(data)
    return out


def _to_array(a: np.ndarray) -> Array:
    """``Array.from_numpy_ndarray(a)``, byte for byte, without ``np.save``'s per-call work."""
    a = np.ascontiguousarray(a)
    plan = _encoding(a.dtype, a.shape)  # a numpy shape is a tuple of ints
    if plan is None:
        return Array.from_numpy_ndarray(a)
    header, name = plan
    data = b"".join((header, a.data))  # one copy of the payload
    return _new_array(dtype=name, shape=a.shape, data=data)


@functools.lru_cache(maxsize=512)
def _encoding(dtype: np.dtype, shape: tuple[int, ...]) -> tuple[bytes, str] | None:
    """(``np.save`` header, ``str(dtype)``: what Flower records as an Array's dtype, ~2 µs uncached) of
    a C-ordered array, or None for what this codec leaves to Flower (object or structured dtypes, 0-d)."""
    if dtype.hasobject or dtype.fields is not None or len(shape) == 0:
        return None
    return _npy_header(dtype.str, shape), str(dtype)


def _from_array(arr: Array) -> np.ndarray:
    """``arr.numpy()``; a read-only view of the payload when the header is exactly ``np.save``'s.

    The header is compared byte for byte with the one ``np.save`` writes for the record's declared
    dtype and shape (C order, no pickle), so anything else — another writer, a lying shape, Fortran
    order — takes Flower's own ``np.load`` path with its checks.
    """
    try:
        layout = _layout(arr.dtype, tuple(arr.shape)) if arr.stype == SType.NUMPY else None
    except TypeError:  # an unhashable or non-iterable shape: let Flower complain
        layout = None
    if layout is None:
        return arr.numpy()
    dtype, shape, header, count, length = layout
    data = arr.data
    if type(data) is not bytes or len(data) != length or not data.startswith(header):
        return arr.numpy()
    # one constructor call (frombuffer + reshape made two): a read-only C-ordered view of the payload
    return np.ndarray(shape, dtype, buffer=data, offset=len(header))


def arrays_to_record(arrays: Sequence[np.ndarray]) -> ArrayRecord:
    """The arrays as an ``ArrayRecord`` keyed ``"0", "1", ...`` (what ``from_numpy_ndarrays`` builds)."""
    record = ArrayRecord()
    data = {str(i): _to_array(np.asarray(a)) for i, a in enumerate(arrays)}
    # every value is an Array (_to_array builds nothing else): what ArrayRecord.__setitem__ checks
    record.__dict__["_data"].update(data)
    if data:
        record.__dict__["_is_dirty"] = True
    return record


def record_to_arrays(record: ArrayRecord) -> list[np.ndarray]:
    """The record's arrays in order (read-only views of the message's bytes where possible)."""
    return [_from_array(a) for a in record.values()]


def instructions_record(instr: RoundInstructions) -> ConfigRecord:
    """The ``config`` record of a train instruction (:meth:`RoundInstructions.to_record`)."""
    return config_record(instr.to_record())


def train_message(node_id: int, instr: RoundInstructions, weights: ArrayRecord, *,
                  config: ConfigRecord | None = None) -> Message:
    """One client's train instruction. ``weights`` is encoded once per round and shared by the cohort's
    messages (as Flower's own strategies share one record); clients only read it. So may ``config``,
    :func:`instructions_record` of ``instr`` built once per round (the cohort gets the same
    instructions); built here when omitted."""
    content = record_dict({"arrays": weights, "config": config if config is not None
                           else instructions_record(instr)})
    return Message(content=content, dst_node_id=node_id, message_type=MessageType.TRAIN,
                   group_id=str(instr.round))


_RecordT = TypeVar("_RecordT", ArrayRecord, ConfigRecord, MetricRecord)


def optional_record(content: RecordDict, name: str, kind: type[_RecordT]) -> _RecordT | None:
    """``content.<kind>s.get(name)`` without building Flower's typed views.

    ``RecordDict.array_records`` / ``config_records`` / ``metric_records`` build a new synced
    dictionary on every access, re-setting each record into it (~0.1 ms a time; measured
    ~0.5 s per 3 rounds of 100 clients in them). A plain lookup with the same type check is enough.
    """
    record = content.get(name)
    return record if isinstance(record, kind) else None


def record_of(content: RecordDict, name: str, kind: type[_RecordT]) -> _RecordT:
    """``content.<kind>s[name]`` (see :func:`optional_record`); KeyError if there is no such record."""
    record = optional_record(content, name, kind)
    if record is None:
        raise KeyError(name)
    return record


def decode_train(msg: Message) -> tuple[RoundInstructions, list[np.ndarray]]:
    """The instructions and the global weights (read-only views of the message's bytes) of a train message.

    A round's messages share one ``config`` and one ``arrays`` record (:func:`train_message`; in one
    process, or within one pickled chunk of the engine's pool): when both records hold exactly the
    objects the last call decoded (identity of every key, value and array field, each of an immutable
    type), the last decoded instructions and read-only views are returned again (a new list), which is
    what decoding them again gives: ~5 µs a message instead of ~11 for a 4-array model.
    """
    global _LAST_TRAIN
    config = record_of(msg.content, "config", ConfigRecord)
    arrays = record_of(msg.content, "arrays", ArrayRecord)
    config_parts, array_parts = _parts(config), _array_parts(arrays)
    last = _LAST_TRAIN
    if (last is not None and config_parts is not None and array_parts is not None
            and _same_objects(config_parts, last[0]) and _same_objects(array_parts, last[1])):
        return last[2], list(last[3])
    instr = RoundInstructions.from_record(dict(config.items()))
    weights = record_to_arrays(arrays)
    if config_parts is not None and array_parts is not None and not any(w.flags.writeable for w in weights):
        _LAST_TRAIN = (config_parts, array_parts, instr, tuple(weights))  # shared views: read-only ones only
    return instr, weights


# (config parts, array parts, instructions, weights) of the last train message decoded
_LAST_TRAIN: tuple[tuple, tuple, RoundInstructions, tuple[np.ndarray, ...]] | None = None
_IMMUTABLE_SCALARS = frozenset((int, float, str, bytes, bool))


def _parts(record: ConfigRecord) -> tuple | None:
    """The record's keys and values in order, or None when a value is of a mutable type."""
    parts = tuple(x for kv in record.items() for x in kv)
    return parts if all(type(v) in _IMMUTABLE_SCALARS for v in parts[1::2]) else None


def _array_parts(record: ArrayRecord) -> tuple | None:
    """The record's keys, Arrays and their four fields in order, or None when a field is mutable."""
    parts: list[Any] = []
    for k, a in record.items():
        shape, data = a.shape, a.data
        if type(shape) is not tuple or type(data) is not bytes:
            return None
        parts += (k, a, a.dtype, shape, a.stype, data)
    return tuple(parts)


def _same_objects(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(map(operator.is_, a, b))


def metrics_record(update: ClientUpdate) -> MetricRecord:
    """What the client discloses besides Δ: only the fields its privacy mode set (finite values).

    The one encoder of a train reply's metrics, for the plain reply and the SecAgg masked reply alike.
    """
    metrics: dict[str, Any] = {}
    if update.num_examples is not None:
        metrics["num-examples"] = int(update.num_examples)
    if update.train_loss is not None and math.isfinite(update.train_loss):
        metrics["train-loss"] = float(update.train_loss)
    for key, value in update.metrics.items():
        metrics[key.replace("_", "-")] = float(value)
    return metric_record(metrics)


def update_metadata(content: RecordDict, partition_id: int, *,
                    delta: tuple[np.ndarray, ...] = ()) -> ClientUpdate:
    """The inverse of :func:`metrics_record` (plus ``delta``, when the reply carries one in the clear)."""
    record = optional_record(content, "metrics", MetricRecord)
    metrics: Mapping[str, Any] = {} if record is None else dict(record.items())
    extra = {k.replace("-", "_"): float(v) for k, v in metrics.items()
             if k not in ("num-examples", "train-loss")}
    n = metrics.get("num-examples")
    loss = metrics.get("train-loss")
    return ClientUpdate(partition_id=partition_id, delta=delta,
                        num_examples=None if n is None else int(n),
                        train_loss=None if loss is None else float(loss), metrics=extra)


def train_reply(msg: Message, update: ClientUpdate) -> Message:
    content = record_dict({"update": arrays_to_record(update.delta), "metrics": metrics_record(update)})
    return Message(content, reply_to=msg)


def decode_train_reply(reply: Message, partition_id: int) -> ClientUpdate:
    delta = tuple(record_to_arrays(record_of(reply.content, "update", ArrayRecord)))
    return update_metadata(reply.content, partition_id, delta=delta)


def query_message(node_id: int, *, attempt: int = 1) -> Message:
    """The partition query (server/loop.py::discover_partitions); ``group_id`` is the attempt, from 1."""
    # the fast builders (equal records): one query per node, a million at a million clients
    return Message(content=record_dict({"config": config_record({"ask": "node"})}), dst_node_id=node_id,
                   message_type=MessageType.QUERY, group_id=str(attempt))


def query_reply(msg: Message, *, partition_id: int, num_partitions: int) -> Message:
    node = config_record({"partition-id": int(partition_id), "num-partitions": int(num_partitions)})
    return Message(record_dict({"node": node}), reply_to=msg)


def decode_query_reply(reply: Message) -> tuple[int, int]:
    node: Mapping[str, Any] = record_of(reply.content, "node", ConfigRecord)
    return int(node["partition-id"]), int(node["num-partitions"])


RESULTS_RECORD = "fedprivacy-results"


def results_record(results_path: str) -> ConfigRecord:
    """What the ServerApp leaves in its Context's state: where it wrote ``results.json``."""
    return ConfigRecord({"path": str(results_path)})


def results_path_of(state: RecordDict) -> str | None:
    """The ``results.json`` path a ServerApp reported in its Context's ``state`` (None if none)."""
    record = optional_record(state, RESULTS_RECORD, ConfigRecord)
    return None if record is None else str(record["path"])
