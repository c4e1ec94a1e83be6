"""Experiment tracking as run callbacks: TensorBoard scalars and MLflow runs of what a run publishes.

``tracking = "tensorboard"``, ``"mlflow"`` or ``"tensorboard,mlflow"`` adds
:class:`TensorBoardCallback` / :class:`MlflowCallback` to a run's default callbacks, after the outputs
(:func:`tracking_callbacks`). Each imports its library only when the run starts; a missing library
is refused with the config (:func:`check_tracking`), in one line naming ``tracking``.

Privacy: a tracker logs exactly the run's published rows (:meth:`fedprivacy.fl.disclosure.
RunDisclosure.published_rows`, the ``rounds`` of ``results.json``), so where the participation counts
are private, so are the counts, the rounds' wall times, the worst client's DP-SGD ε and (as the
mode says) the train loss: none of them reaches a tracker, and the values' wall-time stamps are
then the time the tracker opened (they would time the rounds). Per round the scalars are the row's
numbers under the row's keys (``test_accuracy``, ``test_loss``, ``epsilon``, ``clip_norm``, and
``seconds`` or ``clients_sampled`` where published), with ``clip_norm`` the configured one under
fixed clipping; after the run, a distributed run's ε for each audience as ``epsilon/<audience>``.
MLflow also gets the run config as params and the run's published files (never ``private/``) as
artifacts. Docs: docs/TRACKING.md.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedprivacy.fl.callbacks import RunCallback
from fedprivacy.fl.results import RunStatus

if TYPE_CHECKING:
    from fedprivacy.config import RunConfig
    from fedprivacy.fl.run import FederatedRun, RunResult
    from fedprivacy.fl.types import RoundRecord

__all__ = ["ARTIFACTS", "DEFAULT_EXPERIMENT", "TRACKERS", "MlflowCallback", "mlflow_uri", "prepare_mlflow",
           "TensorBoardCallback", "check_tracking", "parse_tracking",
           "published_scalars", "tracking_callbacks"]

#: tracker -> (the module it needs, the package that brings it)
TRACKERS: Mapping[str, tuple[str, str]] = {"tensorboard": ("tensorboard", "tensorboard"),
                                           "mlflow": ("mlflow", "mlflow-skinny")}
#: MLflow's experiment when ``tracking-experiment`` is empty.
DEFAULT_EXPERIMENT = "fedprivacy"
#: The run's published files that MLflow keeps as artifacts (:func:`fedprivacy.fl.outputs.write_outputs`).
ARTIFACTS = ("results.json", "rounds.csv", "privacy_report.md", "accuracy_epsilon.png")


def parse_tracking(value: str) -> tuple[str, ...]:
    """The trackers a ``tracking`` value names (``""``: none); ValueError naming the key."""
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    for name in names:
        if name not in TRACKERS:
            raise ValueError(f"tracking must be '' or a comma list of {', '.join(TRACKERS)}; got {value!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"tracking must name each tracker once, got {value!r}")
    return names


def check_tracking(options: Any) -> None:
    """The rules of the tracking keys of ``options`` (the config's :class:`~fedprivacy.config.RunOptions`,
    before anything starts); ValueError naming the key.

    A tracker whose library is not installed is refused here (``importlib.util.find_spec``: nothing
    is imported), as is a key that no chosen tracker reads.
    """
    tracking, tracking_uri = options.tracking, options.tracking_uri
    names = parse_tracking(tracking)
    for name in names:
        module, package = TRACKERS[name]
        if importlib.util.find_spec(module) is None:
            raise ValueError(f"tracking={name!r} needs the {package} package, which is not installed: "
                             f"pip install 'fedprivacy[tracking]', or set tracking=''")
    for key, reader in (("tracking-dir", "tensorboard"), ("tracking-uri", "mlflow"),
                        ("tracking-experiment", "mlflow"), ("tracking-run-name", "")):
        if getattr(options, key.replace("-", "_")) and not (reader in names if reader else names):
            raise ValueError(f"{key} is read only with tracking={reader or 'tensorboard or mlflow'!r}, "
                             f"got tracking={tracking!r}")
    if any(c in options.tracking_run_name for c in "/\\") or options.tracking_run_name in (".", ".."):
        raise ValueError(f"tracking-run-name must be a plain name, got {options.tracking_run_name!r}")
    if tracking_uri.startswith("file:") and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() != "true":
        raise ValueError(f"tracking-uri {tracking_uri!r} is MLflow's file store, which MLflow 3 refuses "
                         "unless MLFLOW_ALLOW_FILE_STORE=true; use 'sqlite:///<path>/mlflow.db'")


def tracking_callbacks(cfg: RunConfig, run_dir: Path | None) -> list[RunCallback]:
    """The callbacks ``cfg.tracking`` names, in its order (none for ``tracking = ""``)."""
    from fedprivacy.errors import ConfigError

    names = parse_tracking(cfg.tracking)
    if "tensorboard" in names and run_dir is None and not cfg.tracking_dir:
        raise ConfigError(f"tracking-dir must be set for tracking={cfg.tracking!r} in a run without a "
                          "run folder (run_dir=None)")
    made: dict[str, type[RunCallback]] = {"tensorboard": TensorBoardCallback, "mlflow": MlflowCallback}
    return [made[name]() for name in names]


def run_label(run: FederatedRun) -> str:
    """The name a tracker gives the run: ``tracking-run-name``, else its folder's name (``run-name``,
    or the timestamp)."""
    if run.cfg.tracking_run_name:
        return run.cfg.tracking_run_name
    return run.run_dir.name if run.run_dir is not None else (run.cfg.run_name or "run")


def published_scalars(run: FederatedRun, row: Mapping[str, Any]) -> dict[str, float]:
    """A published row's numbers (its ``round`` aside), and the configured clip norm under fixed
    clipping; nothing that :meth:`~fedprivacy.fl.disclosure.RunDisclosure.published_rows` left out."""
    out = {k: float(v) for k, v in row.items()
           if k != "round" and isinstance(v, int | float) and not isinstance(v, bool)}
    if "clip_norm" not in out and run.cfg.clip_norm > 0:
        out["clip_norm"] = float(run.cfg.clip_norm)
    return out


def audience_scalars(results: Mapping[str, Any]) -> dict[str, float]:
    """A distributed run's published ε for each audience (``epsilon/<audience>``), from its results."""
    audiences = ((results.get("privacy") or {}).get("distributed") or {}).get("audiences") or {}
    return {f"epsilon/{name}": float(block["epsilon"]) for name, block in audiences.items()
            if isinstance(block, Mapping) and isinstance(block.get("epsilon"), int | float)}


