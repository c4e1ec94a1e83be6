"""Authenticated peers: long-term Ed25519 identities over the per-round key advertisements.

Each client signs its :class:`.AdvertiseKeys` with its long-term Ed25519 key (RFC 8032) over
:func:`advertisement_statement`: the run id, a digest of the round's setup, the round, its node id and
the four advertised values, so one signature vouches for one advertisement of one run, setup and round.
Before it shares anything (stage 2) a client checks every roster entry against that peer's long-term
key: from the operator's peer directory (node id -> public key, given out of band) or, without one,
pinned on first use in the client's own file (:class:`FilePinStore`; without a key of the operator's the
client makes its own once, :func:`own_identity`). A substituted key, a missing or
replayed signature, a peer outside the directory or a changed pin is refused (ProtocolViolation: the
client drops out of the round). The directory is the PKI that Bonawitz et al. 2017 (CCS, Sec. 6,
active adversary) and Bell et al. 2020 (CCS, malicious-server variant) assume; pinning gives it after
first contact only. Which assumption holds in each case: ``docs/SECAGG.md`` ("Peer keys").
Node ids are the protocol's (the client's ``partition-id``), not the ids the server assigns.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import secrets
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedprivacy.secagg.messages import (
    AdvertiseKeys,
    ProtocolViolation,
    SetupRequest,
    ShareKeysRequest,
)
from fedprivacy.secagg.transcript import _verify

__all__ = ["FilePinStore", "PeerAuth", "PinStore", "advertisement_statement", "generate_identity",
           "identity_columns", "load_directory", "load_identity", "own_identity"]

_DOMAIN = b"fedprivacy/v1/peer-advertisement"


@functools.lru_cache(maxsize=16)
def _setup_digest(setup: SetupRequest) -> bytes:
    """SHA-256 of the setup's fields; once per setup and process (a roster check hashes it per entry)."""
    values = [int(getattr(setup, f.name)) for f in dataclasses.fields(setup)]
    return hashlib.sha256(struct.pack(f">{len(values)}Q", *values)).digest()


def advertisement_statement(*, run_id: int, setup: SetupRequest, node_id: int, enc_public: bytes,
                            mask_public: bytes, sign_public: bytes, seed_commitment: bytes) -> bytes:
    """What a client's long-term key signs: domain, run id, setup digest, round, node id, the keys."""
    return b"".join((_DOMAIN, struct.pack(">QQQ", int(run_id) % 2**64, setup.round, node_id),
                     _setup_digest(setup), enc_public, mask_public, sign_public, seed_commitment))


def identity_columns(adverts: Sequence[AdvertiseKeys]) -> dict[str, list[bytes]]:
    """The roster's identity columns as the server relays them: empty when no entry carries one."""
    if not any(a.identity_signature or a.identity_public for a in adverts):
        return {}
    return {"identity_publics": [a.identity_public for a in adverts],
            "identity_signatures": [a.identity_signature for a in adverts]}


