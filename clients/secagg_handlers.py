"""The ClientApp's secure-aggregation stages: decode -> one :mod:`fedprivacy.fl.secure` step -> encode.

Where the client's secrets live between a round's exchanges: in the node's ``context.state`` (one
``secagg-session/<round>`` ConfigRecord of :func:`fedprivacy.fl.secure.export_session` fields per live
round, and the encoding the client accepted at its share stage in ``secagg-session-encoding/<round>``),
through :class:`fedprivacy.fl.secure.ExportedSessionStore`. Why not a per-process store keyed by
``(run_id, node_id)``: Flower's simulation runs ClientApps in several Ray actors (processes) and the
Deployment Engine may start a ClientApp process per message, so a node's messages of one round can
reach different processes (measured: ``flwr run`` with 2 actors fails with a per-process store).
``context.state`` is the one piece of client memory every engine carries from one message of a node
to the next, and it stays on the client side: the SuperNode (or the simulation's node state) keeps it
and hands it to the node's ClientApp process; it is never sent to the SuperLink/server. The record
holds private keys, the self-mask seed, the XNoise seeds and held shares until the unmask stage
deletes it (an advertise stage forgets the sessions of rounds before the previous one); it is never
logged, put in metrics or written to disk by fedprivacy (Flower keeps node state in memory). Node state
can be rolled back (a lost save), so each stage's answer is first recorded in the node's durable memory
(:mod:`clients.budget_log`), which refuses a second answer whatever the node state says.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from flwr.app import ConfigRecord, Context, Message

from clients import budget_log, round_log, scaffold_state
from fedprivacy.config import RunConfig
from fedprivacy.fl.byzantine import byzantine_of
from fedprivacy.fl.client import train_client
from fedprivacy.fl.client_limits import check_crowd
from fedprivacy.fl.client_policy import ClientPolicy
from fedprivacy.fl.secure import (
    EncodingSpec,
    ExportedSessionStore,
    client_advertise,
    client_consistency,
    client_masked_round,
    client_share,
    client_unmask,
    peer_auth,
)
from fedprivacy.fl.types import RoundInstructions
from fedprivacy_flwr import codec
from fedprivacy_flwr.secagg_records import from_records, to_records


def _store(context: Context) -> ExportedSessionStore:
    return ExportedSessionStore(context.state, field_name="secagg-session", wrap=codec.config_record)


def _key(context: Context) -> tuple[int, int]:
    return int(context.run_id), int(context.node_id)


def _advertise(context: Context, setup: object, *, partition_id: int, policy: ClientPolicy) -> object:
    """Stage 1 with the node's round record (:mod:`clients.round_log`): refused for a round it
    already took part in, on either path."""
    log = round_log.load(context)
    peers = peer_auth(policy, run_id=int(context.run_id), partition_id=partition_id)  # signs its keys
    keys = client_advertise(_store(context), _key(context), setup, partition_id=partition_id,  # type: ignore[arg-type]
                            policy=policy, log=log, peers=peers)
    budget_log.admit(context, policy, round=setup.round)  # type: ignore[attr-defined]  # durable, before it leaves
    round_log.save(context, log)
    return keys


def _reply(msg: Message, stage: str, out: object, context: Context, *, next_part: _Next | None,
           modulus_bits: int | None = None, **extra: object) -> Message:
    content = to_records(stage, out, modulus_bits=modulus_bits)
    content.update(extra)
    if next_part is not None:
        next_part.run(msg, context, content)
    return Message(codec.record_dict(content), reply_to=msg)


class _Next:
    """Round r+1's key stage riding on a round-r message (``secagg-next``: advertise or share), run
    after round r's part. If only this part fails (the client's floor refuses round r+1, say), round
    r's reply still goes back, with ``secagg-next-error``: the client is a dropout of round r+1 only."""

    def __init__(self, *, cfg: RunConfig, partition_id: int, policy: ClientPolicy) -> None:
        self.cfg, self.partition_id, self.policy = cfg, partition_id, policy

    def run(self, msg: Message, context: Context, content: dict[str, Any]) -> None:
        record = codec.optional_record(msg.content, "secagg-next", ConfigRecord)
        if record is None:
            return
        stage = record.get("stage")
        try:
            if stage == "advertise":
                setup = from_records(msg.content, stage="advertise", name="secagg-next")
                out = _advertise(context, setup, partition_id=self.partition_id, policy=self.policy)
            elif stage == "share":
                out = _share(msg, context, cfg=self.cfg, policy=self.policy, suffix="-next")
            else:
                raise ValueError(f"secagg-next carries stage {stage!r}, not 'advertise' or 'share'")
        except Exception as exc:  # noqa: BLE001 -- any refusal of round r+1 must not lose round r's reply
            content["secagg-next-error"] = ConfigRecord({"error": f"{type(exc).__name__}: {exc}"})
            return
        content.update(to_records(str(stage), out, record="secagg-next"))


