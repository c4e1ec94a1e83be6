"""The ``fedprivacy`` command: privacy accounting from the shell.

``fedprivacy epsilon`` prints the epsilon of T Gaussian releases (noise multiplier z = std / C) with a
given sampling, at delta; ``fedprivacy noise`` prints the smallest noise multiplier that meets a target
epsilon. Both state the neighbouring relation, the unit of privacy and the accountant, and print
either a table or, with ``--json``, one JSON object. Invalid input exits with code 2 and one line that
names the parameter and the rule. The default accountant is PLD (the tightest valid bound); the
Gaussian-DP/CLT approximation is never offered.

This module is library code: it never imports ``flwr``, ``server`` or ``clients``. The installed
``fedprivacy`` command is :func:`server.engine.cli.main`, which adds ``fedprivacy simulate`` (the
Flower engines) to these commands.
"""

from __future__ import annotations

import json
import logging
import math
from enum import StrEnum
from typing import Annotated, Any, NoReturn

import click
import typer

from fedprivacy.accounting import (
    Accountant,
    FixedCohortSampling,
    GaussianEvent,
    Neighbouring,
    NoSampling,
    PoissonSampling,
    PrivacyEvent,
    calibrate_noise_multiplier,
)
from fedprivacy.accounting.events import Sampling

__all__ = ["app", "main", "new_app"]


def new_app(*, help: str) -> typer.Typer:  # noqa: A002 - Typer's own parameter name
    """A ``fedprivacy`` Typer app with the accounting commands' settings (plain errors, no completion)."""
    return typer.Typer(name="fedprivacy", help=help, add_completion=False, no_args_is_help=True,
                       pretty_exceptions_enable=False, rich_markup_mode="rich")


app = new_app(help="fedprivacy: federated learning with differential privacy. Privacy accounting commands.")


class SamplingName(StrEnum):
    poisson = "poisson"
    fixed = "fixed"
    none = "none"


class NeighbouringName(StrEnum):
    add_remove = "add-remove"
    replace_one = "replace-one"


class UnitName(StrEnum):
    user = "user"
    example = "example"


class AccountantName(StrEnum):
    pld = "pld"
    rdp = "rdp"
    prv = "prv"


def usage_error(message: str) -> NoReturn:
    """One line on stderr, exit code 2."""
    typer.echo(f"fedprivacy: error: {message}", err=True)
    raise typer.Exit(code=2)


def _check_delta(delta: float) -> float:
    if not (math.isfinite(delta) and 0.0 < delta < 1.0):
        usage_error(f"--delta must be in (0, 1), got {delta:g}")
    return delta


def _check_steps(steps: int) -> int:
    if steps < 1:
        usage_error(f"--steps must be >= 1, got {steps}")
    return steps


def _resolve_sampling(
    sampling: SamplingName,
    sample_rate: float | None,
    population: int | None,
    cohort: int | None,
    neighbouring: Neighbouring,
) -> Sampling:
    """The sampling the user described, or exit 2 naming the inconsistent parameter."""
    if sampling is SamplingName.fixed:
        if population is None or cohort is None:
            usage_error("--sampling fixed needs --population N and --cohort M")
        if population < 1:
            usage_error(f"--population must be >= 1, got {population}")
        if cohort < 1:
            usage_error(f"--cohort must be >= 1, got {cohort}")
        if cohort > population:
            usage_error(
                f"--cohort must be <= --population, got cohort={cohort} > population={population}"
            )
        if neighbouring is not Neighbouring.REPLACE_ONE:
            usage_error(
                "--sampling fixed requires --neighbouring replace-one (a fixed cohort drawn "
                "without replacement is only analysed under replace-one; never as Poisson)"
            )
        rate = cohort / population
        if sample_rate is not None and not math.isclose(sample_rate, rate, rel_tol=1e-9):
            usage_error(
                f"--sample-rate must equal --cohort/--population = {rate:.12g} for --sampling fixed, "
                f"got {sample_rate:g} (or leave it out)"
            )
        return FixedCohortSampling(cohort=cohort, population=population)
    if population is not None or cohort is not None:
        usage_error("--population/--cohort apply only to --sampling fixed")
    if sampling is SamplingName.none:
        if sample_rate is not None and sample_rate != 1.0:
            usage_error(f"--sample-rate must be 1 (or left out) for --sampling none, got {sample_rate:g}")
        return NoSampling()
    if sample_rate is None:
        usage_error("--sample-rate is required for --sampling poisson")
    if not (math.isfinite(sample_rate) and 0.0 < sample_rate <= 1.0):
        usage_error(f"--sample-rate must be in (0, 1], got {sample_rate:g}")
    return PoissonSampling(rate=sample_rate)


