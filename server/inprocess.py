"""A fast in-process engine for fedprivacy's Flower apps (issue 7).

``InProcessGrid`` implements Flower's ``flwr.serverapp.Grid``. It hands every
instruction Message straight to the ClientApp object (``ClientApp.__call__(message,
context)``), in this process or in a small forked process pool, with the ``Context``
Flower's Simulation Engine would build: the node's random 64-bit ``node_id``,
``node_config = {"partition-id": i, "num-partitions": N}``, the node's ``state`` and
the fused ``run_config``. There is no SuperLink, no polling and no Ray: a
``send_and_receive`` costs what the clients compute.

What the ServerApp sees is what Flower's in-memory simulation gives it (compare
``flwr/superlink/grid/inmemory_grid.py``, ``flwr/server/superlink/linkstate`` and
``flwr/server/superlink/fleet/vce/vce_api.py``):

- instruction Messages get a ``uuid4`` message id on push; invalid ones (bad metadata,
  unknown destination node) are refused with an ERROR log and get no id;
- replies are built by the ClientApp with ``Message(content, reply_to=msg)``, so
  ``reply_to_message_id``, ``group_id``, ``message_type``, src/dst node ids and the
  TTL follow Flower's own rules; the engine gives them a ``uuid4`` id and stamps
  ``delivered_at`` when the ServerApp receives them;
- a ClientApp exception becomes an Error reply with ``ErrorCode.CLIENT_APP_RAISED_EXCEPTION``
  and Flower's reason format; expired instructions or replies become Flower's
  ``MESSAGE_UNAVAILABLE`` / ``REPLY_MESSAGE_UNAVAILABLE`` errors;
- ``send_and_receive(timeout=T)`` returns the replies that arrived within T seconds;
  clients not yet run when T passes run later and their replies can be pulled.

Deliberate differences: time is virtual for injected delays and drops (nothing sleeps
unless ``FaultPlan.real_time``); with ``timeout=None`` a dropped client's missing reply
is logged and ``send_and_receive`` returns instead of waiting forever; replies come back
in the order the instructions were pushed.

Fault injection: see :mod:`server.inprocess_faults`.
"""

from __future__ import annotations

import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.client_app import LoadClientAppError
from flwr.common.config import (
    flatten_dict,
    fuse_dicts,
    get_metadata_from_config,
    get_project_config,
    parse_config_args,
)
from flwr.common.constant import NUM_PARTITIONS_KEY, PARTITION_ID_KEY, SUPERLINK_NODE_ID
from flwr.common.logger import log
from flwr.proto.node_pb2 import NodeInfo  # pylint: disable=E0611
from flwr.server.superlink.linkstate.utils import (
    create_message_error_unavailable_ins_message,
    create_message_error_unavailable_res_message,
)
from flwr.server.utils.validator import validate_message
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.server_app import LoadServerAppError
from flwr.supercore.date import now
from flwr.supercore.object_ref import load_app
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from server.inprocess_faults import FaultDecision, FaultPlan, FaultRule
from server.inprocess_pool import Job, Outcome, PoolExecutor, SerialExecutor

__all__ = [
    "AppSpec",
    "EngineStats",
    "FaultPlan",
    "FlwrRunResult",
    "FaultRule",
    "InProcessGrid",
    "InProcessResult",
    "load_app_spec",
    "resolve_run_config",
    "run_flower_simulation",
    "run_flwr_cli",
    "run_inprocess",
]


# --------------------------------------------------------------------------- config


@dataclass(frozen=True, slots=True, kw_only=True)
class AppSpec:
    """What ``pyproject.toml`` says about the Flower app in ``app_dir``."""

    app_dir: Path
    server_app_ref: str
    client_app_ref: str
    default_config: dict[str, Any]
    fab_id: str
    fab_version: str


