"""A client's SecAgg session as flat fields for the node's own state (the state machine serialises
itself: :meth:`fedprivacy.secagg.protocol.ClientSession.to_state` / ``from_state``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedprivacy.secagg.protocol import ClientSession

__all__ = ["export_session", "import_session"]


def export_session(session: ClientSession) -> dict[str, Any]:
    """A client session as flat fields for the node's own state: :meth:`ClientSession.to_state`.

    It holds the round's secrets (private keys, self-mask seed, held shares): it must stay on the
    client side (Flower's ``context.state`` lives in the SuperNode and its ClientApp process and is
    never sent to the server), and must never be logged, put in metrics or written to disk.
    """
    return session.to_state()


def import_session(fields: Mapping[str, Any]) -> ClientSession:
    """Rebuild a :class:`ClientSession` from :func:`export_session` (:meth:`ClientSession.from_state`)."""
    return ClientSession.from_state(fields)
