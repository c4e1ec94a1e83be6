"""The ServerApp's core, callable from Python: discover nodes, then run the transport-free loop.

:func:`run_server` is what ``server_app.py``'s ``@app.main`` calls; tests, benchmarks and the
in-process engine call it directly with any :class:`flwr.serverapp.Grid`.

Node discovery: one ``query`` message to every node returns its ``partition-id`` / ``num-partitions``
(its ``node_config``). From then on everything is keyed by partition id and done in partition-id order,
so results do not depend on the transport's random node ids. A pass asks its nodes ``QUERY_CHUNK`` at a
time, so a million nodes never have a million Messages alive at once; the map is one ``uint64`` array.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import Message
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid

from fedprivacy.config import RunConfig
from fedprivacy.fl.modes import Transport
from fedprivacy.fl.run import run_federated
from fedprivacy.fl.types import ClientUpdate, Exchange, RoundInstructions
from fedprivacy_flwr import codec

NODE_WAIT_SECONDS = 60.0
QUERY_ATTEMPTS = 3  # asks per node before discovery gives up on it
QUERY_CHUNK = 10_000  # queries per send_and_receive


class PartitionNodes(Mapping[int, int]):
    """Partition id -> node id for partitions ``0..N-1``, held in one read-only ``uint64`` array."""

    __slots__ = ("_nodes",)

    def __init__(self, mapping: Mapping[int, int]) -> None:
        nodes = np.zeros(len(mapping), dtype=np.uint64)
        for pid, nid in mapping.items():
            nodes[pid] = nid
        nodes.setflags(write=False)
        self._nodes = nodes

    def __getitem__(self, pid: int) -> int:
        if isinstance(pid, bool) or not isinstance(pid, int | np.integer) or not 0 <= pid < self._nodes.size:
            raise KeyError(pid)
        return int(self._nodes[pid])

    def __len__(self) -> int:
        return int(self._nodes.size)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self._nodes.size))


class NoClientsError(RuntimeError):
    """No SuperNode (or not every partition) answered the partition query in time (exit code 5)."""


def discover_partitions(
    grid: Grid, *, timeout: float, wait: float = NODE_WAIT_SECONDS, attempts: int = QUERY_ATTEMPTS,
    log: Callable[[str], None] = print,
) -> PartitionNodes:
    """Map partition id -> node id by querying every node; waits until ids 0..N-1 have all answered.

    Each pass asks every connected node that has not answered yet: nodes that appeared since the last
    pass (SuperNodes of a deployment connect one by one; Flower's simulation registers its nodes while
    the ServerApp already runs) and nodes whose reply did not come within ``timeout`` (a lost message, a
    node busy past the timeout: at 1000 SuperNodes Ray answered ~680 queries in one pass), each at most
    ``attempts`` times. A pass that starts after ``wait`` seconds is the last one; if some partition is
    still unknown then, :class:`NoClientsError` names the missing partition ids and the silent nodes.
    Nodes that disagree about the partitions raise RuntimeError. A query's ``group_id`` is its attempt
    (``"1"`` for the first ask), so a fault plan's ``rounds`` select the ask.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    deadline = time.monotonic() + wait
    mapping: dict[int, int] = {}
    totals: set[int] = set()
    asks: dict[int, int] = {}  # node id -> queries sent to it
    answered: set[int] = set()
    while True:
        last = time.monotonic() > deadline
        nodes = list(grid.get_node_ids())
        ask = [n for n in nodes if n not in answered and asks.get(n, 0) < attempts]
        if ask:
            for n in ask:
                asks[n] = asks.get(n, 0) + 1
            got = 0
            for at in range(0, len(ask), QUERY_CHUNK):
                chunk = ask[at:at + QUERY_CHUNK]
                replies = grid.send_and_receive([codec.query_message(n, attempt=asks[n]) for n in chunk],
                                                timeout=timeout)
                got += _take_query_replies(replies, asked=set(chunk), answered=answered, mapping=mapping,
                                           totals=totals)
                del replies
            if got < len(ask):
                log(f"partition query: {len(ask) - got} of {len(ask)} node(s) asked gave no answer within "
                    f"{timeout:g} s; asking them again (at most {attempts} times each)")
        if len(totals) > 1:
            raise RuntimeError(f"nodes disagree on num-partitions: {sorted(totals)}")
        total = next(iter(totals)) if totals else None
        if total is not None:
            if len(mapping) == total and all(0 <= pid < total for pid in mapping):
                return PartitionNodes(mapping)
            if any(not 0 <= pid < total for pid in mapping):
                raise RuntimeError(f"partition ids {sorted(mapping)} do not fit num-partitions={total}")
        if last:
            raise NoClientsError(_missing_text(mapping, total, nodes=nodes, answered=answered, asks=asks,
                                               wait=wait, timeout=timeout))
        if not ask:
            time.sleep(1.0)


_UNANSWERED = frozenset({ErrorCode.MESSAGE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE,
                         ErrorCode.NODE_UNAVAILABLE})