def load_app_spec(app_dir: str | Path = ".") -> AppSpec:
    """Read components and ``[tool.flwr.app.config]`` defaults as Flower does."""
    path = Path(app_dir).absolute()
    config = get_project_config(path)
    app = config["tool"]["flwr"]["app"]
    fab_id, fab_version = get_metadata_from_config(config)
    return AppSpec(
        app_dir=path,
        server_app_ref=app["components"]["serverapp"],
        client_app_ref=app["components"]["clientapp"],
        default_config=flatten_dict(app.get("config", {})),
        fab_id=fab_id,
        fab_version=fab_version,
    )


def parse_overrides(run_config: Mapping[str, Any] | str | None) -> dict[str, Any]:
    """Turn a ``flwr run --run-config`` string (or a mapping) into flat overrides."""
    if run_config is None:
        return {}
    if isinstance(run_config, str):
        import click

        try:
            return dict(parse_config_args([run_config]) if run_config.strip() else {})
        except click.ClickException as exc:
            raise ValueError(f"run_config {run_config!r}: {exc.format_message()}") from exc
    if isinstance(run_config, Mapping):
        return flatten_dict(dict(run_config))
    raise TypeError(f"run_config must be a mapping or a string, got {type(run_config).__name__}")


def resolve_run_config(
    run_config: Mapping[str, Any] | str | None, *, app_dir: str | Path = "."
) -> dict[str, Any]:
    """Defaults from ``pyproject.toml`` fused with overrides, exactly as ``flwr run``.

    Raises:
        ValueError: an override names a key that has no default (Flower's message).
    """
    spec = load_app_spec(app_dir)
    return fuse_dicts(spec.default_config, parse_overrides(run_config))


# --------------------------------------------------------------------------- grid


@dataclass(slots=True)
class EngineStats:
    """Counters the engine keeps for benchmarks and tests."""

    messages: int = 0
    replies: int = 0
    errors: int = 0
    dropped: int = 0
    delayed: int = 0
    late: int = 0
    batches: int = 0
    client_seconds: float = 0.0  # wall time of all ClientApp calls (summed over workers)
    client_cpu_seconds: float = 0.0  # CPU time of all ClientApp calls
    by_type: dict[str, int] = field(default_factory=dict)
    # one entry per send_and_receive: (message type of the first message, messages, seconds)
    exchanges: list[tuple[str, int, float]] = field(default_factory=list)


@dataclass(slots=True)
class _Pending:
    message: Message
    decision: FaultDecision | None
    pushed_at: float  # monotonic


