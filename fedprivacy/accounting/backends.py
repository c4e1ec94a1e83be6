"""Accounting backends, looked up by name in a registry: "pld" (default), "rdp", "prv".

A backend turns a *run* (one mechanism + sampling, self-composed ``count`` times) into a composable
state, composes states, and reads epsilon at a target delta. Backends never mutate anything: the
``Accountant`` owns the ledger and caches states. Every backend first answers ``unsupported_reason``;
an event it cannot bound is refused with that reason, never accounted with a weaker or approximate
bound. The Gaussian-DP / CLT approximation is not a backend.

The backends: ``pld_backend`` (default), ``rdp_backend``, ``prv_backend``, on the interface of
``backend_base``, which states the adaptive-composition rule each is checked against.

* A mechanism registered with ``fedprivacy.accounting.events.register_mechanism`` (not one of the
  four built-ins) carries its own conversion: ``rdp`` uses its ``rdp(orders, ...)`` curve (composed
  additively, counts applied here), ``pld`` its ``pld(...)`` if it defines one; a backend refuses the
  event, with the reason, when the mechanism gives it nothing for that sampling and neighbouring
  (``prv`` always: it knows only the Poisson-sampled Gaussian).
"""

from __future__ import annotations

from fedprivacy.accounting.backend_base import Backend
from fedprivacy.accounting.pld_backend import PldBackend
from fedprivacy.accounting.prv_backend import PrvBackend
from fedprivacy.accounting.rdp_backend import RdpBackend

__all__ = ["BACKENDS", "get_backend", "register_backend"]


BACKENDS: dict[str, Backend] = {}


def register_backend(backend: Backend) -> Backend:
    """Add ``backend`` to the registry under ``backend.name``."""
    BACKENDS[backend.name] = backend
    return backend



for _b in (PldBackend(), RdpBackend(), PrvBackend()):
    register_backend(_b)


def get_backend(name: str) -> Backend:
    """The registered backend called ``name``; ValueError naming the choices otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"backend must be a str, got {type(name).__name__}")
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"backend must be one of {', '.join(sorted(BACKENDS))}, got {name!r}"
        ) from None
