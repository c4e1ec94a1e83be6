"""Flat encoding of the protocol messages for a transport (e.g. Flower ``ConfigRecord``/``ArrayRecord``).

``encode(msg)`` returns ``(kind, fields)`` where ``fields`` maps names to ``int``, ``bytes``,
``list[int]``, ``list[bytes]`` or a numpy array only; ``decode(kind, fields)`` rebuilds the dataclass
and validates every field's type (a transport is untrusted input: TypeError on a wrong type, the
dataclass and session checks do the rest). Secrets never travel: only public keys, sealed shares,
revealed shares in stage 4 and masked vectors.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from fedprivacy.secagg.protocol import (
    AdvertiseKeys,
    MaskedInput,
    MaskedInputRequest,
    SetupRequest,
    SharedKeys,
    ShareKeysRequest,
    UnmaskRequest,
    UnmaskResponse,
)

__all__ = ["MESSAGE_TYPES", "decode", "encode"]

MESSAGE_TYPES: dict[str, type] = {
    "secagg.setup": SetupRequest,
    "secagg.advertise": AdvertiseKeys,
    "secagg.share-request": ShareKeysRequest,
    "secagg.shares": SharedKeys,
    "secagg.masked-request": MaskedInputRequest,
    "secagg.masked": MaskedInput,
    "secagg.unmask-request": UnmaskRequest,
    "secagg.unmask": UnmaskResponse,
}
_KIND_OF = {cls: kind for kind, cls in MESSAGE_TYPES.items()}

_FIELD_TYPES: dict[str, str] = {
    "round": "int", "threshold": "int", "degree": "int", "modulus_bits": "int", "dim": "int",
    "min_survivors": "int", "node_id": "int",
    "enc_public": "bytes", "mask_public": "bytes",
    "node_ids": "ints", "receivers": "ints", "senders": "ints", "survivors": "ints",
    "dropped": "ints", "seed_owners": "ints", "key_owners": "ints",
    "enc_publics": "bytes_list", "mask_publics": "bytes_list", "ciphertexts": "bytes_list",
    "seed_shares": "bytes_list", "key_shares": "bytes_list",
    "masked": "array",
}


def encode(msg: object) -> tuple[str, dict[str, Any]]:
    """``(kind, fields)`` of a protocol message."""
    kind = _KIND_OF.get(type(msg))
    if kind is None:
        raise TypeError(f"not a secagg message: {type(msg).__name__}")
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(msg):  # type: ignore[arg-type]
        v = getattr(msg, f.name)
        fields[f.name] = list(v) if isinstance(v, list | tuple) else v
    return kind, fields


def _check(name: str, value: Any) -> Any:
    t = _FIELD_TYPES.get(name)
    ok = {
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "bytes": lambda v: isinstance(v, bytes),
        "ints": lambda v: isinstance(v, list) and all(
            isinstance(x, int) and not isinstance(x, bool) for x in v),
        "bytes_list": lambda v: isinstance(v, list) and all(isinstance(x, bytes) for x in v),
        "array": lambda v: isinstance(v, np.ndarray),
    }.get(t or "", lambda v: False)(value)
    if not ok:
        raise TypeError(f"field {name!r} must be {t or 'a known field'}, got {type(value).__name__}")
    return value


def decode(kind: str, fields: dict[str, Any]) -> Any:
    """Rebuild a message from :func:`encode`'s output; TypeError/ValueError on malformed input."""
    cls = MESSAGE_TYPES.get(kind)
    if cls is None:
        raise ValueError(f"unknown secagg message kind {kind!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    extra = set(fields) - names
    if extra:
        raise ValueError(f"unexpected fields for {kind}: {sorted(extra)}")
    return cls(**{k: _check(k, v) for k, v in fields.items()})