class InProcessGrid(Grid):
    """A Flower ``Grid`` that delivers Messages straight to a ClientApp object.

    Args:
        client_app: the loaded ClientApp.
        run: the ``Run`` the ServerApp operates in.
        run_config: the fused run config given to every client Context.
        num_supernodes: number of virtual SuperNodes (one partition each).
        workers: 1 runs clients inline; >= 2 uses a forked process pool.
        faults: optional deterministic fault plan.
        node_id_seed: None draws node ids from a secure source, as Flower does; an int
            makes them reproducible.
    """

    def __init__(  # pylint: disable=too-many-arguments
        self,
        *,
        client_app: ClientApp,
        run: Run,
        run_config: Mapping[str, Any],
        num_supernodes: int,
        workers: int = 1,
        faults: FaultPlan | None = None,
        node_id_seed: int | None = None,
    ) -> None:
        if not isinstance(client_app, ClientApp):
            raise TypeError(f"client_app must be a ClientApp, got {type(client_app).__name__}")
        if not isinstance(num_supernodes, int) or num_supernodes < 1:
            raise ValueError(f"num_supernodes must be an int >= 1, got {num_supernodes!r}")
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {workers!r}")
        if faults is not None and not isinstance(faults, FaultPlan):
            raise TypeError(f"faults must be a FaultPlan, got {type(faults).__name__}")
        self._run = run
        self._run_config = dict(run_config)
        self._faults = faults
        self.stats = EngineStats()
        self._lock = threading.Lock()
        self._node_ids = _make_node_ids(num_supernodes, node_id_seed)
        self._partition_of = {nid: i for i, nid in enumerate(self._node_ids)}
        self._num_partitions = num_supernodes
        self._node_state: dict[int, RecordDict] = {}  # only nodes with non-empty state
        self._pending: dict[str, _Pending] = {}  # pushed, not yet delivered
        self._dropped: dict[str, Message] = {}  # delivered to a dropped client: no reply ever
        self._inflight: set[str] = set()  # handed to the executor, no outcome yet
        # replies waiting to be pulled: (reply, arrival time (monotonic), instruction)
        self._ready: dict[str, tuple[Message, float, Message]] = {}
        self._app = client_app
        self._executor: SerialExecutor | PoolExecutor = (
            SerialExecutor(client_app)
            if workers == 1
            else PoolExecutor(client_app, workers=workers)
        )

    # ---- Grid interface -------------------------------------------------------------

    def set_run(self, run: Run) -> None:
        """Set the run (Flower calls this before the ServerApp starts)."""
        if not isinstance(run, Run):
            raise TypeError(f"`run` must be an instance of Run, got {type(run).__name__}")
        self._run = run

    @property
    def run(self) -> Run:
        """Run information (a copy, as Flower returns)."""
        return Run(**vars(self._run))

    def create_message(  # pylint: disable=too-many-arguments,R0917
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        """Create a Message (deprecated in Flower; kept for compatibility)."""
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        """Node ids of all virtual SuperNodes."""
        return list(self._node_ids)

    def get_nodes(self) -> Iterable[NodeInfo]:
        """NodeInfo of all virtual SuperNodes."""
        return [NodeInfo(node_id=nid) for nid in self._node_ids]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Accept instruction Messages; return the ids of the valid ones."""
        ids: list[str] = []
        now_mono = time.monotonic()
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            errors = validate_message(msg, is_reply_message=False)
            if msg.metadata.run_id != self._run.run_id:
                errors.append(f"invalid run id {msg.metadata.run_id}")
            if msg.metadata.dst_node_id not in self._partition_of:
                errors.append(f"invalid destination node id {msg.metadata.dst_node_id}")
            if errors:
                log(ERROR, "Message refused by the in-process engine: %s", errors)
                continue
            partition_id = self._partition_of[msg.metadata.dst_node_id]
            decision = (
                self._faults.decide(
                    message_type=msg.metadata.message_type,
                    group_id=msg.metadata.group_id,
                    partition_id=partition_id,
                )
                if self._faults is not None
                else None
            )
            with self._lock:
                self._pending[msg.metadata.message_id] = _Pending(
                    message=msg, decision=decision, pushed_at=now_mono
                )
                self.stats.messages += 1
                mtype = msg.metadata.message_type
                self.stats.by_type[mtype] = self.stats.by_type.get(mtype, 0) + 1
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Deliver pending instructions among ``message_ids`` and return their replies."""
        ids = list(dict.fromkeys(message_ids))
        self._deliver([i for i in ids if i in self._pending], deadline=None)
        return self._collect(ids)

    def send_and_receive(
        self,
        messages: Iterable[Message],
        *,
        timeout: float | None = None,
    ) -> Iterable[Message]:
        """Push, deliver and return the replies that arrive within ``timeout`` seconds."""
        start = time.monotonic()
        batch = list(messages)
        del messages
        ids = list(self.push_messages(batch))
        deadline = None if timeout is None else start + timeout
        self._deliver(ids, deadline=deadline)
        replies = self._collect(ids, cutoff=deadline)
        self.stats.exchanges.append(
            (batch[0].metadata.message_type if batch else "", len(batch), time.monotonic() - start)
        )
        missing = len(ids) - len(replies)
        if missing and timeout is None:
            log(
                WARNING,
                "%d message(s) will never get a reply (dropped by the fault plan); "
                "returning instead of waiting forever",
                missing,
            )
        elif missing and self._faults is not None and self._faults.real_time:
            remaining = (start + float(timeout or 0.0)) - time.monotonic()
            if remaining > 0:
                time.sleep(remaining)
        return replies

    # ---- engine ---------------------------------------------------------------------

    @property
    def workers(self) -> int:
        """Number of processes that run clients."""
        return self._executor.workers

    def node_partition(self, node_id: int) -> int:
        """The partition id of a node (for tests and tools; the ServerApp never needs it)."""
        return self._partition_of[node_id]

    def close(self) -> None:
        """Stop the worker pool, if any."""
        self._executor.close()

    def _context_for(self, node_id: int) -> Context:
        return Context(
            run_id=self._run.run_id,
            node_id=node_id,
            node_config={
                PARTITION_ID_KEY: self._partition_of[node_id],
                NUM_PARTITIONS_KEY: self._num_partitions,
            },
            # A shallow copy (records shared): a ClientApp that fails after replacing records
            # leaves the stored state intact, as in Flower. A deep copy would also undo in-place
            # edits of a record but costs ~1-2 ms per message with SecAgg's key material.
            state=RecordDict(dict(stored.items()))
            if (stored := self._node_state.get(node_id))
            else RecordDict(),
            run_config=dict(self._run_config),
        )

    def _deliver(self, ids: list[str], *, deadline: float | None) -> None:
        """Run the ClientApp for every pending id in ``ids`` (one batch)."""
        jobs: list[Job] = []
        job_ids: list[str] = []
        delays: list[float] = []
        with self._lock:
            pendings = [(i, self._pending.pop(i)) for i in ids if i in self._pending]
        for msg_id, pending in pendings:
            decision = pending.decision
            if decision is not None and decision.action == "drop":
                self._dropped[msg_id] = pending.message
                self.stats.dropped += 1
                continue
            node_id = pending.message.metadata.dst_node_id
            jobs.append(
                Job(
                    message=pending.message,
                    context=self._context_for(node_id),
                    action=None if decision is None else decision.action,
                )
            )
            job_ids.append(msg_id)
            delays.append(0.0 if decision is None else decision.delay)
        if not jobs:
            return
        with self._lock:
            self._inflight.update(job_ids)
        self.stats.batches += 1
        self.stats.delayed += sum(1 for d in delays if d > 0.0)

        def on_async(index: int, outcome: Outcome) -> None:
            # A pool chunk that finished after the ServerApp stopped waiting.
            self._store(job_ids[index], jobs[index], outcome, delay=delays[index])

        done, not_started = self._executor.run(jobs, deadline=deadline, on_late=on_async)
        for index, outcome in done.items():
            self._store(job_ids[index], jobs[index], outcome, delay=delays[index])
        with self._lock:
            for index in not_started:
                # Still queued when the ServerApp stopped waiting: delivered on a later pull.
                self._inflight.discard(job_ids[index])
                self._pending[job_ids[index]] = _Pending(
                    message=jobs[index].message, decision=None, pushed_at=time.monotonic()
                )

    def _store(self, msg_id: str, job: Job, outcome: Outcome, *, delay: float) -> None:
        node_id = job.message.metadata.dst_node_id
        with self._lock:
            self._inflight.discard(msg_id)
            self.stats.client_seconds += outcome.seconds
            self.stats.client_cpu_seconds += outcome.cpu_seconds
            if not outcome.state_valid:
                pass  # the ClientApp failed: Flower keeps the node's previous Context
            elif outcome.state is not None:
                self._node_state[node_id] = outcome.state
            else:
                self._node_state.pop(node_id, None)
        reply = outcome.reply
        if reply is None:
            return
        reply.metadata.__dict__["_message_id"] = str(uuid.uuid4())
        errors = [
            e
            for e in validate_message(reply, is_reply_message=True)
            if e != "Message TTL has expired"  # handled on delivery, as the SuperLink does
        ]
        if reply.metadata.reply_to_message_id != msg_id:
            errors.append("reply_to_message_id does not match the instruction")
        if reply.metadata.src_node_id != node_id:
            errors.append("src_node_id of the reply is not the destination of the instruction")
        if errors:
            log(ERROR, "Reply from node %s refused: %s", node_id, errors)
            return
        with self._lock:
            if reply.has_error():
                self.stats.errors += 1
            self._ready[msg_id] = (reply, outcome.finished_at + delay, job.message)

    def _collect(self, ids: list[str], *, cutoff: float | None = None) -> list[Message]:
        """Return (and forget) replies for ``ids`` that arrived by ``cutoff``, in push order."""
        out: list[Message] = []
        current = now().timestamp()
        with self._lock:
            for msg_id in ids:
                if msg_id in self._dropped:
                    ins = self._dropped[msg_id]
                    if ins.metadata.created_at + ins.metadata.ttl < current:
                        del self._dropped[msg_id]
                        out.append(
                            create_message_error_unavailable_ins_message(msg_id, self._run.run_id)
                        )
                    continue
                entry = self._ready.get(msg_id)
                if entry is None:
                    if msg_id not in self._pending and msg_id not in self._inflight:
                        # Never pushed, or its reply was already delivered (Flower's error).
                        out.append(
                            create_message_error_unavailable_ins_message(msg_id, self._run.run_id)
                        )
                    continue
                reply, arrival, ins = entry
                if cutoff is not None and arrival > cutoff:
                    self.stats.late += 1  # visible to a later pull, not to this wait
                    continue
                del self._ready[msg_id]
                if reply.metadata.created_at + reply.metadata.ttl < current:
                    reply = create_message_error_unavailable_res_message(
                        ins.metadata, "msg_unavail"
                    )
                reply.metadata.delivered_at = now().isoformat()
                self.stats.replies += 1
                out.append(reply)
        return out


def _make_node_ids(n: int, seed: int | None) -> list[int]:
    """Random unsigned 64-bit node ids, never 0 or the SuperLink's id, all distinct."""
    import random

    rng: Any = secrets.SystemRandom() if seed is None else random.Random(seed)
    ids: list[int] = []
    seen = {0, SUPERLINK_NODE_ID}
    while len(ids) < n:
        nid = rng.getrandbits(64)
        if nid not in seen:
            seen.add(nid)
            ids.append(nid)
    return ids


# --------------------------------------------------------------------------- entry points


@dataclass(frozen=True, slots=True, kw_only=True)
class InProcessResult:
    """What a run on the in-process engine leaves behind.

    Attributes:
        context: the ServerApp's Context after ``main`` returned.
        run_config: the fused run config the apps saw.
        stats: message and fault counters.
        seconds: wall time of the ServerApp run (apps already loaded).
        startup_seconds: loading apps, config and the worker pool.
        num_supernodes: virtual SuperNodes.
        workers: processes that ran clients.
        results_path: ``results.json`` the ServerApp wrote under ``output-dir`` during
            this run, if any.
    """

    context: Context
    run_config: dict[str, Any]
    stats: EngineStats
    seconds: float
    startup_seconds: float
    num_supernodes: int
    workers: int
    results_path: Path | None


def _load_apps(
    spec: AppSpec, server_app: str | ServerApp | None, client_app: str | ClientApp | None
) -> tuple[ServerApp, ClientApp]:
    if isinstance(server_app, ServerApp):
        sapp = server_app
    else:
        sapp = load_app(server_app or spec.server_app_ref, LoadServerAppError, spec.app_dir)
        if not isinstance(sapp, ServerApp):
            raise LoadServerAppError(f"{server_app or spec.server_app_ref} is not a ServerApp")
    if isinstance(client_app, ClientApp):
        capp = client_app
    else:
        capp = load_app(client_app or spec.client_app_ref, LoadClientAppError, spec.app_dir)
        if not isinstance(capp, ClientApp):
            raise LoadClientAppError(f"{client_app or spec.client_app_ref} is not a ClientApp")
    return sapp, capp


def _make_run(spec: AppSpec, overrides: dict[str, Any], run_id: int) -> Run:
    run = Run.create_empty(run_id=run_id)
    run.fab_id = spec.fab_id
    run.fab_version = spec.fab_version
    run.override_config = dict(overrides)
    run.primary_task_id = 1
    return run


def _find_results(run_config: Mapping[str, Any], since: float) -> Path | None:
    out = run_config.get("output-dir")
    if not isinstance(out, str) or not out:
        return None
    root = Path(out)
    if not root.is_dir():
        return None
    found = [p for p in root.rglob("results.json") if p.stat().st_mtime >= since - 1.0]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


@contextmanager
def _native_thread_limit(limit: int | None) -> Iterator[None]:
    """Cap BLAS/OpenMP thread pools (threadpoolctl, a scikit-learn dependency) for a run."""
    if limit is None:
        yield
        return
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - scikit-learn always brings it
        yield
        return
    with threadpool_limits(limits=limit):
        yield


class _TaskIdentityScope:
    """Set Flower's process-wide TaskIdentity (used by ``Message(...)``) for one run."""

    def __init__(self, run_id: int) -> None:
        self._run_id = run_id
        self._saved: tuple[Any, Any, Any] | None = None

    def __enter__(self) -> None:
        ti: Any = TaskIdentity
        self._saved = (ti._task_id, ti._run_id, ti._node_id)  # noqa: SLF001
        TaskIdentity.task_id = 1
        TaskIdentity.run_id = self._run_id
        TaskIdentity.node_id = SUPERLINK_NODE_ID

    def __exit__(self, *exc: object) -> None:
        ti: Any = TaskIdentity
        if self._saved is not None:
            ti._task_id, ti._run_id, ti._node_id = self._saved  # noqa: SLF001


def run_inprocess(  # pylint: disable=too-many-arguments,too-many-locals
    *,
    run_config: Mapping[str, Any] | str = "",
    num_supernodes: int,
    workers: int = 1,
    faults: FaultPlan | None = None,
    app_dir: str | Path = ".",
    server_app: str | ServerApp | None = None,
    client_app: str | ClientApp | None = None,
    node_id_seed: int | None = None,
    native_threads: int | None = 1,
) -> InProcessResult:
    """Run the Flower app in ``app_dir`` on the in-process engine.

    Args:
        run_config: overrides, as a mapping or a ``flwr run --run-config`` string
            (``"num-server-rounds=3 privacy='central'"``); unknown keys raise ValueError.
        num_supernodes: virtual SuperNodes, one data partition each.
        workers: 1 runs clients in this process; >= 2 in a forked process pool.
        faults: optional deterministic fault plan.
        app_dir: the directory holding ``pyproject.toml``.
        server_app, client_app: app references (or objects) overriding the components
            named in ``pyproject.toml``.
        node_id_seed: reproducible node ids (default: random, as Flower).
        native_threads: cap on BLAS/OpenMP threads while the run lasts (``None``: leave
            as is). Many small clients gain nothing from multi-threaded BLAS and lose a
            lot when cores are shared (OpenBLAS threads spin); Flower's Ray engine
            likewise runs each client with ``OMP_NUM_THREADS=num_cpus``.

    Returns:
        The ServerApp's final Context, the fused run config, engine counters, timings
        and the path of ``results.json`` if the ServerApp wrote one.
    """
    t0 = time.monotonic()
    wall0 = time.time()
    spec = load_app_spec(app_dir)
    overrides = parse_overrides(run_config)
    fused = fuse_dicts(spec.default_config, overrides)
    sapp, capp = _load_apps(spec, server_app, client_app)
    run_id = secrets.randbits(63) | 1
    run = _make_run(spec, overrides, run_id)
    with _TaskIdentityScope(run_id), _native_thread_limit(native_threads):
        grid = InProcessGrid(
            client_app=capp,
            run=run,
            run_config=fused,
            num_supernodes=num_supernodes,
            workers=workers,
            faults=faults,
            node_id_seed=node_id_seed,
        )
        context = Context(
            run_id=run_id,
            node_id=SUPERLINK_NODE_ID,
            node_config={},
            state=RecordDict(),
            run_config=dict(fused),
        )
        t1 = time.monotonic()
        try:
            grid.set_run(run)
            sapp(grid=grid, context=context)
        finally:
            grid.close()
        t2 = time.monotonic()
    log(
        INFO,
        "in-process engine: %d supernodes, %d worker(s), %d messages, %.2f s",
        num_supernodes,
        grid.workers,
        grid.stats.messages,
        t2 - t1,
    )
    return InProcessResult(
        context=context,
        run_config=fused,
        stats=grid.stats,
        seconds=t2 - t1,
        startup_seconds=t1 - t0,
        num_supernodes=num_supernodes,
        workers=grid.workers,
        results_path=_find_results(fused, wall0),
    )


def run_flower_simulation(  # pylint: disable=too-many-arguments
    *,
    run_config: Mapping[str, Any] | str = "",
    num_supernodes: int,
    app_dir: str | Path = ".",
    backend_config: Mapping[str, Any] | None = None,
    server_app: str | None = None,
    client_app: str | None = None,
) -> Context:
    """Run the same app on Flower's Ray Simulation Engine, in this process.

    ``flwr.simulation.run_simulation`` has no run-config argument, so this calls the
    function ``flwr run`` itself uses inside its simulation process
    (``flwr.simulation.run_simulation._run_simulation`` with ``is_app=True``): the
    ClientApps get the fused run config from ``app_dir`` plus the overrides carried by
    the ``Run``, and the ServerApp gets it in its Context. Returns the ServerApp's
    final Context.
    """
    from flwr.simulation.run_simulation import _run_simulation
    from flwr.supercore.constant import NOOP_FEDERATION_ID
    from flwr.supercore.telemetry import EventType

    spec = load_app_spec(app_dir)
    overrides = parse_overrides(run_config)
    fused = fuse_dicts(spec.default_config, overrides)
    run_id = secrets.randbits(63) | 1
    run = _make_run(spec, overrides, run_id)
    run.federation_id = NOOP_FEDERATION_ID
    context = Context(
        run_id=run_id,
        node_id=SUPERLINK_NODE_ID,
        node_config={},
        state=RecordDict(),
        run_config=dict(fused),
    )
    config: dict[str, Any] = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0}}
    config.update(dict(backend_config or {}))
    with _TaskIdentityScope(run_id):
        result = _run_simulation(
            server_app_attr=server_app or spec.server_app_ref,
            client_app_attr=client_app or spec.client_app_ref,
            num_supernodes=num_supernodes,
            backend_name="ray",
            backend_config=config,  # type: ignore[arg-type]
            app_dir=str(spec.app_dir),
            run=run,
            server_app_context=context,
            is_app=True,
            exit_event=EventType.PYTHON_API_RUN_SIMULATION_LEAVE,
        )
    return result.context


