"""Every private or internal Flower API the in-process engine uses, in one place.

The engine reproduces what Flower's own in-memory simulation gives a ServerApp (message ids, TTL and
validation errors, Flower's error replies, the process-wide ``TaskIdentity``), which public Flower API
does not expose. Everything here is pinned to ``flwr==1.42.0`` (pyproject); ``tests/engine/
test_grid_contract.py`` is the tripwire for a Flower upgrade: when it fails after an upgrade, this is
the one module to mend. Public Flower API (``flwr.app``, ``flwr.clientapp.ClientApp``,
``flwr.serverapp.Grid``/``ServerApp``) is imported directly where it is used, not from here.
"""

from __future__ import annotations

from typing import Any

from flwr.app.error import Error
from flwr.clientapp.client_app import ClientAppException, LoadClientAppError
from flwr.common.config import (
    flatten_dict,
    fuse_dicts,
    get_metadata_from_config,
    get_project_config,
    parse_config_args,
)
from flwr.common.constant import NUM_PARTITIONS_KEY, PARTITION_ID_KEY, SUPERLINK_NODE_ID, ErrorCode
from flwr.common.logger import log
from flwr.proto.node_pb2 import NodeInfo  # pylint: disable=E0611
from flwr.server.utils.validator import validate_message
from flwr.serverapp.server_app import LoadServerAppError
from flwr.supercore.date import now
from flwr.supercore.object_ref import load_app
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

__all__ = [
    "NUM_PARTITIONS_KEY",
    "PARTITION_ID_KEY",
    "SUPERLINK_NODE_ID",
    "ClientAppException",
    "Error",
    "ErrorCode",
    "LoadClientAppError",
    "LoadServerAppError",
    "NodeInfo",
    "Run",
    "TaskIdentityScope",
    "create_message_error_unavailable_ins_message",
    "create_message_error_unavailable_res_message",
    "flatten_dict",
    "fuse_dicts",
    "get_metadata_from_config",
    "get_project_config",
    "load_app",
    "log",
    "now",
    "parse_config_args",
    "run_simulation_as_flwr_run",
    "set_message_id",
    "validate_message",
]


def create_message_error_unavailable_ins_message(*args: Any, **kwargs: Any) -> Any:
    """Flower's reply for an instruction that could not be delivered (``linkstate.utils``).

    Imported when first needed: the ``linkstate`` package pulls in SQLAlchemy and the SuperLink's
    state machinery, ~0.9 s of CPU before round 1 that a run without lost messages never uses.
    """
    from flwr.server.superlink.linkstate.utils import (
        create_message_error_unavailable_ins_message as f,
    )

    return f(*args, **kwargs)


def create_message_error_unavailable_res_message(*args: Any, **kwargs: Any) -> Any:
    """Flower's error reply for a reply that never came (see the function above)."""
    from flwr.server.superlink.linkstate.utils import (
        create_message_error_unavailable_res_message as f,
    )

    return f(*args, **kwargs)


def set_message_id(message: Any, message_id: str) -> None:
    """Give a Message the id the SuperLink would (Flower's ``Metadata.message_id`` has no setter)."""
    message.metadata.__dict__["_message_id"] = message_id


class TaskIdentityScope:
    """Set Flower's process-wide TaskIdentity (used by ``Message(...)``) for one run, then restore it."""

    def __init__(self, run_id: int) -> None:
        self._run_id = run_id
        self._saved: tuple[Any, Any, Any] | None = None

    def __enter__(self) -> None:
        ti: Any = TaskIdentity
        self._saved = (ti._task_id, ti._run_id, ti._node_id)  # noqa: SLF001
        TaskIdentity.task_id = 1
        TaskIdentity.run_id = self._run_id
        TaskIdentity.node_id = SUPERLINK_NODE_ID

    def __exit__(self, *exc: object) -> None:
        ti: Any = TaskIdentity
        if self._saved is not None:
            ti._task_id, ti._run_id, ti._node_id = self._saved  # noqa: SLF001


def run_simulation_as_flwr_run(**kwargs: Any) -> Any:
    """``flwr.simulation.run_simulation._run_simulation`` as ``flwr run`` calls it (``is_app=True``),
    with the no-op federation and telemetry event Flower's own simulation process uses."""
    from flwr.simulation.run_simulation import _run_simulation
    from flwr.supercore.constant import NOOP_FEDERATION_ID
    from flwr.supercore.telemetry import EventType

    run = kwargs["run"]
    run.federation_id = NOOP_FEDERATION_ID
    return _run_simulation(is_app=True, exit_event=EventType.PYTHON_API_RUN_SIMULATION_LEAVE, **kwargs)
