"""Layering: the library stays free of Flower (STYLE.md, convention 1), and its registries do not depend
on import order (review D1). One fresh interpreter serves both checks."""

import json
import subprocess
import sys

import pytest

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
    # D1: the distributed plan used to exist only after fedprivacy.fl.secure had been imported
    assert fresh_import["modes"] == ["none", "central", "local", "distributed"]