def _take_query_replies(replies: Iterable[Message], *, asked: set[int], answered: set[int],
                        mapping: dict[int, int], totals: set[int]) -> int:
    """Record the answers of one pass; returns how many of the nodes asked answered.

    A SuperLink's "message/reply/node unavailable" error is no answer (the node is asked again); a
    ClientApp's error is final (RuntimeError). A second answer from a node, or a reply from a node not
    asked in this pass, is ignored.
    """
    got = 0
    for reply in replies:
        src = reply.metadata.src_node_id
        if src not in asked or src in answered:
            continue
        if reply.has_error():
            if reply.error.code in _UNANSWERED:
                continue
            raise RuntimeError(f"node {src} failed the partition query: {codec.error_text(reply)}")
        pid, total = codec.decode_query_reply(reply)
        if pid in mapping:
            raise RuntimeError(f"two nodes claim partition-id {pid}")
        mapping[pid] = src
        totals.add(total)
        answered.add(src)
        got += 1
    return got


def _ids(ids: Iterable[int]) -> str:
    """``[0-428, 430, 432-702]``: sorted ids with runs of consecutive ids shortened."""
    parts: list[str] = []
    run: list[int] = []
    for i in sorted(ids):
        if run and i != run[-1] + 1:
            parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
            run = []
        run.append(i)
    if run:
        parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return "[" + ", ".join(parts) + "]"


def _missing_text(mapping: Mapping[int, int], total: int | None, *, nodes: Sequence[int],
                  answered: set[int], asks: Mapping[int, int], wait: float, timeout: float) -> str:
    text = f"only partitions {_ids(mapping)} answered within {wait:.0f} s"
    if total is not None:
        text += f" (num-partitions={total}; missing {_ids(set(range(total)) - set(mapping))})"
    silent = sorted(n for n in nodes if n not in answered)
    if silent:
        shown = ", ".join(str(n) for n in silent[:10]) + (", ..." if len(silent) > 10 else "")
        text += (f"; {len(silent)} connected node(s) never answered, asked up to "
                 f"{max(asks.get(n, 0) for n in silent)} time(s) with client-timeout {timeout:g} s: {shown}")
    return text + "; start a SuperNode for every partition-id 0..num-partitions-1 (see README, Scaling out)"


def make_exchange(grid: Grid, nodes: Mapping[int, int], *, timeout: float) -> Exchange:
    """The plain transport of :func:`fedprivacy.fl.run.run_federated`: one train message per sampled client."""

    def exchange(instr: RoundInstructions, cohort: Sequence[int], weights: Sequence[np.ndarray]
                 ) -> tuple[list[ClientUpdate], dict[int, str]]:
        pid_of = {nodes[pid]: pid for pid in cohort}
        arrays = codec.arrays_to_record(weights)  # once per round, not once per client
        config = codec.instructions_record(instr)  # likewise: the cohort gets the same instructions
        messages = [codec.train_message(nodes[pid], instr, arrays, config=config) for pid in cohort]
        replies = grid.send_and_receive(messages, timeout=timeout) if messages else []
        updates: list[ClientUpdate] = []
        failures: dict[int, str] = {}
        for reply in replies:
            pid = pid_of.get(reply.metadata.src_node_id)
            if pid is None:
                continue
            if reply.has_error():
                failures[pid] = codec.error_text(reply)
                continue
            try:
                updates.append(codec.decode_train_reply(reply, pid))
            except (KeyError, ValueError, TypeError) as exc:
                failures[pid] = f"malformed reply: {exc}"
        answered = {u.partition_id for u in updates} | set(failures)
        for pid in cohort:
            if pid not in answered:
                failures[pid] = f"no reply within client-timeout ({timeout:g} s)"
        updates.sort(key=lambda u: u.partition_id)
        return updates, failures

    return exchange


def run_server(grid: Grid, run_config: Mapping[str, Any], *, log: Callable[[str], None] = print,
               **seams: Any) -> dict[str, Any]:
    """Validate the config, discover partitions, run all rounds; returns the results dict.

    The privacy mode picks the round it needs from the transport: one train message per client, or
    the four stages of secure aggregation (``secagg = true``). ``seams`` go to
    :class:`fedprivacy.fl.run.FederatedRun` (e.g. ``callbacks=``).
    """
    from server.secagg_exchange import GridSecureTransport

    cfg = RunConfig.from_mapping(run_config)
    # Every partition must have answered within client-timeout (at most NODE_WAIT_SECONDS): a run whose
    # SuperNodes never come fails in the time the user set for a reply, not in a fixed minute.
    nodes = discover_partitions(grid, timeout=cfg.client_timeout,
                                wait=min(NODE_WAIT_SECONDS, cfg.client_timeout), log=log)
    transport = Transport(exchange=make_exchange(grid, nodes, timeout=cfg.client_timeout),
                          secure=GridSecureTransport(grid, nodes, timeout=cfg.client_timeout))
    return run_federated(cfg, population=len(nodes), transport=transport, log=log, **seams)
