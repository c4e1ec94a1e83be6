"""The ServerApp's core, callable from Python: discover nodes, then run the transport-free loop.

:func:`run_server` is what ``server_app.py``'s ``@app.main`` calls; tests, benchmarks and the
in-process engine call it directly with any :class:`flwr.serverapp.Grid`.

Node discovery: one ``query`` message to every node returns its ``partition-id`` / ``num-partitions``
(its ``node_config``). From then on everything is keyed by partition id and done in partition-id order,
so results do not depend on the transport's random node ids.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from flwr.serverapp import Grid

from fedprivacy.config import RunConfig
from fedprivacy.fl.modes import Transport
from fedprivacy.fl.run import run_federated
from fedprivacy.fl.types import ClientUpdate, Exchange, RoundInstructions
from fedprivacy_flwr import codec

NODE_WAIT_SECONDS = 60.0


class NoClientsError(RuntimeError):
    """No SuperNode (or not every partition) answered the partition query in time (exit code 5)."""


def discover_partitions(
    grid: Grid, *, timeout: float, wait: float = NODE_WAIT_SECONDS, log: Callable[[str], None] = print
) -> dict[int, int]:
    """Map partition id -> node id by querying every node; waits until ids 0..N-1 have all answered.

    SuperNodes of a deployment connect one by one, so new nodes are queried as they appear, until every
    partition of ``num-partitions`` is known or ``wait`` seconds have passed (then
    :class:`NoClientsError`; nodes that disagree about the partitions raise RuntimeError).
    """
    deadline = time.monotonic() + wait
    mapping: dict[int, int] = {}
    totals: set[int] = set()
    asked: set[int] = set()
    while True:
        new = sorted(set(grid.get_node_ids()) - asked)
        if new:
            asked.update(new)
            for reply in grid.send_and_receive([codec.query_message(n) for n in new], timeout=timeout):
                src = reply.metadata.src_node_id
                if reply.has_error():
                    raise RuntimeError(f"node {src} failed the partition query: {codec.error_text(reply)}")
                pid, total = codec.decode_query_reply(reply)
                if pid in mapping:
                    raise RuntimeError(f"two nodes claim partition-id {pid}")
                mapping[pid] = src
                totals.add(total)
        if len(totals) > 1:
            raise RuntimeError(f"nodes disagree on num-partitions: {sorted(totals)}")
        if totals:
            (total,) = totals
            if sorted(mapping) == list(range(total)):
                return mapping
            if any(not 0 <= pid < total for pid in mapping):
                raise RuntimeError(f"partition ids {sorted(mapping)} do not fit num-partitions={total}")
        if time.monotonic() > deadline:
            have = sorted(mapping)
            raise NoClientsError(
                f"only partitions {have} answered within {wait:.0f} s"
                + (f" (num-partitions={next(iter(totals))})" if totals else "")
                + "; start a SuperNode for every partition-id 0..num-partitions-1 (see README, Scaling out)"
            )
        time.sleep(1.0)


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
