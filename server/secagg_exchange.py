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
query.secagg_consist. ``secagg`` (ConsistencyRequest)               ``secagg`` (ConsistencyResponse)
query.secagg_unmask    ``secagg`` (UnmaskRequest)                    ``secagg`` (UnmaskResponse)
=====================  ============================================  ==================================

(``query.secagg_consist.`` = ``query.secagg_consistency``.) Round r+1's key stage riding on round r's exchange (:meth:`GridSecureTransport.stage_with_next`): a node
in both gets one message of round r's type and group carrying round r+1's part as ``secagg-next`` (and
the share stage's ``config-next``, ``encoding-next``); its reply carries ``secagg-next`` (or
``secagg-next-error`` when only that part failed). A node only in round r+1 gets that stage's own message.

Every ``secagg`` record holds ``stage``, ``kind`` (:data:`fedprivacy.secagg.wire.MESSAGE_TYPES`) and the
message's flat fields from :func:`fedprivacy.secagg.wire.encode`; only public keys, sealed shares,
revealed stage-4 shares and masked vectors travel. Protocol node ids are partition ids, so results do
not depend on Flower's random node ids. A missing or failed reply is a dropout at that stage.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message
from flwr.serverapp import Grid

from fedprivacy.fl.secure import EncodingSpec
from fedprivacy.fl.types import RoundInstructions
from fedprivacy_flwr import codec
from fedprivacy_flwr.secagg_records import MESSAGE_TYPES, from_records, to_records


class GridSecureTransport:
    """:class:`fedprivacy.fl.secure.SecureTransport` over a Flower Grid (one exchange per stage)."""

    def __init__(self, grid: Grid, nodes: Mapping[int, int], *, timeout: float) -> None:
        self.grid = grid
        # a snapshot, unless the map is read-only already (server.loop.PartitionNodes: no million-entry copy)
        self.nodes = dict(nodes) if isinstance(nodes, MutableMapping) else nodes
        self.timeout = timeout

    def _message(self, name: str, pid: int, request: Any, content: dict[str, Any]) -> Message:
        return Message(content=codec.record_dict(content), dst_node_id=self.nodes[pid],
                       message_type=MESSAGE_TYPES[name], group_id=str(request.round))

    def stage(self, name: str, requests: Mapping[int, Any], *, instructions: RoundInstructions | None = None,
              weights: Sequence[np.ndarray] | None = None, encoding: EncodingSpec | None = None,
              ) -> tuple[dict[int, Any], dict[int, str]]:
        payload = {"instructions": instructions, "weights": weights, "encoding": encoding}
        return self.stage_with_next(name, requests, payload, "advertise", {}, {})[0]

    def stage_with_next(self, name: str, requests: Mapping[int, Any], payload: Mapping[str, Any],
                        next_name: str, next_requests: Mapping[int, Any], next_payload: Mapping[str, Any],
                        ) -> tuple[tuple[dict[int, Any], dict[int, str]], tuple[dict[int, Any], dict[int, str]]]:
        """One exchange: stage ``name`` of round r and stage ``next_name`` of round r+1 (module docstring)."""
        shared = _stage_records(name, **payload)
        nxt_shared = _stage_records(next_name, **next_payload) if next_requests else {}
        records = _RequestRecords()
        messages = []
        for pid, req in requests.items():
            content = records(name, req)
            content.update(shared)
            if pid in next_requests:
                content.update(records(next_name, next_requests[pid], record="secagg-next"))
                content.update({f"{key}-next": rec for key, rec in nxt_shared.items()})
            messages.append(self._message(name, pid, req, content))
        messages += [self._message(next_name, pid, req, {**records(next_name, req), **nxt_shared})
                     for pid, req in next_requests.items() if pid not in requests]
        pid_of = {self.nodes[pid]: pid for pid in set(requests) | set(next_requests)}
        replies = self.grid.send_and_receive(messages, timeout=self.timeout) if messages else []
        main: tuple[dict[int, Any], dict[int, str]] = ({}, {})
        nxt: tuple[dict[int, Any], dict[int, str]] = ({}, {})
        for reply in replies:
            src = pid_of.get(reply.metadata.src_node_id)
            if src is None:
                continue
            pid = src
            parts = [(name, "secagg", main)] if pid in requests else []
            if pid in next_requests:
                parts.append((next_name, "secagg-next" if pid in requests else "secagg", nxt))
            for stage, record, (out, failures) in parts:
                if reply.has_error():
                    failures[pid] = f"secagg {stage}: {codec.error_text(reply)}"
                    continue
                error = codec.optional_record(reply.content, f"{record}-error", ConfigRecord)
                if error is not None:
                    why = error.get("error")
                    failures[pid] = f"secagg {stage}: {why if isinstance(why, str) else 'failed'}"
                    continue
                try:
                    msg = from_records(reply.content, stage=stage, name=record)
                    out[pid] = (msg, codec.update_metadata(reply.content, pid)) if stage == "masked" else msg
                except (KeyError, ValueError, TypeError) as exc:
                    failures[pid] = f"secagg {stage}: malformed reply: {exc}"
        for stage, want, (out, failures) in ((name, requests, main), (next_name, next_requests, nxt)):
            for pid in want:
                if pid not in out and pid not in failures:
                    failures[pid] = f"secagg {stage}: no reply within client-timeout ({self.timeout:g} s)"
        return main, nxt


class _RequestRecords:
    """``to_records`` of a stage's requests, built once per request object: the server sends most stages'
    one request (the roster, the view, the unmask sets) to every client, and a roster-sized record costs
    Flower's per-element checks each time it is built. The messages share the record objects, as they
    share the stage's ``config`` record; what each client receives is unchanged."""

    def __init__(self) -> None:
        self._built: dict[tuple[int, str, str], tuple[Any, dict[str, Any]]] = {}

    def __call__(self, stage: str, request: Any, *, record: str = "secagg") -> dict[str, Any]:
        key = (id(request), stage, record)
        hit = self._built.get(key)
        if hit is None or hit[0] is not request:
            hit = (request, to_records(stage, request, record=record))  # (keeps the id taken)
            self._built[key] = hit
        return dict(hit[1])


def _stage_records(name: str, *, instructions: RoundInstructions | None = None,
                   weights: Sequence[np.ndarray] | None = None, encoding: EncodingSpec | None = None,
                   ) -> dict[str, Any]:
    """The records every message of a stage shares (built once per stage, not once per client):
    ``share`` carries the instructions and the encoding, ``masked`` the instructions and the model."""
    if name == "share":
        if instructions is None or encoding is None:
            raise ValueError("the share stage needs the round instructions and the encoding")
        return {"config": codec.config_record(instructions.to_record()),
                "encoding": codec.config_record(encoding.to_record())}
    if name == "masked":
        if instructions is None or weights is None:
            raise ValueError("the masked stage needs the round instructions and the model")
        return {"arrays": codec.arrays_to_record(weights), "config": codec.config_record(instructions.to_record())}
    return {}