def _superlink_pids() -> set[int]:
    """PIDs of running ``flower-superlink`` processes (read from /proc)."""
    pids: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(part.endswith(b"flower-superlink") for part in cmd[:2]):
            pids.add(int(entry.name))
    return pids


@dataclass(frozen=True, slots=True, kw_only=True)
class FlwrRunResult:
    """Exit code and (if captured) console output of ``flwr run``."""

    returncode: int
    output: str | None
    seconds: float


def run_flwr_cli(  # pylint: disable=too-many-arguments
    *,
    run_config: str = "",
    num_supernodes: int,
    app_dir: str | Path = ".",
    federation_config: str = "client-resources-num-cpus=1",
    timeout: float | None = None,
    stream: bool = True,
    capture: bool = False,
) -> FlwrRunResult:
    """Run ``flwr run <app_dir> --stream`` on Flower's Ray engine as a subprocess.

    Runtime dependency installation and telemetry are disabled. If ``flwr run``
    started a detached local SuperLink, that SuperLink (and only it: the processes
    that did not exist before) is stopped afterwards; a SuperLink that was already
    running is left alone (``flwr run`` reuses it).
    """
    import os

    flwr = shutil.which("flwr") or str(Path(sys.executable).with_name("flwr"))
    fed = f"num-supernodes={num_supernodes} {federation_config}".strip()
    cmd = [flwr, "run", str(Path(app_dir).absolute()), "--federation-config", fed]
    if run_config.strip():
        cmd += ["--run-config", run_config]
    if stream:
        cmd.append("--stream")
    env = dict(os.environ)
    # flwr spawns `flower-superlink` / `flwr-simulation` by name: find them beside this Python.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    env["FLWR_TELEMETRY_ENABLED"] = "0"
    before = _superlink_pids()
    start = time.monotonic()
    try:
        proc = subprocess.run(
            cmd,
            env=env,
            timeout=timeout,
            check=False,
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.STDOUT if capture else None,
            text=True,
        )
    finally:
        for pid in sorted(_superlink_pids() - before):
            _stop_process_group(pid)
    return FlwrRunResult(
        returncode=proc.returncode, output=proc.stdout, seconds=time.monotonic() - start
    )


