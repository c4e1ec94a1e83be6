"""The client's crowd floor (``client-min-threshold``, ``client-min-survivors``, ``client-min-roster``):
the smallest aggregate a secure round may release with its input in it, in every mode.

The adversary is the server, which picks the world, the threshold and the survivors: with
``privacy = none`` over secure aggregation and a world of 3 (one of them its own), the released sum
minus its own input is the exact sum of two honest inputs. Real ClientApp handlers, in-process engine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from flwr.clientapp import ClientApp

from clients import client_app as real
from fedprivacy.fl.client_limits import check_crowd
from fedprivacy.fl.client_policy import NODE_CONFIG_KEYS, ClientPolicy, PolicyRefusal
from fedprivacy.secagg.messages import SetupRequest
from server.engine import run_inprocess

REPO = Path(__file__).resolve().parents[2]
NONE_OVER_SECAGG = {"num-server-rounds": 1, "accountant": "rdp", "client-timeout": 60.0, "local-epochs": 1,
                    "privacy": "none", "secagg": True, "clip-norm": 1.0, "max-failed-fraction": 1.0,
                    "seed": -1, "cohort-size": 3}
CROWD = ("client-min-threshold", "client-min-survivors", "client-min-roster")


def _operators_app(refusals: list[str], floor: dict[str, Any]) -> ClientApp:
    """The real handlers under an operator's node config: it takes part in ``none`` rounds and lifts its
    total (it trusts the server with its un-noised update's ρ), and keeps the crowd floor's defaults
    (the simulation launcher's keys for them removed) unless ``floor`` sets them."""
    def own(handler):
        def run(msg, context):
            base = {k: v for k, v in context.node_config.items() if k not in CROWD}
            context.node_config = {**base, "client-privacy-modes": "none", "client-max-rho-total": "inf", **floor}
            try:
                return handler(msg, context)
            except PolicyRefusal as exc:
                refusals.append(str(exc))
                raise
        return run

    app = ClientApp()
    app.query()(own(real.query))
    for stage in ("advertise", "share", "consistency", "unmask"):
        app.query(f"secagg_{stage}")(own(getattr(real, f"secagg_{stage}")))
    app.train("secagg_masked")(own(real.secagg_masked))
    return app


def test_a_world_of_three_with_privacy_none_is_refused_by_the_default_floor(tmp_path: Path) -> None:
    # Arrange: the server asks for a world of 3 (t = 2: a sum of 2 survivors may be released)
    refusals: list[str] = []
    # Act
    run_inprocess(run_config={**NONE_OVER_SECAGG, "output-dir": str(tmp_path), "run-name": "w3"}, num_supernodes=3,
                  app_dir=REPO, node_id_seed=1, client_app=_operators_app(refusals, {}))
    # Assert: every client refused at its first secure stage (before any key or vector left it)
    res = json.loads((tmp_path / "w3" / "results.json").read_text())
    assert res["status"] == "clients-failed" and all(r.get("aborted") for r in res["rounds"])
    assert len(refusals) == 3 and all("client-min-" in why for why in refusals)
    assert all(not r.get("clients_aggregated") for r in res["rounds"])  # nothing summed: nothing to subtract


def test_a_crowd_above_the_floor_runs_and_the_floor_is_the_operators(tmp_path: Path) -> None:
    # Arrange: the same request to operators whose own floor admits a world of 3 (their choice, not the server's)
    refusals: list[str] = []
    floor = {"client-min-threshold": 2, "client-min-survivors": 2, "client-min-roster": 3}
    # Act
    run_inprocess(run_config={**NONE_OVER_SECAGG, "output-dir": str(tmp_path), "run-name": "w3ok"},
                  num_supernodes=3, app_dir=REPO, node_id_seed=1, client_app=_operators_app(refusals, floor))
    # Assert: the round releases its sum of 3
    res = json.loads((tmp_path / "w3ok" / "results.json").read_text())
    assert refusals == [] and res["status"] == "completed"
    assert [r["clients_aggregated"] for r in res["rounds"]] == [3]


@pytest.mark.parametrize("setup, roster, key", [
    (SetupRequest(round=1, threshold=2, degree=2, dim=8), None, "client-min-threshold"),
    (SetupRequest(round=1, threshold=3, degree=4, dim=8), None, "client-min-survivors"),  # t = 3 survivors < 4
    (SetupRequest(round=1, threshold=5, degree=6, dim=8, colluders=2), None, "client-min-survivors"),  # 5 - 2 < 4
    (SetupRequest(round=1, threshold=4, degree=5, dim=8), 4, "client-min-roster"),
])
def test_the_default_floor_refuses_each_small_crowd(setup: SetupRequest, roster: int | None, key: str) -> None:
    policy = ClientPolicy(schedule="semi-honest", colluders=0)
    with pytest.raises(PolicyRefusal, match=key):
        policy.check_secagg(setup)
        check_crowd(policy, roster=roster)
    # the smallest crowd the defaults join: t = 4 survivors, a roster of 5
    policy.check_secagg(SetupRequest(round=1, threshold=4, degree=4, dim=8))
    check_crowd(policy, roster=5)
    assert set(CROWD) <= set(NODE_CONFIG_KEYS)
    assert ClientPolicy.from_node_config({"client-min-roster": 9}).min_roster == 9
    with pytest.raises(ValueError, match="client-min-survivors"):
        ClientPolicy.from_node_config({"client-min-survivors": 1.5})
