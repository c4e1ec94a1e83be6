"""The "How to add ..." examples of docs/DESIGN.md run as written (optimizer, local objective,
mechanism, data set, attack; each is the whole change: one file, or for the new distribution's three parts one file too)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DESIGN = Path(__file__).resolve().parents[1] / "docs" / "DESIGN.md"
_BLOCK = re.compile(r"<!-- example: (?P<name>[a-z-]+) -->\s*```python[^\n]*\n(?P<code>.*?)```", re.S)


def _examples() -> dict[str, str]:
    return {m["name"]: m["code"] for m in _BLOCK.finditer(DESIGN.read_text(encoding="utf-8"))}


def test_design_has_the_six_worked_examples() -> None:
    assert set(_examples()) == {"optimizer", "local-objective", "mechanism", "client-mechanism", "dataset", "attack"}


@pytest.fixture()
def fresh_registries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registrations made by an example stay inside the test."""
    from fedprivacy.accounting import events
    from fedprivacy.attacks import gradient_leakage
    from fedprivacy.fl import mechanisms, modes, server_opt
    from fedprivacy.ml import data

    data.dataset_names()  # the built-in data sets are loaded before the registry is copied
    monkeypatch.setattr(modes, "MODES", dict(modes.MODES))
    monkeypatch.setattr(mechanisms, "CLIENT_MECHANISMS", dict(mechanisms.CLIENT_MECHANISMS))
    monkeypatch.setattr(events, "_MECHANISMS", dict(events._MECHANISMS))
    monkeypatch.setattr(server_opt, "SERVER_OPTIMIZERS", dict(server_opt.SERVER_OPTIMIZERS))
    monkeypatch.setattr(data, "_REGISTRY", dict(data._REGISTRY))
    monkeypatch.setattr(gradient_leakage, "ATTACKS", dict(gradient_leakage.ATTACKS))


@pytest.mark.parametrize("name", ["optimizer", "local-objective", "mechanism", "client-mechanism", "dataset",
                                  "attack"])
def test_the_example_runs(name: str, fresh_registries: None, tmp_path: Path,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code = _examples()[name]
    # dont_inherit: the example runs as its own module would, without this file's __future__ flags
    exec(compile(code, f"DESIGN.md:example:{name}", "exec", dont_inherit=True),
         {"__name__": f"design_example_{name}"})