class _ScalarCallback(RunCallback):
    """Per round the record's published row; at the end what the results add (a last evaluation
    after a stop between evaluations, the audiences' ε), each (tag, round) once."""

    def __init__(self) -> None:
        self._logged: dict[int, set[str]] = {}
        self._opened = time.time()

    def _write(self, run: FederatedRun, step: int, scalars: Mapping[str, float]) -> None:
        raise NotImplementedError

    def _stamp(self, run: FederatedRun) -> float:
        """A value's wall time: now, or, where the rounds' wall times are private (they grow with the
        cohort), the time the tracker opened, so that the stamps do not time the rounds."""
        return time.time() if run.publishes_participation else self._opened

    def on_round_end(self, run: FederatedRun, record: RoundRecord) -> None:
        scalars = published_scalars(run, run.disclosure.published_rows([record])[0])
        self._logged[record.round] = set(scalars)
        self._write(run, record.round, scalars)

    def _resumed(self, run: FederatedRun) -> dict[int, dict[str, float]]:
        """A resumed run's checkpointed rounds, (round -> scalars): what a tracker may have lost when
        the run died (a queue not yet written) or never had (tracking turned on at the resume)."""
        rows = run.disclosure.published_rows(run.records)
        out = {int(row["round"]): published_scalars(run, row) for row in rows}
        self._logged.update({step: set(scalars) for step, scalars in out.items()})
        return out

    def _final_scalars(self, run: FederatedRun, result: RunResult) -> dict[int, dict[str, float]]:
        """(round -> scalars) the results hold beyond what was logged per round."""
        out: dict[int, dict[str, float]] = {}
        for row in result.results["rounds"]:
            step = int(row["round"])
            if step in self._logged:
                extra = {k: v for k, v in published_scalars(run, row).items() if k not in self._logged[step]}
                if extra:
                    out[step] = extra
        if self._logged:
            last = max(self._logged)
            out.setdefault(last, {}).update(audience_scalars(result.results))
        return {k: v for k, v in out.items() if v}


