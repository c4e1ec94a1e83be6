"""The round cost of the clients' durable memory (:mod:`clients.budget_log`) as a share of a secure round.

Usage: ``python scripts/client_memory_bench.py --clients 100 --rounds 4 [--privacy distributed]
[--memory-dir DIR] [--json out.json]``.

One secure run on the in-process engine (one worker: the server and every client in this process, with
the default actively secure schedule). Every call into a client's memory file
(:class:`fedprivacy.fl.client_budget.ClientBudget`: open and read under ``flock``, ``check``, ``charge``,
``record_stage``, and each message's one ``fsync``, :func:`clients.budget_log.one_sync`) is timed in wall
and CPU seconds. The figure,
``memory_over_round``, is those seconds over the rounds' own seconds (goal <= 0.05), over the steady
rounds 2..R-1 as in ``scripts/secagg_round_bench.py`` (R >= 4); the CPU ratio is the load-robust one.
The memory lives in the run-temporary area (``FEDPRIVACY_RUN_TEMP``, a fresh directory under
``--memory-dir``, by default where a simulation's clients keep it: ``/dev/shm`` where writable,
:func:`fedprivacy.fl.client_policy.run_temp_base`; ``--memory-dir /tmp`` for a disk), removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
_TIMED = ("__init__", "check", "charge", "record_stage")
_ROUND_LINE = re.compile(r"\s*round\s+\d+/\d+")  # a round's log line ("round   1/4  accuracy ...")


class _Clock:
    """Wall and CPU seconds spent in the timed methods, and their number of calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.wall = 0.0
        self.cpu = 0.0
        self.by_name: dict[str, float] = {}  # wall seconds per timed function

    def timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        name = fn.__name__

        def run(*args: Any, **kwargs: Any) -> Any:
            w, c = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                wall = time.perf_counter() - w
                self.wall += wall
                self.cpu += time.process_time() - c
                self.calls += 1
                self.by_name[name] = self.by_name.get(name, 0.0) + wall
        return run


def _steady(per_round: list[float]) -> list[float]:
    return per_round[1:-1] if len(per_round) >= 4 else (per_round[1:] or per_round)


def measure(*, clients: int, rounds: int, privacy: str, memory_dir: str | None) -> dict[str, Any]:
    """One run's figures (see the module docstring)."""
    import logging

    from clients import budget_log
    from fedprivacy.fl.client_budget import ClientBudget
    from fedprivacy.fl.run_files import round_seconds
    from server.engine import run_inprocess

    clock = _Clock()
    saved = {name: getattr(ClientBudget, name) for name in _TIMED}
    marks: list[tuple[float, float, float, int]] = []  # (wall, cpu, memory wall, memory cpu) at each round's line

    class _Rounds(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if _ROUND_LINE.match(record.getMessage()):
                marks.append((time.process_time(), clock.wall, clock.cpu, clock.calls))

    handler = _Rounds()
    from fedprivacy.fl.client_policy import run_temp_base

    memory_dir = memory_dir or run_temp_base()
    with tempfile.TemporaryDirectory(dir=memory_dir) as tmp:
        os.environ["FEDPRIVACY_RUN_TEMP"] = str(Path(tmp) / "run-temp")
        for name in _TIMED:
            setattr(ClientBudget, name, clock.timed(saved[name]))
        sync = budget_log.sync_file  # one message's deferred fsync (clients.budget_log.one_sync)
        budget_log.sync_file = clock.timed(sync)  # type: ignore[assignment]
        logging.getLogger("flwr").addHandler(handler)
        marks.append((time.process_time(), 0.0, 0.0, 0))
        try:
            cfg = {"num-server-rounds": rounds, "seed": -1, "privacy": privacy, "secagg": True,
                   "accountant": "rdp", "target-delta": min(1e-5, 0.1 / clients), "output-dir": tmp,
                   "run-name": "memory"}
            run_inprocess(run_config=cfg, num_supernodes=clients, app_dir=REPO, node_id_seed=1)
            secs = round_seconds(Path(tmp) / "memory")
        finally:
            logging.getLogger("flwr").removeHandler(handler)
            for name, fn in saved.items():
                setattr(ClientBudget, name, fn)
            budget_log.sync_file = sync  # type: ignore[assignment]
    per = [(b[0] - a[0], b[1] - a[1], b[2] - a[2], b[3] - a[3]) for a, b in zip(marks, marks[1:], strict=False)]
    cpu_round, mem_wall, mem_cpu, calls = (list(x) for x in zip(*per, strict=True))
    steady = slice(1, -1) if len(secs) >= 4 else slice(1, None)
    return {
        "clients": clients, "rounds": rounds, "privacy": privacy, "schedule": "active",
        "memory_fs": memory_dir,
        "round_seconds": secs, "memory_seconds": mem_wall, "round_cpu_seconds": cpu_round,
        "memory_cpu_seconds": mem_cpu, "memory_calls": calls,
        "memory_seconds_by_call": {k: round(v, 4) for k, v in clock.by_name.items()},
        "memory_ms_per_call": 1e3 * sum(mem_wall[steady]) / max(1, sum(calls[steady])),
        "memory_over_round (goal <= 0.05)": statistics.median(
            [m / s for m, s in zip(_steady(mem_wall), _steady(secs), strict=True)]),
        "memory_over_round_cpu (load-robust)": statistics.median(
            [m / s for m, s in zip(_steady(mem_cpu), _steady(cpu_round), strict=True)]),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--privacy", default="distributed", choices=("distributed", "none"))
    p.add_argument("--memory-dir", default=None, help="where the run-temporary memory lives (its file system)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if args.clients < 3 or args.rounds < 1:
        p.error("--clients must be >= 3 and --rounds >= 1")
    out = measure(clients=args.clients, rounds=args.rounds, privacy=args.privacy, memory_dir=args.memory_dir)
    text = json.dumps(out, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
