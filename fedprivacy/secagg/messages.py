"""The SecAgg+ messages, one frozen dataclass per stage and direction, and their shape checks.

Every message holds ints, bools, bytes, lists and numpy arrays only, so :mod:`.wire` maps it 1:1 onto
a transport's records. A message carries no secret except the sealed shares (stage 2) and the shares
a holder reveals (stage 5). The stages and what each party checks are in ``docs/SECAGG.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

__all__ = [
    "AdvertiseKeys",
    "ConsistencyRequest",
    "ConsistencyResponse",
    "MaskedInput",
    "MaskedInputRequest",
    "ProtocolViolation",
    "RoundAborted",
    "SetupRequest",
    "ShareKeysRequest",
    "SharedKeys",
    "UnmaskRequest",
    "UnmaskResponse",
]


class ProtocolViolation(ValueError):
    """A message breaks the protocol (dishonest or buggy peer); the session refuses it unchanged."""


class RoundAborted(RuntimeError):
    """The round cannot complete; the server has no sum, and no honest input is revealed."""


# ----------------------------------------------------------------------------- messages
@dataclass(frozen=True, slots=True, kw_only=True)
class SetupRequest:
    """Stage 0, server -> client: the round's public parameters.

    ``colluders`` is the number of clients assumed to collude with the server (it enters the threshold
    rule, the signature threshold and the connectivity check); ``active`` selects the schedule with
    the consistency stage (secure against a malicious server) or the semi-honest one without it.
    """

    round: int
    threshold: int
    degree: int
    modulus_bits: int = 32
    dim: int
    min_survivors: int = 0  # 0 means "threshold"
    colluders: int = 0
    active: bool = False

    def __post_init__(self) -> None:
        for name in ("round", "threshold", "degree", "modulus_bits", "dim", "min_survivors", "colluders"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{name} must be an int, got {type(v).__name__}")
        if not isinstance(self.active, bool):
            raise TypeError(f"active must be a bool, got {type(self.active).__name__}")
        if not 0 <= self.round < 2**64:
            raise ValueError(f"round must be in [0, 2**64), got {self.round}")
        if not 16 <= self.modulus_bits <= 32:
            raise ValueError(f"modulus_bits must be in [16, 32], got {self.modulus_bits}")
        if self.dim < 1:
            raise ValueError(f"dim must be >= 1, got {self.dim}")
        if self.threshold < 1:
            raise ValueError(f"threshold must be >= 1, got {self.threshold}")
        if self.min_survivors < 0:
            raise ValueError(f"min_survivors must be >= 0, got {self.min_survivors}")
        if self.colluders < 0:
            raise ValueError(f"colluders must be >= 0, got {self.colluders}")

    @property
    def required_survivors(self) -> int:
        return max(self.min_survivors, self.threshold)


@dataclass(frozen=True, slots=True, kw_only=True)
class AdvertiseKeys:
    """Stage 1, client -> server: three fresh public keys and the commitment to the self-mask seed.

    With authenticated peers (:mod:`.peers`): the client's long-term Ed25519 public key and its
    signature over the advertisement (bound to the run, setup, round and node id); empty otherwise.
    """

    round: int
    node_id: int
    enc_public: bytes
    mask_public: bytes
    sign_public: bytes
    seed_commitment: bytes
    identity_public: bytes = b""
    identity_signature: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class ShareKeysRequest:
    """Stage 2, server -> clients: the roster U1 (parallel lists)."""

    round: int
    node_ids: list[int]
    enc_publics: list[bytes]
    mask_publics: list[bytes]
    sign_publics: list[bytes]
    seed_commitments: list[bytes]
    identity_publics: list[bytes] = field(default_factory=list)  # empty, or one per roster entry
    identity_signatures: list[bytes] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class SharedKeys:
    """Stage 2, client -> server: one sealed share pair per neighbour."""

    round: int
    node_id: int
    receivers: list[int]
    ciphertexts: list[bytes]
    component_commitments: list[bytes] = field(default_factory=list)  # XNoise seeds 1..m


@dataclass(frozen=True, slots=True, kw_only=True)
class MaskedInputRequest:
    """Stage 3, server -> client: the sealed shares addressed to this client, from U2."""

    round: int
    senders: list[int]
    ciphertexts: list[bytes]


@dataclass(frozen=True, slots=True, kw_only=True)
class MaskedInput:
    """Stage 3, client -> server: the masked vector, the peers it masked with (signed), the rejected."""

    round: int
    node_id: int
    masked: np.ndarray  # uint32, shape (dim,), values < 2**modulus_bits
    peers: list[int] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)
    signature: bytes = b""
    design: bytes = b""  # fingerprint of the XNoise design the client encoded with (signed)

    def __repr__(self) -> str:
        return (f"MaskedInput(round={self.round}, node_id={self.node_id}, peers={self.peers}, "
                f"rejected={self.rejected}, masked=<{self.masked.dtype} x {self.masked.shape}>)")


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsistencyRequest:
    """Stage 4, server -> survivors: the proposed view (D and every survivor's signed peer set).

    ``peer_counts[i]`` peers of ``survivors[i]`` follow each other in ``peer_flat``.
    """

    round: int
    survivors: list[int]
    dropped: list[int]
    peer_counts: list[int]
    peer_flat: list[int]
    peer_signatures: list[bytes]
    designs: list[bytes] = field(default_factory=list)  # per survivor (XNoise), empty without it


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsistencyResponse:
    """Stage 4, client -> server: the client's signature on the view."""

    round: int
    node_id: int
    signature: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class UnmaskRequest:
    """Stage 5, server -> client: U3, D and (active schedule) >= T signatures of U3 members on the view."""

    round: int
    survivors: list[int]
    dropped: list[int]
    signers: list[int] = field(default_factory=list)
    signatures: list[bytes] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class UnmaskResponse:
    """Stage 5, client -> server: shares of survivors' self-mask seeds and dropped peers' keys."""

    round: int
    node_id: int
    seed_owners: list[int] = field(default_factory=list)
    seed_shares: list[bytes] = field(default_factory=list)
    key_owners: list[int] = field(default_factory=list)
    key_shares: list[bytes] = field(default_factory=list)
    component_owners: list[int] = field(default_factory=list)  # XNoise: excess components only
    component_indices: list[int] = field(default_factory=list)
    component_shares: list[bytes] = field(default_factory=list)

    def __repr__(self) -> str:
        return (f"UnmaskResponse(round={self.round}, node_id={self.node_id}, "
                f"seed_owners={self.seed_owners}, key_owners={self.key_owners}, "
                f"component_owners={self.component_owners}, shares=<redacted>)")


# ----------------------------------------------------------------------------- stages and shape checks
class _Stage(Enum):
    NEW = 0
    ADVERTISED = 1
    SHARED = 2
    MASKED = 3
    SIGNED = 4
    DONE = 5
    ABORTED = 6


def _check_round(expected: int, got: int, what: str) -> None:
    if got != expected:
        raise ProtocolViolation(f"{what} is for round {got}, this session is round {expected} "
                                f"(replay from another round?)")


def _check_node_id(node_id: int) -> int:
    if isinstance(node_id, bool) or not isinstance(node_id, int) or not 0 <= node_id < 2**64 - 1:
        raise ValueError(f"node_id must be an int in [0, 2**64 - 1), got {node_id!r}")
    return node_id


def _unique(values: Sequence[int], what: str) -> list[int]:
    vals = list(values)
    if len(set(vals)) != len(vals):
        raise ProtocolViolation(f"{what} repeats a node")
    return vals


def _split_peer_lists(survivors: Sequence[int], counts: Sequence[int], flat: Sequence[int]
                      ) -> dict[int, tuple[int, ...]]:
    if len(counts) != len(survivors) or any(c < 0 for c in counts) or sum(counts) != len(flat):
        raise ProtocolViolation("peer lists do not match the survivors")
    out, pos = {}, 0
    for u, c in zip(survivors, counts, strict=True):
        out[u] = tuple(flat[pos:pos + c])
        pos += c
    return out


def _check_vector(vector: object, setup: SetupRequest, what: str) -> np.ndarray:
    if not isinstance(vector, np.ndarray) or vector.dtype != np.uint32 or vector.shape != (setup.dim,):
        got = f"{vector.dtype} x {vector.shape}" if isinstance(vector, np.ndarray) else type(vector).__name__
        raise ProtocolViolation(f"{what} must be uint32 x ({setup.dim},), got {got}")
    if setup.modulus_bits < 32 and int(vector.max(initial=0)) >= 1 << setup.modulus_bits:
        raise ProtocolViolation(f"{what} has values >= 2^{setup.modulus_bits}")
    return vector
