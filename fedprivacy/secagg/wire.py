"""Flat encoding of the protocol messages for a transport (e.g. Flower ``ConfigRecord``/``ArrayRecord``).

``encode(msg)`` returns ``(kind, fields)`` where ``fields`` maps names to ``int``, ``bool``, ``bytes``,
``list[int]``, ``list[bytes]`` or a numpy array only; ``decode(kind, fields)`` rebuilds the dataclass
and validates every field's type (a transport is untrusted input: TypeError on a wrong type, the
dataclass and session checks do the rest). The expected type of each field is read from the
message dataclass itself, so a new field needs no second table here. Secrets never travel: only
public keys, commitments, signatures, sealed shares, revealed shares in the unmask stage and masked
vectors.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from fedprivacy.secagg.messages import (
    AdvertiseKeys,
    ConsistencyRequest,
    ConsistencyResponse,
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
    "secagg.consistency-request": ConsistencyRequest,
    "secagg.consistency": ConsistencyResponse,
    "secagg.unmask-request": UnmaskRequest,
    "secagg.unmask": UnmaskResponse,
}
_KIND_OF = {cls: kind for kind, cls in MESSAGE_TYPES.items()}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _all_type(v: Any, t: type) -> bool:
    """Every element of the list ``v`` is exactly of type ``t`` (``type(True) is bool``, not int)."""
    return isinstance(v, list) and set(map(type, v)) <= {t}  # (C speed: the roster-sized lists)


_CHECKS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "int": ("an int", _is_int),
    "bool": ("a bool", lambda v: isinstance(v, bool)),
    "bytes": ("bytes", lambda v: isinstance(v, bytes)),
    "list[int]": ("a list of ints", lambda v: _all_type(v, int)),
    "list[bytes]": ("a list of bytes", lambda v: _all_type(v, bytes)),
    "np.ndarray": ("a numpy array", lambda v: isinstance(v, np.ndarray)),
}


@functools.cache
def _field_types(cls: Any) -> dict[str, str]:
    """Field name -> annotation string of a message dataclass (``from __future__ import annotations``)."""
    out = {}
    for f in dataclasses.fields(cls):
        t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        if t not in _CHECKS:  # pragma: no cover - a new message field of a type the wire cannot carry
            raise TypeError(f"{cls.__name__}.{f.name} has type {t}, which the wire format cannot carry")
        out[f.name] = t
    return out


def encode(msg: object) -> tuple[str, dict[str, Any]]:
    """``(kind, fields)`` of a protocol message."""
    kind = _KIND_OF.get(type(msg))
    if kind is None:
        raise TypeError(f"not a secagg message: {type(msg).__name__}")
    fields: dict[str, Any] = {}
    cls: Any = type(msg)
    for name in _field_types(cls):
        v = getattr(msg, name)
        fields[name] = list(v) if isinstance(v, list | tuple) else v
    return kind, fields


def decode(kind: str, fields: dict[str, Any]) -> Any:
    """Rebuild a message from :func:`encode`'s output; TypeError/ValueError on malformed input."""
    cls = MESSAGE_TYPES.get(kind)
    if cls is None:
        raise ValueError(f"unknown secagg message kind {kind!r}")
    types = _field_types(cls)
    extra = set(fields) - set(types)
    if extra:
        raise ValueError(f"unexpected fields for {kind}: {sorted(extra)}")
    for name, value in fields.items():
        what, ok = _CHECKS[types[name]]
        if not ok(value):
            raise TypeError(f"field {name!r} must be {what}, got {type(value).__name__}")
    return cls(**fields)
