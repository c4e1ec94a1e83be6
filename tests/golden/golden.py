"""Seeded reference runs that pin the behaviour of the whole stack (issue 14: "behaviour unchanged").

Each config runs the real ServerApp and ClientApp on the in-process engine (6 partitions of digits,
2 rounds, seeded research mode). :func:`fingerprint` keeps everything a run publishes that must not
change under a refactoring: every per-round figure except wall time, the whole ``privacy`` block
(ε, the claim, the distributed summary), and a SHA-256 of the final global weights' bytes.

The reference file ``runs.json`` was recorded on main at ``8cd920e`` (before the issue-14 redesign)
with ``python tests/golden/golden.py --write``. A change that is *meant* to alter behaviour (new noise,
new accounting) re-records it with the same command and says why in its commit message.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
REFERENCE = Path(__file__).with_name("runs.json")

_COMMON: dict[str, Any] = {"num-server-rounds": 2, "seed": 11, "local-epochs": 1, "dataset": "digits",
                           "client-timeout": 30.0}
# data3's Fashion-MNIST benchmark recipe (scripts/benchmark.py --setup fedavgm-c300: 3000 clients x 20 examples,
# convnet, 2 local epochs, batch 10, FedAvgM) with ~6 clients per round: pins the convnet's training path
# (its max pools; issue 16) and FedAvgM. Recorded on main c63cb7b, before the pool's fast path.
FASHION = "fashion-convnet-fedavgm"
SUPERNODES: dict[str, int] = {FASHION: 3000}
CONFIGS: dict[str, dict[str, Any]] = {
    "none": {"privacy": "none", "secagg": False, "accountant": "pld"},
    "central-poisson": {"privacy": "central", "secagg": False, "accountant": "pld",
                        "sample-rate": 0.5, "noise-multiplier": 1.1},
    "local": {"privacy": "local", "secagg": False, "accountant": "rdp", "noise-multiplier": 0.8},
    "distributed-secagg": {"privacy": "distributed", "secagg": True, "accountant": "rdp",
                           "target-delta": 1e-3},
    FASHION: {"dataset": "fashion-mnist", "model": "convnet", "partitioner": "iid", "privacy": "central",
              "secagg": False, "accountant": "pld", "sampling": "poisson", "sample-rate": 0.002,
              "noise-multiplier": 1.0, "clip-norm": 0.5, "local-epochs": 2, "batch-size": 10,
              "learning-rate": 0.1, "server-optimizer": "fedavgm", "server-learning-rate": 1.0,
              "server-momentum": 0.9},
    "central-fixed-cohort": {"privacy": "central", "secagg": False, "accountant": "rdp",
                             "sampling": "fixed", "cohort-size": 4, "neighbouring": "replace-one",
                             "target-delta": 1e-3},
}
NUM_SUPERNODES = 6
_VOLATILE_ROW_KEYS = ("seconds",)
_VOLATILE_KEYS = ("seconds", "run_dir", "run_name", "config")


def weights_digest(weights: list[np.ndarray]) -> str:
    h = hashlib.sha256()
    for w in weights:
        a = np.ascontiguousarray(w)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def fingerprint(results: dict[str, Any], weights: list[np.ndarray]) -> dict[str, Any]:
    """What must stay bit-identical: results without wall times and paths, plus the weights' digest."""
    out = {k: v for k, v in results.items() if k not in _VOLATILE_KEYS}
    out["rounds"] = [{k: v for k, v in row.items() if k not in _VOLATILE_ROW_KEYS}
                     for row in results["rounds"]]
    out["weights_sha256"] = weights_digest(weights)
    return json.loads(json.dumps(out))  # the JSON form (tuples -> lists), as the file stores it


def run(name: str, out_dir: Path) -> dict[str, Any]:
    """Run config ``name`` on the in-process engine; its fingerprint."""
    from fedprivacy.fl.checkpoint import load_checkpoint
    from server.engine import run_inprocess

    run_config = {**_COMMON, **CONFIGS[name], "output-dir": str(out_dir), "run-name": name}
    run_inprocess(run_config=run_config, num_supernodes=SUPERNODES.get(name, NUM_SUPERNODES), app_dir=REPO,
                  node_id_seed=3)
    results = json.loads((out_dir / name / "results.json").read_text(encoding="utf-8"))
    ckpt = load_checkpoint(out_dir / name / "checkpoint")
    if ckpt is None:
        raise RuntimeError(f"run {name!r} left no checkpoint")
    return fingerprint(results, [np.asarray(w) for w in ckpt.weights])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"re-record {REFERENCE.name}")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    with tempfile.TemporaryDirectory() as tmp:
        got = {name: run(name, Path(tmp)) for name in CONFIGS}
    if args.write:
        REFERENCE.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        print(f"wrote {REFERENCE}")
        return 0
    ref = json.loads(REFERENCE.read_text(encoding="utf-8"))
    bad = [n for n in CONFIGS if ref.get(n) != got[n]]
    print("identical" if not bad else f"differs: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
