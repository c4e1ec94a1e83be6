"""The node's durable memory in Flower terms: :mod:`fedprivacy.fl.client_budget`'s file, on every run.

Every client-side guard lives in the node's own file (:meth:`fedprivacy.fl.client_policy.ClientPolicy.memory_path`:
``client-budget-path``, else ``partition-<partition id>.jsonl`` in ``client-memory-dir``, by default a SuperNode's
:func:`fedprivacy.fl.client_policy.default_memory_dir` and a simulation's run-temporary area), fsync'd before
the reply leaves: the rounds admitted, each secure stage answered (share, consistency: the signed view,
unmask: the shares revealed) and the ρ charges, shared by every run of the node. Flower's node state,
which a lost save rolls back, keeps only the file's id and length (``client-memory``): a file missing,
replaced or shorter than that is refused (the server counts a dropout). The plain ``train`` path checks
before it trains and charges before its reply leaves; the secure path checks at the share stage, holds
the round's ρ in node state and charges it at the masked stage, before the masked vector leaves.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING

from flwr.app import ConfigRecord, Context

from fedprivacy.fl.client_budget import ClientBudget, sync_file
from fedprivacy.fl.client_policy import ClientPolicy, PolicyRefusal

if TYPE_CHECKING:
    from fedprivacy.fl.secure import EncodingSpec
    from fedprivacy.secagg.messages import SetupRequest

__all__ = ["admit", "charge", "charge_held", "check", "hold", "memory", "one_sync", "record_stage", "secagg_cost"]

_MEMORY = "client-memory"  # the durable file's id and length, as this node last wrote it
#: inside :func:`one_sync`: the files written but not yet fsync'd, with the node whose state records them
_UNSYNCED: ContextVar[dict[Path, tuple[Context, ClientBudget]] | None] = ContextVar(
    "fedprivacy_client_memory_unsynced", default=None)
_PENDING = "client-budget-pending"


def memory(context: Context, policy: ClientPolicy) -> ClientBudget:
    """The node's durable memory (read by each use, under :func:`_writable`'s refusal)."""
    path = policy.memory_path(run_id=int(context.run_id), partition_id=int(context.node_config["partition-id"]))
    record = context.state.get(_MEMORY)
    expect = (str(record["id"]), int(record["lines"])) if isinstance(record, ConfigRecord) else None  # type: ignore[arg-type]
    budget = policy.budget(path=path, expect=expect, load=False)  # each use reads it under its lock
    budget.sync = _UNSYNCED.get() is None
    return budget


@contextmanager
def _writable(policy: ClientPolicy, budget: ClientBudget) -> Iterator[None]:
    """Refuse (:class:`PolicyRefusal`, naming the key) a memory that cannot be created or read; a missing,
    replaced or behind one is refused by the budget itself."""
    try:
        yield
    except OSError as exc:  # the path stays in the client's log, not in the reason the server receives
        key = "client-budget-path" if policy.budget_path else "client-memory-dir"
        logging.getLogger(__name__).error("durable memory %s cannot be created or read: %s", budget.path, exc)
        raise PolicyRefusal(f"this client's durable memory cannot be created or read "
                            f"({exc.strerror or type(exc).__name__}): set node config {key} to a place this "
                            "node can write") from None


def _saved(context: Context, budget: ClientBudget) -> None:
    """The node state's record of the file (its id and length), once what it counts is fsync'd."""
    pending = _UNSYNCED.get()
    if pending is not None and budget.path is not None:
        pending[budget.path] = (context, budget)
    else:
        context.state[_MEMORY] = ConfigRecord({"id": budget.file_id, "lines": budget.lines})


@contextmanager
def one_sync() -> Iterator[None]:
    """The records written inside are fsync'd once, on the way out (before the reply is returned): one
    message's records, its own stage's and those of round r+1's stage riding on it, for one flush."""
    pending: dict[Path, tuple[Context, ClientBudget]] = {}
    token = _UNSYNCED.set(pending)
    try:
        yield
    finally:
        _UNSYNCED.reset(token)
        for path, (context, budget) in pending.items():
            sync_file(path)
            context.state[_MEMORY] = ConfigRecord({"id": budget.file_id, "lines": budget.lines})


