"""The in-process engine's virtual SuperNodes: random 64-bit node ids and their partition ids, in numpy.

Node ``i`` holds partition ``i``. The ids live in one ``uint64`` array (8 bytes a node) and are found by a
binary search over a sorted copy, so a population of a million nodes costs ~24 MB instead of ~150 MB of
Python ints, lists and dicts; the lookups of the nodes a run talks to are memoised in a bounded dict,
so a run of up to ``CACHE_NODES`` nodes answers every lookup after the first from the dict.
Node ids are drawn as Flower draws them: a secure source unless a seed is given for reproducibility.
"""

from __future__ import annotations

import random
import secrets
from typing import Any

import numpy as np

from server.engine._flwr_private import SUPERLINK_NODE_ID

__all__ = ["CACHE_NODES", "NodeTable", "make_node_ids"]

CACHE_NODES = 1 << 16  # memoised node -> partition lookups; the memo is emptied when it is full


class NodeTable:
    """Node ids in partition order and the partition of a node id.

    Args:
        node_ids: distinct unsigned 64-bit ids; ``node_ids[i]`` is the node of partition ``i``.
    """

    __slots__ = ("_ids", "_sorted", "_order", "_memo")

    def __init__(self, node_ids: np.ndarray) -> None:
        ids = np.asarray(node_ids, dtype=np.uint64)
        if ids.ndim != 1 or ids.size < 1:
            raise ValueError(f"node_ids must be a non-empty 1-D array, got shape {ids.shape}")
        self._order = np.argsort(ids)
        self._sorted = ids[self._order]
        if ids.size > 1 and bool((self._sorted[1:] == self._sorted[:-1]).any()):
            raise ValueError("node_ids must be distinct")
        ids.setflags(write=False)
        self._ids = ids
        self._memo: dict[int, int] = {}

    def __len__(self) -> int:
        return int(self._ids.size)

    def ids(self) -> list[int]:
        """Every node id, in partition order, as Python ints."""
        return self._ids.tolist()

    def partition_of(self, node_id: Any) -> int | None:
        """The partition of ``node_id``, or None if no node has that id."""
        pid = self._memo.get(node_id)
        if pid is not None:
            return pid
        if isinstance(node_id, bool) or not isinstance(node_id, int | np.integer) or not 0 <= node_id < 2**64:
            return None
        key = np.uint64(node_id)
        at = int(np.searchsorted(self._sorted, key))
        if at == self._sorted.size or self._sorted[at] != key:
            return None
        pid = int(self._order[at])
        if len(self._memo) >= CACHE_NODES:
            self._memo.clear()
        self._memo[int(node_id)] = pid
        return pid


def make_node_ids(n: int, seed: int | None) -> np.ndarray:
    """``n`` random unsigned 64-bit node ids, never 0 or the SuperLink's id, all distinct.

    ``seed`` None draws them from ``secrets`` as Flower does; an int gives the same ids as calling
    ``random.Random(seed).getrandbits(64)`` in turn and skipping repeats and the reserved ids (one call
    for all ``64 n`` bits returns the same words, least significant first, as ``n`` calls in turn).
    """
    reserved = (0, SUPERLINK_NODE_ID)
    rng = _node_id_rng(seed)
    drawn = np.frombuffer(rng.getrandbits(64 * n).to_bytes(8 * n, "little"), dtype="<u8").astype(np.uint64)
    out = drawn[(drawn != 0) & (drawn != np.uint64(SUPERLINK_NODE_ID))]
    extra: list[int] = []
    while out.size + len(extra) < n:  # a reserved id was drawn: the next draws take its place
        nid = rng.getrandbits(64)
        if nid not in reserved:
            extra.append(nid)
    if extra:
        out = np.concatenate([out, np.array(extra, dtype=np.uint64)])
    ordered = np.sort(out)  # not np.unique: ~20x slower on a million ids (numpy 2.4)
    if not bool((ordered[1:] == ordered[:-1]).any()):
        return out
    # a repeat among n 64-bit draws (probability ~ n^2 / 2^65): again, from the start, skipping repeats
    rng = _node_id_rng(seed)
    ids: list[int] = []
    seen = set(reserved)
    while len(ids) < n:
        nid = rng.getrandbits(64)
        if nid not in seen:
            seen.add(nid)
            ids.append(nid)
    return np.array(ids, dtype=np.uint64)


def _node_id_rng(seed: int | None) -> Any:
    return secrets.SystemRandom() if seed is None else random.Random(seed)
