"""XNoise on the wire: the clients' seeded noise components and the server's removal of the excess.

Design and privacy argument: :class:`fedprivacy.accounting.xnoise_design.XNoiseDesign` (exact noise
for every agreed survivor count; Dordis, Jiang, Wang & Chen, EuroSys 2024, Sec. 4). This module only
turns a design into integer vectors:

* Client (:func:`client_noise`): component 0 ``N_Z(0, b)`` from the client's own secure
  :class:`~fedprivacy.dp.rng.RandomSource` (never revealed, never regenerated), plus one seeded
  component per removable level, each expanded from a fresh secret 32-byte seed by
  :func:`component_noise`. The seeds are the client's secrets; the protocol Shamir-shares them
  (threshold t) and reveals, after the consistency check has agreed the survivor set U3, exactly the
  seeds of ``design.removable(survivors=|U3|, rank)`` (:func:`removable_components`).
* Server (:func:`excess_noise`, :func:`remove_excess`): regenerates the revealed components of every
  survivor and subtracts their sum from the unmasked sum mod ``2^b``. Modular arithmetic makes the
  pre-removal range irrelevant: only the released sum (target noise) must fit the ring.

Seed expansion: ``key = HKDF-SHA256(seed, salt = round || node || index, info =
b"fedprivacy/v1/xnoise-component")`` keys an AES-256-CTR :class:`RandomSource` that drives the
tabulated sampler (:mod:`fedprivacy.dp.tabulated`: inversion of an integer CDF, so the output law is
known exactly and its distance to ``N_Z(0, v)`` enters the accounting). All components, the
never-revealed component 0 included, use it. The expansion is deterministic, so client and server get
the same vector; it is pinned by a known-answer test (``tests/secagg/test_xnoise.py``): changing the
sampler changes :data:`EXPANSION_VERSION`. Caveat: the table's float64 weights could differ in the
last bit on another platform's ``exp``, moving a table boundary; a draw landing exactly there
(probability ~2^-50 per draw) would differ between client and server on one coordinate (an accuracy
glitch there, never less noise than the design: the client's own draw stays in the sum).

Threat model: the seeds come from the client's secure source, never from the server; a seed is
revealed only when its component is excess for the agreed survivors; component 0 is never seeded.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedprivacy.accounting.xnoise_design import XNoiseDesign
from fedprivacy.dp.rng import RandomSource
from fedprivacy.dp.tabulated import sample_tabulated_discrete_gaussian
from fedprivacy.secagg.quantize import to_ring

__all__ = [
    "EXPANSION_VERSION",
    "ComponentSeeds",
    "client_noise",
    "component_noise",
    "excess_noise",
    "remove_excess",
    "removable_components",
]

#: Label of the seed expansion (bumped whenever the expansion or the sampler changes its output).
EXPANSION_VERSION = b"fedprivacy/v2/xnoise-component"
SEED_BYTES = 32


def _component_salt(seed: bytes, *, round: int, node_id: int, index: int) -> bytes:
    if len(seed) != SEED_BYTES:
        raise ValueError(f"seed must be {SEED_BYTES} bytes, got {len(seed)}")
    for name, v in (("round", round), ("node_id", node_id), ("index", index)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**64:
            raise ValueError(f"{name} must be an int in [0, 2**64), got {v!r}")
    return struct.pack(">QQQ", round, node_id, index)


def _component_key(seed: bytes, *, round: int, node_id: int, index: int) -> bytes:
    salt = _component_salt(seed, round=round, node_id=node_id, index=index)
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=EXPANSION_VERSION).derive(seed)


def _check_component(seed: bytes, *, variance: float, round: int, node_id: int, index: int) -> None:
    """What :func:`component_noise` refuses, in its order (raises its error)."""
    if not (math.isfinite(variance) and variance > 0):
        raise ValueError(f"variance must be a finite number > 0, got {variance!r}")
    _component_salt(seed, round=round, node_id=node_id, index=index)


def component_noise(seed: bytes, *, variance: float, size: int, round: int, node_id: int,
                    index: int) -> np.ndarray:
    """The seeded component ``index`` of ``node_id`` in ``round``: ``N_Z(0, variance)^size`` (int64)."""
    _check_component(seed, variance=variance, round=round, node_id=node_id, index=index)
    key = _component_key(seed, round=round, node_id=node_id, index=index)
    return sample_tabulated_discrete_gaussian(variance=variance, size=size,
                                              rng=RandomSource.keyed(key))


@dataclass(frozen=True, slots=True, kw_only=True)
class ComponentSeeds:
    """One client's secret seeds for the seeded components of ``design`` in one round.

    ``seeds[j - 1]`` expands component ``j`` (``j = 1..design.num_seeded``). Never log or send these
    except as Shamir shares; ``repr`` hides them.
    """

    design: XNoiseDesign
    round: int
    node_id: int
    seeds: tuple[bytes, ...]

    def __post_init__(self) -> None:
        if len(self.seeds) != self.design.num_seeded:
            raise ValueError(f"seeds must hold {self.design.num_seeded} seeds for this design, "
                             f"got {len(self.seeds)}")
        if any(len(s) != SEED_BYTES for s in self.seeds):
            raise ValueError(f"every seed must be {SEED_BYTES} bytes")

    def __repr__(self) -> str:
        return (f"ComponentSeeds(round={self.round}, node_id={self.node_id}, "
                f"seeds=<{len(self.seeds)} hidden>)")

    @classmethod
    def fresh(cls, design: XNoiseDesign, *, round: int, node_id: int,
              rng: RandomSource) -> ComponentSeeds:
        """New seeds from the client's own source (secure unless its own side enabled research mode)."""
        return cls(design=design, round=round, node_id=node_id,
                   seeds=tuple(rng.random_bytes(SEED_BYTES) for _ in range(design.num_seeded)))

    def reveal(self, *, survivors: int, rank: int) -> dict[int, bytes]:
        """The seeds of the components that are excess for ``survivors`` at ``rank`` (index -> seed)."""
        return {j: self.seeds[j - 1] for j in self.design.removable(survivors=survivors, rank=rank)}


