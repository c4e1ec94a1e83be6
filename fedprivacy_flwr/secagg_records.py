"""Secure-aggregation protocol messages as Flower records (shared by the ServerApp and the ClientApp).

Every ``secagg`` record holds ``stage``, ``kind`` (:data:`fedprivacy.secagg.wire.MESSAGE_TYPES`) and the
message's flat fields from :func:`fedprivacy.secagg.wire.encode`; a masked vector travels as the
``secagg-masked`` ArrayRecord. Message types: :data:`MESSAGE_TYPES` (``group_id`` = round).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MessageType, RecordDict

from fedprivacy.secagg import wire
from fedprivacy_flwr.codec import arrays_to_record, optional_record, record_to_arrays

__all__ = ["MESSAGE_TYPES", "from_records", "to_records"]

MESSAGE_TYPES = {
    "advertise": f"{MessageType.QUERY}.secagg_advertise",
    "share": f"{MessageType.QUERY}.secagg_share",
    "masked": f"{MessageType.TRAIN}.secagg_masked",
    "consistency": f"{MessageType.QUERY}.secagg_consistency",
    "unmask": f"{MessageType.QUERY}.secagg_unmask",
}
_ARRAY_FIELD = "masked"


def to_records(stage: str, msg: object, *, record: str = "secagg") -> dict[str, Any]:
    """``secagg`` ConfigRecord (and ``secagg-masked`` ArrayRecord for a masked vector) of a message."""
    kind, fields = wire.encode(msg)
    array = fields.pop(_ARRAY_FIELD, None)
    out: dict[str, Any] = {record: ConfigRecord({"stage": stage, "kind": kind, **fields})}
    if array is not None:
        out["secagg-masked"] = arrays_to_record([array])
    return out


def from_records(content: RecordDict, *, stage: str, name: str = "secagg") -> Any:
    """Rebuild a protocol message from a Message's content; ValueError/TypeError if malformed."""
    record = optional_record(content, name, ConfigRecord)  # (not the typed views: slow, codec.py)
    if record is None:
        raise ValueError(f"no {name!r} record in the message")
    fields: dict[str, Any] = dict(record)
    got = fields.pop("stage", None)
    if got != stage:
        raise ValueError(f"secagg stage {got!r} where {stage!r} was expected")
    kind = fields.pop("kind", None)
    if not isinstance(kind, str):
        raise ValueError("secagg record has no kind")
    fields = {k: list(v) if isinstance(v, list | tuple) else v for k, v in fields.items()}
    masked = optional_record(content, "secagg-masked", ArrayRecord)
    if masked is not None:
        (array,) = record_to_arrays(masked)
        fields[_ARRAY_FIELD] = np.asarray(array)
    return wire.decode(kind, fields)
