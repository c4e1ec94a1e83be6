"""The masking graph of SecAgg+ and the safety rules on (degree, threshold).

Graph (Bell et al. 2020, "Secure Single-Server Aggregation with (Poly)Logarithmic Overhead", CCS,
Section 3/4): a Harary graph H(n, k) on a pseudo-random permutation of the participants. Position ``p``
is joined to ``p +- 1, ..., p +- floor(k/2)`` (mod n) and, for odd ``k`` and even ``n``, to ``p + n/2``;
so every node has exactly ``k`` neighbours (``k`` odd with ``n`` odd is rounded up to ``k + 1``).
``k >= n - 1`` gives the complete graph, i.e. the original protocol of Bonawitz et al. (2017, CCS).

The permutation is derived from a public seed that every client recomputes from the round number and
the full roster of advertised keys (:func:`graph_seed`), so the server cannot hand a client a
neighbourhood of its choosing: a client refuses a neighbour list that differs from its own
computation. (A server can still grind by excluding clients from the roster; Bell et al. assume the
graph is random given the set of participants.)

Safety rule (:func:`check_safe`). A client u Shamir-shares its self-mask seed ``b_u`` and its masking
key ``s_u`` among ``k + 1`` holders, its ``k`` neighbours and itself, threshold ``t``. An honest holder
reveals, for a given peer and round, *either* its share of ``b_u`` (u survived) *or* its share of ``s_u``
(u dropped), never both; u itself, being alive, only ever reveals its share of ``b_u``. To unmask a live
u the server needs ``t`` shares of each. With ``c`` corrupted neighbours (who reveal everything) it
needs ``t - 1 - c`` honest neighbours for ``b_u`` (u gives one) and a disjoint set of ``t - c`` honest
neighbours for ``s_u``, out of ``k - c``; impossible iff ``(t - 1 - c) + (t - c) > k - c``, i.e.
``t > (k + 1 + c) / 2``. For the complete graph (``k = n - 1``) and ``c = 0`` this is ``t > n / 2``,
the bound of Bonawitz et al. (2017, Sec. 4) against a server that lies about who dropped out; we
enforce it for the neighbourhood (semi-honest clients by default, ``corrupted`` raises it).
Reconstruction needs ``t <= k + 1``.

Connectivity rule (:func:`is_connected`). After unmasking, the server can cancel every pairwise mask
inside a connected component of the survivors' graph, so if that graph splits, it learns the sum of
each component separately (Bell et al. 2020 bound the size of such sets; with a ring-structured
Harary graph a server that ignores two blocks of ``k/2`` clients would learn the sum of an arc of
about ``k/2 + 1`` clients). Clients therefore refuse to unmask when the survivor list induces a
disconnected subgraph, and the honest server aborts such rounds itself; together with a large
``min_survivors`` this stops a server from presenting small, isolated survivor sets.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Sequence

__all__ = [
    "abort_probability_bound",
    "check_safe",
    "graph_seed",
    "harary_neighbours",
    "is_connected",
    "min_safe_threshold",
]


def graph_seed(*, round: int, roster: Sequence[tuple[int, bytes, bytes]]) -> bytes:
    """SHA-256 over the round and the sorted roster ``(node_id, enc_public, mask_public)``."""
    h = hashlib.sha256(b"fedprivacy/v1/graph")
    h.update(struct.pack(">Q", round))
    for node_id, enc_pk, mask_pk in sorted(roster):
        h.update(struct.pack(">Q", node_id))
        h.update(enc_pk)
        h.update(mask_pk)
    return h.digest()


def effective_degree(num_clients: int, degree: int) -> int:
    """The degree actually used: ``min(degree, n - 1)``, rounded up to even when ``n`` is odd."""
    if degree >= num_clients - 1:
        return num_clients - 1
    if degree % 2 == 1 and num_clients % 2 == 1:
        return degree + 1
    return degree


def harary_neighbours(
    ids: Sequence[int], *, degree: int, seed: bytes
) -> dict[int, tuple[int, ...]]:
    """Neighbour sets (sorted tuples) of the Harary graph H(n, degree) on a seeded permutation."""
    ids = list(ids)
    if len(set(ids)) != len(ids):
        raise ValueError("node ids must be distinct")
    n = len(ids)
    if n < 2:
        raise ValueError(f"need at least 2 clients, got {n}")
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
        raise ValueError(f"degree must be an int >= 1, got {degree!r}")
    k = effective_degree(n, degree)
    if k == n - 1:
        return {i: tuple(sorted(j for j in ids if j != i)) for i in ids}
    order = sorted(ids, key=lambda i: hashlib.sha256(seed + struct.pack(">Q", i)).digest())
    nb: dict[int, set[int]] = {i: set() for i in ids}
    for p, i in enumerate(order):
        for step in range(1, k // 2 + 1):
            j = order[(p + step) % n]
            nb[i].add(j)
            nb[j].add(i)
        if k % 2 == 1:
            j = order[(p + n // 2) % n]
            nb[i].add(j)
            nb[j].add(i)
    return {i: tuple(sorted(s)) for i, s in nb.items()}


def min_safe_threshold(degree: int, *, corrupted: int = 0) -> int:
    """Smallest ``t`` with ``t > (degree + 1 + corrupted) / 2``."""
    return (degree + 1 + corrupted) // 2 + 1


def check_safe(*, num_clients: int, degree: int, threshold: int, corrupted: int = 0) -> int:
    """Refuse unsafe (degree, threshold); returns the effective degree.

    Raises:
        ValueError: with the violated rule, e.g. ``threshold must be > (degree+1+corrupted)/2 = 4.0``.
    """
    for name, v in (("num_clients", num_clients), ("degree", degree), ("threshold", threshold),
                    ("corrupted", corrupted)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if num_clients < 3:
        raise ValueError(f"num_clients must be >= 3 for secure aggregation, got {num_clients}")
    k = effective_degree(num_clients, degree)
    if k < 2:
        raise ValueError(f"degree must be >= 2 (a single neighbour learns the input), got {degree}")
    if corrupted < 0:
        raise ValueError(f"corrupted must be >= 0, got {corrupted}")
    if threshold > k + 1:
        raise ValueError(f"threshold must be <= degree+1={k + 1} share holders (else nothing can be "
                         f"reconstructed), got {threshold}")
    if 2 * threshold <= k + 1 + corrupted:
        raise ValueError(
            f"threshold must be > (degree+1+corrupted)/2 = {(k + 1 + corrupted) / 2} so that a server "
            f"lying about dropouts cannot collect both the self-mask and the key shares of a live "
            f"client (Bonawitz et al. 2017, Sec. 4); got threshold={threshold}"
        )
    return k


def _binom_tail(k: int, p: float, at_least: int) -> float:
    """P[Binomial(k, p) >= at_least]."""
    if at_least <= 0:
        return 1.0
    return math.fsum(math.comb(k, j) * p**j * (1 - p) ** (k - j) for j in range(at_least, k + 1))


def abort_probability_bound(*, num_clients: int, degree: int, threshold: int, dropout: float) -> float:
    """Upper bound on the probability that a round aborts when each client drops independently
    with probability ``dropout`` before the masked-input stage (and answers afterwards).

    A dropped client's key needs ``t`` of its ``k`` neighbours alive, a survivor's seed needs ``t`` of
    its ``k + 1`` holders (itself included); by Markov's inequality the probability that some client
    fails is at most ``n (p P[Bin(k,p) > k - t] + (1-p) P[Bin(k,p) > k+1-t])``. A round also aborts
    when the survivors' graph is disconnected; the Harary graph contains the circulant ring
    ``C_n(1..h)``, ``h = floor(k/2)``, which splits only if two disjoint windows of ``h`` consecutive
    clients all drop: at most ``n^2/2 p^(2h)``. The sum of both terms is returned (capped at 1).
    This is the price of sparse graphs: k = 7, t = 5, n = 100 at 10% dropout gives ~0.5, while
    k = 15, t = 9 gives ~6e-3. Use it to choose ``degree``.
    """
    if not 0 <= dropout < 1:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    k = effective_degree(num_clients, degree)
    p = dropout
    per_dropped = _binom_tail(k, p, k - threshold + 1)
    per_survivor = _binom_tail(k, p, k + 1 - threshold + 1)
    split = 0.0 if k >= num_clients - 1 else num_clients**2 / 2.0 * p ** (2 * (k // 2))
    return min(1.0, num_clients * (p * per_dropped + (1 - p) * per_survivor) + split)


def is_connected(nodes: set[int] | frozenset[int], neighbours: dict[int, tuple[int, ...]]) -> bool:
    """Whether the subgraph induced by ``nodes`` is connected (True for 0 or 1 node)."""
    if len(nodes) <= 1:
        return True
    start = next(iter(nodes))
    seen = {start}
    stack = [start]
    while stack:
        u = stack.pop()
        for v in neighbours.get(u, ()):
            if v in nodes and v not in seen:
                seen.add(v)
                stack.append(v)
    return len(seen) == len(nodes)