def _stop_process_group(pid: int, grace: float = 10.0) -> None:
    """Stop a detached process we started (its own session/process group)."""
    import os

    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        return
    target = pgid if pgid == pid else None
    try:
        if target is not None:
            os.killpg(target, signal.SIGTERM)
        else:
            os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    end = time.monotonic() + grace
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    try:
        if target is not None:
            os.killpg(target, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# --------------------------------------------------------------------------- CLI helper

ENGINES = ("inprocess", "flower")


def _absolute_output_dir(overrides: dict[str, Any], fused: Mapping[str, Any]) -> dict[str, Any]:
    """Pin a relative ``output-dir`` to this working directory (Flower's processes may run elsewhere)."""
    out = fused.get("output-dir")
    if isinstance(out, str) and out and not Path(out).is_absolute():
        return {**overrides, "output-dir": str(Path(out).absolute())}
    return overrides


def _config_string(overrides: Mapping[str, Any]) -> str:
    """Render overrides in ``flwr run --run-config`` syntax (TOML values)."""
    parts = []
    for key, value in overrides.items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, int | float):
            text = repr(value)
        else:
            text = str(value)
            if '"' in text and "'" in text:
                raise ValueError(f"run-config value of {key!r} cannot hold both quote kinds")
            text = f"'{text}'" if '"' in text else f'"{text}"'
        parts.append(f"{key}={text}")
    return " ".join(parts)


