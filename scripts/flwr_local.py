"""Run fedprivacy with ``flwr run .`` on a local Flower simulation, offline, and clean up afterwards.

This is the README's main command, a thin entry point over :func:`server.engine.flower.run_flwr`: a
private ``FLWR_HOME`` (a fresh temporary folder unless ``--flwr-home`` is given; the user's ``~/.flwr``
is untouched), no runtime dependency installation, no telemetry, free ports for the local SuperLink,
``flwr run . --federation-config "num-supernodes=N client-resources-num-cpus=1" --stream``, and
afterwards it stops the processes this run started (and only those), by process id, also when it is
interrupted or killed.

The configuration is checked before anything starts (one line naming the key, exit code 2). The exit
code is the run's, not ``flwr run``'s: 0 completed, 1 error, 2 bad configuration, 3 budget stop,
4 client failures, 5 no SuperNode answered, 130 interrupted (README "Exit codes").

``--ray-address auto|HOST:PORT`` runs the simulation on a running Ray cluster instead of a private Ray
instance, and leaves the cluster running (``server.engine.ray_cluster``, docs/ENGINE.md).

Usage: ``python scripts/flwr_local.py [--supernodes 10] [--run-config "num-server-rounds=5 seed=0"]``.
Results land in ``runs/<run-name or timestamp>/`` of the repository unless ``output-dir`` is given.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Run fedprivacy with `flwr run .` on a local Flower simulation, offline; stop "
                    "everything it started afterwards. Exit codes: 0 completed, 1 error, 2 bad "
                    "configuration, 3 budget stop, 4 client failures, 5 no SuperNode answered, "
                    "130 interrupted.")
    parser.add_argument("--supernodes", type=int, default=10, help="simulated clients (default 10)")
    parser.add_argument("--run-config", default="", help='overrides, e.g. "num-server-rounds=5 seed=0"')
    parser.add_argument("--flwr-home", type=Path, default=None, help="FLWR_HOME (default: a temp folder)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds before giving up")
    parser.add_argument("--ray-address", default=None,
                        help="run on this running Ray cluster: 'auto' or HOST:PORT of its head "
                             "(default: a private Ray instance)")
    args = parser.parse_args(argv)
    if args.supernodes < 1:
        print(f"flwr_local: error: --supernodes must be >= 1, got {args.supernodes}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO))
    from server.engine.ray_cluster import check_reachable

    if args.ray_address is not None:
        try:
            check_reachable(args.ray_address)
        except ValueError as exc:
            print(f"flwr_local: error: --ray-address: {exc}", file=sys.stderr)
            return 2
    from server.engine.launch import launch_flwr

    return launch_flwr(num_supernodes=args.supernodes, run_config=args.run_config, app_dir=REPO,
                       default_output_dir=REPO / "runs", flwr_home=args.flwr_home, timeout=args.timeout,
                       prog="flwr_local", run_name=time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3),
                       ray_address=args.ray_address)


if __name__ == "__main__":
    raise SystemExit(main())
