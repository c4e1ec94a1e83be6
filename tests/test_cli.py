"""The `fedprivacy epsilon` / `fedprivacy noise` commands (Typer), against independent computations."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import dp_accounting as dpa
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from typer.testing import CliRunner

from fedprivacy.accounting.adversary import adaptive_delta, fixed_cohort_orientations
from fedprivacy.cli import app, main

runner = CliRunner()


def run_json(*args: str) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


POISSON = [(1.1, 256 / 60000, 500, 1e-5), (2.0, 0.1, 50, 1e-3)]


@pytest.mark.parametrize(("z", "q", "steps", "delta"), POISSON)
def test_epsilon_poisson_agrees_with_independent_pld(
    z: float, q: float, steps: int, delta: float
) -> None:
    out = run_json(
        "epsilon",
        "--noise-multiplier",
        str(z),
        "--sample-rate",
        repr(q),
        "--steps",
        str(steps),
        "--delta",
        str(delta),
    )
    ref = dpa.pld.PLDAccountant()
    ref.compose(
        dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), steps)
    )
    assert out["epsilon"] == pytest.approx(ref.get_epsilon(delta), rel=0.01)
    lower = (
        pld_lib.from_gaussian_mechanism(
            standard_deviation=z, sampling_prob=q, pessimistic_estimate=False
        )
        .self_compose(steps)
        .get_epsilon_for_delta(delta)
    )
    assert out["epsilon"] >= lower  # never below the optimistic (lower) estimate
    assert {
        "epsilon",
        "delta",
        "accountant",
        "sampling",
        "neighbouring",
        "unit",
        "noise_multiplier",
        "steps",
    } <= set(out)
    assert (out["accountant"], out["sampling"], out["neighbouring"], out["unit"]) == (
        "pld",
        "poisson",
        "add-remove",
        "user",
    )


def test_epsilon_fixed_replace_one_is_above_the_adaptive_adversary() -> None:
    z, m, n, steps, delta = 2.0, 20, 500, 100, 1e-5
    out = run_json(
        "epsilon",
        "--noise-multiplier",
        str(z),
        "--steps",
        str(steps),
        "--delta",
        str(delta),
        "--sampling",
        "fixed",
        "--population",
        str(n),
        "--cohort",
        str(m),
        "--neighbouring",
        "replace-one",
    )
    # Independent: the optimistic PLD of real datasets (all units +C, one replaced by -C; see
    # backends), a non-adaptive lower bound; the one pair for both directions costs ~5% more here.
    lower = (
        pld_lib.from_gaussian_mechanism(
            standard_deviation=z, sensitivity=2.0, sampling_prob=m / n, pessimistic_estimate=False
        )
        .self_compose(steps)
        .get_epsilon_for_delta(delta)
    )
    assert lower <= out["epsilon"] <= lower * 1.12
    # An adversary that switches direction round by round does not reach the printed figure.
    orientations = fixed_cohort_orientations(
        mechanism="gaussian", noise_multiplier=z, sample_rate=m / n, grid=5e-4
    )
    assert adaptive_delta(orientations, rounds=steps, epsilon=out["epsilon"]) <= delta
    assert out["sample_rate"] == m / n and out["cohort"] == m and out["population"] == n
    # Consistent --sample-rate is accepted.
    again = run_json(
        "epsilon",
        "--noise-multiplier",
        str(z),
        "--steps",
        str(steps),
        "--delta",
        str(delta),
        "--sampling",
        "fixed",
        "--population",
        str(n),
        "--cohort",
        str(m),
        "--neighbouring",
        "replace-one",
        "--sample-rate",
        repr(m / n),
    )
    assert again["epsilon"] == out["epsilon"]


def test_readme_fixed_cohort_example_is_valid_against_an_adaptive_adversary() -> None:
    """The README's command: 5.538 (the direction-by-direction 5.148 is beaten by an adaptive adversary)."""
    out = run_json(
        "epsilon",
        "--noise-multiplier",
        "2",
        "--sampling",
        "fixed",
        "--population",
        "1000",
        "--cohort",
        "100",
        "--steps",
        "50",
        "--delta",
        "1e-5",
        "--neighbouring",
        "replace-one",
        "--accountant",
        "pld",
    )
    assert out["epsilon"] == pytest.approx(5.538, abs=2e-3)
    orientations = fixed_cohort_orientations(
        mechanism="gaussian", noise_multiplier=2.0, sample_rate=0.1, grid=5e-4
    )
    assert adaptive_delta(orientations, rounds=50, epsilon=out["epsilon"]) <= 1e-5
    assert adaptive_delta(orientations, rounds=50, epsilon=5.148) > 1e-5


@pytest.mark.parametrize("neighbouring", ["add-remove", "replace-one"])
def test_epsilon_none_agrees_with_analytic_gaussian(neighbouring: str) -> None:
    z, steps, delta = 4.0, 10, 1e-5
    out = run_json(
        "epsilon",
        "--noise-multiplier",
        str(z),
        "--steps",
        str(steps),
        "--delta",
        str(delta),
        "--sampling",
        "none",
        "--neighbouring",
        neighbouring,
    )
    ref = dpa.pld.PLDAccountant(
        neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE
        if neighbouring == "replace-one"
        else dpa.NeighboringRelation.ADD_OR_REMOVE_ONE
    )
    ref.compose(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z), steps))
    assert out["epsilon"] == pytest.approx(ref.get_epsilon(delta), rel=0.01)
    # Lower bound: a single unsampled release with the same total noise is exact (analytic Gaussian).
    ratio = z / (2.0 if neighbouring == "replace-one" else 1.0) / math.sqrt(steps)
    assert dpa.get_epsilon_gaussian(ratio, delta) <= out["epsilon"] * (1 + 1e-6)


