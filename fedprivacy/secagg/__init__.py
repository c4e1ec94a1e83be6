"""Secure aggregation (SecAgg+, Bell et al. 2020; Bonawitz et al. 2017) with distributed DP.

Pure and transport-free: the state machines of :mod:`.client_session` and :mod:`.server_session`
exchange the plain dataclasses of :mod:`.messages` (ints, bytes, lists and numpy arrays); the Flower glue in ``server/`` and ``clients/`` only encodes them.
See ``docs/SECAGG.md`` for the threat model and the protocol write-up.
"""

from fedprivacy.secagg.client_session import ClientSession
from fedprivacy.secagg.messages import (
    AdvertiseKeys,
    MaskedInput,
    MaskedInputRequest,
    ProtocolViolation,
    RoundAborted,
    SetupRequest,
    SharedKeys,
    ShareKeysRequest,
    UnmaskRequest,
    UnmaskResponse,
)
from fedprivacy.secagg.server_session import ServerSession

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
