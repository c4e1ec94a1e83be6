"""What one SecAgg+ round hashes, signs and derives: the world id, commitments, signed statements.

The world id ``W = SHA-256(setup | roster)`` names one protocol instance; it seeds the masking graph
and is bound into every AEAD associated data, HKDF salt and signed statement, so clients shown
different setups or rosters can combine nothing. Commitments are SHA-256 with a domain label (binding,
and hiding for uniformly random 256-bit seeds in the random-oracle model); signatures are Ed25519
(RFC 8032); pairwise mask seeds are X25519 -> HKDF-SHA256 with ``info=b"fedprivacy/v1/mask"``.
The argument that these bindings give is in ``docs/SECAGG.md``.
"""

from __future__ import annotations

import functools
import hashlib
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from fedprivacy.secagg import shamir
from fedprivacy.secagg.keys import Secret, context_bytes, derive_key

if TYPE_CHECKING:
    from fedprivacy.secagg.messages import SetupRequest, ShareKeysRequest

__all__ = ["component_commitment", "seed_commitment", "world_id"]

_SHARE_SEAL = "share-seal"
_MASK = "mask"
_KEY_BYTES = 32
_SIG_BYTES = 64


def _abscissae(ids: Iterable[int]) -> dict[int, int]:
    """Shamir abscissa of each roster member: 1 + its position in the sorted roster (the limbed
    scheme of :mod:`.shamir` needs abscissae in [1, 2^31 - 1); the world fixes the roster)."""
    return {i: k + 1 for k, i in enumerate(sorted(ids))}


_SECRET_BYTES = 32


_ROW_BYTES = 4 * shamir.limbs_per_secret(_SECRET_BYTES)


def _share_rows(data: bytes, start: int, stop: int) -> bytes:
    """``encode_shares(decode_shares(data, ...)[start:stop])`` for ``data`` that ``decode_shares`` accepted:
    the encoding is the rows' little-endian limbs one after another, so rows ``start..stop`` are these
    bytes (no second decode/encode per row)."""
    return bytes(data[_ROW_BYTES * start:_ROW_BYTES * stop])


def _u64s(values: Iterable[int]) -> bytes:
    vals = list(values)
    return struct.pack(f">Q{len(vals)}Q", len(vals), *vals)


def seed_commitment(*, round: int, node_id: int, seed: bytes) -> bytes:
    """``SHA-256("fedprivacy/v1/seed-commit" | round | node_id | seed)``: binding, and hiding for a
    uniformly random 256-bit seed (random-oracle model)."""
    return hashlib.sha256(b"fedprivacy/v1/seed-commit" + struct.pack(">QQ", round, node_id)
                          + bytes(seed)).digest()


def component_commitment(*, round: int, node_id: int, index: int, seed: bytes) -> bytes:
    """Commitment to XNoise component seed ``index`` (same construction as :func:`seed_commitment`)."""
    return hashlib.sha256(b"fedprivacy/v1/component-commit" + struct.pack(">QQQ", round, node_id, index)
                          + bytes(seed)).digest()


def world_id(setup: SetupRequest, roster: ShareKeysRequest) -> bytes:
    """``SHA-256`` over every setup field and the sorted roster: the identity of one protocol instance."""
    columns = (tuple(roster.node_ids), tuple(roster.enc_publics), tuple(roster.mask_publics),
               tuple(roster.sign_publics), tuple(roster.seed_commitments))
    try:
        return _world_id(setup, *columns)
    except TypeError:  # an unhashable element (a bytearray key): computed without the cache
        return _world_id.__wrapped__(setup, *columns)


@functools.lru_cache(maxsize=16)
def _world_id(setup: SetupRequest, *columns: tuple[Any, ...]) -> bytes:
    """:func:`world_id` of equal inputs, computed once per process (every client of the in-process engine
    derives the world of the same roster; equal setups and columns pack to the same bytes)."""
    h = hashlib.sha256(b"fedprivacy/v1/world")
    h.update(struct.pack(">QQQQQQQ?", setup.round, setup.threshold, setup.degree, setup.modulus_bits,
                         setup.dim, setup.min_survivors, setup.colluders, setup.active))
    entries = sorted(zip(*columns, strict=True))
    parts = [struct.pack(">Q", len(entries))]  # hashed as one string: the same bytes as one update each
    for node_id, *keys in entries:
        parts.append(struct.pack(">Q", node_id))
        for k in keys:
            parts.append(struct.pack(">H", len(k)))
            parts.append(bytes(k))
    h.update(b"".join(parts))
    return h.digest()


def _context(world: bytes, round_: int, sender: int, receiver: int) -> bytes:
    return world + context_bytes(round=round_, sender=sender, receiver=receiver)


def _pair_seed(mask_private: X25519PrivateKey, peer_mask_public: bytes, *, world: bytes, round_: int,
               me: int, peer: int) -> bytes:
    lo, hi = (me, peer) if me < peer else (peer, me)
    return derive_key(mask_private, peer_mask_public, purpose=_MASK,
                      context=_context(world, round_, lo, hi))


def _peers_statement(world: bytes, node_id: int, peers: Sequence[int], design: bytes = b"") -> bytes:
    return (b"fedprivacy/v1/peers" + world + struct.pack(">Q", node_id) + _u64s(peers)
            + struct.pack(">H", len(design)) + design)


def _view_digest(world: bytes, survivors: Sequence[int], dropped: Sequence[int],
                 peer_sets: Mapping[int, Sequence[int]], design: bytes = b"") -> bytes:
    h = hashlib.sha256(b"fedprivacy/v1/view" + world)
    h.update(_u64s(sorted(survivors)))
    h.update(_u64s(sorted(dropped)))
    for u in sorted(survivors):
        h.update(_u64s(peer_sets[u]))
    h.update(struct.pack(">H", len(design)) + design)
    return h.digest()


def _view_statement(digest: bytes) -> bytes:
    return b"fedprivacy/v1/view-signature" + digest


def _sign(private: Secret, data: bytes) -> bytes:
    return Ed25519PrivateKey.from_private_bytes(private.reveal()).sign(data)


@functools.lru_cache(maxsize=1 << 16)
def _verify(public: bytes, signature: bytes, data: bytes) -> bool:
    """Ed25519 verification (RFC 8032). Cached: in one process (the in-process engine) many clients
    verify the same statement, and a triple that verified once stays valid."""
    if len(public) != _KEY_BYTES or len(signature) != _SIG_BYTES:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, data)
    except (InvalidSignature, ValueError):
        return False
    return True
