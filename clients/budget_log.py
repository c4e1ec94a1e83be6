"""The node's cumulative privacy budget in Flower terms (review2 R2): :mod:`fedprivacy.fl.client_budget`.

The charges live in the budget file the node's operator names (``client-budget-path``, shared by every
run of the node) or, without one, in the node's ``context.state`` (per run, never sent to the server).
The plain ``train`` path checks before it trains and charges before its reply leaves; the secure path
checks at the share stage (before any secret leaves the client), holds the round's ρ in node state and
charges it at the masked stage, before the masked (noised) vector leaves.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from flwr.app import ConfigRecord, Context

from fedprivacy.fl.client_budget import ClientBudget
from fedprivacy.fl.client_policy import ClientPolicy, PolicyRefusal

if TYPE_CHECKING:
    from fedprivacy.fl.secure import EncodingSpec
    from fedprivacy.secagg.messages import SetupRequest

__all__ = ["charge", "charge_held", "check", "hold", "record_stage", "secagg_cost"]

_STATE = "client-budget"
_PENDING = "client-budget-pending"


def _enforced(policy: ClientPolicy) -> bool:
    return math.isfinite(policy.max_rho_total) or bool(policy.budget_path)


def _load(context: Context, policy: ClientPolicy) -> ClientBudget:
    record = context.state.config_records.get(_STATE)
    charges = ClientBudget.charges_from_state(dict(record)) if record is not None and not policy.budget_path else []
    return policy.budget(charges=charges)


def check(context: Context, policy: ClientPolicy, rho: float, *, round: int, mode: str,
          slack: tuple[float, float] = (0.0, 0.0)) -> None:
    """Refuse (:class:`PolicyRefusal`) a round the client's total cannot pay; changes nothing."""
    if _enforced(policy):
        _load(context, policy).check(rho, round=round, what=mode, slack=slack[0], tv=slack[1])


def charge(context: Context, policy: ClientPolicy, rho: float, *, round: int, mode: str,
           slack: tuple[float, float] = (0.0, 0.0)) -> None:
    """Charge the round (durably with a budget file); call right before its reply leaves the client.
    ``slack``: a distributed round's ``(eta + A, G)`` (:func:`secagg_cost`)."""
    if not _enforced(policy):
        return
    budget = _load(context, policy)
    budget.charge(rho, run=str(context.run_id), round=round, mode=mode, what=mode, slack=slack[0],
                  tv=slack[1])
    if budget.path is None:
        context.state[_STATE] = ConfigRecord(budget.to_state())


def record_stage(context: Context, policy: ClientPolicy, *, round: int, stage: str) -> None:
    """Record durably (with a budget file) that this node answered round ``round``'s ``stage``; refuse a
    second answer (:meth:`fedprivacy.fl.client_budget.ClientBudget.record_stage`, review6 Y2)."""
    if policy.budget_path:
        policy.budget().record_stage(run=str(context.run_id), round=round, stage=stage)


def secagg_cost(policy: ClientPolicy, encoding: EncodingSpec, setup: SetupRequest, *,
                roster: int) -> tuple[float, tuple[float, float]]:
    """``(ρ, (slack, tv))`` of a secure round's release: the worst released sum of the encoding the
    server sent (:meth:`ClientPolicy.check_distributed`, which also refuses an encoding outside the
    floor) and that release's discrete slack (:meth:`ClientPolicy.distributed_release`, review6 Y1);
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
    stage (a client may hold two live rounds: round r+1's share stage rides on round r's unmask)."""
    if not _enforced(policy):
        return
    record = context.state.config_records.get(_PENDING)
    pending = {k: v for k, v in (record or {}).items() if int(k) >= round - 1}
    pending[str(int(round))] = "inf" if math.isinf(rho) else [float(rho), float(slack[0]), float(slack[1])]
    context.state[_PENDING] = ConfigRecord(pending)  # type: ignore[arg-type]


def charge_held(context: Context, policy: ClientPolicy, *, round: int, mode: str, unbounded: bool = False) -> None:
    """Charge the ρ and slack accepted at round ``round``'s share stage (before the masked vector
    leaves); refused when that stage did not run on this node. ``unbounded``: the masked stage itself
    costs ``ρ = ∞`` whatever the share stage held (it draws from a server-sent seed, review7 Z2)."""
    if not _enforced(policy):
        return
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
