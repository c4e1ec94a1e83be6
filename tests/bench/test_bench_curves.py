"""fedprivacy_bench.curves: seeds pooled into points that state sigma, q, T and the accountant."""

from __future__ import annotations

from pathlib import Path

from fedprivacy_bench.curves import (
    curve_goals,
    curve_points,
    curves_markdown,
    experiment_title,
    headline_setups,
    membership_experiments,
    membership_markdown,
    membership_tested_markdown,
    plot_curves,
    plot_membership,
    plot_membership_tradeoff,
)


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
    assert "| fashion iid | fedprivacy | central | 4 | 4 | 0.895 | 0.0333 | 200 | 1e-05 | add/remove |" in table
    assert "0.840–0.860 | 0,1,2 |" in table
    path = plot_curves(points, tmp_path)
    assert path is not None and path.stat().st_size > 10_000


def test_runs_of_different_lengths_are_different_curves() -> None:
    rows = [_row("none", 0, 0.80, eps=None, target=None), _row("central", 0, 0.78, eps=4.0, target=4.0)]
    rows += [dict(_row("none", 0, 0.86, eps=None, target=None), rounds=100),
             dict(_row("central", 0, 0.84, eps=4.0, target=4.0), rounds=100)]
    points = curve_points(rows)
    assert sorted((p["mode"], p["rounds"], p["accuracy"]) for p in points) == [
        ("central", 100, 0.84), ("central", 200, 0.78), ("none", 100, 0.86), ("none", 200, 0.80)]


def test_many_setups_plot_in_rows_of_three_panels(tmp_path: Path) -> None:
    rows = [dict(_row(mode, 0, acc, eps=eps, target=eps), label=f"fashion iid {name}")
            for name in ("a", "b", "c", "d") for mode, acc, eps in (("none", 0.88, None), ("central", 0.85, 4.0))]
    path = plot_curves(curve_points(rows), tmp_path)
    assert path is not None
    from PIL import Image

    width, height = Image.open(path).size
    assert (width, height) == (round(6.5 * 3 * 110), round(4.5 * 2 * 110))  # 3 columns, 2 rows at 110 dpi


def _mia(eps: float | None, *, auc: float, tpr: float, acc: float) -> dict:
    rows = [{"attack": a, "level": lvl, "auc": auc if lvl == "user" else 0.5, "tpr_at_fpr_1pct": tpr,
             "tpr_at_fpr_01pct": tpr, "members": 200, "nonmembers": 200, "fpr_resolution": 0.005}
            for a in ("loss", "lira-online") for lvl in ("user", "example")]
    return {"rows": rows, "summary": {"epsilon": eps, "delta": 1e-5, "noise_multiplier": 1.0,
                                      "sample_rate": 0.4, "rounds": 30, "test_accuracy": acc,
                                      "test_accuracy_min": acc, "test_accuracy_max": acc,
                                      "clients": 100, "per_client": 100, "models": 4,
                                      "config": {"local_epochs": 5, "model": "mlp"}}}


def test_issue_13_goals_follow_the_figures(tmp_path: Path) -> None:
    points = curve_points([_row("none", s, a, eps=None, target=None) for s, a in ((0, 0.87), (1, 0.89))]
                          + [_row("central", 0, 0.83, eps=4.0, target=4.0)])
    useful = [_mia(None, auc=0.95, tpr=0.4, acc=0.8), _mia(8.0, auc=0.55, tpr=0.01, acc=0.7)]
    useless = [_mia(None, auc=0.95, tpr=0.4, acc=0.8), _mia(8.0, auc=0.52, tpr=0.01, acc=0.1)]

    goals = curve_goals(points, useful)
    verdicts = [g["verdict"] for g in goals]

    assert verdicts == ["met", "met", "met"]  # 0.88 mean, -5.0 points, chance at ε=8 on acc 0.7
    assert "0.880" in goals[0]["figures"] and "-5.0 points" in goals[1]["figures"]
    assert curve_goals(points, useless)[2]["verdict"] == "missed"  # chance only on a useless model
    low = curve_points([_row("none", 0, 0.80, eps=None, target=None),
                        _row("central", 0, 0.70, eps=4.0, target=4.0)])
    assert [g["verdict"] for g in curve_goals(low)] == ["missed", "missed", "not measured"]
    # a non-IID pair far below its non-DP twin is reported, not judged (the goal's setup is IID)
    dirichlet = [dict(_row(m, 0, a, eps=e, target=e), label="fashion dirichlet0.5 x")
                 for m, a, e in (("none", 0.85, None), ("central", 0.70, 4.0))]
    with_dirichlet = curve_goals(curve_points([_row("none", 0, 0.88, eps=None, target=None),
                                               _row("central", 0, 0.85, eps=4.0, target=4.0)] + dirichlet))[1]
    assert with_dirichlet["verdict"] == "met (IID); missed (non-IID)" and "-15.0 points" in with_dirichlet["figures"]
    assert "reported, not judged" in with_dirichlet["figures"]
    # the goal's figure is the point meeting it on the most seeds, not a higher single-seed one
    seeds3 = [dict(_row("none", s, a, eps=None, target=None), rounds=120) for s, a in ((0, 0.886), (1, 0.889),
                                                                                     (2, 0.886))]
    chosen = curve_goals(curve_points(seeds3 + [_row("none", 0, 0.8884, eps=None, target=None)]))[0]
    assert "mean of seeds [0, 1, 2]" in chosen["figures"] and "T=120" in chosen["figures"]
    table = membership_markdown(useful)
    assert table.count("\n") == 2 + 2 * 4 - 1 and "| no DP | – |" in table
    assert plot_membership(useful, tmp_path / "m.png").stat().st_size > 10_000