def simulate(  # pylint: disable=too-many-arguments
    *,
    engine: str,
    num_supernodes: int,
    run_config: Mapping[str, Any] | str = "",
    workers: int = 1,
    app_dir: str | Path = ".",
    faults: FaultPlan | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Run the app on the chosen engine; return a JSON-ready summary (used by ``fedprivacy simulate``).

    Both engines read the same ``--run-config`` syntax; a relative ``output-dir`` is made
    absolute so that the results land in this working directory with either engine.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    spec = load_app_spec(app_dir)
    overrides = parse_overrides(run_config)
    fused = fuse_dicts(spec.default_config, overrides)  # refuses unknown keys up front
    overrides = _absolute_output_dir(overrides, fused)
    wall0 = time.time()
    summary: dict[str, Any] = {"engine": engine, "num_supernodes": num_supernodes}
    if engine == "inprocess":
        res = run_inprocess(
            run_config=overrides,
            num_supernodes=num_supernodes,
            workers=workers,
            faults=faults,
            app_dir=app_dir,
        )
        summary.update(
            workers=res.workers,
            seconds=res.seconds,
            startup_seconds=res.startup_seconds,
            messages=res.stats.messages,
            replies=res.stats.replies,
            errors=res.stats.errors,
            dropped=res.stats.dropped,
            results_path=None if res.results_path is None else str(res.results_path),
        )
    else:
        if faults is not None or workers != 1:
            raise ValueError("faults and workers apply to the inprocess engine only")
        out = run_flwr_cli(
            run_config=_config_string(overrides),
            num_supernodes=num_supernodes,
            app_dir=app_dir,
            timeout=timeout,
        )
        if out.returncode != 0:
            raise RuntimeError(f"flwr run exited with code {out.returncode}")
        path = _find_results(fuse_dicts(spec.default_config, overrides), wall0)
        summary.update(seconds=out.seconds, results_path=None if path is None else str(path))
    if summary.get("results_path"):
        import json

        results = json.loads(Path(summary["results_path"]).read_text(encoding="utf-8"))
        rows = results.get("rounds", [])
        summary["rounds"] = len(rows)
        if rows:
            summary["final"] = {
                k: rows[-1].get(k) for k in ("round", "test_accuracy", "epsilon", "delta")
            }
    return summary
