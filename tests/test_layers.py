"""Layering: the library must stay free of Flower (STYLE.md, convention 1)."""

import subprocess
import sys


def test_importing_fedprivacy_never_loads_flwr() -> None:
    code = (
        "import sys, importlib, pkgutil, fedprivacy\n"
        "for m in pkgutil.walk_packages(fedprivacy.__path__, 'fedprivacy.'):\n"
        "    if m.name.startswith('fedprivacy.cli'):\n"
        "        continue\n"
        "    importlib.import_module(m.name)\n"
        "print('flwr' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"