def test_membership_experiments_are_judged_apart_and_one_meeting_both_halves_meets_the_goal() -> None:
    def pool(setting: dict, clients: int) -> dict:
        return {**setting, "summary": {**setting["summary"], "clients": clients}}

    small = [_mia(None, auc=0.75, tpr=0.17, acc=0.82), _mia(4.0, auc=0.57, tpr=0.03, acc=0.48)]  # useless
    large = [pool(_mia(None, auc=0.70, tpr=0.08, acc=0.85), 1000),
             pool(_mia(4.0, auc=0.55, tpr=0.012, acc=0.80), 1000)]  # chance on a useful model
    mixed = [small[0], large[0], small[1], large[1]]  # the order settings come from several JSONs

    experiments = membership_experiments(mixed)
    verdict = curve_goals([], mixed)[2]
    only_small = curve_goals([], small)[2]

    assert [[s["summary"]["clients"] for s in e] for e in experiments] == [[100, 100], [1000, 1000]]
    assert "100 candidate clients x 100" in experiment_title(experiments[0])
    assert verdict["verdict"] == "met" and only_small["verdict"] == "missed"
    assert verdict["figures"].count("[missed]") == 1 and verdict["figures"].count("[met]") == 1
    assert "[chance, useful]" in verdict["figures"].split("[met]")[1]
    # AUC below 0.6 is not enough: TPR at 1% FPR 0.06 with 200 + 200 pairs is > 0.01 + 3 se (0.040)
    low_fpr_leak = [large[0], pool(_mia(4.0, auc=0.55, tpr=0.06, acc=0.80), 1000)]
    assert curve_goals([], low_fpr_leak)[2]["verdict"] == "missed"
    assert curve_goals([], [large[0], pool(_mia(4.0, auc=0.55, tpr=0.039, acc=0.80), 1000)])[2][
        "verdict"] == "met"


def _dist_pair(seed: int, central_acc: float, dist_acc: float) -> list[dict]:
    spec = {"dataset": "digits", "label": "digits 100k setup", "num_clients": 1000, "clients_per_round": 100,
            "rounds": 15, "noise_multiplier": 1.04, "target_epsilon": 3.0, "seed": seed}
    common = {"dataset": "digits", "label": "digits 100k setup", "framework": "fedprivacy",
              "engine": "inprocess", "seed": seed, "rounds": 15, "noise_multiplier": 1.04,
              "target_epsilon": 3.0, "sample_rate": 0.1, "delta": 1e-5, "num_clients": 1000,
              "clients_per_round": 100, "status": "ok", "wall_seconds": 10.0}
    central = {**common, "mode": "central", "test_accuracy": central_acc, "epsilon": 3.0,
               "spec": {**spec, "mode": "central"}}
    dist = {**common, "mode": "distributed", "test_accuracy": dist_acc, "epsilon": 10.35,
            "spec": {**spec, "mode": "distributed"},
            "epsilon_audiences": {"audience": "server", "server": 10.35, "observers": 3.004,
                                  "central_same_sigma_and_sampling": 3.0,
                                  "central_same_sigma_no_sampling": 10.34, "noise": "exact XNoise"}}
    return [central, dist]


