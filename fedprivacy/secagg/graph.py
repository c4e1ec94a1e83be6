"""The masking graph of SecAgg+ and the safety rules on (degree, threshold).

Graph (Bell et al. 2020, "Secure Single-Server Aggregation with (Poly)Logarithmic Overhead", CCS,
Section 3/4): a Harary graph H(n, k) on a pseudo-random permutation of the participants. Position ``p``
is joined to ``p +- 1, ..., p +- floor(k/2)`` (mod n) and, for odd ``k`` and even ``n``, to ``p + n/2``;
so every node has exactly ``k`` neighbours (``k`` odd with ``n`` odd is rounded up to ``k + 1``).
``k >= n - 1`` gives the complete graph, i.e. the original protocol of Bonawitz et al. (2017, CCS).

The permutation is derived from a public seed that every client recomputes from the round number and
the full roster of advertised keys (:func:`graph_seed`); a client refuses a neighbour list that differs
from its own computation. Assumed (as by Bell et al.): the graph is random given the set of
participants; a server can still grind by excluding clients from the roster.

Rules, with ``c`` clients colluding with the server ("colluders"); a client u Shamir-shares its
self-mask seed ``b_u`` and its masking key ``s_u`` among its ``k`` neighbours and itself, threshold ``t``:

* :func:`check_safe`: ``k > c`` (else every neighbour of a client could be a colluder);
  ``t > (k + 1 + c)/2`` (Bonawitz et al. 2017, Sec. 4, applied per neighbourhood: a server that lies
  about who dropped cannot collect ``t`` shares of both ``b_u`` and ``s_u``; it implies ``t > c``; the
  complete graph with ``c = 0`` gives ``t > n/2``); ``t <= k + 1`` (reconstruction is possible). The
  threshold rule protects the semi-honest schedule and bounds the damage of a broken signature
  assumption on the active one.
* :func:`min_signers`: ``T > (n + c)/2`` signatures make two certified views of one round impossible
  (an honest client signs at most one view).
* :func:`is_k_connected`: the graph of the edges *really used* among the survivors must be
  ``(c + 1)``-vertex-connected, so that the only sum over honest clients the server can learn is the
  sum over all of them.

Rationale: docs/SECAGG.md, section "Why the rules hold".
"""

from __future__ import annotations

import functools
import hashlib
import math
import struct
from collections.abc import Collection, Mapping, Sequence

