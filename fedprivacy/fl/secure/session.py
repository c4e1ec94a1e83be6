"""A client's SecAgg session as flat fields for the node's own state (the state machine serialises
itself: :meth:`fedprivacy.secagg.client_session.ClientSession.to_state` / ``from_state``).

Two costs of that state are cut here without changing what it holds (at 100 clients they were
~30% of a distributed round's CPU):

- **Packed lists.** The roster-sized list fields (node ids, public keys, held shares, the graph) are
  stored as one ``bytes`` value each (:data:`INT_LISTS` as big-endian uint64, :data:`BLOB_LISTS` as a
  count, the lengths and the concatenation), so Flower's ``ConfigRecord`` checks one value per field,
  not one per element. :func:`import_session` unpacks (refusing a malformed packing, naming the field)
  and hands plain lists to ``from_state``, which validates everything as before; unpacked lists are
  accepted too.
- **The live session.** :func:`remember` keeps, per process, a copy of the session last exported into
  a given record object, for as long as that object lives (a weak reference: when the node's state
  drops the record, at ``finish`` or the next ``put``, the copy goes with it). :func:`recall` returns a
  fresh copy only for that very object (identity, not equality), so a state that came through a
  pickle, another process or a hand edit is always parsed and validated. The in-process engine hands a
  node's records from one message to the next as the same objects, so it parses each session once.
"""

from __future__ import annotations

import functools
import struct
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from fedprivacy.secagg.client_session import ClientSession

__all__ = ["BLOB_LISTS", "INT_LISTS", "copy_session", "export_session", "import_session", "recall",
           "remember"]

#: ``to_state`` fields that are lists of ints in [0, 2**64) (node ids, sizes): packed as ``>u8``
INT_LISTS = ("roster_ids", "graph.nodes", "graph.sizes", "graph.flat", "neighbours", "seal_keys.peers",
             "held.peers", "peers", "view_survivors", "view_dropped", "revealed.peers",
             "held_components.peers")
#: ``to_state`` fields that are lists of bytes (keys, shares, seeds): packed as count, lengths, data
BLOB_LISTS = ("mask_publics", "sign_publics", "seal_keys.keys", "held_seed_shares", "held_key_shares",
              "components", "held_components.shares")
_U64 = np.dtype(">u8")
_U32 = np.dtype(">u4")


def _pack_ints(values: list[int]) -> bytes | list[int]:
    try:
        return np.asarray(values, dtype=_U64).tobytes()
    except (OverflowError, TypeError, ValueError):  # pragma: no cover - to_state holds ids in range
        return values


def _pack_blobs(values: list[bytes]) -> bytes:
    lengths = np.fromiter((len(v) for v in values), dtype=np.uint64, count=len(values))
    return struct.pack(">I", len(values)) + lengths.astype(_U32).tobytes() + b"".join(values)


def _unpack_ints(name: str, data: bytes) -> list[int]:
    if len(data) % 8:
        raise ValueError(f"state field {name!r}: packed ints must be a multiple of 8 bytes, got {len(data)}")
    out: list[int] = np.frombuffer(data, dtype=_U64).tolist()
    return out


def _unpack_blobs(name: str, data: bytes) -> list[bytes]:
    if len(data) < 4:
        raise ValueError(f"state field {name!r}: packed bytes list too short")
    (count,) = struct.unpack_from(">I", data)
    if count == 0:
        if len(data) != 4:
            raise ValueError(f"state field {name!r}: packed lengths do not add up to the data")
        return []
    body = 4 + 4 * count
    if len(data) < body:
        raise ValueError(f"state field {name!r}: packed bytes list too short for {count} lengths")
    ends = np.cumsum(np.frombuffer(data, dtype=_U32, count=count, offset=4), dtype=np.int64) + body
    if ends[-1] != len(data):
        raise ValueError(f"state field {name!r}: packed lengths do not add up to the data")
    starts = [body, *ends[:-1].tolist()]
    return [data[a:b] for a, b in zip(starts, ends.tolist(), strict=True)]