def _public_bytes(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def load_identity(path: str | os.PathLike[str], *, what: str = "client-identity-key") -> Ed25519PrivateKey:
    """The client's long-term Ed25519 private key (unencrypted PKCS#8 PEM); ValueError naming ``what``."""
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        detail = " ".join(str(exc).split())  # one line
        raise ValueError(f"{what}: cannot read an Ed25519 private key from {str(path)!r}, refusing: {detail}"
                         ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{what}: {str(path)!r} holds a {type(key).__name__}, not an Ed25519 key")
    return key


def _fsync_dir(path: Path) -> None:
    dfd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _write_new(path: Path, data: bytes) -> None:
    """``data`` at ``path`` (owner-only), written whole, fsync'd, then linked into place: a reader sees no
    file or the whole one; FileExistsError when ``path`` exists (another process's key is never replaced)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f"{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)  # the no-clobber rename
    finally:
        os.unlink(tmp)
    _fsync_dir(path.parent)


def _pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def generate_identity(path: str | os.PathLike[str]) -> bytes:
    """Write a fresh long-term key to ``path`` (owner-only PEM, durable) and return its raw public key;
    FileExistsError when ``path`` exists."""
    key = Ed25519PrivateKey.generate()
    _write_new(Path(path), _pem(key))
    return _public_bytes(key)


def own_identity(path: str | os.PathLike[str], *, what: str = "client-identity-key") -> Ed25519PrivateKey:
    """The node's own long-term key at ``path``, generated there on first use (trust on first use needs
    no operator step): a fresh key is written whole, fsync'd and linked into place before it signs
    anything, so a crash leaves no file or the whole one, and two processes of one node end up with the
    same key (the one linked first). A file that exists is read, never replaced: a truncated or altered
    one is refused (ValueError naming ``what``), since a new key would be refused by every peer that
    pinned the old one."""
    target = Path(path)
    if not os.path.lexists(target):
        try:
            _write_new(target, _pem(Ed25519PrivateKey.generate()))
        except OSError as exc:
            # FileExistsError with the file there: another process of this node made it first (its key is
            # the one to use); without it, something else is in the way
            if not (isinstance(exc, FileExistsError) and os.path.lexists(target)):
                raise ValueError(f"{what}: cannot create this node's long-term key {str(target)!r}: {exc}"
                                 ) from None
    return load_identity(target, what=what)


def _parse_keys(raw: object, where: str) -> dict[int, bytes]:
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be a JSON object of node id -> hex Ed25519 public key")
    out: dict[int, bytes] = {}
    for node, key in raw.items():
        try:
            node_id, public = int(node), bytes.fromhex(key)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: entry {node!r} is not node id -> hex public key") from None
        if len(public) != 32 or not 0 <= node_id < 2**64:
            raise ValueError(f"{where}: entry {node!r} is not a 32-byte Ed25519 public key")
        out[node_id] = public
    return out


def load_directory(path: str | os.PathLike[str], *, what: str = "client-peer-directory") -> dict[int, bytes]:
    """The peer directory: a JSON object ``{"<node id>": "<hex of the raw 32-byte public key>"}``."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{what}: cannot read the peer directory {str(path)!r}: {exc}") from None
    return _parse_keys(raw, f"{what} {str(path)!r}")


class PinStore(Protocol):
    """Where a client keeps the long-term keys it pinned on first use (durable before ``pin`` returns)."""

    def pins(self) -> dict[int, bytes]: ...

    def pin(self, new: Mapping[int, bytes]) -> None: ...


