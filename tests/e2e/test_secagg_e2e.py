"""Secure aggregation with distributed DP on Flower's own simulation engine (slow): ``flwr run .``.

Runs offline through ``server.engine.flower.run_flwr`` (private ``FLWR_HOME``, SuperLink stopped by process id).
With ``client-resources-num-cpus=1`` Flower starts two ClientApp actors on this machine, so a node's four
secagg messages of a round reach different processes: this also tests that the client's session travels
in its ``context.state``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from server.engine.flower import run_flwr

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_flwr_run_distributed_dp_with_secagg_two_rounds(tmp_path: Path) -> None:
    # Arrange
    home = tmp_path / "flwr-home"
    out = tmp_path / "runs"
    run_config = (f"num-server-rounds=2 seed=0 run-name='sa' output-dir='{out}' privacy='distributed' "
                  "secagg=true accountant='rdp' target-delta=0.001")
    # Act
    res = run_flwr(num_supernodes=6, run_config=run_config, app_dir=REPO, flwr_home=home, timeout=900,
                   capture=True)
    # Assert
    log = res.output or ""
    assert res.exit_code == 0, (res.status, log[-3000:])  # flwr run returns 0 when the ServerApp fails
    assert "round   2/2" in log and "ABORTED" not in log and "LookupError" not in log
    results = json.loads((out / "sa" / "results.json").read_text())
    rows = results["rounds"]
    assert [r["round"] for r in rows] == [1, 2]
    assert [r["secagg_survivors"] for r in rows] == [6, 6]
    assert [r["secagg_exchanges"] for r in rows] == [5, 3]  # active schedule; round 2 pipelined (its key stages rode on round 1)
    d = results["privacy"]["distributed"]
    assert d["threshold"] == 4 and d["survivors_per_round"] == [6, 6]
    # exact XNoise: the sum carries z C = 0.5 whatever the survivors (the legacy share left sqrt(6/4) of it),
    # so ε is the Gaussian's at z ~ 1 (accountant rdp here: dp-accounting's RDP composition, up to
    # the rounding's sensitivity and the slack), never below central DP's PLD at the same σ
    import dp_accounting

    assert d["noise_std_of_sum_per_round"] == pytest.approx([0.5] * 2, rel=1e-12)
    rdp = dp_accounting.rdp.RdpAccountant()
    rdp.compose(dp_accounting.GaussianDpEvent(noise_multiplier=1.0), 2)
    assert results["privacy"]["epsilon"] == pytest.approx(rdp.get_epsilon(1e-3), rel=1e-3)
    assert d["central_dp_epsilon_same_sigma"] <= results["privacy"]["epsilon"]
    report = (out / "sa" / "privacy_report.md").read_text()
    assert "noise the survivors left" in report
