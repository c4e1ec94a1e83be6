"""A fast in-process engine for fedprivacy's Flower apps.

``InProcessGrid`` implements Flower's ``flwr.serverapp.Grid``. It hands every
instruction Message straight to the ClientApp object (``ClientApp.__call__(message,
context)``), in this process or in a small forked process pool, with the ``Context``
Flower's Simulation Engine would build: the node's random 64-bit ``node_id``,
``node_config = {"partition-id": i, "num-partitions": N}``, the node's ``state`` and
the fused ``run_config``. There is no SuperLink, no polling and no Ray: a
``send_and_receive`` costs what the clients compute.

What the ServerApp sees is what Flower's in-memory simulation (flwr 1.42) gives it: ``uuid4``
message ids on push and invalid instructions refused with an ERROR log; replies built by the
ClientApp with ``Message(content, reply_to=msg)``, so their metadata follow Flower's own rules; an
Error reply with Flower's code and reason for a ClientApp exception or an expired message; and
``send_and_receive(timeout=T)`` returning the replies that arrived within T seconds (clients not yet
run then run later, and their replies can be pulled).

Deliberate differences: time is virtual for injected delays and drops (nothing sleeps
unless ``FaultPlan.real_time``); with ``timeout=None`` a dropped client's missing reply
is logged and ``send_and_receive`` returns instead of waiting forever; replies come back
in the order the instructions were pushed.

Fault injection: see :mod:`server.engine.faults`. Every private Flower API used here is imported
from :mod:`server.engine._flwr_private`. Rationale: docs/ENGINE.md, section "The in-process engine".
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from logging import ERROR, WARNING
from typing import Any

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid

from fedprivacy_flwr import codec
from server.engine._flwr_private import (
    NUM_PARTITIONS_KEY,
    PARTITION_ID_KEY,
    NodeInfo,
    Run,
    create_message_error_unavailable_ins_message,
    create_message_error_unavailable_res_message,
    log,
    now,
    set_message_id,
    validate_message,
)
from server.engine.faults import FaultDecision, FaultPlan
from server.engine.nodes import NodeTable, make_node_ids
from server.engine.pool import Job, Outcome, PoolExecutor, SerialExecutor

__all__ = ["EngineStats", "InProcessGrid"]


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
        # a local simulation: the user runs the clients too, so their floor is the run they asked
        # for (fedprivacy.fl.client_policy.simulation_node_config); a bad config fails in the apps
        try:
            from server.engine.appspec import simulation_node_config

            self._client_policy = simulation_node_config(self._run_config)
        except ValueError:
            self._client_policy = {}
        self._faults = faults
        self.stats = EngineStats()
        self._lock = threading.Lock()
        self._nodes = NodeTable(make_node_ids(num_supernodes, node_id_seed))
        self._num_partitions = num_supernodes
        self._node_state: dict[int, RecordDict] = {}  # only nodes with non-empty state
        self._pending: dict[str, _Pending] = {}  # pushed, not yet delivered
        self._dropped: dict[str, Message] = {}  # delivered to a dropped client: no reply ever
        self._inflight: set[str] = set()  # handed to the executor, no outcome yet
        # replies waiting to be pulled: (reply, arrival time (monotonic), instruction)
        self._ready: dict[str, tuple[Message, float, Message]] = {}
        self._reply_ids: list[str] = []  # uuid4 strings not yet given to a reply
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
        return self._nodes.ids()

    def get_nodes(self) -> Iterable[NodeInfo]:
        """NodeInfo of all virtual SuperNodes."""
        return [NodeInfo(node_id=nid) for nid in self._nodes.ids()]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Accept instruction Messages; return the ids of the valid ones."""
        ids: list[str] = []
        now_mono = time.monotonic()
        batch = list(messages)
        new_ids = _uuid4s(len(batch))
        for msg, msg_id in zip(batch, new_ids, strict=True):
            set_message_id(msg, msg_id)
            md = msg.metadata  # a property: read once
            errors = validate_message(msg, is_reply_message=False)
            if md.run_id != self._run.run_id:
                errors.append(f"invalid run id {md.run_id}")
            partition_id = self._nodes.partition_of(md.dst_node_id)
            if partition_id is None:
                errors.append(f"invalid destination node id {md.dst_node_id}")
            if errors or partition_id is None:
                log(ERROR, "Message refused by the in-process engine: %s", errors)
                continue
            mtype = md.message_type
            decision = (
                self._faults.decide(
                    message_type=mtype,
                    group_id=md.group_id,
                    partition_id=partition_id,
                )
                if self._faults is not None
                else None
            )
            with self._lock:
                self._pending[msg_id] = _Pending(message=msg, decision=decision, pushed_at=now_mono)
                self.stats.messages += 1
                self.stats.by_type[mtype] = self.stats.by_type.get(mtype, 0) + 1
            ids.append(msg_id)
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
        pid = self._nodes.partition_of(node_id)
        if pid is None:
            raise KeyError(node_id)
        return pid

    def close(self) -> None:
        """Stop the worker pool, if any."""
        self._executor.close()

    def _context_for(self, node_id: int) -> Context:
        return Context(
            run_id=self._run.run_id,
            node_id=node_id,
            node_config={
                PARTITION_ID_KEY: self.node_partition(node_id),
                NUM_PARTITIONS_KEY: self._num_partitions,
                **self._client_policy,
            },
            # A shallow copy (records shared): a ClientApp that fails after replacing records
            # leaves the stored state intact, as in Flower. A deep copy would also undo in-place
            # edits of a record but costs ~1-2 ms per message with SecAgg's key material.
            state=codec.record_dict(dict(stored.items()))
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
        with self._lock:
            if not self._reply_ids:  # ids for replies, made in batches (one os.urandom call each)
                self._reply_ids = _uuid4s(256)
            reply_id = self._reply_ids.pop()
        set_message_id(reply, reply_id)
        errors = [
            e
            for e in validate_message(reply, is_reply_message=True)
            if e != "Message TTL has expired"  # handled on delivery, as the SuperLink does
        ]
        md = reply.metadata
        if md.reply_to_message_id != msg_id:
            errors.append("reply_to_message_id does not match the instruction")
        if md.src_node_id != node_id:
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
        stamp = now()  # the moment the ServerApp receives this batch
        current, delivered_at = stamp.timestamp(), stamp.isoformat()
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
                md = reply.metadata
                if md.created_at + md.ttl < current:
                    reply = create_message_error_unavailable_res_message(
                        ins.metadata, "msg_unavail"
                    )
                reply.metadata.delivered_at = delivered_at
                self.stats.replies += 1
                out.append(reply)
        return out


def _uuid4s(n: int) -> list[str]:
    """``n`` ids as ``str(uuid.uuid4())`` makes them (16 bytes of ``os.urandom`` each, version 4, RFC 4122
    variant, the canonical 8-4-4-4-12 hex form), from one ``os.urandom`` call: ~1 µs an id instead of
    ~2.5 (``uuid.UUID``'s argument checks and int arithmetic)."""
    raw = bytearray(os.urandom(16 * n))
    out: list[str] = []
    for i in range(0, 16 * n, 16):
        raw[i + 6] = (raw[i + 6] & 0x0F) | 0x40  # version 4
        raw[i + 8] = (raw[i + 8] & 0x3F) | 0x80  # variant RFC 4122
        h = raw[i:i + 16].hex()
        out.append(f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
    return out
