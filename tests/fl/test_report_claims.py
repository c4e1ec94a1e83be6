"""The privacy report states the assumptions its ε was computed under: colluders,
participation counts, and charges of rounds a crash cut off."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from fedprivacy.fl.modes import get_mode
from fedprivacy.report import privacy_report_md

GOLDEN = json.loads((Path(__file__).resolve().parents[1] / "golden" / "runs.json").read_text())


def _results(name: str) -> dict:
    r = copy.deepcopy(GOLDEN[name])
    return {**r, "run_name": name, "config": {}}


def test_distributed_report_states_the_colluders_its_epsilon_assumes() -> None:
    results = _results("distributed-secagg")
    for audience in results["privacy"]["distributed"]["audiences"].values():
        if isinstance(audience, dict) and "colluders" in audience:
            audience["colluders"] = 2
    report = privacy_report_md(results, covers=get_mode(results["privacy"]["mode"]).covers)
    assert "| Colluding clients assumed | 2 (" in report
    assert "at most 2 clients collude with it" in report and "corrupted = 0" not in report


def test_central_report_says_participation_is_private_and_charges_came_first() -> None:
    results = _results("central-poisson")
    assert results["privacy"]["participation"]["published"] is False
    results["privacy"]["write_ahead"]["unfinished_rounds"] = [2]
    report = privacy_report_md(results, covers=get_mode(results["privacy"]["mode"]).covers)
    assert "Participation counts (not published; not covered by ε)" in report
    assert "Rounds [2] were charged and cut off" in report
    assert "Colluding clients assumed" not in report