def test_distributed_rows_pair_with_central_of_the_same_run_and_state_both_audiences() -> None:
    from fedprivacy_bench.curves import distributed_goal, distributed_markdown, distributed_pairs

    rows = [r for s, c, d in ((0, 0.77, 0.765), (1, 0.78, 0.79), (2, 0.76, 0.75))
            for r in _dist_pair(s, c, d)]
    other_sigma = _dist_pair(0, 0.7, 0.1)
    other_sigma[1]["spec"] = {**other_sigma[1]["spec"], "noise_multiplier": 2.0}  # no central twin
    rows += other_sigma[1:]

    pairs = distributed_pairs(rows)

    assert len(pairs) == 1 and pairs[0]["seeds"] == [0, 1, 2]
    p = pairs[0]
    assert [round(x, 6) for x in p["points"]] == [-0.5, 1.0, -1.0]
    assert abs(p["mean_points"] - (-0.5 + 1.0 - 1.0) / 3) < 1e-9
    assert (p["epsilon_server"], p["epsilon_observers"], p["central_epsilon"]) == (10.35, 3.004, 3.0)
    table = distributed_markdown(pairs)
    assert "| digits 100k setup | 1.0400 | 0.1 | 15 | 0,1,2 | 0.770 / 0.780 / 0.760 → 0.7700 (0.760–0.780) | " \
        "0.765 / 0.790 / 0.750 → 0.7683 (0.750–0.790) |" in table  # per seed, mean, min–max
    assert "3.004 (+0.1%)" in table and "10.35 (+0.1% vs 10.34)" in table
    goal = distributed_goal(pairs)
    assert goal["verdict"] == "met" and "-0.17 points over seeds 0,1,2" in goal["figures"]
    worse = distributed_pairs([r for s in (0, 1) for r in _dist_pair(s, 0.77, 0.75)])
    assert distributed_goal(worse)["verdict"] == "missed"  # -2 points
    one = distributed_goal(distributed_pairs(_dist_pair(0, 0.77, 0.77)))
    assert one["verdict"] == "met" and "one seed has no spread" in one["figures"]
    assert distributed_goal([])["verdict"] == "not measured"
    older = _dist_pair(5, 0.77, 0.64)  # a saved row of an earlier version: no audiences, not judged
    del older[1]["epsilon_audiences"]
    mixed = distributed_pairs(rows + older)
    assert [(p["recorded"], p["seeds"]) for p in mixed] == [(True, [0, 1, 2]), (False, [5])]
    judged = distributed_goal(distributed_pairs(older) + pairs)
    assert judged["verdict"] == "met" and "not judged: 1 older saved pair" in judged["figures"]
    assert "not recorded (an older saved run" in distributed_markdown(distributed_pairs(older))
    # on the curve a distributed point sits at the public's ε, the comparable audience of central's
    fashion = [dict(r, dataset="fashion-mnist", label="fashion iid x") for r in rows[:2]]
    points = {p["mode"]: p for p in curve_points(fashion)}
    assert points["distributed"]["epsilon_observers"] == 3.004 and points["distributed"]["epsilon"] == 10.35
    assert "10.3 (server), 3 (observers)" in curves_markdown(list(points.values()))


def _tested(eps: float | None, *, d: float, seed: int) -> dict:
    """A setting as ``scripts/user_membership.py --statistics`` writes it, JSON round-tripped (ceiling keys
    become text), from membership_table's real figures on a Gaussian world of 6 models x 40 clients x 10."""
    import json

    import numpy as np

    from fedprivacy.attacks.lira_eval import membership_table

    rng = np.random.default_rng(seed)
    groups = np.repeat(np.arange(40), 10)
    member = np.stack([rng.permutation(40) < 20 for _ in range(6)])[:, groups]
    phi = rng.normal(0.0, 3.0, 400) + d * member + rng.normal(0.0, 1.0, (6, 400))
    rows = membership_table(phi=phi, loss=-phi, member=member, groups=groups, model="toy", epsilon=eps,
                            attacks=("loss", "lira-offline"), statistics=True)
    ceiling = None if eps is None else {"tpr_at_fpr": {0.01: 0.033, 0.001: 0.0052}, "auc": 0.633}
    summary = {**_mia(eps, auc=0.5, tpr=0.01, acc=0.7 if eps else 0.82)["summary"], "dp_ceiling": ceiling,
               "train_accuracy": 0.8, "noise_multiplier": 4.5865 if eps else 0.0, "seconds": 12.0}
    return json.loads(json.dumps({"rows": rows, "summary": summary}, default=float))


