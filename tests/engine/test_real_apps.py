"""fedprivacy's own apps (server.server_app:app, clients.client_app:app) on the in-process engine.

Also the equivalence with Flower's Ray engine (``flwr run``), marked slow.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import pytest

from fedprivacy.fl.run import read_participation
from server.engine import FaultPlan, FaultRule, run_flwr, run_inprocess
from server.engine.appspec import config_string
from server.engine.cli import simulate

REPO_DIR = Path(__file__).resolve().parents[2]

pytest.importorskip("server.server_app")
pytest.importorskip("clients.client_app")

# Metrics that must agree between runs; "seconds" is wall time and may not.
_COMPARED = (
    "round",
    "clients_sampled",
    "clients_aggregated",
    "train_loss",
    "test_loss",
    "test_accuracy",
    "epsilon",
    "delta",
)


def _config(tmp_path: Path, name: str, **extra: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "num-server-rounds": 2,
        "privacy": "central",
        "secagg": False,
        "noise-multiplier": 1.0,
        "sample-rate": 1.0,
        "local-epochs": 1,
        "seed": 1,
        "output-dir": str(tmp_path),
        "run-name": name,
        "client-timeout": 60.0,
    }
    cfg.update(extra)
    return cfg


def _rows(results_path: Path | str | None) -> list[dict[str, Any]]:
    """The published rows, joined with the server's private participation counts (central mode
    keeps them out of results.json)."""
    assert results_path is not None, "the ServerApp wrote no results.json"
    rows = json.loads(Path(results_path).read_text())["rounds"]
    counts = {c["round"]: c for c in read_participation(Path(results_path).parent)}
    return [{k: {**r, **counts.get(r["round"], {})}.get(k) for k in _COMPARED} for r in rows]


# Batched local training (fedprivacy.ml.batched) groups the clients a worker holds into one computation, and
# a batched matmul sums in another order than one client's: the losses then agree up to float rounding,
# not bit for bit. Everything else (counts, accuracy, ε, δ) must be identical.
_ROUNDED = ("train_loss", "test_loss")


def _same(left: list[dict[str, Any]], right: list[dict[str, Any]]) -> bool:
    if len(left) != len(right):
        return False
    for a, b in zip(left, right, strict=True):
        exact = {k: v for k, v in a.items() if k not in _ROUNDED}
        if exact != {k: v for k, v in b.items() if k not in _ROUNDED}:
            return False
        for k in _ROUNDED:  # None where a mode keeps the figure private
            if (a[k] is None) != (b[k] is None) or (a[k] is not None and a[k] != pytest.approx(b[k], rel=1e-6)):
                return False
    return True


def test_two_rounds_five_clients_same_with_one_or_two_workers(tmp_path: Path) -> None:
    one = run_inprocess(
        run_config=_config(tmp_path, "w1"), num_supernodes=5, workers=1, app_dir=REPO_DIR
    )
    two = run_inprocess(
        run_config=_config(tmp_path, "w2"), num_supernodes=5, workers=2, app_dir=REPO_DIR
    )

    rows = _rows(one.results_path)
    assert [r["round"] for r in rows] == [1, 2]
    assert all(r["clients_sampled"] == 5 and r["clients_aggregated"] == 5 for r in rows)
    assert 0 < rows[0]["epsilon"] < rows[1]["epsilon"]
    assert _same(rows, _rows(two.results_path))
    # one partition query per node, then 5 train messages per round
    assert one.stats.by_type.get("query") == 5 and one.stats.by_type.get("train") == 10
    # the engine freezes the collector's old objects only while a run lasts (also for the forked pool)
    assert gc.get_freeze_count() == 0


def test_distributed_secure_round_same_with_one_or_two_workers(tmp_path: Path) -> None:
    # Arrange: distributed DP over the actively secure schedule; with 2 workers each node's session
    # (keys, shares, its round log) lives in a forked worker during a call and comes back as its state
    cfg = {"privacy": "distributed", "secagg": True, "accountant": "rdp", "client-timeout": 120.0}
    # Act
    one = run_inprocess(run_config=_config(tmp_path, "d1", **cfg), num_supernodes=8, workers=1,
                        app_dir=REPO_DIR)
    two = run_inprocess(run_config=_config(tmp_path, "d2", **cfg), num_supernodes=8, workers=2,
                        app_dir=REPO_DIR)
    # Assert: the same released sums (accuracy, loss) and ε, every stage delivered to all 8 nodes
    rows = _rows(one.results_path)
    assert [r["round"] for r in rows] == [1, 2] and 0 < rows[0]["epsilon"] < rows[1]["epsilon"]
    assert _same(rows, _rows(two.results_path))
    assert one.stats.by_type == two.stats.by_type
    assert two.stats.by_type["train.secagg_masked"] == 16 and two.stats.errors == 0


def test_dropout_and_crash_do_not_stop_the_round(tmp_path: Path) -> None:
    plan = FaultPlan(
        rules=(
            FaultRule(action="drop", message_type="train", rounds=(2,), partition_ids=(1,)),
            FaultRule(action="raise", message_type="train", rounds=(2,), partition_ids=(3,)),
        )
    )
    res = run_inprocess(
        run_config=_config(tmp_path, "faults", **{"client-timeout": 5.0}),
        num_supernodes=5,
        faults=plan,
        app_dir=REPO_DIR,
    )

    r1, r2 = _rows(res.results_path)
    assert (r1["clients_sampled"], r1["clients_aggregated"]) == (5, 5)
    assert (r2["clients_sampled"], r2["clients_aggregated"]) == (5, 3)
    assert res.stats.dropped == 1 and res.stats.errors == 1


def test_discovery_asks_again_the_nodes_whose_query_reply_was_lost(tmp_path: Path) -> None:
    """At 1000 SuperNodes Ray answered ~680 partition queries in one pass and discovery never
    asked the rest again. Here the first ask to partitions 2 and 5 gets no reply (a drop: the query's
    group_id is its attempt); the second ask finds them and the run is the run without faults."""
    plan = FaultPlan.parse("drop:type=query,rounds=1,partitions=2|5")
    cfg = {"num-server-rounds": 1, "client-timeout": 5.0}
    lossy = run_inprocess(run_config=_config(tmp_path, "lossy", **cfg), num_supernodes=8, faults=plan,
                          app_dir=REPO_DIR)
    clean = run_inprocess(run_config=_config(tmp_path, "clean", **cfg), num_supernodes=8, app_dir=REPO_DIR)

    assert lossy.stats.dropped == 2 and lossy.stats.by_type.get("query") == 8 + 2
    (row,) = _rows(lossy.results_path)
    assert (row["clients_sampled"], row["clients_aggregated"]) == (8, 8)
    assert _same(_rows(lossy.results_path), _rows(clean.results_path))


def test_discovery_gives_up_after_its_attempts_and_names_what_is_missing(tmp_path: Path) -> None:
    from server.loop import QUERY_ATTEMPTS, NoClientsError

    plan = FaultPlan.parse("drop:type=query,partitions=3|6|7")  # every ask to these nodes is lost
    with pytest.raises(NoClientsError) as err:
        run_inprocess(run_config=_config(tmp_path, "silent", **{"client-timeout": 2.0}), num_supernodes=9,
                      faults=plan, app_dir=REPO_DIR)
    text = str(err.value)
    assert "only partitions [0-2, 4-5, 8] answered" in text and "missing [3, 6-7]" in text
    assert f"3 connected node(s) never answered, asked up to {QUERY_ATTEMPTS} time(s)" in text
    assert "(num-partitions=9;" in text


def test_simulate_summary(tmp_path: Path) -> None:
    out = simulate(
        engine="inprocess",
        num_supernodes=4,
        run_config=config_string(_config(tmp_path, "sim", **{"num-server-rounds": 1})),
        app_dir=REPO_DIR,
    )

    assert out["engine"] == "inprocess" and out["rounds"] == 1
    assert out["final"]["round"] == 1 and out["final"]["epsilon"] > 0
    assert Path(out["results_path"]).is_file()


@pytest.mark.slow
def test_inprocess_equals_flwr_run_on_ray(tmp_path: Path) -> None:
    """Seeded mode: same per-round metrics and the same ε as `flwr run` (Ray engine)."""
    inproc = run_inprocess(
        run_config=_config(tmp_path, "inprocess"), num_supernodes=4, app_dir=REPO_DIR
    )
    ray = run_flwr(
        run_config=config_string(_config(tmp_path, "ray")),
        num_supernodes=4,
        app_dir=REPO_DIR,
        timeout=600,
        capture=True,
    )

    assert ray.exit_code == 0, (ray.status, ray.output)  # flwr run returns 0 when the ServerApp fails
    ray_rows = _rows(tmp_path / "ray" / "results.json")
    assert _same(ray_rows, _rows(inproc.results_path))


@pytest.mark.slow
def test_ray_simulation_gives_the_clients_the_floor_of_the_run(tmp_path: Path) -> None:
    """``run_flower_simulation`` (bench_engine's Ray rows): the clients get the floor of the run asked
    for, as with ``flwr run``. Privacy ``none`` is outside the code defaults (distributed, local): every
    client refused it and the run stopped after one "round" of refusals (the Ray figures)."""
    import os
    import subprocess
    import sys

    cfg = _config(tmp_path, "ray-sim", privacy="none")
    code = ("from server.engine import run_flower_simulation; "
            f"run_flower_simulation(run_config={cfg!r}, num_supernodes=4, app_dir={str(REPO_DIR)!r})")
    env = {k: v for k, v in os.environ.items() if k != "FEDPRIVACY_CLIENT_POLICY"}
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO_DIR, env=env, timeout=600)
    data = json.loads((tmp_path / "ray-sim" / "results.json").read_text())
    assert data["status"] == "completed", data.get("stopped")
    inproc = run_inprocess(run_config=_config(tmp_path, "inproc", privacy="none"), num_supernodes=4,
                           app_dir=REPO_DIR)
    assert _same(_rows(tmp_path / "ray-sim" / "results.json"), _rows(inproc.results_path))


def test_secagg_dropout_at_the_masked_input_stage(tmp_path: Path) -> None:
    """A stage-targeted drop: two clients vanish after sharing keys, before the masked upload."""
    plan = FaultPlan.parse("drop:type=train.secagg_masked,rounds=1,partitions=3|5", seed=1)
    cfg = _config(
        tmp_path,
        "secagg-drop",
        **{
            "privacy": "distributed",
            "secagg": True,
            "accountant": "rdp",
            "neighbouring": "add-remove",
            "num-server-rounds": 1,
            "client-timeout": 10.0,
        },
    )
    res = run_inprocess(run_config=cfg, num_supernodes=8, faults=plan, app_dir=REPO_DIR)

    (row,) = _rows(res.results_path)
    assert (row["clients_sampled"], row["clients_aggregated"]) == (8, 6)
    assert row["epsilon"] > 0
    assert res.stats.dropped == 2
    assert res.stats.by_type["train.secagg_masked"] == 8
