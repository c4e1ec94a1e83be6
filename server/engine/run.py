"""Run a Flower app on the in-process engine: load the apps, build the Run and Contexts, drive the
ServerApp against an :class:`server.engine.grid.InProcessGrid`."""

from __future__ import annotations

import gc
import secrets
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from logging import INFO
from pathlib import Path
from typing import Any

from flwr.app import Context, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import ServerApp

from fedprivacy.runtime import keep_freed_memory
from fedprivacy_flwr.codec import results_path_of
from server.engine._flwr_private import (
    SUPERLINK_NODE_ID,
    LoadClientAppError,
    LoadServerAppError,
    Run,
    TaskIdentityScope,
    fuse_dicts,
    load_app,
    log,
)
from server.engine.appspec import AppSpec, load_app_spec, parse_overrides
from server.engine.faults import FaultPlan
from server.engine.grid import EngineStats, InProcessGrid

__all__ = ["InProcessResult", "forget_run_memory", "make_run", "run_inprocess", "server_context"]


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
        results_path: the ``results.json`` the ServerApp wrote, as it reported it in its
            Context's state (``fedprivacy_flwr.codec.results_path_of``), or None.
    """

    context: Context
    run_config: dict[str, Any]
    stats: EngineStats
    seconds: float
    startup_seconds: float
    num_supernodes: int
    workers: int
    results_path: Path | None


def load_apps(
    spec: AppSpec, server_app: str | ServerApp | None, client_app: str | ClientApp | None
) -> tuple[ServerApp, ClientApp]:
    return (_app(server_app, spec.server_app_ref, ServerApp, LoadServerAppError, spec.app_dir),
            _app(client_app, spec.client_app_ref, ClientApp, LoadClientAppError, spec.app_dir))


def _app(given: Any, ref: str, kind: type, error: type[Exception], app_dir: Path) -> Any:
    """``given`` if it is already an app of ``kind``, else the app its reference (or ``ref``) names."""
    if isinstance(given, kind):
        return given
    app = load_app(given or ref, error, app_dir)
    if not isinstance(app, kind):
        raise error(f"{given or ref} is not a {kind.__name__}")
    return app


def server_context(run_id: int, run_config: Mapping[str, Any]) -> Context:
    """The ServerApp's Context, as Flower's SuperLink builds it."""
    return Context(run_id=run_id, node_id=SUPERLINK_NODE_ID, node_config={}, state=RecordDict(),
                   run_config=dict(run_config))


def make_run(spec: AppSpec, overrides: dict[str, Any], run_id: int) -> Run:
    run = Run.create_empty(run_id=run_id)
    run.fab_id = spec.fab_id
    run.fab_version = spec.fab_version
    run.override_config = dict(overrides)
    run.primary_task_id = 1
    return run


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


def forget_run_memory(run_id: int) -> None:
    """The simulated clients' durable memory of this run (their guards, in the run's own temporary area:
    :func:`fedprivacy.fl.client_policy.run_temp_dir`) goes with the run."""
    import shutil

    from fedprivacy.fl.client_policy import run_temp_dir

    shutil.rmtree(run_temp_dir(run_id), ignore_errors=True)


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
        server_app: an app reference (or object) overriding the ServerApp named in
            ``pyproject.toml``.
        client_app: the same for the ClientApp.
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
    # freed numpy/torch temporaries stay mapped for reuse instead of being page-faulted in again by the
    # next client (glibc; ~2x on a distributed-DP client's encoding; fedprivacy.runtime); forked
    # workers inherit the setting
    keep_freed_memory()
    spec = load_app_spec(app_dir)
    overrides = parse_overrides(run_config)
    fused = fuse_dicts(spec.default_config, overrides)
    sapp, capp = load_apps(spec, server_app, client_app)
    run_id = secrets.randbits(63) | 1
    run = make_run(spec, overrides, run_id)
    with TaskIdentityScope(run_id), _native_thread_limit(native_threads):
        grid = InProcessGrid(client_app=capp, run=run, run_config=fused, num_supernodes=num_supernodes,
                             workers=workers, faults=faults, node_id_seed=node_id_seed)
        context = server_context(run_id, fused)
        t1 = time.monotonic()
        # The objects that exist now (torch, flwr and every imported module: ~250k) are moved out of the
        # cyclic collector's reach for the run: each full collection, triggered by the run's many small
        # Messages and records, scanned them all (~60-90 ms each, several per round). Undone
        # after the run, so a caller's later collections see them again. No effect on results.
        gc.freeze()
        try:
            grid.set_run(run)
            sapp(grid=grid, context=context)
        finally:
            gc.unfreeze()
            grid.close()
            forget_run_memory(run_id)
        t2 = time.monotonic()
    # no message count here: it is the sum of the cohort sizes, private when the run keeps its counts
    # private; it stays in InProcessResult.stats for benchmarks
    log(INFO, "in-process engine: %d supernodes, %d worker(s), %.2f s", num_supernodes, grid.workers, t2 - t1)
    path = results_path_of(context.state)
    return InProcessResult(context=context, run_config=fused, stats=grid.stats, seconds=t2 - t1,
                           startup_seconds=t1 - t0, num_supernodes=num_supernodes, workers=grid.workers,
                           results_path=None if path is None else Path(path))
