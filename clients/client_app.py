"""fedprivacy's Flower ClientApp (Message API): decode -> one library call -> encode.

The client's own privacy floor (:class:`fedprivacy.fl.client_policy.ClientPolicy`) comes from its
``node_config`` ``client-*`` keys, then the ``FEDPRIVACY_CLIENT_POLICY`` environment variable of this
process, then safe defaults in code: never from the server's messages or the run config (which whoever
submits the run chooses). A request outside it is refused (an error reply: the server counts a dropout).
Every guard (rounds taken part in, secure stages answered, ρ charges) is also in the node's durable
memory, fsync'd before the reply leaves (:mod:`clients.budget_log`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from clients import budget_log, round_log, scaffold_state
from fedprivacy.config import RunConfig
from fedprivacy.fl.byzantine import byzantine_of
from fedprivacy.fl.client import train_client
from fedprivacy.fl.client_policy import ENV_VAR, ClientPolicy, PolicyRefusal
from fedprivacy.fl.modes import get_mode
from fedprivacy.fl.types import ClientUpdate, RoundInstructions
from fedprivacy_flwr import codec

app = ClientApp()


@functools.lru_cache(maxsize=4)
def _config(items: tuple) -> RunConfig:
    return RunConfig.from_mapping(dict(items))


@functools.lru_cache(maxsize=64)
def _policy_of(node_items: tuple, env: str | None) -> ClientPolicy:
    return ClientPolicy.resolve(dict(node_items), {ENV_VAR: env} if env else {})


# The last run config and client floor seen, with what they resolved to: a message of the same run (every
# message of a simulation) is answered by a comparison in C instead of building and hashing a key
# (~3 µs each). Compared with ==, as the lru caches' keys are: the same values resolve the same way.
_LAST_CONFIG: tuple[dict, RunConfig] | None = None
_LAST_POLICY: tuple[dict, str | None, ClientPolicy] | None = None
_NODE_KEYS = ("partition-id", "num-partitions")


def _policy(context: Context) -> ClientPolicy:
    # keyed by the client-* keys only, the ones ClientPolicy.resolve reads: one entry per floor, not per
    # node (a node's config also holds its partition id). In their order, as for _config below (not
    # sorted: a few µs a message; another order of the same keys is a miss that resolves the same floor)
    global _LAST_POLICY
    node_config, env = context.node_config, os.environ.get(ENV_VAR)
    last = _LAST_POLICY
    # the last floor's client-* items, and nothing else but the two node keys: the same client-* items
    if (last is not None and last[1] == env and len(node_config) == len(last[0]) + 2
            and all(k in node_config for k in _NODE_KEYS) and last[0].items() <= node_config.items()):
        return last[2]
    floor = tuple(kv for kv in node_config.items() if str(kv[0]).startswith("client-"))
    policy = _policy_of(floor, env)
    _LAST_POLICY = (dict(floor), env, policy)
    return policy


def _node(context: Context) -> tuple[RunConfig, int, int]:
    # keyed by the items in their order (one order per run: the engine and Flower copy one dict); another
    # order of the same items is a miss that parses the same RunConfig
    global _LAST_CONFIG
    run_config = context.run_config
    last = _LAST_CONFIG
    if last is not None and last[0] == run_config:
        cfg = last[1]
    else:
        cfg = _config(tuple(run_config.items()))
        _LAST_CONFIG = (dict(run_config), cfg)
    pid = int(context.node_config["partition-id"])
    total = int(context.node_config["num-partitions"])
    return cfg, pid, total


def _forget_last() -> None:
    """Drop the one-entry memos of :func:`_node` and :func:`_policy` (tests that count cache misses)."""
    global _LAST_CONFIG, _LAST_POLICY
    _LAST_CONFIG = _LAST_POLICY = None


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Tell the server which partition this node holds."""
    _, pid, total = _node(context)
    return codec.query_reply(msg, partition_id=pid, num_partitions=total)


_NO_REPLY = RuntimeError("no reply")  # replaced for every message of a batch


@dataclass(slots=True)
class _Admitted:
    """One train message past its client's checks, waiting for its update."""

    msg: Message
    context: Context
    cfg: RunConfig
    pid: int
    total: int
    policy: ClientPolicy
    instr: RoundInstructions
    weights: list
    rho: float


def _admit(msg: Message, context: Context) -> _Admitted:
    """Decode, apply the client's own floor, admit the round, check its budget (all before training)."""
    cfg, pid, total = _node(context)
    policy = _policy(context)
    instr, weights = codec.decode_train(msg)
    dim = sum(int(w.size) for w in weights)
    try:
        mode = get_mode(instr.privacy)  # this process's registry: the meaning of the name the server sent
    except ValueError as exc:
        raise PolicyRefusal(f"server asks for privacy {instr.privacy!r}: {exc}") from None
    instr = policy.apply(instr, dim=dim, mode=mode)  # its own mode floor, seed rule and its own noise
    log = round_log.load(context)
    log.admit(instr.round)  # once per round, rounds in order (ProtocolViolation otherwise)
    budget_log.admit(context, policy, round=instr.round)  # the same, in the node's durable memory
    round_log.save(context, log)
    rho = policy.round_rho(instr, dim=dim)  # its cumulative budget: refused before training if it cannot pay
    budget_log.check(context, policy, rho, round=instr.round, mode=instr.privacy)
    return _Admitted(msg=msg, context=context, cfg=cfg, pid=pid, total=total, policy=policy, instr=instr,
                     weights=list(weights), rho=rho)


