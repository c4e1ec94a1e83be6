"""Running ClientApp calls for the in-process engine: inline or in a small process pool.

Both executors run one *job* per instruction Message: they build nothing themselves
(the Grid hands them the Message, the node's Context and the fault action) and call the
ClientApp exactly as Flower's simulation backend does (``ClientApp.__call__(message,
context)``), turning an exception into a Flower Error reply with the same code and
reason format as Flower's Simulation Engine (``flwr/server/superlink/fleet/vce``).

The process pool uses the ``fork`` start method. The ClientApp is loaded in the parent
*before* the pool is created, so every worker inherits it (and whatever model/data
caches its modules hold) copy-on-write and never re-imports it. Messages and Contexts
are plain picklable Flower objects; a chunk of jobs is pickled in one call, so a model
``RecordDict`` shared by all messages of a broadcast is serialised once per chunk.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from logging import DEBUG
from typing import Any

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

from server.engine._flwr_private import (
    ClientAppException,
    Error,
    ErrorCode,
    LoadClientAppError,
    log,
)
from server.engine.faults import InjectedClientFault
from server.engine.processes import die_with_parent


@dataclass(slots=True)
class Job:
    """One delivery: the instruction Message, the node's Context, the fault action."""

    message: Message
    context: Context
    action: str | None  # None | "raise" | "delay"  ("drop" never reaches an executor)


@dataclass(slots=True)
class Outcome:
    """The result of one delivery, as the SuperLink would store it."""

    reply: Message | None
    state: RecordDict | None  # node state after the call (None: empty, nothing to keep)
    state_valid: bool  # False when the call failed: the node keeps its previous state (as Flower)
    seconds: float
    cpu_seconds: float  # CPU time of this process (thread) spent on the call
    finished_at: float  # time.monotonic() in the parent's clock domain (same machine)


def _error_reply(message: Message, ex: BaseException) -> Message:
    """Build the Error reply Flower's Simulation Engine builds for an exception."""
    if isinstance(ex, ClientAppException):
        code = ErrorCode.CLIENT_APP_RAISED_EXCEPTION
    elif isinstance(ex, LoadClientAppError):
        code = ErrorCode.LOAD_CLIENT_APP_EXCEPTION
    else:
        code = ErrorCode.UNKNOWN
    reason = str(type(ex)) + ":<'" + str(ex) + "'>"
    return Message(Error(code=code, reason=reason), reply_to=message)


def run_job(app: ClientApp, job: Job) -> Outcome:
    """Deliver one Message to the ClientApp; never raises."""
    start = time.perf_counter()
    cpu_start = time.thread_time()
    message, context = job.message, job.context
    run_config_before = dict(context.run_config)
    failed = False
    try:
        try:
            if job.action == "raise":
                raise InjectedClientFault(
                    f"injected fault: client {context.node_config.get('partition-id')} raised "
                    f"on {message.metadata.message_type!r} (group {message.metadata.group_id!r})"
                )
            reply = app(message=message, context=context)
        except LoadClientAppError:
            raise
        except Exception as ex:  # noqa: BLE001 - Flower wraps every ClientApp error
            raise ClientAppException(str(ex)) from ex
        if not isinstance(reply, Message):
            raise ClientAppException(
                f"ClientApp returned {type(reply).__name__}, expected a flwr Message"
            )
        if context.run_config != run_config_before:
            # Flower's DeprecatedRunInfoStore.update_context refuses this too.
            raise ValueError(
                "The `run_config` field of the `Context` object cannot be "
                f"modified (run_id: {context.run_id})."
            )
    except Exception as ex:  # noqa: BLE001 - turned into an Error reply, as Flower does
        # DEBUG, not ERROR: one console line per failing client counts the failures of a round, which
        # with private counts (and "every one of them") gives the cohort size; the reason
        # reaches the server in the error reply, and the run logs it where its counts may be read
        log(DEBUG, "ClientApp error on node %s: %s", context.node_id, ex)
        reply = _error_reply(message, ex)
        failed = True
    state = context.state if len(context.state) > 0 else None
    return Outcome(
        reply=reply,
        state=state,
        state_valid=not failed,
        seconds=time.perf_counter() - start,
        cpu_seconds=time.thread_time() - cpu_start,
        finished_at=time.monotonic(),
    )


