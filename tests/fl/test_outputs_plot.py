"""The per-run plot: ε from 0 on its own axis, accuracy from 0 to 1, a legend naming both curves."""

from __future__ import annotations

from fedprivacy.fl.outputs import plot_figure, plot_png

ROWS = [{"round": r, "test_accuracy": 0.5 + 0.1 * r, "epsilon": 3.0 + r} for r in (1, 2, 3)]


def test_epsilon_axis_starts_at_zero_and_the_legend_names_both_curves() -> None:
    fig = plot_figure(ROWS, title="run")

    accuracy_axis, epsilon_axis = fig.axes
    assert accuracy_axis.get_ylim() == (0.0, 1.0)
    assert epsilon_axis.get_ylim()[0] == 0.0  # the data start at ε = 4
    legend = accuracy_axis.get_legend()
    assert legend is not None
    assert [t.get_text() for t in legend.get_texts()] == ["test accuracy", "ε"]


def test_a_run_without_dp_has_one_axis_and_a_png() -> None:
    rows = [{**r, "epsilon": None} for r in ROWS]

    assert len(plot_figure(rows, title="none").axes) == 1
    assert plot_png(rows, title="none").startswith(b"\x89PNG")
