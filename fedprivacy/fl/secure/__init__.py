"""Secure aggregation in the DP-FedAvg round (``secagg = true``; privacy ``none`` or ``distributed``).

* :mod:`.server`: :class:`SecureRound`, the server's side of a round over a :class:`SecureTransport`;
* :mod:`.client`: the client's session store and its four protocol steps;
* :mod:`.params`: a run config's threshold, degree and encoding (over the pure
  :mod:`fedprivacy.secagg.encoding`);
* :mod:`.session`: a client session as flat fields for the node's own state.

The planning and reporting of distributed DP live with its privacy mode
(:mod:`fedprivacy.fl.modes.distributed`).
"""

from fedprivacy.fl.secure.client import (
    ExportedSessionStore,
    SessionStore,
    check_encoding,
    client_advertise,
    client_consistency,
    client_masked,
    client_masked_round,
    client_share,
    client_unmask,
    forget_peer_auth,
    peer_auth,
)
from fedprivacy.fl.secure.params import (
    encoding_kind,
    expected_cohort_size,
    make_encoding,
    secagg_parameters,
)
from fedprivacy.fl.secure.server import STAGES, PipelinedTransport, SecureRound, SecureTransport
from fedprivacy.fl.secure.session import export_session, import_session
from fedprivacy.secagg.encoding import EncodingSpec

__all__ = [
    "STAGES",
    "EncodingSpec",
    "ExportedSessionStore",
    "PipelinedTransport",
    "SecureRound",
    "SecureTransport",
    "SessionStore",
    "check_encoding",
    "client_advertise",
    "client_masked",
    "client_masked_round",
    "client_consistency",
    "client_share",
    "client_unmask",
    "encoding_kind",
    "expected_cohort_size",
    "export_session",
    "forget_peer_auth",
    "import_session",
    "make_encoding",
    "peer_auth",
    "secagg_parameters",
]