def client_noise(components: ComponentSeeds, *, size: int, rng: RandomSource) -> np.ndarray:
    """All of one client's noise (int64, length ``size``): own-source base + seeded components."""
    var = components.design.variances
    total = sample_tabulated_discrete_gaussian(variance=var[0], size=size, rng=rng)
    for j, seed in enumerate(components.seeds, start=1):
        total += component_noise(seed, variance=var[j], size=size, round=components.round,
                                 node_id=components.node_id, index=j)
    return total


def removable_components(design: XNoiseDesign, survivors: Sequence[int]) -> dict[int, tuple[int, ...]]:
    """For the agreed survivor ids: ``node id -> indices`` whose seeds are revealed (rank = sorted order)."""
    ids = sorted(int(i) for i in survivors)
    if len(set(ids)) != len(ids):
        raise ValueError("survivors must be distinct node ids")
    return {i: design.removable(survivors=len(ids), rank=r) for r, i in enumerate(ids)}


def excess_noise(design: XNoiseDesign, revealed: Mapping[int, Mapping[int, bytes]], *,
                 survivors: Sequence[int], round: int, size: int) -> np.ndarray:
    """Sum of the survivors' excess components, regenerated from the revealed seeds (int64).

    ``revealed[node][index]`` must hold exactly the seeds :func:`removable_components` names: a
    missing seed would leave that component in the sum (more noise than the accounting assumes for
    the observers) and an extra one would remove kept noise, so both are refused.
    """
    want = removable_components(design, survivors)
    if set(revealed) != set(want):
        raise ValueError(f"revealed seeds must cover exactly the survivors {sorted(want)}, "
                         f"got {sorted(revealed)}")
    total = np.zeros(size, dtype=np.int64)
    var = design.variances
    for node, idx in want.items():  # every refusal first, in the order of a node-by-node expansion
        got = revealed[node]
        if set(got) != set(idx):
            raise ValueError(f"node {node}: revealed components {sorted(got)} != removable {list(idx)}")
        for j in idx:
            _check_component(got[j], variance=var[j], round=round, node_id=node, index=j)
    # component by component (an integer sum in any order): each variance's table stays in cache
    # for all the survivors instead of alternating between the design's tables
    for j in sorted({j for idx in want.values() for j in idx}):
        for node, idx in want.items():
            if j in idx:
                total += component_noise(revealed[node][j], variance=var[j], size=size, round=round,
                                         node_id=node, index=j)
    return total


def remove_excess(total: np.ndarray, excess: np.ndarray, *, modulus_bits: int) -> np.ndarray:
    """``(total - excess) mod 2^b`` as uint32 residues."""
    t = np.asarray(total)
    if t.dtype != np.uint32 or t.shape != np.shape(excess):
        raise ValueError("total must be uint32 residues of the same shape as excess")
    return to_ring(t.astype(np.int64) - to_ring(excess, modulus_bits=modulus_bits).astype(np.int64),
                   modulus_bits=modulus_bits)