class TensorBoardCallback(_ScalarCallback):
    """Scalars per round in ``<tracking-dir>/<run name>`` (default ``<run dir>/tensorboard``): one
    event per round holding all of its scalars, through TensorBoard's own event-file writer (a
    background thread writes; ``torch.utils.tensorboard`` wraps the same writer, one event a scalar)."""

    def __init__(self) -> None:
        super().__init__()
        self.writer: Any = None
        self.log_dir: Path | None = None

    def on_run_start(self, run: FederatedRun) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        cfg = run.cfg
        if cfg.tracking_dir:
            self.log_dir = Path(cfg.tracking_dir) / run_label(run)
        else:
            assert run.run_dir is not None  # tracking_callbacks refuses the other case
            self.log_dir = run.run_dir / "tensorboard"
        self.writer = EventFileWriter(str(self.log_dir))
        self._opened = time.time()
        if run.records:  # resumed: TensorBoard drops the earlier events from step 1 on, then all again
            from tensorboard.compat.proto.event_pb2 import Event, SessionLog

            self.writer.add_event(Event(wall_time=self._opened, step=1,
                                        session_log=SessionLog(status=SessionLog.START)))
            for step, scalars in self._resumed(run).items():
                self._write(run, step, scalars)

    def _write(self, run: FederatedRun, step: int, scalars: Mapping[str, float]) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=tag, simple_value=value) for tag, value in scalars.items()]
        self.writer.add_event(Event(wall_time=self._stamp(run), step=step, summary=Summary(value=values)))

    def on_run_end(self, run: FederatedRun, result: RunResult) -> None:
        if self.writer is None:
            return
        for step, scalars in self._final_scalars(run, result).items():
            self._write(run, step, scalars)
        self.writer.close()
        self.writer = None


def mlflow_uri(cfg: RunConfig) -> str:
    """``tracking-uri``, or MLflow's SQLite store ``<output-dir>/mlflow.db`` when it is empty."""
    if cfg.tracking_uri:
        return cfg.tracking_uri
    return f"sqlite:///{(Path(cfg.output_dir) / 'mlflow.db').resolve()}"


def _artifact_root(uri: str, experiment: str) -> str | None:
    """Where a new experiment keeps its artifacts: beside a SQLite store (MLflow's default is a
    folder of the working directory); None (the server's or file store's choice) otherwise."""
    if not uri.startswith("sqlite:///"):
        return None
    return (Path(uri[len("sqlite:///"):]).parent / "mlartifacts" / experiment).resolve().as_uri()