def test_tested_tables_state_intervals_p_values_and_what_is_not_resolved(tmp_path: Path) -> None:
    settings = [_tested(None, d=2.0, seed=0), _tested(1.998, d=0.0, seed=1)]

    text = membership_tested_markdown(settings)
    rows = {(r["attack"], r["level"]): r for r in settings[0]["rows"]}

    # one header line and one table per setting, a row per (attack, level)
    assert text.count("| attack | level |") == 2 and text.count("| loss | user |") == 2
    assert "**no DP**" in text and "**ε = 1.998 (δ = 1e-05, σ = 4.5865)**" in text
    assert "DP ceiling (any test): TPR@1% ≤ 0.0330, TPR@0.1% ≤ 0.0052, AUC ≤ 0.633" in text
    # user level: 6 models x 20 non-member clients = 120 pairs: 1% allows 1 FP, 0.1% none (not resolved)
    user = rows["loss", "user"]
    lo, hi = user["auc_ci95"]
    assert f"| loss | user | {user['auc']:.3f} [{lo:.3f}, {hi:.3f}] p {user['auc_p_value']:.3f} |" in text
    assert user["nonmembers"] == 120 and "(1 FP)" in text and "(not resolved: 0 FP)" in text
    assert f"| {user['tpr_at_fpr_0.001']:.4f} [" in text  # TPR near 0.1%: four decimals
    # example level: 1200 non-member pairs, 1 FP at 0.1%
    assert rows["loss", "example"]["tpr_at_fpr_0.001_false_positives_allowed"] == 1
    assert "| 1200/1200 | 0.00083 |" in text
    # a strong signal is not at chance, no signal is (d = 0 on the DP setting)
    assert "| no |" in text.split("**ε")[0] and "| yes |" in text.split("**ε")[1]


def test_the_tradeoff_figure_puts_accuracy_beside_both_levels(tmp_path: Path) -> None:
    from PIL import Image

    settings = [_tested(1.998, d=0.0, seed=1), _tested(None, d=2.0, seed=0), _tested(3.999, d=0.5, seed=2)]

    path = plot_membership_tradeoff(settings, tmp_path / "t.png")

    assert path is not None and Image.open(path).size == (1900, 800)  # accuracy + 2 levels x 3 figures
    assert plot_membership_tradeoff([], tmp_path / "none.png") is None
    # rows without statistics (no intervals) draw as well
    bare = [_mia(None, auc=0.7, tpr=0.05, acc=0.8), _mia(4.0, auc=0.5, tpr=0.01, acc=0.7)]
    assert plot_membership_tradeoff(bare, tmp_path / "bare.png", attacks=("loss",)) is not None


