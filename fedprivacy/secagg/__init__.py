"""Secure aggregation (SecAgg+, Bell et al. 2020; Bonawitz et al. 2017) with distributed DP.

Pure and transport-free: the state machines in :mod:`.protocol` exchange plain dataclasses of ints,
bytes, lists and numpy arrays; the Flower glue in ``server/`` and ``clients/`` only encodes them.
See ``docs/SECAGG.md`` for the threat model and the protocol write-up.
"""

from fedprivacy.secagg.protocol import (
    AdvertiseKeys,
    ClientSession,
    MaskedInput,
    MaskedInputRequest,
    ProtocolViolation,
    RoundAborted,
    ServerSession,
    SetupRequest,
    SharedKeys,
    ShareKeysRequest,
    UnmaskRequest,
    UnmaskResponse,
)

__all__ = [
    "AdvertiseKeys",
    "ClientSession",
    "MaskedInput",
    "MaskedInputRequest",
    "ProtocolViolation",
    "RoundAborted",
    "ServerSession",
    "SetupRequest",
    "ShareKeysRequest",
    "SharedKeys",
    "UnmaskRequest",
    "UnmaskResponse",
]