def _reply(a: _Admitted, update: ClientUpdate) -> Message:
    reply = codec.train_reply(a.msg, a.policy.filter_update(update))
    budget_log.charge(a.context, a.policy, a.rho, round=a.instr.round, mode=a.instr.privacy)  # before it leaves
    return reply


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Local training, Δ clipped and noised by the named client mechanism; see :mod:`fedprivacy.fl.client`.
    A SCAFFOLD round reads and keeps this client's ``c_i`` in its own node state (:mod:`fedprivacy.fl.scaffold`)."""
    with budget_log.one_sync():  # the admission and the charge: one fsync, before the reply is returned
        a = _admit(msg, context)
        control = scaffold_state.load(context) if a.instr.scaffold else None
        update = train_client(a.cfg, partition_id=a.pid, num_partitions=a.total, weights=a.weights,
                              instructions=a.instr, attack=byzantine_of(context), control=control)
        scaffold_state.save(context, control)
        return _reply(a, update)


def train_batch(jobs: Sequence[tuple[Message, Context]]) -> list[Message | Exception] | None:
    """The ``train`` messages of one delivery, their local training as one computation.

    The in-process engine's batch entry (``app.batch_entries["train"]``): None (run them one by one
    through :func:`train`) unless the run's ``batched-training`` applies to its model. Each message
    still goes through its own client's checks, privatisation and ledger (:func:`_admit`,
    :func:`fedprivacy.fl.client_batch.train_clients`, :func:`_reply`); one reply or exception per
    message, in order. Messages whose starting weights or training instructions differ train in
    separate groups.
    """
    from fedprivacy.fl.client_batch import train_clients, training_key
    from fedprivacy.fl.task import batching_chosen

    if not jobs or not batching_chosen(_node(jobs[0][1])[0]) or byzantine_of(jobs[0][1]) is not None:
        return None  # Byzantine simulations train per client
    with budget_log.one_sync():  # every client's records: one fsync per file, before the replies are returned
        return _train_batch(jobs, train_clients, training_key)


def _train_batch(jobs: Sequence[tuple[Message, Context]], train_clients: Callable[..., list[ClientUpdate]],
                 training_key: Callable[[RoundInstructions], tuple]) -> list[Message | Exception]:
    out: list[Message | Exception] = [_NO_REPLY] * len(jobs)
    admitted: dict[int, _Admitted] = {}
    for i, (msg, context) in enumerate(jobs):
        try:
            a = _admit(msg, context)
        except Exception as ex:  # noqa: BLE001 - this client's own refusal, as train() raises it
            out[i] = ex
            continue
        admitted[i] = a
    for members in _groups(admitted, training_key):
        first = admitted[members[0]]
        try:
            updates = train_clients(first.cfg, partition_ids=[admitted[i].pid for i in members],
                                    num_partitions=first.total, weights=first.weights,
                                    instructions=[admitted[i].instr for i in members])
        except Exception as ex:  # noqa: BLE001 - the group failed together: each client gets the error
            for i in members:
                out[i] = ex
            continue
        for i, update in zip(members, updates, strict=True):
            try:
                out[i] = _reply(admitted[i], update)
            except Exception as ex:  # noqa: BLE001
                out[i] = ex
    return out


def _groups(admitted: dict[int, _Admitted], key: Callable[[RoundInstructions], tuple]) -> list[list[int]]:
    """Indices of the admitted messages that train together: the same run config, training key and
    starting weights (equal arrays; the codec hands a broadcast's messages the same ones)."""
    groups: list[tuple[_Admitted, tuple, list[int]]] = []
    for i, a in admitted.items():
        k = key(a.instr)
        for first, first_key, members in groups:
            if first.cfg == a.cfg and first_key == k and _same(first.weights, a.weights):
                members.append(i)
                break
        else:
            groups.append((a, k, [i]))
    return [members for _, _, members in groups]


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x is y or np.array_equal(x, y) for x, y in zip(a, b, strict=True))


app.batch_entries = {"train": train_batch}  # type: ignore[attr-defined]


# ---- secure aggregation stages (clients/secagg_handlers.py); message types query/train.secagg_*
@app.query("secagg_advertise")
def secagg_advertise(msg: Message, context: Context) -> Message:
    from clients import secagg_handlers

    _, pid, _ = _node(context)
    with budget_log.one_sync():  # one fsync of this message's records, before it is returned
        return secagg_handlers.advertise(msg, context, partition_id=pid, policy=_policy(context))


@app.query("secagg_share")
def secagg_share(msg: Message, context: Context) -> Message:
    from clients import secagg_handlers

    cfg, _, _ = _node(context)
    with budget_log.one_sync():  # one fsync of this message's records, before it is returned
        return secagg_handlers.share(msg, context, cfg=cfg, policy=_policy(context))


@app.train("secagg_masked")
def secagg_masked(msg: Message, context: Context) -> Message:
    from clients import secagg_handlers

    cfg, pid, total = _node(context)
    with budget_log.one_sync():
        return secagg_handlers.masked(msg, context, cfg=cfg, partition_id=pid, num_partitions=total,
                                      policy=_policy(context))


@app.query("secagg_consistency")
def secagg_consistency(msg: Message, context: Context) -> Message:
    from clients import secagg_handlers

    cfg, pid, _ = _node(context)
    with budget_log.one_sync():  # one fsync of this message's records, before it is returned
        return secagg_handlers.consistency(msg, context, cfg=cfg, partition_id=pid, policy=_policy(context))


@app.query("secagg_unmask")
def secagg_unmask(msg: Message, context: Context) -> Message:
    from clients import secagg_handlers

    cfg, pid, _ = _node(context)
    with budget_log.one_sync():  # one fsync of this message's records, before it is returned
        return secagg_handlers.unmask(msg, context, cfg=cfg, partition_id=pid, policy=_policy(context))
# ---- end of secure aggregation stages
