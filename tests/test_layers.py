"""Layering: the library stays free of Flower, its registries do not depend on import order (one fresh
interpreter serves both checks), and the layers contract names every module of ``fedprivacy.fl``."""

import json
import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import fedprivacy.fl

_CODE = (
    "import json, sys, importlib, pkgutil\n"
    "import fedprivacy.fl.modes as modes\n"  # first, before anything else of fedprivacy.fl
    "first = list(modes.MODES)\n"
    "import fedprivacy\n"
    "for m in pkgutil.walk_packages(fedprivacy.__path__, 'fedprivacy.'):\n"
    "    importlib.import_module(m.name)\n"
    "print(json.dumps({'flwr': 'flwr' in sys.modules, 'modes': first}))\n"
)


@pytest.fixture(scope="module")
def fresh_import() -> dict:
    out = subprocess.run([sys.executable, "-c", _CODE], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_fedprivacy_never_loads_flwr(fresh_import: dict) -> None:
    assert fresh_import["flwr"] is False  # every library module, fedprivacy.cli included


def test_every_privacy_mode_is_registered_before_any_other_import(fresh_import: dict) -> None:
    # the distributed plan must not depend on fedprivacy.fl.secure having been imported
    assert fresh_import["modes"] == ["none", "central", "local", "distributed", "dpftrl"]


def test_the_fl_layers_contract_names_every_fl_module() -> None:
    # Arrange: the contract's layers, each a "|"-separated list of independent modules
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    (contract,) = [c for c in pyproject["tool"]["importlinter"]["contracts"] if c["name"].startswith("fl layers")]
    named = {m.strip() for layer in contract["layers"] for m in layer.split("|")}
    # Act
    present = {f"fedprivacy.fl.{m.name}" for m in pkgutil.iter_modules(fedprivacy.fl.__path__)}
    # Assert: an unnamed module would be free to import upwards
    assert present - named == set(), "name these fl modules in pyproject's fl layers contract"
    assert named - present == set()
