"""Key agreement, key derivation and share sealing for secure aggregation.

Recipe (STYLE.md, convention 6; pyca/cryptography's own guidance):

* key agreement: X25519 (RFC 7748), one fresh key pair per purpose per round;
* key derivation: HKDF-SHA256 (RFC 5869) with ``info = b"fedprivacy/v1/<purpose>"`` and a ``salt`` that
  binds the context (protocol round and the two node ids), so one X25519 secret never yields the same
  key for two purposes or two rounds;
* sealing: ChaCha20-Poly1305 (RFC 8439) with a fresh random 96-bit nonce per message and associated data
  that binds purpose, round, sender and receiver. A ciphertext moved to another round, another sender or
  another receiver fails authentication.

Secrets are held in :class:`Secret`, whose ``repr``/``str`` never show the bytes, so that a key or seed
cannot reach a log line or a metrics record by accident.

Batch forms (:func:`derive_keys`, :func:`seal_many`, :func:`open_many`) do a client's k exchanges,
seals or opens in one call: the private key is parsed once, the purpose label checked once, the
nonces drawn in one :func:`secrets.token_bytes` call, and a failure names the index of the peer
(so a caller can drop that peer instead of aborting). Each item is computed exactly as by the
single-item function (tested), so the two forms interoperate.
"""

from __future__ import annotations

import functools
import secrets
import struct
from collections.abc import Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = [
    "INFO_PREFIX",
    "KeyPair",
    "Secret",
    "SealError",
    "context_bytes",
    "derive_key",
    "derive_keys",
    "load_private",
    "open_many",
    "open_sealed",
    "public_from_private",
    "seal",
    "seal_many",
]

INFO_PREFIX = b"fedprivacy/v1/"
NONCE_BYTES = 12
KEY_BYTES = 32


class SealError(ValueError):
    """A sealed message failed authentication (tampered, replayed or misrouted)."""


class Secret:
    """Bytes that must never be printed, logged or serialised by accident."""

    __slots__ = ("_value",)

    def __init__(self, value: bytes) -> None:
        if not isinstance(value, bytes | bytearray):
            raise TypeError(f"secret must be bytes, got {type(value).__name__}")
        self._value = bytes(value)

    def reveal(self) -> bytes:
        """The raw bytes; call only where they are consumed by a primitive."""
        return self._value

    def __len__(self) -> int:
        return len(self._value)

    def __repr__(self) -> str:
        return f"Secret(<{len(self._value)} bytes redacted>)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return secrets.compare_digest(self._value, other._value)

    def __hash__(self) -> int:  # pragma: no cover - secrets are not dict keys
        raise TypeError("Secret is not hashable")

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("Secret must not be pickled")


@functools.lru_cache(maxsize=64)
def _check_purpose(purpose: str) -> bytes:
    if not isinstance(purpose, str):
        raise TypeError(f"purpose must be a str, got {type(purpose).__name__}")
    if not purpose or not all(c.isalnum() or c in "-_" for c in purpose):
        raise ValueError(f"purpose must be a non-empty [A-Za-z0-9_-] label, got {purpose!r}")
    return INFO_PREFIX + purpose.encode("ascii")


def context_bytes(*, round: int, sender: int, receiver: int) -> bytes:
    """Fixed-width encoding of (round, sender, receiver): 3 x unsigned 64-bit big-endian."""
    for name, v in (("round", round), ("sender", sender), ("receiver", receiver)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
        if not 0 <= v < 2**64:
            raise ValueError(f"{name} must be in [0, 2**64), got {v}")
    return struct.pack(">QQQ", round, sender, receiver)


class KeyPair:
    """An X25519 key pair; the private half is a :class:`Secret` (32 raw bytes)."""

    __slots__ = ("private", "public")

    def __init__(self, private: Secret, public: bytes) -> None:
        self.private = private
        self.public = public

    @classmethod
    def generate(cls) -> KeyPair:
        """A fresh key pair; the private key is 32 bytes from :func:`secrets.token_bytes`."""
        raw = secrets.token_bytes(KEY_BYTES)
        return cls(Secret(raw), public_from_private(raw))

    def __repr__(self) -> str:
        return f"KeyPair(public={self.public.hex()[:16]}..., private=<redacted>)"


def public_from_private(private: bytes) -> bytes:
    """The raw 32-byte X25519 public key of a raw 32-byte private key (RFC 7748, clamping inside)."""
    key = X25519PrivateKey.from_private_bytes(bytes(private))
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def load_private(private: Secret | bytes) -> X25519PrivateKey:
    """An X25519 private-key object (to reuse across many exchanges without re-parsing)."""
    raw = private.reveal() if isinstance(private, Secret) else bytes(private)
    if len(raw) != KEY_BYTES:
        raise ValueError(f"X25519 private keys must be 32 bytes, got {len(raw)}")
    return X25519PrivateKey.from_private_bytes(raw)


def derive_key(
    private: Secret | bytes | X25519PrivateKey, peer_public: bytes, *, purpose: str, context: bytes
) -> bytes:
    """HKDF-SHA256(X25519(private, peer_public), salt=context, info=b"fedprivacy/v1/<purpose>").

    Both ends of a pair derive the same 32 bytes when ``context`` is built symmetrically (the caller
    orders the two node ids). Raises ValueError for a low-order peer point (all-zero shared secret,
    RFC 7748 section 6.1), which ``cryptography`` rejects.
    """
    info = _check_purpose(purpose)
    key = private if isinstance(private, X25519PrivateKey) else load_private(private)
    if len(peer_public) != KEY_BYTES:
        raise ValueError(f"X25519 public keys must be 32 bytes, got {len(peer_public)}")
    shared = key.exchange(X25519PublicKey.from_public_bytes(bytes(peer_public)))
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=context, info=info).derive(shared)