def check(context: Context, policy: ClientPolicy, rho: float, *, round: int, mode: str,
          slack: tuple[float, float] = (0.0, 0.0)) -> None:
    """Refuse (:class:`PolicyRefusal`) a round the client's total cannot pay; changes nothing."""
    budget = memory(context, policy)
    with _writable(policy, budget):
        budget.check(rho, round=round, what=mode, slack=slack[0], tv=slack[1])


def charge(context: Context, policy: ClientPolicy, rho: float, *, round: int, mode: str,
           slack: tuple[float, float] = (0.0, 0.0)) -> None:
    """Charge the round durably; call right before its reply leaves the client.
    ``slack``: a distributed round's ``(eta + A, G)`` (:func:`secagg_cost`)."""
    budget = memory(context, policy)
    with _writable(policy, budget):
        budget.charge(rho, run=str(context.run_id), round=round, mode=mode, what=mode, slack=slack[0],
                      tv=slack[1])
    _saved(context, budget)


def record_stage(context: Context, policy: ClientPolicy, *, round: int, stage: str) -> None:
    """Record durably that this node answered round ``round``'s ``stage``; refuse a second answer
    (:meth:`fedprivacy.fl.client_budget.ClientBudget.record_stage`)."""
    budget = memory(context, policy)
    with _writable(policy, budget):
        budget.record_stage(run=str(context.run_id), round=round, stage=stage)
    _saved(context, budget)


def admit(context: Context, policy: ClientPolicy, *, round: int) -> None:
    """Record durably that this node takes part in round ``round`` (advertise or plain train); refuse a
    round number not above every one it was admitted to in this run."""
    record_stage(context, policy, round=round, stage="admit")


def secagg_cost(policy: ClientPolicy, encoding: EncodingSpec, setup: SetupRequest, *,
                roster: int) -> tuple[float, tuple[float, float]]:
    """``(ρ, (slack, tv))`` of a secure round's release: the worst released sum of the encoding the
    server sent (:meth:`ClientPolicy.check_distributed`, which also refuses an encoding outside the
    floor) and that release's discrete slack (:meth:`ClientPolicy.distributed_release`);
    a sum without noise (``privacy = none`` under secure aggregation) costs ``ρ = ∞``."""
    if encoding.kind != "ddgauss":
        return math.inf, (0.0, 0.0)
    ddp = encoding.ddp()
    rho = policy.check_distributed(ddp, setup=setup, roster=roster)
    release = policy.distributed_release(ddp, roster=roster)
    return rho, (release.eta + release.sampler_ratio, release.sampler_tv)


def hold(context: Context, policy: ClientPolicy, rho: float, *, round: int,
         slack: tuple[float, float] = (0.0, 0.0)) -> None:
    """Remember the ρ (and slack) the client accepted at round ``round``'s share stage until its masked
    stage (a client may hold two live rounds: round r+1's share stage rides on round r's unmask). A
    rollback that loses it makes the masked stage refuse; one that keeps it meets the durable charge."""
    record = context.state.config_records.get(_PENDING)
    pending = {k: v for k, v in (record or {}).items() if int(k) >= round - 1}
    pending[str(int(round))] = "inf" if math.isinf(rho) else [float(rho), float(slack[0]), float(slack[1])]
    context.state[_PENDING] = ConfigRecord(pending)  # type: ignore[arg-type]


def charge_held(context: Context, policy: ClientPolicy, *, round: int, mode: str, unbounded: bool = False) -> None:
    """Charge the ρ and slack accepted at round ``round``'s share stage (before the masked vector
    leaves); refused when that stage did not run on this node. ``unbounded``: the masked stage itself
    costs ``ρ = ∞`` whatever the share stage held (it draws from a server-sent seed)."""
    record = context.state.config_records.get(_PENDING)
    if record is None or str(round) not in record:
        raise PolicyRefusal(f"masked stage of round {round} without this client's share stage of that round")
    held = record[str(round)]
    if held == "inf" or unbounded:
        charge(context, policy, math.inf, round=round, mode=mode)
    else:
        rho, slack, tv = (float(v) for v in held)  # type: ignore[union-attr]
        charge(context, policy, rho, round=round, mode=mode, slack=(slack, tv))
    pending = {k: v for k, v in record.items() if k != str(round)}
    context.state[_PENDING] = ConfigRecord(pending)  # type: ignore[arg-type]