def _share(msg: Message, context: Context, *, cfg: RunConfig, policy: ClientPolicy, suffix: str = "") -> object:
    """Stage 2: the client checks the encoding against its own floor before it shares anything."""
    request = from_records(msg.content, stage="share", name="secagg" + suffix)
    check_crowd(policy, roster=len(request.node_ids))  # the crowd floor's roster, in every mode
    encoding = EncodingSpec.from_record(dict(codec.record_of(msg.content, "encoding" + suffix, ConfigRecord)))
    instr = RoundInstructions.from_record(dict(codec.record_of(msg.content, "config" + suffix, ConfigRecord)))
    # the client's cumulative budget (clients/budget_log.py): refused before any secret leaves it; a seeded
    # round's XNoise follows from the server's seed, so its sum carries no noise against the server
    session = _store(context).get(_key(context), round=request.round)
    rho, slack = budget_log.secagg_cost(policy, encoding, session.setup, roster=len(request.node_ids))
    if policy.seed(instr.seed) >= 0:
        rho = math.inf
    budget_log.check(context, policy, rho, round=request.round, mode=instr.privacy, slack=slack)
    out = client_share(_store(context), _key(context), request, encoding=encoding, instructions=instr,
                       cfg=cfg, policy=policy,  # its peers' long-term signatures checked (pins fsync'd)
                       peers=peer_auth(policy, run_id=int(context.run_id), partition_id=session.node_id))
    budget_log.hold(context, policy, rho, round=request.round, slack=slack)
    # answered once per run and round, on record before it leaves (a rollback of the node state would let a
    # second share request with another roster split the same keys again: one roster's survivors revealing
    # the self-mask seed and the other's the key would unmask this client's vector)
    budget_log.record_stage(context, policy, round=request.round, stage="share")
    return out


def advertise(msg: Message, context: Context, *, partition_id: int, policy: ClientPolicy) -> Message:
    setup = from_records(msg.content, stage="advertise")
    return _reply(msg, "advertise", _advertise(context, setup, partition_id=partition_id, policy=policy),
                  context, next_part=None)


def share(msg: Message, context: Context, *, cfg: RunConfig, policy: ClientPolicy) -> Message:
    """Stage 2 (the client checks the encoding against its own floor before it shares anything)."""
    return _reply(msg, "share", _share(msg, context, cfg=cfg, policy=policy), context, next_part=None)


def masked(msg: Message, context: Context, *, cfg: RunConfig, partition_id: int, num_partitions: int,
           policy: ClientPolicy) -> Message:
    """Stage 3 (+ round r+1's advertise on the semi-honest schedule)."""
    request = from_records(msg.content, stage="masked")
    instr, weights = codec.decode_train(msg)
    # the ring width of the encoding this client accepted at its share stage: the upload is packed
    bits = _store(context).encoding(_key(context), round=request.round).modulus_bits
    control = scaffold_state.load(context) if instr.scaffold else None  # c_i: node state, never sent
    out, meta = client_masked_round(_store(context), _key(context), request, cfg=cfg,
                                    instructions=instr, weights=weights, partition_id=partition_id,
                                    num_partitions=num_partitions, policy=policy,
                                    train=functools.partial(train_client, attack=byzantine_of(context),
                                                            control=control))
    scaffold_state.save(context, control)
    reply = _reply(msg, "masked", out, context, modulus_bits=bits, metrics=codec.metrics_record(meta),
                   next_part=_Next(cfg=cfg, partition_id=partition_id, policy=policy))
    # before it leaves; a seed in the masked request (whatever the share stage's said) seeds the rounding and
    # the XNoise base component, which the server can then regenerate: an unbounded rho
    budget_log.charge_held(context, policy, round=request.round, mode=instr.privacy,
                           unbounded=policy.seed(instr.seed) >= 0)
    return reply


def consistency(msg: Message, context: Context, *, cfg: RunConfig, partition_id: int,
                policy: ClientPolicy) -> Message:
    """Stage 4 (+ round r+1's advertise on the active schedule)."""
    request = from_records(msg.content, stage="consistency")
    reply = _reply(msg, "consistency", client_consistency(_store(context), _key(context), request), context,
                   next_part=_Next(cfg=cfg, partition_id=partition_id, policy=policy))
    budget_log.record_stage(context, policy, round=request.round, stage="consistency")  # before it leaves
    return reply


def unmask(msg: Message, context: Context, *, cfg: RunConfig, partition_id: int, policy: ClientPolicy) -> Message:
    """Stage 5 (+ round r+1's share stage)."""
    request = from_records(msg.content, stage="unmask")
    reply = _reply(msg, "unmask", client_unmask(_store(context), _key(context), request), context,
                   next_part=_Next(cfg=cfg, partition_id=partition_id, policy=policy))
    budget_log.record_stage(context, policy, round=request.round, stage="unmask")  # before it leaves
    return reply


__all__ = ["advertise", "consistency", "masked", "share", "unmask"]