def _batch_entry(app: ClientApp, jobs: Sequence[Job]) -> Callable[..., Any] | None:
    """The ClientApp's batch entry for these jobs' message type (``app.batch_entries[type]``), if any."""
    entries = getattr(app, "batch_entries", None)
    if not isinstance(entries, Mapping) or len(jobs) < 2:
        return None
    mtype = jobs[0].message.metadata.message_type
    if any(job.message.metadata.message_type != mtype for job in jobs):
        return None
    entry = entries.get(mtype)
    return entry if callable(entry) else None


def run_batch(app: ClientApp, jobs: Sequence[Job]) -> list[Outcome] | None:
    """Deliver ``jobs`` (one message type) through the ClientApp's batch entry; never raises.

    The entry takes ``[(message, context), ...]`` and returns one reply Message or exception per
    message, in order, or None to have them delivered one by one (:func:`run_job`); so does this
    function. Jobs with an injected ``raise`` fault are run alone, as :func:`run_job` does. Each
    outcome gets the batch's time divided equally, and its own state, run-config check and error reply.
    """
    entry = _batch_entry(app, jobs)
    if entry is None:
        return None
    together = [i for i, job in enumerate(jobs) if job.action != "raise"]
    start, cpu_start = time.perf_counter(), time.thread_time()
    before = [dict(jobs[i].context.run_config) for i in together]
    try:
        results: Sequence[Any] | None = entry([(jobs[i].message, jobs[i].context) for i in together])
    except Exception as ex:  # noqa: BLE001 - the batch failed as a whole: every message gets the error
        results = [ex] * len(together)
    if results is None:
        return None
    seconds = (time.perf_counter() - start) / max(1, len(together))
    cpu = (time.thread_time() - cpu_start) / max(1, len(together))
    out: dict[int, Outcome] = {}
    finished = time.monotonic()
    for i, result, run_config in zip(together, results, before, strict=True):
        out[i] = _batched_outcome(jobs[i], result, run_config, seconds=seconds, cpu=cpu, finished=finished)
    for i, job in enumerate(jobs):
        if i not in out:
            out[i] = run_job(app, job)
    return [out[i] for i in range(len(jobs))]


def _batched_outcome(job: Job, result: Any, run_config_before: dict, *, seconds: float, cpu: float,
                     finished: float) -> Outcome:
    """What :func:`run_job` would record for ``job`` had the ClientApp returned (or raised) ``result``."""
    message, context = job.message, job.context
    reply: Message
    failed = True
    if isinstance(result, LoadClientAppError | ClientAppException):
        ex: BaseException = result
    elif isinstance(result, Exception):
        ex = ClientAppException(str(result))
    elif not isinstance(result, Message):
        ex = ClientAppException(f"ClientApp returned {type(result).__name__}, expected a flwr Message")
    elif context.run_config != run_config_before:
        ex = ValueError("The `run_config` field of the `Context` object cannot be "
                        f"modified (run_id: {context.run_id}).")
    else:
        reply, failed = result, False
    if failed:
        log(DEBUG, "ClientApp error on node %s: %s", context.node_id, ex)
        reply = _error_reply(message, ex)
    return Outcome(reply=reply, state=context.state if len(context.state) > 0 else None,
                   state_valid=not failed, seconds=seconds, cpu_seconds=cpu, finished_at=finished)


class SerialExecutor:
    """Runs jobs one after another in this process (``workers=1``)."""

    workers = 1

    def __init__(self, app: ClientApp) -> None:
        self._app = app

    def run(
        self,
        jobs: Sequence[Job],
        *,
        deadline: float | None,
        on_late: Callable[[int, Outcome], None],
    ) -> tuple[dict[int, Outcome], list[int]]:
        """Run jobs until ``deadline`` (monotonic); return (outcomes, indices not started).

        A job that finishes after the deadline is returned too: its ``finished_at``
        tells the Grid that the reply arrived late. ``on_late`` is unused here.
        """
        done: dict[int, Outcome] = {}
        if deadline is None or time.monotonic() < deadline:
            batch = run_batch(self._app, jobs)  # replies arriving after the deadline are late, as below
            if batch is not None:
                return dict(enumerate(batch)), []
        for i, job in enumerate(jobs):
            if deadline is not None and time.monotonic() >= deadline:
                return done, list(range(i, len(jobs)))
            done[i] = run_job(self._app, job)
        return done, []

    def close(self) -> None:
        """Nothing to release."""