def export_session(session: ClientSession) -> dict[str, Any]:
    """A client session as flat fields for the node's own state: :meth:`ClientSession.to_state` with
    the list fields packed (module docstring).

    It holds the round's secrets (private keys, self-mask seed, held shares): it must stay on the
    client side (Flower's ``context.state`` lives in the SuperNode and its ClientApp process and is
    never sent to the server), and must never be logged, put in metrics or written to disk.
    """
    roster = _packed_roster(session)
    state = session.to_state(roster_fields=roster)
    for name in INT_LISTS:
        if roster is None or name not in roster:
            state[name] = _pack_ints(state[name])
    for name in BLOB_LISTS:
        if roster is None or name not in roster:
            state[name] = _pack_blobs(state[name])
    return state


# world id -> (the roster source it was packed from, its packed roster fields): every client of a round in
# this process, at each of its stages, exports the same roster, key maps and graph (~0.1 ms per export)
_ROSTERS: dict[bytes, tuple[tuple[Any, ...], dict[str, Any]]] = {}
_ROSTERS_KEPT = 4


def _packed_roster(session: ClientSession) -> dict[str, Any] | None:
    """The packed :data:`ClientSession.ROSTER_FIELDS` of ``session``, from the cache when the session's
    roster source equals the one packed for its world (compared in full, not trusted to the world id)."""
    world = session._world
    if not world:
        return None  # before stage 2: empty roster
    source = session.roster_source()
    hit = _ROSTERS.get(world)
    if hit is not None and hit[0] == source:
        return hit[1]
    fields = session.roster_state()
    packed = {n: _pack_ints(v) if n in INT_LISTS else _pack_blobs(v) for n, v in fields.items()}
    _ROSTERS[world] = (tuple(dict(x) if type(x) is dict else x for x in source), packed)
    while len(_ROSTERS) > _ROSTERS_KEPT:
        del _ROSTERS[next(iter(_ROSTERS))]
    return packed


def import_session(fields: Mapping[str, Any]) -> ClientSession:
    """Rebuild a :class:`ClientSession` from :func:`export_session` (:meth:`ClientSession.from_state`,
    which validates every field)."""
    f = dict(fields)
    for name in INT_LISTS:
        if isinstance(f.get(name), bytes):
            f[name] = _unpack_ints(name, f[name])
    for name in BLOB_LISTS:
        if isinstance(f.get(name), bytes):
            f[name] = _unpack_blobs(name, f[name])
    return ClientSession.from_state(f)


def copy_session(session: ClientSession) -> ClientSession:
    """An independent copy (what ``from_state(to_state())`` gives, without the parse): every slot, the
    dict-valued ones copied (the session replaces its other values, never edits them in place)."""
    copy = object.__new__(ClientSession)
    for slot in ClientSession.__slots__:
        value = getattr(session, slot)
        object.__setattr__(copy, slot, dict(value) if type(value) is dict else value)
    return copy


# id(record) -> (weak reference to the record, the object it holds); entries leave with their record
_LIVE: dict[int, tuple[weakref.ref[Any], Any]] = {}


def remember(record: Any, value: ClientSession | Any) -> None:
    """Keep ``value`` (a session: copied; anything else: kept as is, so pass only immutable values) as
    what ``record`` holds, while ``record`` lives (module docstring)."""
    key = id(record)
    try:
        ref = weakref.ref(record, functools.partial(_forget, key))
    except TypeError:  # a plain dict holder (tests): nothing to hold on to, every load parses
        return
    _LIVE[key] = (ref, copy_session(value) if isinstance(value, ClientSession) else value)


def _forget(key: int, ref: weakref.ref[Any]) -> None:
    entry = _LIVE.get(key)
    if entry is not None and entry[0] is ref:
        _LIVE.pop(key, None)


def recall(record: Any) -> ClientSession | Any | None:
    """What :func:`remember` kept for this very ``record`` object (a session: a fresh copy), or None."""
    entry = _LIVE.get(id(record))
    if entry is None or entry[0]() is not record:
        return None
    kept = entry[1]
    return copy_session(kept) if isinstance(kept, ClientSession) else kept
