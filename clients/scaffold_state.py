"""The node's SCAFFOLD control variate ``c_i`` (:mod:`fedprivacy.fl.scaffold`), in its ``context.state``.

Client side only: ``c_i`` is never put in a reply. It leaves the node only through the clipped, noised
(or masked) ``Δy ++ Δc`` it shapes. A node that lost its state starts again from ``c_i = 0``; that
changes training, not what is released.
"""

from __future__ import annotations

from flwr.app import ArrayRecord, Context

from fedprivacy.fl.scaffold import ClientControl
from fedprivacy_flwr import codec

__all__ = ["load", "save"]

_CONTROL = "scaffold-control"


def load(context: Context) -> ClientControl:
    record = codec.optional_record(context.state, _CONTROL, ArrayRecord)
    return ClientControl(value=None if record is None else tuple(codec.record_to_arrays(record)))


def save(context: Context, control: ClientControl | None) -> None:
    if control is not None and control.value is not None:
        context.state[_CONTROL] = codec.arrays_to_record(control.value)
