"""Flower's Ray simulation on a Ray cluster that is already running (``--ray-address``).

Flower 1.42's Simulation Engine calls ``ray.init(**init_args)`` in the ``flwr-simulation`` process
(``flwr/server/superlink/fleet/vce/backend/raybackend.py``), and the federation config of ``flwr run``
carries only ``num_cpus``, ``num_gpus``, ``logging_level`` and ``log_to_driver`` as init args
(``flwr/simulation/app.py``): no address. ``ray.init`` with no address reads ``RAY_ADDRESS``
(``ray/_private/worker.py``), so the launcher passes the cluster in that variable:

* with an address (``auto`` or ``HOST:PORT``, the GCS address ``ray start --head`` prints), the run's
  driver joins that cluster and leaves it running: nothing here starts or stops a cluster;
* without one, ``RAY_ADDRESS=local``: the run starts its own Ray instance, as before, and never
  attaches to a cluster that happens to run on the machine (``ray.init()`` alone would).

A cluster's actors are started by its own raylets, with the environment of ``ray start``, not the
driver's. The clients' floor (``FEDPRIVACY_CLIENT_POLICY``) and the other ``FEDPRIVACY_*`` variables
the ClientApp reads therefore travel in the job's runtime environment, through the variable Ray's job
submission uses for the same purpose (``RAY_JOB_CONFIG_JSON_ENV_VAR``, merged with what is there).
Every node must hold the app and its dependencies at the same paths as the driver (docs/ENGINE.md).
This module imports neither ``ray`` nor ``flwr``.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Mapping

__all__ = ["AUTO", "JOB_CONFIG_ENV", "check_ray_address", "check_reachable", "ray_env"]

#: join the cluster ``ray start`` last started or joined on this machine
AUTO = "auto"
#: Ray's own variable for a job's config (``ray._private.runtime_env.constants``)
JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
#: FEDPRIVACY_* variables that stay with the driver (the ServerApp's status file)
_DRIVER_ONLY = frozenset({"FEDPRIVACY_STATUS_FILE"})
_PORT = re.compile(r"^[0-9]{1,5}$")
_HOST = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?)$")


def check_ray_address(address: str) -> str:
    """The address a run's Ray driver joins: ``auto`` or ``HOST:PORT`` (port 1-65535).

    Raises:
        ValueError: anything else, e.g. a Ray Client address (``ray://...``), which Flower's backend
            does not use, or ``local`` (leave the option out for a private Ray instance).
    """
    if not isinstance(address, str):
        raise TypeError(f"ray_address must be a str, got {type(address).__name__}")
    text = address.strip()
    if text == AUTO:
        return text
    if "://" in text:
        raise ValueError(f"must be 'auto' or HOST:PORT of the cluster's head (the address `ray start "
                         f"--head` prints), not a URL, got {address!r}")
    host, sep, port = text.rpartition(":")
    if not sep or not _HOST.match(host) or not _PORT.match(port) or not 1 <= int(port) <= 65535:
        raise ValueError(f"must be 'auto' or HOST:PORT with a port in 1..65535, got {address!r}")
    return text


def check_reachable(address: str, *, timeout: float = 5.0) -> None:
    """Raise ValueError when nothing accepts a TCP connection at ``HOST:PORT`` (``auto`` is left to
    Ray), so a wrong address is refused at once instead of after ``ray.init``'s connection retries."""
    text = check_ray_address(address)
    if text == AUTO:
        return
    host, _, port = text.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as exc:
        raise ValueError(f"no Ray cluster answers at {text} ({exc.strerror or exc}); start its head with "
                         f"`ray start --head --port={port}` or give the address it printed") from None


def ray_env(address: str | None, environ: Mapping[str, str]) -> dict[str, str]:
    """Environment entries for the simulation's Ray driver: join ``address``, or start a private
    instance when it is None (``RAY_ADDRESS=local``).

    With an address, the ``FEDPRIVACY_*`` entries of ``environ`` (but the driver's status file) are
    added to the job's runtime environment, so the cluster's actors see the clients' floor the run
    asks for; an existing job config in ``environ`` is kept and its variables of the same name win.
    """
    if address is None:
        return {"RAY_ADDRESS": "local"}
    forwarded = {k: v for k, v in environ.items() if k.startswith("FEDPRIVACY_") and k not in _DRIVER_ONLY}
    job = json.loads(environ.get(JOB_CONFIG_ENV) or "{}")
    runtime_env = job.setdefault("runtime_env", {}) or {}
    job["runtime_env"] = runtime_env
    runtime_env["env_vars"] = {**forwarded, **(runtime_env.get("env_vars") or {})}
    return {"RAY_ADDRESS": check_ray_address(address), JOB_CONFIG_ENV: json.dumps(job, sort_keys=True)}
