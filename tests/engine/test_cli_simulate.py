"""`fedprivacy simulate`: the engine switch from the shell."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedprivacy.fl.run import read_participation
from server.engine.cli import main

REPO_DIR = Path(__file__).resolve().parents[2]


def test_importing_the_cli_does_not_load_flwr() -> None:
    code = "import sys, fedprivacy.cli, server.engine.cli; print('flwr' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_simulate_inprocess_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = (
        f'num-server-rounds=1 privacy="central" secagg=false noise-multiplier=1.0 sample-rate=1.0 '
        f'local-epochs=1 seed=3 output-dir="{tmp_path}" run-name="cli"'
    )
    code = main(
        [
            "simulate",
            "--engine", "inprocess",
            "--num-supernodes", "3",
            "--run-config", cfg,
            "--faults", "raise:type=train,partitions=2",
            "--app-dir", str(REPO_DIR),
            "--json",
        ]
    )  # fmt: skip

    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0
    assert out["engine"] == "inprocess" and out["num_supernodes"] == 3
    assert out["rounds"] == 1
    # the engine's message/error counts sum the cohorts: private like the rows
    assert not {"messages", "replies", "errors", "dropped"} & set(out)
    assert out["results_path"] == str(tmp_path / "cli" / "results.json")
    rows = read_participation(Path(out["results_path"]).parent)  # central: counts kept private
    assert rows[0]["clients_aggregated"] == 2  # the client that raised is left out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--num-supernodes", "0"], "--num-supernodes must be >= 1"),
        (["--workers", "0"], "--workers must be >= 1"),
        (["--run-config", "no-such-key=1"], "no-such-key"),
        (["--faults", "explode:partitions=1"], "--faults"),
        (["--engine", "flower", "--workers", "2"], "apply only to --engine inprocess"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["simulate", "--app-dir", str(REPO_DIR), *args])

    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and needle in err[0]