def derive_keys(
    private: Secret | bytes | X25519PrivateKey, peer_publics: Sequence[bytes], *, purpose: str,
    contexts: Sequence[bytes],
) -> list[bytes]:
    """:func:`derive_key` for many peers at once: ``out[i]`` is the key with ``peer_publics[i]``.

    Raises:
        ValueError: lengths differ, or ``peer_publics[i]`` is malformed or a low-order point (the
            message names ``i``).
    """
    info = _check_purpose(purpose)
    if len(peer_publics) != len(contexts):
        raise ValueError(f"peer_publics and contexts must have one length, got {len(peer_publics)} "
                         f"and {len(contexts)}")
    key = private if isinstance(private, X25519PrivateKey) else load_private(private)
    sha = hashes.SHA256()
    out = []
    for i, (pub, ctx) in enumerate(zip(peer_publics, contexts, strict=True)):
        if len(pub) != KEY_BYTES:
            raise ValueError(f"peer_publics[{i}]: X25519 public keys must be 32 bytes, got {len(pub)}")
        try:
            shared = key.exchange(X25519PublicKey.from_public_bytes(bytes(pub)))
        except ValueError as exc:
            raise ValueError(f"peer_publics[{i}]: {exc}") from None
        out.append(HKDF(algorithm=sha, length=KEY_BYTES, salt=ctx, info=info).derive(shared))
    return out


def _ad(purpose: str, context: bytes) -> bytes:
    return _check_purpose(purpose) + b"|" + context


def seal(key: bytes, plaintext: bytes, *, purpose: str, context: bytes) -> bytes:
    """ChaCha20-Poly1305 with a fresh random nonce; returns ``nonce || ciphertext || tag``."""
    nonce = secrets.token_bytes(NONCE_BYTES)
    return nonce + ChaCha20Poly1305(key).encrypt(nonce, plaintext, _ad(purpose, context))


def open_sealed(key: bytes, sealed: bytes, *, purpose: str, context: bytes) -> bytes:
    """Inverse of :func:`seal`; raises :class:`SealError` if authentication fails."""
    if not isinstance(sealed, bytes | bytearray):
        raise TypeError(f"sealed must be bytes, got {type(sealed).__name__}")
    if len(sealed) < NONCE_BYTES + 16:
        raise SealError(f"sealed message too short: {len(sealed)} bytes")
    nonce, body = bytes(sealed[:NONCE_BYTES]), bytes(sealed[NONCE_BYTES:])
    try:
        return ChaCha20Poly1305(key).decrypt(nonce, body, _ad(purpose, context))
    except InvalidTag:
        raise SealError(
            "sealed message failed authentication (tampered, or from another round/sender/receiver)"
        ) from None


def seal_many(keys: Sequence[bytes], plaintexts: Sequence[bytes], *, purpose: str,
              contexts: Sequence[bytes]) -> list[bytes]:
    """:func:`seal` item by item (``keys[i]``, ``plaintexts[i]``, ``contexts[i]``), fresh nonces."""
    if not len(keys) == len(plaintexts) == len(contexts):
        raise ValueError(f"keys, plaintexts and contexts must have one length, got {len(keys)}, "
                         f"{len(plaintexts)} and {len(contexts)}")
    prefix = _check_purpose(purpose) + b"|"
    nonces = secrets.token_bytes(NONCE_BYTES * len(keys))
    out = []
    for i, (key, pt, ctx) in enumerate(zip(keys, plaintexts, contexts, strict=True)):
        nonce = nonces[NONCE_BYTES * i : NONCE_BYTES * (i + 1)]
        out.append(nonce + ChaCha20Poly1305(key).encrypt(nonce, pt, prefix + ctx))
    return out


def open_many(keys: Sequence[bytes], sealed: Sequence[bytes], *, purpose: str,
              contexts: Sequence[bytes]) -> list[bytes]:
    """:func:`open_sealed` item by item; raises :class:`SealError` naming the first failing index."""
    if not len(keys) == len(sealed) == len(contexts):
        raise ValueError(f"keys, sealed and contexts must have one length, got {len(keys)}, "
                         f"{len(sealed)} and {len(contexts)}")
    prefix = _check_purpose(purpose) + b"|"
    out = []
    for i, (key, msg, ctx) in enumerate(zip(keys, sealed, contexts, strict=True)):
        if not isinstance(msg, bytes | bytearray):
            raise TypeError(f"sealed[{i}] must be bytes, got {type(msg).__name__}")
        if len(msg) < NONCE_BYTES + 16:
            raise SealError(f"sealed[{i}]: message too short: {len(msg)} bytes")
        try:
            out.append(ChaCha20Poly1305(key).decrypt(bytes(msg[:NONCE_BYTES]), bytes(msg[NONCE_BYTES:]),
                                                     prefix + ctx))
        except InvalidTag:
            raise SealError(f"sealed[{i}] failed authentication (tampered, or from another "
                            f"round/sender/receiver)") from None
    return out
