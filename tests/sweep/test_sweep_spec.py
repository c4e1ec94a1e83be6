"""The sweep file: expansion into runs, the config hash, and one-line refusals naming the key."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedprivacy.config import ConfigError
from fedprivacy.sweep.spec import config_hash, load_sweep, parse_sweep, sweep_from_options

REPO = Path(__file__).resolve().parents[2]

DOC = """
[sweep]
name = "t"
num-supernodes = 6
seeds = [0, 1, 2]

[base]
dataset = "digits"
num-server-rounds = 2

[[grid]]
privacy = "none"

[[grid]]
privacy = ["central", "local"]
target-epsilon = [1.0, 4.0]
"""


def test_grid_tables_are_a_union_of_products_crossed_with_seeds() -> None:
    plans = parse_sweep(tomllib.loads(DOC)).plans()

    assert len(plans) == (1 + 2 * 2) * 3
    central = [p for p in plans if p.overrides["privacy"] == "central"]
    assert {(p.overrides["target-epsilon"], p.seed) for p in central} == {
        (e, s) for e in (1.0, 4.0) for s in (0, 1, 2)}
    assert all(p.overrides["dataset"] == "digits" and p.overrides["seed"] == p.seed for p in plans)
    assert plans[0].name == "privacy=none,seed=0"
    assert len({p.name for p in plans}) == len(plans)


def test_command_line_axes_seeds_and_sets_change_every_table() -> None:
    spec = sweep_from_options(parse_sweep(tomllib.loads(DOC)), sets=["num-server-rounds=5"],
                              grid=["clip-norm=0.5,1.0"], seeds="7")

    plans = spec.plans()

    assert len(plans) == (1 + 4) * 2
    assert {p.overrides["clip-norm"] for p in plans} == {0.5, 1.0}
    assert {p.seed for p in plans} == {7}
    assert {p.overrides["num-server-rounds"] for p in plans} == {5}


def test_the_hash_ignores_where_a_run_writes_and_sees_what_it_computes() -> None:
    fused = {"privacy": "central", "seed": 0, "output-dir": "a", "run-name": "x", "resume": False}

    same = config_hash({**fused, "output-dir": "b", "run-name": "y"}, num_supernodes=5)
    assert config_hash(fused, num_supernodes=5) == same
    assert config_hash({**fused, "seed": 1}, num_supernodes=5) != same
    assert config_hash(fused, num_supernodes=6) != same


@pytest.mark.parametrize(("doc", "key"), [
    ('[sweep]\nseedz = [0]', "sweep.seedz"),
    ('[sweeps]\nname = "x"', "'sweeps'"),
    ("[sweep]\nseeds = [0, 0]", "sweep.seeds"),
    ('[sweep]\nseeds = "0"', "sweep.seeds"),
    ("[sweep]\nnum-supernodes = 0", "sweep.num-supernodes"),
    ("[base]\nseed = 3", "base.seed"),
    ('[grid]\noutput-dir = ["a", "b"]', "grid.output-dir"),
    ("[grid]\nclip-norm = []", "grid.clip-norm"),
    ("[base]\nclip-norm = [1.0, 2.0]", "base"),
])
def test_a_bad_sweep_file_is_refused_naming_the_key(doc: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        parse_sweep(tomllib.loads(doc))


def _cli(args: list[str]) -> tuple[int, str]:
    from server.engine.cli import app

    res = CliRunner().invoke(app, args)
    return res.exit_code, res.output


@pytest.mark.parametrize(("body", "needle"), [
    ("[base]\nclip-normm = 1.0\n", "clip-normm"),
    ('[grid]\nprivacy = ["central", "nonsense"]\n', "privacy"),
    ("[sweep]\njobz = 2\n", "sweep.jobz"),
    ("[sweep\n", "not valid TOML"),
])
def test_the_command_refuses_a_bad_run_in_one_line_before_anything_starts(
        tmp_path: Path, body: str, needle: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text('[sweep]\nnum-supernodes = 5\n' + body if not body.startswith("[sweep") else body)
    out = tmp_path / "out"

    code, text = _cli(["sweep", str(path), "--out", str(out), "--app-dir", str(REPO)])

    assert code == 2, text
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], text
    assert not out.exists()


def test_dry_run_lists_every_run_with_its_hash(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(DOC.replace('"local"', '"central"').replace('["central", "central"]', '"central"')
                    .replace("[1.0, 4.0]", "[4.0, 8.0]").replace('dataset = "digits"',
                                                                 'dataset = "digits"\nsecagg = false'))

    code, text = _cli(["sweep", str(path), "--dry-run", "--out", str(tmp_path / "o"), "--app-dir", str(REPO)])

    assert code == 0, text
    lines = text.strip().splitlines()
    assert len(lines) == 9 and all(len(ln.split()[0]) == 16 for ln in lines)


def test_load_sweep_names_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_sweep(tmp_path / "none.toml")