class FilePinStore:
    """Pins in a JSON file of the client's own (written whole, fsync'd, renamed, directory fsync'd)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def pins(self) -> dict[int, bytes]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        try:
            return _parse_keys(json.loads(text), f"peer pins {str(self.path)!r}")
        except ValueError as exc:  # a truncated or altered file is refused, never read as "no pins"
            raise ValueError(f"peer pins {str(self.path)!r} are unreadable, refusing: {exc}") from None

    def pin(self, new: Mapping[int, bytes]) -> None:
        """Add ``new`` under an exclusive lock (two processes of one node never lose each other's pins),
        refusing a peer that another process pinned to another key meanwhile."""
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock = os.open(self.path.with_name(self.path.name + ".lock"), os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            current = self.pins()
            changed = sorted(k for k, v in new.items() if k in current and current[k] != v)
            if changed:
                raise ProtocolViolation(f"peers {changed} were pinned to other keys meanwhile; refusing")
            tmp = self.path.with_name(f"{self.path.name}.{secrets.token_hex(8)}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump({str(k): v.hex() for k, v in sorted({**current, **new}.items())}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            _fsync_dir(self.path.parent)
        finally:
            os.close(lock)  # releases the lock


@dataclasses.dataclass(frozen=True, slots=True)
class PeerAuth:
    """A client's long-term identity and how it authenticates its peers: ``directory`` (node id ->
    public key) when the operator gave one, else ``pins`` (trust on first use)."""

    identity: Ed25519PrivateKey = dataclasses.field(repr=False)
    directory: Mapping[int, bytes] | None = None
    pins: PinStore | None = None

    def __post_init__(self) -> None:
        if (self.directory is None) == (self.pins is None):
            raise ValueError("PeerAuth needs exactly one of a peer directory and a pin store")

    @property
    def public(self) -> bytes:
        return _public_bytes(self.identity)

    def sign(self, ad: AdvertiseKeys, *, run_id: int, setup: SetupRequest) -> AdvertiseKeys:
        """``ad`` with this client's long-term public key and signature."""
        data = advertisement_statement(run_id=run_id, setup=setup, node_id=ad.node_id,
                                       enc_public=ad.enc_public, mask_public=ad.mask_public,
                                       sign_public=ad.sign_public, seed_commitment=ad.seed_commitment)
        return dataclasses.replace(ad, identity_public=self.public, identity_signature=self.identity.sign(data))

    def check_roster(self, request: ShareKeysRequest, *, node_id: int, run_id: int, setup: SetupRequest) -> None:
        """Refuse (ProtocolViolation) a roster entry not signed by its peer's long-term key; pin the keys
        of first-seen peers (durably) once the whole roster passed."""
        ids = list(request.node_ids)
        pubs, sigs = list(request.identity_publics), list(request.identity_signatures)
        if len(pubs) != len(ids) or len(sigs) != len(ids):
            raise ProtocolViolation("roster carries no long-term signature for every peer: refusing")
        known = dict(self.directory) if self.directory is not None else self.pins.pins()  # type: ignore[union-attr]
        if known.get(node_id, self.public) != self.public:
            raise ProtocolViolation(f"the long-term key on record for this client ({node_id}) is not its own")
        known[node_id] = self.public  # its own entry must carry its own key
        new: dict[int, bytes] = {}
        cols = zip(ids, request.enc_publics, request.mask_publics, request.sign_publics,
                   request.seed_commitments, pubs, sigs, strict=True)
        for node, enc, mask, sign, commit, public, sig in cols:
            expected = known.get(node)
            if expected is None and self.directory is not None:
                raise ProtocolViolation(f"peer {node} is not in the peer directory: refusing")
            if expected is not None and public != expected:
                raise ProtocolViolation(f"peer {node}'s long-term key is not the one "
                                        f"{'in the directory' if self.directory is not None else 'pinned'}")
            data = advertisement_statement(run_id=run_id, setup=setup, node_id=node, enc_public=enc,
                                           mask_public=mask, sign_public=sign, seed_commitment=commit)
            if not _verify(public, sig, data):
                raise ProtocolViolation(f"peer {node}'s advertised keys are not signed by its long-term key")
            if expected is None and node != node_id:
                new[node] = public
        if new and self.pins is not None:
            self.pins.pin(new)

    @classmethod
    def from_paths(cls, *, identity: str, directory: str = "", pins: str | os.PathLike[str] = "",
                   create: bool = False) -> PeerAuth | None:
        """From the client's configuration: ``None`` without an identity key (then a directory is refused);
        ``directory`` when given, else the pin file ``pins``. ``create``: ``identity`` is the node's own
        generated key (:func:`own_identity`), made on first use; only without a directory."""
        if not identity:
            if directory:
                raise ValueError("client-peer-directory needs client-identity-key (this client's own "
                                 "long-term Ed25519 key, to sign its advertisements)")
            return None
        if create and directory:
            raise ValueError("client-peer-directory needs client-identity-key (the key the directory names)")
        key = own_identity(identity) if create else load_identity(identity)
        if directory:
            return cls(key, directory=load_directory(directory))
        if not str(pins):
            raise ValueError("client-identity-key without client-peer-directory needs a pin file")
        return cls(key, pins=FilePinStore(pins))