def test_rdp_and_prv_accountants_are_labelled_and_not_below_pld() -> None:
    args = [
        "epsilon",
        "--noise-multiplier",
        "1.0",
        "--sample-rate",
        "0.01",
        "--steps",
        "60",
        "--delta",
        "1e-5",
    ]
    pld = run_json(*args)["epsilon"]
    rdp = run_json(*args, "--accountant", "rdp")
    prv = run_json(*args, "--accountant", "prv")
    assert rdp["accountant"] == "rdp" and prv["accountant"] == "prv"
    assert pld <= rdp["epsilon"] and pld <= prv["epsilon"] * 1.001


def test_noise_round_trip_and_table_output() -> None:
    out = run_json(
        "noise",
        "--target-epsilon",
        "2.0",
        "--delta",
        "1e-5",
        "--sample-rate",
        "0.01",
        "--steps",
        "100",
    )
    z = out["noise_multiplier"]
    back = run_json(
        "epsilon",
        "--noise-multiplier",
        repr(z),
        "--sample-rate",
        "0.01",
        "--steps",
        "100",
        "--delta",
        "1e-5",
    )
    assert 2.0 * (1 - 1e-2) <= back["epsilon"] <= 2.0
    table = runner.invoke(
        app,
        [
            "epsilon",
            "--noise-multiplier",
            repr(z),
            "--sample-rate",
            "0.01",
            "--steps",
            "100",
            "--delta",
            "1e-5",
        ],
    )
    assert table.exit_code == 0 and "epsilon" in table.stdout and "add-remove" in table.stdout


BASE = ["--steps", "10", "--delta", "1e-5"]
BAD = [
    (
        [
            "epsilon",
            "--noise-multiplier",
            "1",
            "--sample-rate",
            "0.1",
            "--steps",
            "10",
            "--delta",
            "0",
        ],
        "--delta",
    ),
    (
        [
            "epsilon",
            "--noise-multiplier",
            "1",
            "--sample-rate",
            "0.1",
            "--steps",
            "10",
            "--delta",
            "1",
        ],
        "--delta",
    ),
    (["epsilon", "--noise-multiplier", "1", "--sample-rate", "0", *BASE], "--sample-rate"),
    (["epsilon", "--noise-multiplier", "1", "--sample-rate", "1.5", *BASE], "--sample-rate"),
    (
        [
            "epsilon",
            "--noise-multiplier",
            "1",
            "--sample-rate",
            "0.1",
            "--steps",
            "0",
            "--delta",
            "1e-5",
        ],
        "--steps",
    ),
    (["epsilon", "--noise-multiplier", "0", "--sample-rate", "0.1", *BASE], "--noise-multiplier"),
    (["epsilon", "--noise-multiplier", "-1", "--sample-rate", "0.1", *BASE], "--noise-multiplier"),
    (["epsilon", "--noise-multiplier", "1", *BASE], "--sample-rate"),
    (
        [
            "epsilon",
            "--noise-multiplier",
            "1",
            "--sampling",
            "fixed",
            "--population",
            "10",
            "--cohort",
            "20",
            "--neighbouring",
            "replace-one",
            *BASE,
        ],
        "--cohort",
    ),
    (
        [
            "epsilon",
            "--noise-multiplier",
            "1",
            "--sampling",
            "fixed",
            "--population",
            "100",
            "--cohort",
            "10",
            *BASE,
        ],
        "--neighbouring",
    ),
    (
        [
            "epsilon",
            "--noise-multiplier",
            "1",
            "--sampling",
            "fixed",
            "--population",
            "100",
            "--cohort",
            "10",
            "--neighbouring",
            "replace-one",
            "--sample-rate",
            "0.2",
            *BASE,
        ],
        "--sample-rate",
    ),
    (
        [
            "epsilon",
            "--noise-multiplier",
            "1",
            "--sampling",
            "fixed",
            "--population",
            "100",
            "--cohort",
            "10",
            "--neighbouring",
            "replace-one",
            "--accountant",
            "prv",
            *BASE,
        ],
        "--accountant",
    ),
    (
        [
            "epsilon",
            "--noise-multiplier",
            "1",
            "--sample-rate",
            "0.1",
            "--neighbouring",
            "replace-one",
            "--accountant",
            "rdp",
            *BASE,
        ],
        "--accountant",
    ),
    (["noise", "--target-epsilon", "0", "--sample-rate", "0.1", *BASE], "--target-epsilon"),
]


@pytest.mark.parametrize(("argv", "name"), BAD)
def test_bad_input_exits_2_with_one_line(argv: list[str], name: str) -> None:
    result = runner.invoke(app, argv)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and name in lines[0], result.stderr


def test_unparsable_value_is_one_line_via_main(capsys) -> None:
    code = main(["epsilon", "--noise-multiplier", "abc", "--sample-rate", "0.1", *BASE])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--noise-multiplier" in err[0]


def test_subprocess_entry_point() -> None:
    script = Path(sys.executable).parent / "fedprivacy"
    cmd = (
        [str(script)]
        if script.exists()
        else [sys.executable, "-c", "import sys; from fedprivacy.cli import main; sys.exit(main())"]
    )
    bad = subprocess.run(
        [
            *cmd,
            "epsilon",
            "--noise-multiplier",
            "1",
            "--sample-rate",
            "0.1",
            "--steps",
            "10",
            "--delta",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "--delta" in bad.stderr
    good = subprocess.run(
        [
            *cmd,
            "epsilon",
            "--noise-multiplier",
            "2",
            "--sample-rate",
            "0.1",
            "--steps",
            "10",
            "--delta",
            "1e-5",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert good.returncode == 0 and json.loads(good.stdout)["epsilon"] > 0
