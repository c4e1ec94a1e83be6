"""fedprivacy's in-process engine for Flower apps, and launchers for Flower's own engines.

* :mod:`.grid`: :class:`InProcessGrid`, a ``flwr.serverapp.Grid`` that hands Messages straight to the
  ClientApp (inline or in a forked pool, :mod:`.pool`), with deterministic faults (:mod:`.faults`);
* :mod:`.run`: :func:`run_inprocess`, the app in ``app_dir`` on that grid;
* :mod:`.flower`: :func:`run_flower_simulation` (Ray, in this process) and :func:`run_flwr`
  (``flwr run`` with a private ``FLWR_HOME``, stopping only what it started);
* :mod:`.appspec`: the app's ``pyproject.toml`` and run-config overrides, as ``flwr run`` reads them;
* :mod:`.cli`: ``fedprivacy simulate``;
* :mod:`._flwr_private`: every private Flower API the engine needs, in one shim.

See docs/ENGINE.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from server.engine.appspec import AppSpec, load_app_spec, parse_overrides, resolve_run_config
    from server.engine.faults import FaultPlan, FaultRule
    from server.engine.flower import FlwrRunResult, run_flower_simulation, run_flwr
    from server.engine.grid import EngineStats, InProcessGrid
    from server.engine.run import InProcessResult, run_inprocess

# Lazy (PEP 562): ``server.engine.cli`` (the ``fedprivacy`` command) must import without Flower.
_EXPORTS = {
    "AppSpec": "appspec", "load_app_spec": "appspec", "parse_overrides": "appspec",
    "resolve_run_config": "appspec", "FaultPlan": "faults", "FaultRule": "faults",
    "FlwrRunResult": "flower", "run_flower_simulation": "flower", "run_flwr": "flower",
    "EngineStats": "grid", "InProcessGrid": "grid", "InProcessResult": "run", "run_inprocess": "run",
}
__all__ = [
    "AppSpec", "EngineStats", "FaultPlan", "FaultRule", "FlwrRunResult", "InProcessGrid", "InProcessResult",
    "load_app_spec", "parse_overrides", "resolve_run_config", "run_flower_simulation", "run_flwr",
    "run_inprocess",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'server.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(f"server.engine.{module}"), name)
