"""fedprivacy_bench.curves: seeds pooled into points that state sigma, q, T and the accountant."""

from __future__ import annotations

from pathlib import Path

from fedprivacy_bench.curves import curve_points, curves_markdown, plot_curves


def _row(mode: str, seed: int, acc: float, *, eps: float | None, target: float | None,
         framework: str = "fedprivacy", status: str = "ok") -> dict:
    return {"dataset": "fashion-mnist", "label": "fashion iid", "framework": framework, "mode": mode,
            "seed": seed, "test_accuracy": acc, "epsilon": eps, "target_epsilon": target,
            "noise_multiplier": 0.895 if target else 0.0, "sample_rate": 1 / 30, "rounds": 200,
            "delta": 1e-5, "epsilon_note": "fedprivacy pld accountant, Poisson", "num_clients": 3000,
            "clients_per_round": 100, "status": status}


def test_points_pool_seeds_and_keep_what_the_claim_needs(tmp_path: Path) -> None:
    rows = [_row("none", s, a, eps=None, target=None) for s, a in ((0, 0.88), (1, 0.89), (2, 0.87))]
    rows += [_row("central", s, a, eps=e, target=4.0)
             for s, a, e in ((0, 0.85, 3.99), (1, 0.86, 4.0), (2, 0.84, 4.01))]
    rows += [_row("central", 3, 0.10, eps=4.0, target=4.0, status="failed")]  # left out
    rows += [{"dataset": "digits", "framework": "fedprivacy", "mode": "none", "status": "ok",
              "test_accuracy": 0.9}]  # not a curve row

    points = curve_points(rows)

    assert [(p["mode"], p["seeds"]) for p in points] == [("central", [0, 1, 2]), ("none", [0, 1, 2])]
    central = points[0]
    assert abs(central["accuracy"] - 0.85) < 1e-12
    assert (central["accuracy_min"], central["accuracy_max"]) == (0.84, 0.86)
    assert abs(central["epsilon"] - 4.0) < 1e-12
    assert (central["noise_multiplier"], central["rounds"], central["delta"]) == (0.895, 200, 1e-5)
    table = curves_markdown(points)
    assert "| fashion iid | fedprivacy | central | 4 | 4 | 0.895 | 0.0333 | 200 | 1e-05 |" in table
    assert "0.840–0.860 | 0,1,2 |" in table
    path = plot_curves(points, tmp_path)
    assert path is not None and path.stat().st_size > 10_000