__all__ = [
    "abort_probability_bound",
    "check_safe",
    "graph_seed",
    "harary_neighbours",
    "is_connected",
    "is_k_connected",
    "min_safe_threshold",
    "min_signers",
    "used_graph",
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
    return dict(_harary(tuple(ids), effective_degree(n, degree), bytes(seed)))


@functools.lru_cache(maxsize=16)
def _harary(ids: tuple[int, ...], k: int, seed: bytes) -> dict[int, tuple[int, ...]]:
    """The graph of :func:`harary_neighbours` (validated ids, effective degree ``k``), cached: every
    client of a round builds the same graph (n SHA-256 and n k set insertions, ~1 ms at n = 100);
    callers get a copy of the dict (its values are tuples)."""
    n = len(ids)
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


def min_safe_threshold(degree: int, *, colluders: int = 0) -> int:
    """Smallest ``t`` with ``t > (degree + 1 + colluders) / 2``."""
    return (degree + 1 + colluders) // 2 + 1


def min_signers(num_clients: int, *, colluders: int = 0) -> int:
    """Signatures a view of a roster of ``num_clients`` needs: ``floor((n + c)/2) + 1`` (``> (n+c)/2``)."""
    return (num_clients + colluders) // 2 + 1


def check_safe(*, num_clients: int, degree: int, threshold: int, colluders: int = 0) -> int:
    """Refuse unsafe (degree, threshold) for ``colluders`` colluding clients; returns the effective degree.

    Raises:
        ValueError: with the violated rule, e.g. ``threshold must be > (degree+1+colluders)/2 = 4.0``.
    """
    for name, v in (("num_clients", num_clients), ("degree", degree), ("threshold", threshold),
                    ("colluders", colluders)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if num_clients < 3:
        raise ValueError(f"num_clients must be >= 3 for secure aggregation, got {num_clients}")
    k = effective_degree(num_clients, degree)
    if k < 2:
        raise ValueError(f"degree must be >= 2 (a single neighbour learns the input), got {degree}")
    if colluders < 0:
        raise ValueError(f"colluders must be >= 0, got {colluders}")
    if k <= colluders:
        raise ValueError(f"degree must be > colluders={colluders} (else all neighbours of a client may "
                         f"collude and know its pairwise masks), got effective degree {k}")
    if threshold > k + 1:
        raise ValueError(f"threshold must be <= degree+1={k + 1} share holders (else nothing can be "
                         f"reconstructed), got {threshold}")
    if 2 * threshold <= k + 1 + colluders:
        raise ValueError(
            f"threshold must be > (degree+1+colluders)/2 = {(k + 1 + colluders) / 2} so that a server "
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


def _disjoint_paths(adj: Mapping[int, set[int]], source: int | None, sources: frozenset[int],
                    sink: int, need: int) -> int:
    """Internally vertex-disjoint paths from ``sources`` (or one ``source``) to ``sink``, up to ``need``.

    Unit-capacity augmenting paths on the split graph (every vertex ``v`` becomes ``v_in -> v_out`` of
    capacity 1), so paths share no vertex other than the endpoints (Menger's theorem).
    """
    # residual capacities on arcs between ("in"/"out", v) nodes; None stands for the super source
    cap: dict[tuple[object, object], int] = {}

    def arc(a: object, b: object, c: int) -> None:
        cap[(a, b)] = cap.get((a, b), 0) + c
        cap.setdefault((b, a), 0)

    starts = sources if source is None else frozenset({source})
    for v in adj:
        if v not in starts and v != sink:
            arc(("in", v), ("out", v), 1)
        for w in adj[v]:
            if w in adj:
                arc(("out", v), ("in", w), 1)
    for v in starts:  # one start vertex is an endpoint of `need` paths, a fan vertex of at most one
        arc("S", ("out", v), need if source is not None else 1)
    out_arcs: dict[object, list[object]] = {}
    for a, b in cap:
        out_arcs.setdefault(a, []).append(b)
    target = ("in", sink)
    found = 0
    while found < need:
        parent: dict[object, object] = {"S": None}
        queue: list[object] = ["S"]
        while queue and target not in parent:
            nxt = []
            for a in queue:
                for b in out_arcs.get(a, ()):
                    if b not in parent and cap[(a, b)] > 0:
                        parent[b] = a
                        nxt.append(b)
            queue = nxt
        if target not in parent:
            break
        node: object = target
        while parent[node] is not None:
            prev = parent[node]
            cap[(prev, node)] -= 1
            cap[(node, prev)] += 1
            node = prev
        found += 1
    return found


def is_k_connected(nodes: set[int] | frozenset[int], neighbours: Mapping[int, Collection[int]],
                   k: int) -> bool:
    """Whether the subgraph induced by ``nodes`` is ``k``-vertex-connected.

    A graph is ``k``-connected if it has more than ``k`` vertices and stays connected after removing
    any ``k - 1`` of them. Test of Even (1975, "An algorithm for determining whether the connectivity
    of a graph is at least k", SIAM J. Comput. 4(3)): order the vertices ``v_1..v_n``; it is
    ``k``-connected iff (1) every non-adjacent pair among ``v_1..v_k`` is joined by ``k`` internally
    disjoint paths and (2) for every ``j > k`` a new vertex joined to ``v_1..v_{j-1}`` has ``k``
    disjoint paths to ``v_j``. A ``v_j`` with ``k`` neighbours among ``v_1..v_{j-1}`` passes (2)
    trivially, so a greedy clique followed by a breadth-first order makes almost every step free on the
    graphs used here.
    ``k = 1`` is plain connectivity (:func:`is_connected`).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    if len(nodes) <= k:
        return False
    adj = {v: {w for w in neighbours.get(v, ()) if w in nodes and w != v} for v in nodes}
    if not is_connected(frozenset(nodes), {v: tuple(ws) for v, ws in adj.items()}):
        return False
    if k == 1:
        return True
    if min(len(ws) for ws in adj.values()) < k:
        return False
    # start from a greedy clique (its pairs need no flow), then breadth-first
    start = max(sorted(adj), key=lambda v: len(adj[v]))
    order = [start]
    candidates = set(adj[start])
    while len(order) < k and candidates:
        w = max(sorted(candidates), key=lambda u: len(adj[u] & candidates))
        order.append(w)
        candidates &= adj[w]
    seen = set(order)
    for v in order:
        for w in sorted(adj[v]):
            if w not in seen:
                seen.add(w)
                order.append(w)
    first = order[:k]
    for i, a in enumerate(first):
        for b in first[i + 1:]:
            if b not in adj[a] and _disjoint_paths(adj, a, frozenset(), b, k) < k:
                return False
    earlier: set[int] = set(first)
    for v in order[k:]:
        if len(adj[v] & earlier) < k and _disjoint_paths(adj, None, frozenset(earlier), v, k) < k:
            return False
        earlier.add(v)
    return True


def used_graph(peer_sets: Mapping[int, Sequence[int]]) -> dict[int, set[int]]:
    """Mutual edges among the keys of ``peer_sets`` (both ends masked with each other)."""
    return {u: {w for w in ps if w in peer_sets and u in peer_sets[w]} for u, ps in peer_sets.items()}
