"""The quick sweep (tiny models, few rounds) judges no goal: each verdict says it is not a result."""

from __future__ import annotations

from fedprivacy_bench import report


def test_quick_sweep_verdicts_say_not_a_result() -> None:
    assert report.quick_verdict({"sweep": "quick"}, "met") == "quick: not a result"
    assert report.quick_verdict({"sweep": "quick"}, "missed") == "quick: not a result"


def test_other_sweeps_keep_their_verdict() -> None:
    assert report.quick_verdict({"sweep": "full"}, "met") == "met"
    assert report.quick_verdict({"sweep": "budget"}, "missed") == "missed"
