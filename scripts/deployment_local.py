"""Run fedprivacy on Flower's Deployment Engine over loopback: one SuperLink, N SuperNodes, `flwr run`.

The copy-paste recipe of the README's "Scaling out", as one command that also cleans up. In a private
``FLWR_HOME`` (a temporary folder) it

1. checks the run configuration first (nothing is started for a refused one; exit code 2);
2. starts ``flower-superlink --insecure --host 127.0.0.1 --port <P>``: in Flower 1.42 the Fleet,
   Control and Runtime APIs are all served over HTTP on that one port (default 8000);
3. starts N ``flower-supernode --insecure --superlink 127.0.0.1:<P> --port <Q_i> --node-config
   "partition-id=i num-partitions=N ..."``: every SuperNode on one host needs its own ``--port`` (its
   ClientApp runtime API, default 9094);
4. writes the connection ``[superlink.loopback] address = "127.0.0.1:<P>" insecure = true`` to
   ``$FLWR_HOME/config.toml`` and runs ``flwr run . loopback --stream``;
5. stops exactly the processes it started (they all carry the private ``FLWR_HOME``), also when it is
   interrupted or killed (watchdog, parent-death signal), and removes the temporary folder.

The exit code is the run's: 0 completed, 1 error, 2 bad configuration, 3 budget stop, 4 client failures,
5 no SuperNode answered (e.g. ``--start 0``), 130 interrupted. Idle SuperNodes poll every 3 s, so a round
takes tens of seconds here; the same apps run unchanged on real machines.

Usage: ``python scripts/deployment_local.py [--supernodes 3] [--run-config "num-server-rounds=2"]``.
"""

from __future__ import annotations

import argparse
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _wait_port(port: int, *, timeout: float, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"flower-superlink exited with code {proc.returncode} before listening")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout:g} s")


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--supernodes", type=int, default=3, help="partitions N, one SuperNode each (default 3)")
    p.add_argument("--start", type=int, default=None,
                   help="SuperNodes actually started (default N; fewer leaves partitions unanswered)")
    p.add_argument("--run-config", default="", help='overrides, e.g. "num-server-rounds=2 local-epochs=1"')
    p.add_argument("--node-config", default="", help="extra node config for every SuperNode, e.g. "
                   "\"client-allow-seeded=true client-max-rho-total='inf'\" (the client's own privacy floor; a seeded "
                   "round costs an unbounded rho)")
    p.add_argument("--port", type=int, default=0, help="SuperLink port (default: a free one; Flower's is 8000)")
    p.add_argument("--timeout", type=float, default=None, help="seconds before giving up on flwr run")
    p.add_argument("--logs", type=Path, default=None, help="keep the SuperLink/SuperNode logs in this folder")
    return p.parse_args(argv)


def _start_federation(spawn: Callable[[list[str], str], subprocess.Popen[bytes]], *, args: argparse.Namespace,
                      home: Path, port: int, start: int, prog: str) -> None:
    """The SuperLink on loopback, ``start`` SuperNodes, and the flwr CLI's connection to them."""
    from server.engine.flower import free_port

    bindir = Path(sys.executable).parent
    link = spawn([str(bindir / "flower-superlink"), "--insecure", "--host", "127.0.0.1", "--port",
                  str(port), "--database", str(home / "state.db")], "superlink.log")
    _wait_port(port, timeout=120, proc=link)
    print(f"{prog}: SuperLink on 127.0.0.1:{port} (Fleet, Control and Runtime APIs), FLWR_HOME={home}", flush=True)
    for i in range(start):
        node_port = free_port()
        node_cfg = f"partition-id={i} num-partitions={args.supernodes} {args.node_config}".strip()
        spawn([str(bindir / "flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{port}",
               "--port", str(node_port), "--node-config", node_cfg], f"supernode{i}.log")
        print(f"{prog}: SuperNode {i} (port {node_port}): {node_cfg}", flush=True)
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\naddress = "127.0.0.1:{port}"\n'
        "insecure = true\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    start = args.supernodes if args.start is None else args.start
    if args.supernodes < 1 or not 0 <= start <= args.supernodes:
        print(f"deployment_local: error: need --supernodes >= 1 and 0 <= --start <= --supernodes, got "
              f"{args.supernodes} and {start}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO))
    from fedprivacy.config import ConfigError
    from fedprivacy.exit_codes import STATUS_ENV, ExitCode
    from server.engine.flower import flwr_env, free_port, run_flwr, status_path
    from server.engine.launch import checked_run, report
    from server.engine.processes import (
        Watchdog,
        die_with_parent,
        signals_interrupt,
        stop_started_by,
    )

    prog = "deployment_local"
    try:
        pre = checked_run(args.run_config, app_dir=REPO, num_supernodes=args.supernodes,
                          default_output_dir=REPO / "runs",
                          run_name=time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3))
    except (ConfigError, FileNotFoundError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return int(ExitCode.CONFIG)
    from server.engine.appspec import config_string

    home = Path(tempfile.mkdtemp(prefix="fedprivacy-flwr-"))
    logs = args.logs or home
    logs.mkdir(parents=True, exist_ok=True)
    watchdog = Watchdog(home, remove=[home])
    env = {**flwr_env(home), STATUS_ENV: str(status_path(home))}  # the ServerApp runs under the SuperLink
    if not sys.stdout.isatty():  # its lines reach this stdout through flwr run: no colour codes there
        env.setdefault("NO_COLOR", "1")
    port = args.port or free_port()

    def spawn(cmd: list[str], log: str) -> subprocess.Popen[bytes]:
        with (logs / log).open("wb") as fh:
            return subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=home,
                                    start_new_session=True, preexec_fn=die_with_parent)

    try:
        with signals_interrupt():
            _start_federation(spawn, args=args, home=home, port=port, start=start, prog=prog)
            res = run_flwr(num_supernodes=args.supernodes, run_config=config_string(pre.overrides),
                           app_dir=REPO, flwr_home=home, timeout=args.timeout, echo=True,
                           connection="loopback")
        return report(prog, pre, res)
    except KeyboardInterrupt as exc:
        print(f"{prog}: interrupted ({str(exc) or 'SIGINT'}): the SuperLink, the SuperNodes and the run were "
              "stopped", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)
    finally:
        stop_started_by(home)  # run_flwr already did, unless we stopped before it ran
        shutil.rmtree(home, ignore_errors=True)
        watchdog.close()


if __name__ == "__main__":
    raise SystemExit(main())
