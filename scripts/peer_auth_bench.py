"""The round cost of authenticated peers (``client-peer-auth = "pin"``) against relay trust.

Usage: ``python scripts/peer_auth_bench.py --clients 20 --rounds 4 [--repeats 2] [--json out.json]``.

Secure runs (distributed, active schedule) on the in-process engine, the real ClientApp handlers, each
client's floor the simulation's (``ClientPolicy.for_simulation``) with ``client-peer-auth`` set to
``pin`` (each node makes its own Ed25519 identity on first use and pins its peers' keys) or ``relay``
(no long-term keys), alternated ``--repeats`` times. Per setting: the steady rounds' seconds (2..R-1,
as in ``scripts/secagg_round_bench.py``), and under ``pin`` the calls and seconds spent signing
advertisements (:meth:`PeerAuth.sign`, one Ed25519 signature) and checking rosters
(:meth:`PeerAuth.check_roster`: one verification per roster entry, and the pin file written when a peer
is new), per client and round. ``pin_over_relay`` is the ratio of the medians of the steady rounds;
``ed25519`` one signature's and one verification's microseconds, uncached.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
_HANDLERS = (("query", None, "query"), ("query", "secagg_advertise", "secagg_advertise"),
             ("query", "secagg_share", "secagg_share"), ("train", "secagg_masked", "secagg_masked"),
             ("query", "secagg_consistency", "secagg_consistency"), ("query", "secagg_unmask", "secagg_unmask"))


def _app(peer_auth: str) -> Any:
    """The real ClientApp's secure handlers, each node's config with ``client-peer-auth`` set."""
    from flwr.clientapp import ClientApp

    from clients import client_app as real

    def wrap(handler: Callable[..., Any]) -> Callable[..., Any]:
        def run(msg: Any, context: Any) -> Any:
            context.node_config = {**context.node_config, "client-peer-auth": peer_auth}
            return handler(msg, context)
        return run

    app = ClientApp()
    for kind, name, attr in _HANDLERS:
        decorator = getattr(app, kind)(name) if name else getattr(app, kind)()
        decorator(wrap(getattr(real, attr)))
    return app


class _Clock:
    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.seconds: dict[str, float] = {}

    def timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[fn.__name__] = self.seconds.get(fn.__name__, 0.0) + time.perf_counter() - t
                self.calls[fn.__name__] = self.calls.get(fn.__name__, 0) + 1
        return run


def measure(*, clients: int, rounds: int, peer_auth: str) -> dict[str, Any]:
    """One run's round seconds, and its time in :class:`PeerAuth` (see the module docstring)."""
    import os

    from fedprivacy.fl.client_policy import run_temp_base
    from fedprivacy.fl.run_files import round_seconds
    from fedprivacy.fl.secure import forget_peer_auth
    from fedprivacy.secagg.peers import PeerAuth
    from server.engine import run_inprocess

    clock = _Clock()
    saved = {name: getattr(PeerAuth, name) for name in ("sign", "check_roster")}
    with tempfile.TemporaryDirectory(dir=run_temp_base()) as tmp:  # where a simulation keeps its memory
        os.environ["FEDPRIVACY_RUN_TEMP"] = str(Path(tmp) / "run-temp")
        for name, fn in saved.items():
            setattr(PeerAuth, name, clock.timed(fn))
        try:
            forget_peer_auth()
            cfg = {"num-server-rounds": rounds, "seed": -1, "privacy": "distributed", "secagg": True,
                   "accountant": "rdp", "target-delta": min(1e-5, 0.1 / clients), "output-dir": tmp,
                   "run-name": "peers"}
            run_inprocess(run_config=cfg, num_supernodes=clients, app_dir=REPO, node_id_seed=1,
                          client_app=_app(peer_auth))
            secs = round_seconds(Path(tmp) / "peers")
        finally:
            for name, fn in saved.items():
                setattr(PeerAuth, name, fn)
            forget_peer_auth()
    per = clients * rounds
    return {"peer_auth": peer_auth, "round_seconds": secs,
            "steady_round_seconds": statistics.median(secs[1:-1] if len(secs) >= 4 else secs[1:] or secs),
            "calls": clock.calls,
            "ms_per_client_round": {k: 1e3 * v / per for k, v in clock.seconds.items()}}


def primitives(number: int = 2000) -> dict[str, float]:
    """One client's own crypto cost, uncached: an Ed25519 signature and verification (microseconds). A
    SuperNode pays one signature and one verification per roster entry a round (the in-process engine's
    cache shares the verifications of one statement between its clients)."""
    import os
    import timeit

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key, data = Ed25519PrivateKey.generate(), os.urandom(200)
    public, sig = key.public_key(), key.sign(data)
    return {"sign_us": 1e6 * timeit.timeit(lambda: key.sign(data), number=number) / number,
            "verify_us": 1e6 * timeit.timeit(lambda: public.verify(sig, data), number=number) / number}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if args.clients < 5 or args.rounds < 2 or args.repeats < 1:
        p.error("--clients must be >= 5, --rounds >= 2 and --repeats >= 1")
    runs = [measure(clients=args.clients, rounds=args.rounds, peer_auth=mode)
            for _ in range(args.repeats) for mode in ("relay", "pin")]
    steady = {m: statistics.median(r["steady_round_seconds"] for r in runs if r["peer_auth"] == m)
              for m in ("relay", "pin")}
    out = {"clients": args.clients, "rounds": args.rounds, "privacy": "distributed", "schedule": "active",
           "steady_round_seconds": steady, "pin_over_relay": steady["pin"] / steady["relay"],
           "ed25519": primitives(), "runs": runs}
    text = json.dumps(out, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
