"""Deterministic fault injection: drop, delay past a timeout, raise."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.engine import FaultPlan, FaultRule, run_inprocess
from server.engine.faults import FaultDecision


def _rounds(result) -> list[str]:  # type: ignore[no-untyped-def]
    return list(result.context.state["toy-results"]["rounds"])


def test_drop_means_missing_reply_within_timeout(toyapp_dir: Path) -> None:
    plan = FaultPlan(
        rules=(FaultRule(action="drop", message_type="train", rounds=(2,), partition_ids=(1, 3)),)
    )
    result = run_inprocess(
        num_supernodes=5, app_dir=toyapp_dir, faults=plan, run_config="timeout=5.0"
    )

    r1, r2 = _rounds(result)
    assert "replies=5 errors=0 pids=[0, 1, 2, 3, 4]" in r1
    assert "replies=3 errors=0 pids=[0, 2, 4]" in r2
    assert result.stats.dropped == 2


def test_raise_gives_error_reply(toyapp_dir: Path) -> None:
    plan = FaultPlan(rules=(FaultRule(action="raise", partition_ids=(0,)),))
    result = run_inprocess(num_supernodes=4, app_dir=toyapp_dir, faults=plan)

    for line in _rounds(result):
        assert "replies=3 errors=1 pids=[1, 2, 3]" in line
    assert result.stats.errors == 2


def test_delay_past_timeout_is_missing_then_pullable(toyapp_dir: Path) -> None:
    plan = FaultPlan(
        rules=(
            FaultRule(action="delay", partition_ids=(2,), rounds=(1,), delay=10.0),
            FaultRule(action="delay", partition_ids=(3,), rounds=(1,), delay=0.5),
        )
    )
    result = run_inprocess(
        num_supernodes=4, app_dir=toyapp_dir, faults=plan, run_config="timeout=2.0"
    )

    r1, r2 = _rounds(result)
    assert "replies=3 errors=0 pids=[0, 1, 3]" in r1  # 0.5 s < timeout: on time
    assert "replies=4" in r2
    assert result.stats.delayed == 2 and result.stats.late == 1


def test_unknown_rule_values_are_refused() -> None:
    with pytest.raises(ValueError, match="action"):
        FaultRule(action="explode", partition_ids=(1,))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exactly one of partition_ids and fraction"):
        FaultRule(action="drop")
    with pytest.raises(ValueError, match="fraction must be in"):
        FaultRule(action="drop", fraction=1.5)
    with pytest.raises(ValueError, match="delay must be > 0"):
        FaultRule(action="delay", partition_ids=(1,))


def test_parse_matches_constructed_plan() -> None:
    plan = FaultPlan.parse("drop:type=train,rounds=2|3,fraction=0.25; raise:partitions=1|4", seed=5)

    assert plan == FaultPlan(
        rules=(
            FaultRule(action="drop", message_type="train", rounds=(2, 3), fraction=0.25),
            FaultRule(action="raise", partition_ids=(1, 4)),
        ),
        seed=5,
    )


def _hits(plan: FaultPlan, n: int, group: str = "1") -> list[int]:
    return [
        p for p in range(n) if plan.decide(message_type="train", group_id=group, partition_id=p)
    ]


def test_fraction_is_deterministic_given_seed() -> None:
    rule = FaultRule(action="drop", fraction=0.3)
    a, b = FaultPlan(rules=(rule,), seed=11), FaultPlan(rules=(rule,), seed=11)
    c = FaultPlan(rules=(rule,), seed=12)

    assert _hits(a, 1000) == _hits(b, 1000)
    assert _hits(a, 1000) != _hits(c, 1000)
    assert _hits(a, 1000, "1") != _hits(a, 1000, "2")  # fresh draw each round


@settings(max_examples=25, deadline=None)
@given(fraction=st.floats(0.05, 0.95), seed=st.integers(0, 2**31))
def test_fraction_hits_about_that_share(fraction: float, seed: int) -> None:
    plan = FaultPlan(rules=(FaultRule(action="drop", fraction=fraction),), seed=seed)
    share = len(_hits(plan, 4000)) / 4000
    # binomial sd <= 0.008 at n=4000; 6 sd is a safe bound
    assert abs(share - fraction) < 0.05


def test_first_matching_rule_wins_and_patterns_match() -> None:
    plan = FaultPlan(
        rules=(
            FaultRule(action="raise", message_type="query.*", partition_ids=(1,)),
            FaultRule(action="drop", message_type="*", partition_ids=(1, 2)),
        )
    )
    assert plan.decide(message_type="query.keys", group_id="3", partition_id=1) == FaultDecision(
        action="raise", delay=0.0, rule_index=0
    )
    assert plan.decide(message_type="train", group_id="3", partition_id=1).action == "drop"  # type: ignore[union-attr]
    assert plan.decide(message_type="train", group_id="3", partition_id=0) is None


def test_same_plan_same_outcome_across_runs_and_workers(toyapp_dir: Path) -> None:
    plan = FaultPlan(rules=(FaultRule(action="drop", fraction=0.4),), seed=3)
    a = run_inprocess(num_supernodes=12, app_dir=toyapp_dir, faults=plan)
    b = run_inprocess(num_supernodes=12, app_dir=toyapp_dir, faults=plan, workers=2)

    assert _rounds(a) == _rounds(b)
    assert a.stats.dropped == b.stats.dropped > 0