def mlflow_experiment(client: Any, uri: str, name: str) -> str:
    """The id of experiment ``name`` in the store (created, artifacts beside a SQLite store, if new)."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    return str(client.create_experiment(name, artifact_location=_artifact_root(uri, name)))


def prepare_mlflow(uri: str, experiment: str) -> None:
    """Create the store and the experiment once, before runs that share them start in parallel (a
    new SQLite store builds its tables, which two processes must not do at once)."""
    from mlflow.tracking import MlflowClient

    mlflow_experiment(MlflowClient(tracking_uri=uri), uri, experiment)


class MlflowCallback(_ScalarCallback):
    """One MLflow run per fedprivacy run, in experiment ``tracking-experiment``: params = the run
    config, metrics per round, artifacts = the run's published files (:data:`ARTIFACTS`). A resumed
    run continues its MLflow run (tag ``fedprivacy.run``) and keeps the params of its start.

    Metrics are kept and handed to MLflow's background writer in one batch at most every
    ``flush_seconds`` (and waited for at the end), as TensorBoard's writer does: one write to a
    SQLite store costs about 6 ms plus 0.06 ms a metric, a round of a small model 20-100 ms.
    """

    def __init__(self, *, flush_seconds: float = 5.0) -> None:
        super().__init__()
        self.client: Any = None
        self.run_id: str | None = None
        self.flush_seconds = flush_seconds
        self._pending: list[Any] = []  # metrics not yet handed to MLflow
        self._writing: list[Any] = []  # MLflow's RunOperations not yet waited for
        self._flushed = 0.0

    def on_run_start(self, run: FederatedRun) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri, label = mlflow_uri(run.cfg), run_label(run)
        name = run.cfg.tracking_experiment or DEFAULT_EXPERIMENT
        self.client = client = MlflowClient(tracking_uri=uri)
        self._opened = time.time()
        experiment = mlflow_experiment(client, uri, name)
        earlier = client.search_runs([experiment], filter_string=f"tags.`fedprivacy.run` = '{label}'")
        if earlier and run.records:  # the same run, continued: its params are those it started with
            self.run_id = earlier[0].info.run_id
            client.update_run(self.run_id, status="RUNNING")
            self._backfill(run, earlier[0].data.metrics)
            return
        for stale in earlier:  # an attempt that died and is started over (a sweep's unfinished run)
            if stale.info.status == "RUNNING":
                client.set_terminated(stale.info.run_id, status="KILLED")
        self.run_id = client.create_run(experiment, run_name=label, tags={"fedprivacy.run": label}).info.run_id
        params = [Param(k, str(v)) for k, v in run.cfg.to_mapping().items()]
        for i in range(0, len(params), 100):  # MLflow's limit per batch
            client.log_batch(self.run_id, params=params[i:i + 100])
        self._backfill(run, {})

    def _backfill(self, run: FederatedRun, keys: Mapping[str, Any]) -> None:
        """A resumed run's checkpointed rounds that the MLflow run lacks (each (key, round) once)."""
        have = {(k, m.step) for k in keys for m in self.client.get_metric_history(self.run_id, k)}
        for step, scalars in self._resumed(run).items():
            missing = {k: v for k, v in scalars.items() if (k, step) not in have}
            if missing:
                self._write(run, step, missing)
        self.flush(wait=True)

    def _write(self, run: FederatedRun, step: int, scalars: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        stamp = int(self._stamp(run) * 1000)
        self._pending.extend(Metric(key=k, value=v, timestamp=stamp, step=step) for k, v in scalars.items())
        if time.monotonic() - self._flushed >= self.flush_seconds:
            self.flush()

    def flush(self, *, wait: bool = False) -> None:
        """Hand every metric kept so far to MLflow's background writer (batches of 1000, its limit);
        ``wait``: until all that was handed over is in the store."""
        for i in range(0, len(self._pending), 1000):
            self._writing.append(self.client.log_batch(self.run_id, metrics=self._pending[i:i + 1000],
                                                       synchronous=False))
        self._pending, self._flushed = [], time.monotonic()
        while wait and self._writing:
            self._writing.pop(0).wait()

    def on_run_end(self, run: FederatedRun, result: RunResult) -> None:
        if self.run_id is None:
            return
        for step, scalars in self._final_scalars(run, result).items():
            self._write(run, step, scalars)
        self.flush(wait=True)
        for path in [run.run_dir / name for name in ARTIFACTS] if run.run_dir is not None else []:
            if path.is_file():
                self.client.log_artifact(self.run_id, str(path))
        self.client.set_tag(self.run_id, "fedprivacy.status", str(result.status))
        failed = result.status not in (RunStatus.COMPLETED, RunStatus.BUDGET_EXHAUSTED)  # a clean stop
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")
        self.run_id = None