def test_flower_rows_are_their_own_curves_and_sit_beside_fedprivacy_at_the_same_sigma(tmp_path: Path) -> None:
    """One invocation's rows (fedprivacy central, Flower client- and server-side clipping, Flower
    non-DP): two Flower curves, a Flower non-DP line, and one comparison table stating each ε."""
    from fedprivacy_bench.curves import flower_comparisons, flower_markdown

    central = _row("central", 0, 0.80, eps=3.997, target=4.0)
    flower = dict(_row("central", 0, 0.78, eps=60.5, target=4.0, framework="flower"),
                  epsilon_note="Flower RdpAccountant", flower_strategy="ClientSide",
                  fedprivacy_epsilon={"zero-out": 58.7, "replace-one": 140.1}, seconds_per_round=9.5,
                  spec={"extra": []})
    server = dict(flower, flower_strategy="ServerSide", spec={"extra": [["flower_clipping", "server"]]})
    none = dict(_row("none", 0, 0.86, eps=None, target=None, framework="flower"), flower_strategy="FedAvg")
    other_seed = _row("central", 1, 0.81, eps=4.0, target=4.0)  # no Flower row of its run: no table
    rows = [central, flower, server, none, other_seed]

    points = curve_points(rows)
    assert sorted((p["framework"], p["mode"]) for p in points) == [
        ("fedprivacy", "central"), ("flower", "central"), ("flower", "none"), ("flower server-clip", "central")]
    assert plot_curves(points, tmp_path) is not None
    # the ε = 4 goal pairs fedprivacy's point with fedprivacy's non-DP only (none here)
    assert curve_goals(points)[1]["verdict"] == "not measured"

    groups = flower_comparisons(rows)
    assert len(groups) == 1 and groups[0]["seed"] == 0
    assert [r["row"] for r in groups[0]["rows"]] == [
        "fedprivacy central", "flower central", "flower server-clip central", "flower none"]
    table = flower_markdown(groups)
    assert "| fashion iid | 200 | 0 | flower central | ClientSide | 0.8950 | fixed cohort 100 of 3000" in table
    assert "60.5 (Flower RdpAccountant) | 58.7; 140.1 | 0.7800 | 9.5 |" in table
    assert "Poisson q = 0.0333 | 3.997 (fedprivacy pld accountant, Poisson) | – | 0.8000 |" in table
    assert "| flower none | FedAvg | – |" in table and "no privacy" in table
    # the curve table names each point's relation; Flower's point targets no ε and draws a fixed cohort
    curve_table = curves_markdown(points)
    assert "| 0.0333 | 200 | 1e-05 | add/remove | fedprivacy pld" in curve_table
    assert ("| flower | central | σ of fedprivacy's ε=4 | 60.5 | 0.895 | cohort 100/3000 | 200 | 1e-05 | "
            "zero-out | Flower RdpAccountant |") in curve_table
    # the figure's legend qualifies Flower's ε, which holds under zero-out only
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    seen: list[str] = []
    real_legend = plt.Axes.legend

    def spy(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        legend = real_legend(self, *args, **kwargs)
        seen.extend(t.get_text() for t in legend.get_texts())
        return legend

    plt.Axes.legend = spy  # type: ignore[method-assign]
    try:
        plot_curves(points, tmp_path)
    finally:
        plt.Axes.legend = real_legend  # type: ignore[method-assign]
    flower_labels = [t for t in seen if t.startswith("flower") and "central" in t]
    assert flower_labels and all("Flower's RDP, zero-out, no amplification" in t for t in flower_labels)
    assert not any("zero-out" in t for t in seen if t.startswith("fedprivacy central"))


def test_the_headline_shows_the_judged_setups_zoomed_with_a_diverged_run_on_the_edge(tmp_path: Path) -> None:
    main = [_row("none", s, 0.88, eps=None, target=None) for s in (0, 1, 2)]
    main += [_row("central", s, a, eps=4.0, target=4.0) for s, a in ((0, 0.84), (1, 0.85), (2, 0.86))]
    main += [_row("local", 0, 0.06, eps=4.0, target=4.0)]  # diverged: below the zoomed axis
    one_seed = [dict(_row(m, 0, a, eps=e, target=e), label="fashion iid other")
                for m, a, e in (("none", 0.80, None), ("central", 0.70, 4.0))]
    flower = [dict(_row(m, 0, a, eps=e, target=4.0, framework=fw), label="fashion iid fedavg")
              for fw, m, a, e in (("fedprivacy", "central", 0.80, 4.0), ("flower", "central", 0.79, 60.0))]
    points = curve_points(main + one_seed + flower)

    setups = headline_setups(points)

    # the 3-seed setup and the one with Flower's rows; a single-seed fedprivacy-only setup is not headline
    assert setups == [("fashion iid", 200), ("fashion iid fedavg", 200)]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    here = [p for p in points if p["label"] == "fashion iid"]
    from fedprivacy.sweep.curves import _focus

    _focus(ax, here)
    low, high = ax.get_ylim()
    assert abs(low - 0.82) < 1e-9 and abs(high - 0.89) < 1e-9  # the learned runs' range, padded
    assert [t.get_text() for t in ax.texts] == ["fedprivacy local: 0.060"]
    plt.close(fig)


def test_the_page_leads_with_the_issue_13_goals_and_the_headline_figure(tmp_path: Path) -> None:
    from fedprivacy_bench import report

    rows = [dict(_row("none", s, 0.88, eps=None, target=None), engine="inprocess") for s in (0, 1, 2)]
    rows += [dict(_row("central", s, 0.85, eps=4.0, target=4.0), engine="inprocess") for s in (0, 1, 2)]
    plots = report.make_plots(rows, tmp_path)
    assert [p.name for p in plots][:2] == [report.HEADLINE_PLOT, "bench_fashion_accuracy_vs_epsilon.png"]
    payload = {"rows": rows, "goals": report.evaluate_goals(rows), "machine": report.machine_info(),
               "command": "python scripts/benchmark.py --setup x", "sweep": "setup x",
               "runtime_seconds": 60.0, "finished": "now", "notes": []}

    md = report.render_markdown(payload, plots=[str(p) for p in plots])

    order = [md.index(h) for h in ("## Goals", f"img/{report.HEADLINE_PLOT}",
                                   "## Goals of the digits and Synthetic sweep", "## Plots")]
    assert order == sorted(order)
    assert md.count(f"img/{report.HEADLINE_PLOT}") == 1  # not repeated under Plots