def _check_combination(
    accountant: str, neighbouring: Neighbouring, sampling: Sampling, steps: int
) -> None:
    acc = Accountant(backend=accountant, neighbouring=neighbouring)
    event = PrivacyEvent(
        mechanism=GaussianEvent(noise_multiplier=1.0), sampling=sampling, count=steps
    )
    reason = acc.unsupported_reason(event)
    if reason is not None:
        usage_error(
            f"unsupported combination --accountant {accountant} --sampling {sampling.kind} "
            f"--neighbouring {neighbouring.value}: {reason}"
        )


def _sampling_fields(sampling: Sampling) -> dict[str, Any]:
    out: dict[str, Any] = {"sampling": sampling.kind, "sample_rate": sampling.rate}
    if isinstance(sampling, FixedCohortSampling):
        out.update(population=sampling.population, cohort=sampling.cohort)
    return out


def _emit(result: dict[str, Any], *, as_json: bool, title: str) -> None:
    if as_json:
        typer.echo(json.dumps(result, allow_nan=False))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_header=True)
    table.add_column("quantity")
    table.add_column("value")
    for key, value in result.items():
        shown = f"{value:.6g}" if isinstance(value, float) else str(value)
        table.add_row(key.replace("_", " "), shown)
    Console().print(table)


# Shared options.
SampleRateOpt = Annotated[
    float | None,
    typer.Option(
        "--sample-rate", help="Poisson sampling rate q in (0, 1]; derived as M/N for fixed."
    ),
]
StepsOpt = Annotated[
    int, typer.Option("--steps", help="Number of releases (rounds / steps) T >= 1.")
]
DeltaOpt = Annotated[float, typer.Option("--delta", help="Target delta in (0, 1).")]
AccountantOpt = Annotated[
    AccountantName,
    typer.Option("--accountant", help="pld (default, tightest), rdp, or prv (cross-check)."),
]
SamplingOpt = Annotated[SamplingName, typer.Option("--sampling", help="poisson, fixed or none.")]
PopulationOpt = Annotated[
    int | None, typer.Option("--population", help="Population size N (fixed cohorts).")
]
CohortOpt = Annotated[int | None, typer.Option("--cohort", help="Cohort size M (fixed cohorts).")]
NeighbouringOpt = Annotated[
    NeighbouringName,
    typer.Option("--neighbouring", help="add-remove or replace-one (sensitivity 2C)."),
]
UnitOpt = Annotated[
    UnitName, typer.Option("--unit", help="Unit of privacy: user (DP-FedAvg) or example (DP-SGD).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")]


def _resolve_release(
    steps: int,
    sampling: SamplingName,
    sample_rate: float | None,
    population: int | None,
    cohort: int | None,
    neighbouring: NeighbouringName,
    accountant: AccountantName,
) -> tuple[Neighbouring, Sampling]:
    """The options shared by ``epsilon`` and ``noise``, validated (exit 2 on bad input)."""
    _check_steps(steps)
    nb = Neighbouring(neighbouring.value)
    samp = _resolve_sampling(sampling, sample_rate, population, cohort, nb)
    _check_combination(accountant.value, nb, samp, steps)
    return nb, samp


