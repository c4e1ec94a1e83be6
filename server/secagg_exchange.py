"""Secure aggregation over the Flower Grid: the transport of :class:`fedprivacy.fl.secure.SecureRound`.

Wire format (Message API; ``group_id`` = round, so fault plans and logs see the round):

=====================  ============================================  ==================================
message type           content (server -> client)                    reply content
=====================  ============================================  ==================================
query.secagg_advertise ``secagg`` ConfigRecord (SetupRequest)        ``secagg`` (AdvertiseKeys)
query.secagg_share     ``secagg`` (ShareKeysRequest), ``config``     ``secagg`` (SharedKeys)
                       (round instructions), ``encoding``
train.secagg_masked    ``arrays`` (model), ``config`` (round          ``secagg`` (MaskedInput header),
                       instructions), ``secagg``                     ``secagg-masked`` ArrayRecord
                       (MaskedInputRequest)                          (residues packed to b bits:
                                                                     ceil(m b/8) bytes), ``metrics``
query.secagg_unmask    ``secagg`` (UnmaskRequest) and/or             ``secagg`` (UnmaskResponse),
                       ``secagg-next`` (SetupRequest of round r+1)   ``secagg-next`` (AdvertiseKeys r+1)
=====================  ============================================  ==================================

Every ``secagg`` record holds ``stage``, ``kind`` (:data:`fedprivacy.secagg.wire.MESSAGE_TYPES`) and the
message's flat fields from :func:`fedprivacy.secagg.wire.encode`; only public keys, sealed shares,
revealed stage-4 shares and masked vectors travel. Protocol node ids are partition ids, so results do
not depend on Flower's random node ids. A missing or failed reply is a dropout at that stage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from fedprivacy.fl.secure import EncodingSpec
from fedprivacy.fl.types import RoundInstructions
from fedprivacy_flwr import codec
from fedprivacy_flwr.secagg_records import MESSAGE_TYPES, from_records, to_records


class GridSecureTransport:
    """:class:`fedprivacy.fl.secure.SecureTransport` over a Flower Grid (one exchange per stage)."""

    def __init__(self, grid: Grid, nodes: Mapping[int, int], *, timeout: float) -> None:
        self.grid = grid
        self.nodes = dict(nodes)
        self.timeout = timeout

    def _message(self, name: str, pid: int, request: Any, *, shared: dict[str, Any]) -> Message:
        content = to_records(name, request)
        content.update(shared)
        return Message(content=RecordDict(content), dst_node_id=self.nodes[pid],
                       message_type=MESSAGE_TYPES[name], group_id=str(request.round))

    def stage(self, name: str, requests: Mapping[int, Any], *, instructions: RoundInstructions | None = None,
              weights: Sequence[np.ndarray] | None = None, encoding: EncodingSpec | None = None,
              ) -> tuple[dict[int, Any], dict[int, str]]:
        shared = _stage_records(name, instructions=instructions, weights=weights, encoding=encoding)
        messages = [self._message(name, pid, req, shared=shared) for pid, req in requests.items()]
        pid_of = {self.nodes[pid]: pid for pid in requests}
        replies = self.grid.send_and_receive(messages, timeout=self.timeout) if messages else []
        out: dict[int, Any] = {}
        failures: dict[int, str] = {}
        for reply in replies:
            pid = pid_of.get(reply.metadata.src_node_id)
            if pid is None:
                continue
            if reply.has_error():
                failures[pid] = f"secagg {name}: {codec.error_text(reply)}"
                continue
            try:
                msg = from_records(reply.content, stage=name)
                if name == "masked":
                    out[pid] = (msg, codec.update_metadata(reply.content, pid))
                else:
                    out[pid] = msg
            except (KeyError, ValueError, TypeError) as exc:
                failures[pid] = f"secagg {name}: malformed reply: {exc}"
        for pid in requests:
            if pid not in out and pid not in failures:
                failures[pid] = f"secagg {name}: no reply within client-timeout ({self.timeout:g} s)"
        return out, failures

    def unmask_and_advertise(self, unmask: Mapping[int, Any], setups: Mapping[int, Any]
                             ) -> tuple[dict[int, Any], dict[int, str], dict[int, Any], dict[int, str]]:
        """Round r's unmask stage and round r+1's advertise stage in one exchange."""
        return _unmask_and_advertise(self, unmask, setups)


def _stage_records(name: str, *, instructions: RoundInstructions | None,
                   weights: Sequence[np.ndarray] | None, encoding: EncodingSpec | None) -> dict[str, Any]:
    """The records every message of a stage shares (built once per stage, not once per client):
    ``share`` carries the instructions and the encoding, ``masked`` the instructions and the model."""
    if name == "share":
        if instructions is None or encoding is None:
            raise ValueError("the share stage needs the round instructions and the encoding")
        return {"config": ConfigRecord(instructions.to_record()),
                "encoding": ConfigRecord(encoding.to_record())}
    if name == "masked":
        if instructions is None or weights is None:
            raise ValueError("the masked stage needs the round instructions and the model")
        return {"arrays": codec.arrays_to_record(weights), "config": ConfigRecord(instructions.to_record())}
    return {}


def _unmask_and_advertise(transport: GridSecureTransport, unmask: Mapping[int, Any],
                          setups: Mapping[int, Any]) -> tuple[dict[int, Any], dict[int, str],
                                                              dict[int, Any], dict[int, str]]:
    """One exchange: round r's ``UnmaskRequest`` (``secagg``) and round r+1's ``SetupRequest``
    (``secagg-next``), merged into one ``query.secagg_unmask`` message per node."""
    messages = []
    for pid in sorted(set(unmask) | set(setups)):
        content: dict[str, Any] = {}
        if pid in unmask:
            content.update(to_records("unmask", unmask[pid]))
        if pid in setups:
            content.update(to_records("advertise", setups[pid], record="secagg-next"))
        rnd = unmask[pid].round if pid in unmask else setups[pid].round - 1
        messages.append(Message(content=RecordDict(content), dst_node_id=transport.nodes[pid],
                                message_type=MESSAGE_TYPES["unmask"], group_id=str(rnd)))
    pid_of = {transport.nodes[pid]: pid for pid in set(unmask) | set(setups)}
    replies = transport.grid.send_and_receive(messages, timeout=transport.timeout) if messages else []
    unm: dict[int, Any] = {}
    adv: dict[int, Any] = {}
    unm_fail: dict[int, str] = {}
    adv_fail: dict[int, str] = {}
    for reply in replies:
        src = pid_of.get(reply.metadata.src_node_id)
        if src is None:
            continue
        pid = src
        if reply.has_error():
            for want, fail in ((unmask, unm_fail), (setups, adv_fail)):
                if pid in want:
                    fail[pid] = f"secagg unmask/advertise: {codec.error_text(reply)}"
            continue
        for want, name, stage, out, fail in ((unmask, "secagg", "unmask", unm, unm_fail),
                                             (setups, "secagg-next", "advertise", adv, adv_fail)):
            if pid in want:
                try:
                    out[pid] = from_records(reply.content, stage=stage, name=name)
                except (KeyError, ValueError, TypeError) as exc:
                    fail[pid] = f"secagg {stage}: malformed reply: {exc}"
    for want, out, fail, stage in ((unmask, unm, unm_fail, "unmask"), (setups, adv, adv_fail, "advertise")):
        for pid in want:
            if pid not in out and pid not in fail:
                fail[pid] = f"secagg {stage}: no reply within client-timeout ({transport.timeout:g} s)"
    return unm, unm_fail, adv, adv_fail
