"""The defences a gradient-leakage attack faces: the shipped client steps.

Defences are the shipped client steps: :func:`apply_defence` is
:func:`fedprivacy.fl.client.privatize_update` (clipping, Gaussian noise from a ``RandomSource``), and a
distributed-DP share goes through the ``ddgauss`` encoder (:func:`encoded_share`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from fedprivacy.dp.rng import RandomSource

def apply_defence(
    update: Sequence[np.ndarray],
    *,
    clip_norm: float | None,
    noise_std: float,
    rng: RandomSource | None,
) -> list[np.ndarray]:
    """Clip the whole update to L2 norm ``clip_norm`` (if given) and add N(0, noise_std^2) per coordinate.

    This is the shipped client step, :func:`fedprivacy.fl.client.privatize_update` (global-norm
    clipping, then local-mode Gaussian noise from ``rng``); never numpy's global RNG.
    """
    from fedprivacy.dp.rng import RandomSource
    from fedprivacy.fl.client import privatize_update

    if noise_std < 0:
        raise ValueError(f"noise_std must be >= 0, got {noise_std}")
    if noise_std > 0 and rng is None:
        raise ValueError("rng is required when noise_std > 0")
    clipped = privatize_update(update, clip_norm=clip_norm or 0.0, mechanism=None, noise_multiplier=0.0,
                               private=False, rng=rng if rng is not None else RandomSource.secure())
    if noise_std == 0:
        return clipped
    assert rng is not None
    return [a + rng.normal(std=noise_std, size=a.shape) for a in clipped]


def encoded_share(
    update: Sequence[np.ndarray],
    *,
    clip_norm: float,
    noise_multiplier: float,
    threshold: int,
    rng: RandomSource,
) -> list[np.ndarray]:
    """One client's distributed-DP share as the shipped client encodes it, decoded back to floats.

    The update is clipped to ``clip_norm`` (the client pipeline's
    :func:`fedprivacy.fl.client.privatize_update`) and encoded with the run's ``ddgauss``
    :class:`fedprivacy.secagg.encoding.EncodingSpec` for ``threshold`` survivors (Kairouz, Liu & Steinke
    2021: rotation, scaling, conditional rounding, ``N_Z(0, (zCs)^2/t)``, modular clipping); decoding
    that one vector is what a server that unmasked this client alone would see.
    """
    from fedprivacy.dp.clipping import flatten, unflatten
    from fedprivacy.fl.client import privatize_update
    from fedprivacy.secagg.encoding import largest_scale_encoding

    clipped = privatize_update(update, clip_norm=clip_norm, mechanism=None, noise_multiplier=0.0, private=False,
                               rng=rng)
    flat = flatten(clipped, dtype=np.float64)
    enc = largest_scale_encoding(kind="ddgauss", dim=int(flat.size), clip_norm=clip_norm,
                                 modulus_bits=32, population=threshold, noise_multiplier=noise_multiplier,
                                 threshold=threshold, rotation_seed=rng.child("rotation").random_bytes(32))
    decoded = enc.decode(enc.encode(flat, rng=rng.child("share")))
    return [np.asarray(a, dtype=np.float64) for a in unflatten(decoded, clipped)]


# ------------------------------------------------------------------------------------------ attacks


@dataclass(frozen=True, slots=True, kw_only=True)
class Defence:
    """What stands between a client's raw update and the server.

    ``clip_norm`` None means no clipping; the noise std is ``noise_multiplier * clip_norm``; the
    server sees the sum of ``clients`` updates (secure aggregation when > 1); ``local_steps``/``lr``
    describe the update (1 and 1.0: a FedSGD gradient). ``share_of = t > 0``: the update goes through
    the shipped distributed-DP client encoder (:class:`fedprivacy.secagg.encoding.EncodingSpec`,
    ``ddgauss``: rotation, scaling, rounding, discrete Gaussian of std ``noise_multiplier C / sqrt(t)``
    in scaled units) and the attacker sees that one client's decoded share, as a server that unmasked
    it would.
    """

    name: str
    clip_norm: float | None = None
    noise_multiplier: float = 0.0
    clients: int = 1
    local_steps: int = 1
    lr: float = 1.0
    share_of: int = 0

    def __post_init__(self) -> None:
        if self.clip_norm is not None and self.clip_norm <= 0:
            raise ValueError(f"clip_norm must be > 0, got {self.clip_norm}")
        if self.noise_multiplier < 0:
            raise ValueError(f"noise_multiplier must be >= 0, got {self.noise_multiplier}")
        if self.noise_multiplier > 0 and self.clip_norm is None:
            raise ValueError(
                "noise_multiplier > 0 needs a clip_norm (noise std = noise_multiplier * C)"
            )
        if self.share_of and (self.clip_norm is None or self.noise_multiplier <= 0 or self.share_of < 2):
            raise ValueError(f"share_of must be 0 or >= 2 with clip_norm and noise_multiplier > 0, got "
                             f"share_of={self.share_of}, clip_norm={self.clip_norm}, "
                             f"noise_multiplier={self.noise_multiplier}")
        if self.clients < 1 or self.local_steps < 1 or self.lr <= 0:
            raise ValueError(
                f"need clients >= 1, local_steps >= 1, lr > 0, got {self.clients}, "
                f"{self.local_steps}, {self.lr}"
            )


def default_defences(
    *,
    clip_norm: float = 1.0,
    noise_multipliers: Sequence[float] = (0.001, 0.01, 0.1, 1.0),
    distributed_clients: int = 10,
    distributed_central: Sequence[float] = (0.1, 1.0),
    fedavg_steps: int | None = 3,
    fedavg_lr: float = 0.1,
    secure_aggregation: bool = True,
) -> tuple[Defence, ...]:
    """The defence ladder of the script: none, a FedAvg update, clipping, clipping + noise, one
    client's share ``sigma / sqrt(n)`` of distributed-DP noise (through the shipped encoder), and a
    secure-aggregation sum. ``fedavg_steps=None`` leaves out the FedAvg row and
    ``secure_aggregation=False`` the sum of ``distributed_clients`` updates (the single-client ladder
    of the Fashion-MNIST run)."""
    out = [Defence(name="none")]
    if fedavg_steps is not None:
        out.append(Defence(name="none-fedavg", local_steps=fedavg_steps, lr=fedavg_lr))
    out.append(Defence(name="clip", clip_norm=clip_norm))
    out += [
        Defence(name=f"clip+noise(sigma={s:g})", clip_norm=clip_norm, noise_multiplier=s)
        for s in noise_multipliers
    ]
    out += [
        Defence(
            name=f"distributed-dp-share(n={distributed_clients},sigma={s:g})",
            clip_norm=clip_norm,
            noise_multiplier=s,
            share_of=distributed_clients,
        )
        for s in distributed_central
    ]
    if secure_aggregation:
        out.append(Defence(name=f"secagg-sum(n={distributed_clients})", clients=distributed_clients))
    return tuple(out)