# The ClientApp inherited by forked workers (set in the parent before forking).
_WORKER_APP: ClientApp | None = None


def _init_worker() -> None:
    # A worker dies with the engine's process, even when that is SIGKILLed, and leaves Ctrl-C to it
    # (the parent stops the pool once, instead of every worker printing a KeyboardInterrupt).
    # SIGKILL: the worker inherits the parent's signal handlers (Flower's, the CLI's), which must not
    # get a chance to keep an orphan alive; a worker has nothing to flush.
    die_with_parent(signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Several workers on few cores: one native thread each avoids oversubscription.
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1)
    except ImportError:  # pragma: no cover - scikit-learn always brings it
        pass


def _run_chunk(jobs: list[Job]) -> list[Outcome]:
    if _WORKER_APP is None:
        raise LoadClientAppError("worker has no ClientApp (pool not created by fork)")
    batch = run_batch(_WORKER_APP, jobs)
    return batch if batch is not None else [run_job(_WORKER_APP, job) for job in jobs]


class PoolExecutor:
    """Runs the jobs of one batch in ``workers`` forked processes."""

    def __init__(self, app: ClientApp, *, workers: int, chunks_per_worker: int = 2) -> None:
        if workers < 2:
            raise ValueError(f"workers must be >= 2 for a pool, got {workers}")
        if "fork" not in multiprocessing.get_all_start_methods():
            raise RuntimeError("the in-process engine's pool needs the 'fork' start method")
        self.workers = workers
        self._app = app
        self._chunks = workers * chunks_per_worker
        self._pool: cf.ProcessPoolExecutor | None = None

    def _start(self) -> None:
        """Fork the workers (they inherit the ClientApp and every cache the parent filled)."""
        global _WORKER_APP
        _WORKER_APP = self._app
        self._pool = cf.ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=multiprocessing.get_context("fork"),
            initializer=_init_worker,
        )
        list(self._pool.map(_noop, range(self.workers)))

    def run(
        self,
        jobs: Sequence[Job],
        *,
        deadline: float | None,
        on_late: Callable[[int, Outcome], None],
    ) -> tuple[dict[int, Outcome], list[int]]:
        """Run jobs in parallel until ``deadline``.

        Chunks finished by then are returned; each chunk still running is handed to
        ``on_late`` from a pool thread when it completes.
        """
        n = len(jobs)
        if n == 0:
            return {}, []
        done: dict[int, Outcome] = {}
        first = 0
        if self._pool is None:
            category = jobs[0].message.metadata.message_type.split(".")[0]
            if category != "train" or n < 2:
                # Cheap set-up exchanges (e.g. a partition query) run inline; the pool is forked
                # at the first train batch, after its first job ran here and warmed the caches
                # (imports, data partitions) that the workers then share copy-on-write.
                return SerialExecutor(self._app).run(jobs, deadline=deadline, on_late=on_late)
            done[0] = run_job(self._app, jobs[0])
            first = 1
            self._start()
        pool = self._pool
        if pool is None:
            raise RuntimeError("worker pool failed to start")
        rest = list(range(first, n))
        k = min(self._chunks, len(rest))
        index_chunks = [rest[c::k] for c in range(k)]
        futures = {pool.submit(_run_chunk, [jobs[i] for i in idx]): idx for idx in index_chunks}
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        finished, pending = cf.wait(futures, timeout=timeout)
        for fut in finished:
            for i, outcome in zip(futures[fut], fut.result(), strict=True):
                done[i] = outcome
        for fut in pending:
            idx = futures[fut]

            def _deliver(f: cf.Future[list[Outcome]], idx: list[int] = idx) -> None:
                for i, outcome in zip(idx, f.result(), strict=True):
                    on_late(i, outcome)

            fut.add_done_callback(_deliver)
        return done, []

    def close(self) -> None:
        """Stop the worker processes."""
        global _WORKER_APP
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        _WORKER_APP = None


def _noop(_: int) -> None:
    return None
