"""Run one secure-aggregation round in a single process (tests, benchmarks, the in-process engine).

This is the reference driver of the state machines of :mod:`.client_session` and
:mod:`.server_session`: it passes each stage's messages between one :class:`ServerSession` and many
:class:`ClientSession` objects and lets clients drop out before a chosen stage. It does no cryptography of its own. With ``setup.active`` the round has
the consistency stage (five stages); without it, the four of the semi-honest schedule.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fedprivacy.secagg.client_session import ClientSession
from fedprivacy.secagg.messages import SetupRequest
from fedprivacy.secagg.server_session import ServerSession

__all__ = ["STAGES", "run_round"]

STAGES = ("advertise", "share", "masked", "consistency", "unmask")


def run_round(
    setup: SetupRequest,
    inputs: Mapping[int, np.ndarray],
    *,
    drop_before: Mapping[int, str] | None = None,
    transcript: list[object] | None = None,
) -> tuple[np.ndarray, ServerSession, dict[int, ClientSession]]:
    """Run a round; ``drop_before[node] = stage`` makes ``node`` vanish before that stage.

    If ``transcript`` is a list, every message the server sends or receives is appended to it (what a
    curious server sees). Returns the unmasked sum (uint32 mod 2^b), the server session (``u2``, ``u3``,
    ``failures``) and the clients. Raises :class:`.messages.RoundAborted` when too few clients remain.
    A ``"consistency"`` dropout in the semi-honest schedule acts at the unmask stage.
    """
    drop_before = dict(drop_before or {})
    for node, stage in drop_before.items():
        if stage not in STAGES:
            raise ValueError(f"drop_before[{node}] must be one of {STAGES}, got {stage!r}")

    def alive(node: int, stage: str) -> bool:
        d = drop_before.get(node)
        return d is None or STAGES.index(stage) < STAGES.index(d)

    seen = transcript if transcript is not None else []
    server = ServerSession(setup)
    clients = {i: ClientSession(node_id=i, setup=setup, colluders=setup.colluders,
                                require_active=setup.active) for i in inputs}
    adv = [c.advertise_keys() for i, c in clients.items() if alive(i, "advertise")]
    seen.extend(adv)
    roster = server.receive_keys(adv)
    seen.append(roster)
    shared = [clients[i].share_keys(roster) for i in roster.node_ids if alive(i, "share")]
    seen.extend(shared)
    reqs = server.receive_shares(shared)
    seen.extend(reqs.values())
    masked = [clients[i].masked_input(r, inputs[i]) for i, r in reqs.items() if alive(i, "masked")]
    seen.extend(masked)
    nxt = server.receive_masked(masked)
    seen.extend(nxt.values())
    if setup.active:
        views = [clients[i].sign_view(r) for i, r in nxt.items()  # type: ignore[arg-type]
                 if alive(i, "consistency")]
        seen.extend(views)
        nxt = server.receive_consistency(views)
        seen.extend(nxt.values())
    replies = [clients[i].unmask(r) for i, r in nxt.items()  # type: ignore[arg-type]
               if alive(i, "consistency" if not setup.active else "unmask") and alive(i, "unmask")]
    seen.extend(replies)
    return server.receive_unmask(replies), server, clients
