"""fedprivacy's Flower ClientApp (Message API): decode -> one library call -> encode.

The client's own privacy floor (:class:`fedprivacy.fl.client_policy.ClientPolicy`) comes from its
``node_config`` ``client-*`` keys, then the ``FEDPRIVACY_CLIENT_POLICY`` environment variable of this
process, then safe defaults in code: never from the server's messages or the run config (which whoever
submits the run chooses). A request outside it is refused (an error reply: the server counts a dropout).
"""

from __future__ import annotations

import functools
import logging
import math
import os

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from clients import budget_log, round_log
from fedprivacy.config import RunConfig
from fedprivacy.fl.client import train_client
from fedprivacy.fl.client_policy import ENV_VAR, ClientPolicy, PolicyRefusal
from fedprivacy.fl.modes import get_mode
from fedprivacy_flwr import codec

app = ClientApp()


@functools.lru_cache(maxsize=4)
def _config(items: tuple) -> RunConfig:
    return RunConfig.from_mapping(dict(items))


@functools.lru_cache(maxsize=64)
def _policy_of(node_items: tuple, env: str | None) -> ClientPolicy:
    policy = ClientPolicy.resolve(dict(node_items), {ENV_VAR: env} if env else {})
    if math.isfinite(policy.max_rho_total) and not policy.budget_path:
        # review4 W3: Flower's node state is per run, and whoever submits runs decides how many there are
        logging.getLogger(__name__).warning(
            "client-max-rho-total=%g bounds one run only: without client-budget-path the charges live in "
            "Flower's per-run node state, so a server that starts a new run gets the total again; set "
            "client-budget-path to a file of this node's to bound every run", policy.max_rho_total)
    return policy


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


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Local training, Δ clipped and noised by the named client mechanism; see :mod:`fedprivacy.fl.client`."""
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
    round_log.save(context, log)
    rho = policy.round_rho(instr, dim=dim)  # its cumulative budget: refused before training if it cannot pay
    budget_log.check(context, policy, rho, round=instr.round, mode=instr.privacy)
    update = train_client(cfg, partition_id=pid, num_partitions=total, weights=weights, instructions=instr)
    reply = codec.train_reply(msg, policy.filter_update(update))
    budget_log.charge(context, policy, rho, round=instr.round, mode=instr.privacy)  # on disk before it leaves
    return reply


# ---- secure aggregation stages (clients/secagg_handlers.py); message types query/train.secagg_*
@app.query("secagg_advertise")
def secagg_advertise(msg: Message, context: Context) -> Message:
    from clients import secagg_handlers

    _, pid, _ = _node(context)
    return secagg_handlers.advertise(msg, context, partition_id=pid, policy=_policy(context))


@app.query("secagg_share")
def secagg_share(msg: Message, context: Context) -> Message:
    from clients import secagg_handlers

    cfg, _, _ = _node(context)
    return secagg_handlers.share(msg, context, cfg=cfg, policy=_policy(context))


@app.train("secagg_masked")
def secagg_masked(msg: Message, context: Context) -> Message:
    from clients import secagg_handlers

    cfg, pid, total = _node(context)
    return secagg_handlers.masked(msg, context, cfg=cfg, partition_id=pid, num_partitions=total,
                                  policy=_policy(context))


@app.query("secagg_consistency")
def secagg_consistency(msg: Message, context: Context) -> Message:
    from clients import secagg_handlers

    cfg, pid, _ = _node(context)
    return secagg_handlers.consistency(msg, context, cfg=cfg, partition_id=pid, policy=_policy(context))


@app.query("secagg_unmask")
def secagg_unmask(msg: Message, context: Context) -> Message:
    from clients import secagg_handlers

    cfg, pid, _ = _node(context)
    return secagg_handlers.unmask(msg, context, cfg=cfg, partition_id=pid, policy=_policy(context))
# ---- end of secure aggregation stages
