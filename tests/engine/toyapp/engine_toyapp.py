"""A tiny deterministic Flower app (Message API) for the in-process engine tests.

Each round the ServerApp sends the global vector ``w`` to every node (``train``),
every client returns ``w + (partition_id + 1) * 0.01`` scaled by its call counter
(kept in ``context.state``, to exercise node state), and the server averages the
replies. Per-round records (replies, errors, partition ids, mean) are kept in the
server Context's state as a ConfigRecord, so a test can compare engines.
"""

from __future__ import annotations

import time

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

client_app = ClientApp()
server_app = ServerApp()


def _calls(context: Context) -> int:
    rec = context.state.get("toy", ConfigRecord({"calls": 0}))
    return int(rec["calls"])  # type: ignore[index, arg-type]


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    pid = int(context.node_config["partition-id"])
    cfg = context.run_config
    if pid == int(cfg["fail-partition"]):
        raise RuntimeError(f"toy client {pid} fails on purpose")
    if pid == int(cfg["sleep-partition"]):
        time.sleep(float(cfg["sleep-seconds"]))
    calls = _calls(context) + 1
    context.state["toy"] = ConfigRecord({"calls": calls})
    w = msg.content["arrays"].to_numpy_ndarrays()[0]
    new = w + (pid + 1) * 0.01 * calls
    content = RecordDict(
        {
            "arrays": ArrayRecord([new]),
            "metrics": MetricRecord(
                {
                    "partition-id": pid,
                    "num-partitions": int(context.node_config["num-partitions"]),
                    "calls": calls,
                }
            ),
        }
    )
    return Message(content, reply_to=msg)


@client_app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    pid = int(context.node_config["partition-id"])
    return Message(RecordDict({"metrics": MetricRecord({"partition-id": pid})}), reply_to=msg)


@client_app.query()
def query(msg: Message, context: Context) -> Message:
    pid = int(context.node_config["partition-id"])
    return Message(
        RecordDict({"metrics": MetricRecord({"partition-id": pid, "node-id": context.node_id})}),
        reply_to=msg,
    )


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    w = np.zeros(int(cfg["dim"]), dtype=np.float64)
    rounds: list[str] = []
    node_ids = sorted(grid.get_node_ids())
    for rnd in range(1, int(cfg["num-server-rounds"]) + 1):
        content = RecordDict({"arrays": ArrayRecord([w]), "config": ConfigRecord({"round": rnd})})
        msgs = [Message(content, nid, "train", group_id=str(rnd)) for nid in node_ids]
        replies = list(grid.send_and_receive(msgs, timeout=float(cfg["timeout"])))
        ok = [r for r in replies if r.has_content()]
        errors = [r for r in replies if r.has_error()]
        if ok:
            w = np.mean([r.content["arrays"].to_numpy_ndarrays()[0] for r in ok], axis=0)
        pids = sorted(int(r.content["metrics"]["partition-id"]) for r in ok)  # type: ignore[arg-type]
        rounds.append(
            f"round={rnd} replies={len(ok)} errors={len(errors)} "
            f"pids={pids} mean={float(w.mean()):.12f}"
        )
    context.state["toy-results"] = ConfigRecord({"rounds": rounds, "final-mean": float(w.mean())})
    print("TOY-RESULTS " + " | ".join(rounds), flush=True)
