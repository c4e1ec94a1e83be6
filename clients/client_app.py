"""fedprivacy's Flower ClientApp (Message API): decode -> one library call -> encode."""

from __future__ import annotations

import functools

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedprivacy.config import RunConfig
from fedprivacy.fl.client import train_client
from fedprivacy_flwr import codec

app = ClientApp()


@functools.lru_cache(maxsize=4)
def _config(items: tuple) -> RunConfig:
    return RunConfig.from_mapping(dict(items))


def _node(context: Context) -> tuple[RunConfig, int, int]:
    cfg = _config(tuple(sorted(context.run_config.items())))
    pid = int(context.node_config["partition-id"])
    total = int(context.node_config["num-partitions"])
    return cfg, pid, total


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Tell the server which partition this node holds."""
    _, pid, total = _node(context)
    return codec.query_reply(msg, partition_id=pid, num_partitions=total)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Local training, Δ clipped (and noised in local mode); see :mod:`fedprivacy.fl.client`."""
    cfg, pid, total = _node(context)
    instr, weights = codec.decode_train(msg)
    update = train_client(cfg, partition_id=pid, num_partitions=total, weights=weights, instructions=instr)
    return codec.train_reply(msg, update)


# ---- secure aggregation stages (clients/secagg_handlers.py); message types query/train.secagg_*
@app.query("secagg_advertise")
def secagg_advertise(msg: Message, context: Context) -> Message:
    from clients import secagg_handlers

    _, pid, _ = _node(context)
    return secagg_handlers.advertise(msg, context, partition_id=pid)


@app.query("secagg_share")
def secagg_share(msg: Message, context: Context) -> Message:
    from clients import secagg_handlers

    return secagg_handlers.share(msg, context)


@app.train("secagg_masked")
def secagg_masked(msg: Message, context: Context) -> Message:
    from clients import secagg_handlers

    cfg, pid, total = _node(context)
    return secagg_handlers.masked(msg, context, cfg=cfg, partition_id=pid, num_partitions=total)


@app.query("secagg_unmask")
def secagg_unmask(msg: Message, context: Context) -> Message:
    from clients import secagg_handlers

    _, pid, _ = _node(context)
    return secagg_handlers.unmask(msg, context, partition_id=pid)
# ---- end of secure aggregation stages