@app.command()
def epsilon(
    noise_multiplier: Annotated[
        float,
        typer.Option("--noise-multiplier", help="Noise std divided by the clip norm C (> 0)."),
    ],
    steps: StepsOpt,
    delta: DeltaOpt,
    sample_rate: SampleRateOpt = None,
    accountant: AccountantOpt = AccountantName.pld,
    sampling: SamplingOpt = SamplingName.poisson,
    population: PopulationOpt = None,
    cohort: CohortOpt = None,
    neighbouring: NeighbouringOpt = NeighbouringName.add_remove,
    unit: UnitOpt = UnitName.user,
    as_json: JsonOpt = False,
) -> None:
    """Print the epsilon (an upper bound) of STEPS Gaussian releases at DELTA."""
    _check_delta(delta)
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        usage_error(f"--noise-multiplier must be > 0, got {noise_multiplier:g}")
    nb, samp = _resolve_release(steps, sampling, sample_rate, population, cohort, neighbouring,
                                accountant)
    acc = Accountant(backend=accountant.value, neighbouring=nb, unit=unit.value)
    acc.spend(
        PrivacyEvent(
            mechanism=GaussianEvent(noise_multiplier=noise_multiplier), sampling=samp, count=steps
        )
    )
    eps = acc.epsilon(delta=delta)
    result = {
        "epsilon": eps,
        "delta": delta,
        "noise_multiplier": noise_multiplier,
        "steps": steps,
        **_sampling_fields(samp),
        "neighbouring": nb.value,
        "unit": unit.value,
        "accountant": accountant.value,
        "bound": "upper",
    }
    _emit(result, as_json=as_json, title="fedprivacy epsilon")


@app.command()
def noise(
    target_epsilon: Annotated[
        float, typer.Option("--target-epsilon", help="Epsilon to meet at --delta (> 0).")
    ],
    steps: StepsOpt,
    delta: DeltaOpt,
    sample_rate: SampleRateOpt = None,
    accountant: AccountantOpt = AccountantName.pld,
    sampling: SamplingOpt = SamplingName.poisson,
    population: PopulationOpt = None,
    cohort: CohortOpt = None,
    neighbouring: NeighbouringOpt = NeighbouringName.add_remove,
    unit: UnitOpt = UnitName.user,
    as_json: JsonOpt = False,
) -> None:
    """Print the smallest noise multiplier (relative tolerance 1e-3) whose epsilon <= TARGET."""
    _check_delta(delta)
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        usage_error(f"--target-epsilon must be > 0, got {target_epsilon:g}")
    nb, samp = _resolve_release(steps, sampling, sample_rate, population, cohort, neighbouring,
                                accountant)
    try:
        z = calibrate_noise_multiplier(
            target_epsilon=target_epsilon,
            target_delta=delta,
            sampling=samp,
            steps=steps,
            backend=accountant.value,
            neighbouring=nb,
        )
    except ValueError as exc:
        usage_error(f"--target-epsilon: {exc}")
    acc = Accountant(backend=accountant.value, neighbouring=nb, unit=unit.value)
    acc.spend(PrivacyEvent(mechanism=GaussianEvent(noise_multiplier=z), sampling=samp, count=steps))
    result = {
        "noise_multiplier": z,
        "epsilon": acc.epsilon(delta=delta),
        "target_epsilon": target_epsilon,
        "delta": delta,
        "steps": steps,
        **_sampling_fields(samp),
        "neighbouring": nb.value,
        "unit": unit.value,
        "accountant": accountant.value,
        "bound": "upper",
    }
    _emit(result, as_json=as_json, title="fedprivacy noise")


def main(argv: list[str] | None = None, *, command: typer.Typer | None = None) -> int:
    """Run the accounting commands (or ``command``, an app extending them); returns the exit code
    (usage errors: 2, one line)."""
    # dp-accounting's RDP code warns (via absl) for every Renyi order it drops when a series does not
    # converge; dropping an order only loosens the bound, so it is noise for a command-line user.
    logging.getLogger("absl").setLevel(logging.ERROR)
    try:
        rv = (command or app)(args=argv, prog_name="fedprivacy", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        typer.echo(exc.ctx.get_help() if exc.ctx is not None else str(exc))
        return 0
    except click.ClickException as exc:
        typer.echo(f"fedprivacy: error: {exc.format_message()}", err=True)
        return exc.exit_code
    except click.exceptions.Abort:
        return 1
    return rv if isinstance(rv, int) else 0
