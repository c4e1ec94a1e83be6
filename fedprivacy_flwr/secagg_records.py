"""Secure-aggregation protocol messages as Flower records (shared by the ServerApp and the ClientApp).

Every ``secagg`` record holds ``stage``, ``kind`` (:data:`fedprivacy.secagg.wire.MESSAGE_TYPES`) and the
message's flat fields from :func:`fedprivacy.secagg.wire.encode`; a masked vector travels as the
``secagg-masked`` ArrayRecord (packed to ``b`` bits per residue when the sender gives ``modulus_bits``).
Message types: :data:`MESSAGE_TYPES` (``group_id`` = round).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MessageType, RecordDict

from fedprivacy.secagg import wire
from fedprivacy.secagg.packing import pack_residues, unpack_residues
from fedprivacy_flwr.codec import arrays_to_record, config_record, optional_record, record_to_arrays

__all__ = ["MESSAGE_TYPES", "from_records", "to_records"]

MESSAGE_TYPES = {
    "advertise": f"{MessageType.QUERY}.secagg_advertise",
    "share": f"{MessageType.QUERY}.secagg_share",
    "masked": f"{MessageType.TRAIN}.secagg_masked",
    "consistency": f"{MessageType.QUERY}.secagg_consistency",
    "unmask": f"{MessageType.QUERY}.secagg_unmask",
}
_ARRAY_FIELD = "masked"


def to_records(stage: str, msg: object, *, record: str = "secagg",
               modulus_bits: int | None = None) -> dict[str, Any]:
    """``secagg`` ConfigRecord (and ``secagg-masked`` ArrayRecord for a masked vector) of a message.

    With ``modulus_bits`` a masked vector travels packed (:func:`fedprivacy.secagg.packing.pack_residues`:
    ``ceil(m b / 8)`` bytes, 2.5 B per coordinate at 20 bits instead of uint32's 4), as a uint8 array
    with ``packed_bits`` and ``count`` in the record.
    """
    kind, fields = wire.encode(msg)
    array = fields.pop(_ARRAY_FIELD, None)
    if array is not None and modulus_bits is not None:
        values = np.asarray(array)
        packed = pack_residues(values, modulus_bits=modulus_bits)
        fields.update(packed_bits=int(modulus_bits), count=int(values.shape[0]))
        array = np.frombuffer(packed, dtype=np.uint8)
    out: dict[str, Any] = {record: config_record({"stage": stage, "kind": kind, **fields})}
    if array is not None:
        out[f"{record}-masked"] = arrays_to_record([array])
    return out


def _unpacked(array: np.ndarray, fields: dict[str, Any]) -> np.ndarray:
    """A packed masked vector -> uint32 residues (ValueError if the record does not describe it)."""
    bits, count = fields.pop("packed_bits"), fields.pop("count", None)
    if (isinstance(bits, bool) or not isinstance(bits, int) or isinstance(count, bool)
            or not isinstance(count, int)):
        raise ValueError("a packed masked vector needs int packed_bits and count")
    if array.dtype != np.uint8 or array.ndim != 1:
        raise ValueError("a packed masked vector must be a 1-D uint8 array")
    return unpack_residues(array.tobytes(), count=count, modulus_bits=bits)


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
    masked = optional_record(content, f"{name}-masked", ArrayRecord)  # (this record's own vector)
    if masked is not None:
        (array,) = record_to_arrays(masked)
        array = np.asarray(array)
        fields[_ARRAY_FIELD] = _unpacked(array, fields) if "packed_bits" in fields else array
    return wire.decode(kind, fields)
