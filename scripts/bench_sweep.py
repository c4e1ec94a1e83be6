"""Parallel speed-up of ``fedprivacy sweep``: one small grid run serially (``--jobs 1``) and with
``--jobs N`` in one process, each into a fresh folder; prints and writes (``--json``) both wall times,
their ratio, the load average and the machine's cores. Compare ratios from one run only."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_HEADER = """
[sweep]
name = "{name}"
num-supernodes = {{clients}}
seeds = [{{seeds}}]

[base]
dataset = "digits"
num-server-rounds = {{rounds}}
local-epochs = 1
noise-multiplier = 0.0
"""
GRID = _HEADER.format(name="speedup") + """secagg = false

[grid]
privacy = "central"
target-epsilon = [1.0, 4.0]
"""
# The goal grid: 4 modes x 4 target epsilons x the seeds (distributed needs secure aggregation)
MODES_GRID = _HEADER.format(name="speedup-modes") + """
[[grid]]
privacy = ["central", "local", "dpftrl"]
secagg = false
target-epsilon = [1.0, 2.0, 4.0, 8.0]

[[grid]]
privacy = "distributed"
secagg = true
target-epsilon = [1.0, 2.0, 4.0, 8.0]
"""
GRIDS = {"small": GRID, "modes": MODES_GRID}
CHILD = "import sys; from server.engine.cli import main; sys.exit(main(sys.argv[1:]))"


def _timed(sweep: Path, out: Path, jobs: int) -> dict[str, object]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", CHILD, "sweep", str(sweep), "--out", str(out),
                           "--jobs", str(jobs), "--app-dir", str(REPO), "--json"],
                          capture_output=True, text=True, check=False)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"sweep --jobs {jobs} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return {"jobs": jobs, "wall_seconds": round(wall, 2), **json.loads(proc.stdout.splitlines()[-1])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--seeds", default="0,1", help="seeds of every grid point, e.g. 0,1")
    ap.add_argument("--grid", choices=sorted(GRIDS), default="small",
                    help="small: central x 2 epsilons; modes: 4 modes x 4 epsilons")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        sweep = Path(tmp) / "grid.toml"
        sweep.write_text(GRIDS[args.grid].format(clients=args.clients, rounds=args.rounds, seeds=args.seeds))
        serial = _timed(sweep, Path(tmp) / "serial", 1)
        parallel = _timed(sweep, Path(tmp) / "parallel", args.jobs)
    result = {"grid": args.grid, "runs": serial["runs"], "rounds": args.rounds, "clients": args.clients,
              "cores": os.cpu_count(), "load_average": os.getloadavg(),
              "serial_seconds": serial["wall_seconds"], "parallel_seconds": parallel["wall_seconds"],
              "jobs": args.jobs,
              "speedup": round(float(serial["wall_seconds"]) / float(parallel["wall_seconds"]), 3)}
    print(f"sweep of {result['runs']} runs: serial {result['serial_seconds']} s, --jobs {args.jobs} "
          f"{result['parallel_seconds']} s, speed-up {result['speedup']}x (load {result['load_average']})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
