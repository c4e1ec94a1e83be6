"""The ClientApp's secure-aggregation stages: decode -> one :mod:`fedprivacy.fl.secure` step -> encode.

Where the client's secrets live between a round's four exchanges: in :data:`STORE`, a per-process
:class:`fedprivacy.fl.secure.SessionStore` keyed by ``(run_id, node_id)``, *not* in
``context.state``. The node state is a RecordDict that Flower's engines serialise and hand between
the SuperNode and the ClientApp process (and the in-process engine's pool pickles it), so secrets put
there would leave the client's memory; a ``ClientSession`` also refuses to be pickled. The price: a
node's messages of one round must reach the same ClientApp process. That holds for the in-process
engine with ``workers=1`` and for Flower's simulation with one ClientApp actor per process set
(the default ``num-cpus = 2`` per ClientApp on this 2-core machine gives one actor); if it does not
hold, the stage raises ``LookupError`` and the server counts the client as dropped (the round aborts
below threshold, nothing is revealed). Secrets are never logged, put in metrics or written to disk.
"""

from __future__ import annotations

from typing import Any

from flwr.app import Context, Message, MetricRecord, RecordDict

from fedprivacy.config import RunConfig
from fedprivacy.fl.client import client_rng, train_client
from fedprivacy.fl.secure import (
    EncodingSpec,
    SessionStore,
    client_advertise,
    client_masked,
    client_share,
    client_unmask,
)
from server import codec
from server.secagg_exchange import from_records, to_records

STORE = SessionStore()


def _key(context: Context) -> tuple[int, int]:
    return int(context.run_id), int(context.node_id)


def _reply(msg: Message, stage: str, out: object, **extra: object) -> Message:
    content = to_records(stage, out)
    content.update(extra)
    return Message(RecordDict(content), reply_to=msg)


def advertise(msg: Message, context: Context, *, partition_id: int) -> Message:
    setup = from_records(msg.content, stage="advertise")
    return _reply(msg, "advertise", client_advertise(STORE, _key(context), setup, partition_id=partition_id))


def share(msg: Message, context: Context) -> Message:
    request = from_records(msg.content, stage="share")
    return _reply(msg, "share", client_share(STORE, _key(context), request))


def masked(msg: Message, context: Context, *, cfg: RunConfig, partition_id: int, num_partitions: int) -> Message:
    request = from_records(msg.content, stage="masked")
    encoding = EncodingSpec.from_record(dict(msg.content.config_records["encoding"]))
    instr, weights = codec.decode_train(msg)
    if instr.round != request.round:
        raise ValueError(f"round instructions for round {instr.round}, secagg request for {request.round}")
    update = train_client(cfg, partition_id=partition_id, num_partitions=num_partitions, weights=weights,
                          instructions=instr)
    rng = client_rng(seed=instr.seed, partition_id=partition_id, round=instr.round).child("secagg")
    out = client_masked(STORE, _key(context), request, update, cfg=cfg, encoding=encoding, rng=rng)
    metrics: dict[str, Any] = {}
    if update.num_examples is not None:
        metrics["num-examples"] = int(update.num_examples)
    if update.train_loss is not None:
        metrics["train-loss"] = float(update.train_loss)
    metrics.update({k.replace("_", "-"): float(v) for k, v in update.metrics.items()})
    return _reply(msg, "masked", out, metrics=MetricRecord(metrics))


def unmask(msg: Message, context: Context) -> Message:
    request = from_records(msg.content, stage="unmask")
    return _reply(msg, "unmask", client_unmask(STORE, _key(context), request))


__all__ = ["STORE", "advertise", "masked", "share", "unmask"]
