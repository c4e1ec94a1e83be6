"""The node's record of the rounds it took part in ("refuses to take part in one twice").

One :class:`fedprivacy.secagg.session_state.RoundLog` per run in the node's ``context.state`` (client side
only, never sent to the server), shared by the plain ``train`` path and the secure-aggregation
advertise stage: a round number is taken part in once, on either path, and round numbers strictly
increase (a server that sends the same local-mode round again and again would otherwise
average the client's fresh noise away). Node state can be rolled back: the same admission is also
recorded in the node's durable memory (:func:`clients.budget_log.admit`), which does not.
"""

from __future__ import annotations

from flwr.app import ConfigRecord, Context

from fedprivacy.secagg.session_state import RoundLog
from fedprivacy_flwr import codec

__all__ = ["load", "save"]

_LOG = "secagg-rounds"  # (name kept from the secagg-only log: existing node state stays valid)


def load(context: Context) -> RoundLog:
    # a plain lookup, not ``state.config_records`` (a fresh typed view of every record per access)
    record = codec.optional_record(context.state, _LOG, ConfigRecord)
    return RoundLog.from_state(record) if record is not None else RoundLog()


def save(context: Context, log: RoundLog) -> None:
    context.state[_LOG] = codec.config_record(log.to_state())
