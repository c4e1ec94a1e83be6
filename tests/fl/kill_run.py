"""Child process of the write-ahead kill tests: one real run on the in-process engine, SIGKILLed at a point.

Usage: python tests/fl/kill_run.py RUN_CONFIG_JSON RELEASE_LOG [POINT ROUND]

Runs fedprivacy's real ServerApp glue (``server.loop.run_server``) and ClientApp on the in-process
Flower engine, with the default callbacks plus :class:`Faults`: every charge and release is appended
to ``RELEASE_LOG`` (fsync'd, so the parent knows what was released even when this process dies), and
at ``POINT`` of round ``ROUND`` the process kills itself with SIGKILL (no cleanup, no flush):

* ``charged``: the round's charge is on disk, nothing of the round is released yet;
* ``released``: the round's release happened (noised aggregate computed, or the SecAgg sum unmasked),
  not yet applied or checkpointed;
* ``checkpointed``: the round's checkpoint is written;
* ``sent`` (client side): a client received the round's train instructions, before it trains;
* ``replied`` (client side): the first client's reply of the round is built and handed to the engine
  (the server can see it), before the round function returns.

Every train reply (round, partition, DP-SGD steps and rate it reports) is logged before it leaves the
ClientApp, so the parent knows every example-level release too.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(REPO))
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp

    from fedprivacy.fl.callbacks import (
        CheckpointCallback,
        ConsoleCallback,
        OutputsCallback,
        RunCallback,
    )
    from server.engine import run_inprocess
    from server.loop import run_server

    run_config: dict[str, Any] = json.loads(argv[0])
    log_path = Path(argv[1])
    point, at = (argv[2], int(argv[3])) if len(argv) > 3 else (None, -1)

    def note(record: dict[str, Any]) -> None:
        with open(log_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    class Faults(RunCallback):
        def on_charged(self, run, round, event):  # type: ignore[no-untyped-def]
            note({"charged": round, "pid": os.getpid()})
            if point == "charged" and round == at:
                die()

        def on_released(self, run, round, event):  # type: ignore[no-untyped-def]
            note({"released": round, "event": None if event is None else event.to_dict(),
                  "pid": os.getpid()})
            if point == "released" and round == at:
                die()

        def on_round_end(self, run, record):  # type: ignore[no-untyped-def]
            if point == "checkpointed" and record.round == at:
                die()

    from flwr.clientapp import ClientApp

    from clients import client_app as real_client
    from fedprivacy_flwr import codec

    client = ClientApp()

    @client.query()
    def _query(msg, context):  # type: ignore[no-untyped-def]
        return real_client.query(msg, context)

    @client.train()
    def _train(msg, context):  # type: ignore[no-untyped-def]
        pid = int(context.node_config["partition-id"])
        instr, _ = codec.decode_train(msg)
        if point == "sent" and instr.round == at:
            note({"sent": instr.round, "partition": pid, "pid": os.getpid()})
            die()
        reply = real_client.train(msg, context)
        update = codec.decode_train_reply(reply, pid)
        note({"replied": instr.round, "partition": pid, "steps": update.metrics.get("dpsgd_steps"),
              "rate": update.metrics.get("dpsgd_sample_rate"), "pid": os.getpid()})
        if point == "replied" and instr.round == at:
            die()
        return reply

    app = ServerApp()

    @app.main()
    def _main(grid: Grid, context: Context) -> None:
        callbacks = [CheckpointCallback(), Faults(), OutputsCallback(), ConsoleCallback(lambda s: None)]
        run_server(grid, context.run_config, log=lambda s: None, callbacks=callbacks)

    client_side = point in ("sent", "replied") or bool(run_config.get("dpsgd"))
    run_inprocess(run_config=run_config, num_supernodes=6, app_dir=REPO, node_id_seed=3, server_app=app,
                  client_app=client if client_side else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
