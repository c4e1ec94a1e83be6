"""Seeded reference runs that pin the behaviour of the whole stack under refactoring.

Each config runs the real ServerApp and ClientApp on the in-process engine (6 partitions of digits,
2 rounds, seeded research mode). :func:`fingerprint` keeps everything a run publishes that must not
change under a refactoring: every per-round figure except wall time, the whole ``privacy`` block
(ε, the claim, the distributed summary), and a fingerprint of the final global weights (per tensor: its
shape, L2 norm and three fixed random projections, plus the SHA-256 of all bytes).

Torch and the FFTs behind the PLD accountant pick their kernels by CPU, so another machine reproduces
a run only up to the last bits of its floats. :func:`assert_same` therefore compares every float to
``REL_TOL`` relative (a changed noise draw, cohort or accounting rule moves them by far more) and
everything else exactly; the weights' SHA-256 is informational.

A change that is *meant* to alter behaviour (new noise, new accounting) re-records ``runs.json`` with
``python tests/golden/golden.py --write`` and says why in its commit message.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
REFERENCE = Path(__file__).with_name("runs.json")

_COMMON: dict[str, Any] = {"num-server-rounds": 2, "seed": 11, "local-epochs": 1, "dataset": "digits",
                           "client-timeout": 30.0, "batched-training": "off"}
# The golden runs pin the per-client path; tests/engine/test_batched_engine.py holds the batched path
# (the default, ``auto``) to the same ε and figures.
# The Fashion-MNIST benchmark recipe (scripts/benchmark.py --setup fedavgm-c300: 3000 clients x 20 examples,
# convnet, 2 local epochs, batch 10, FedAvgM) with ~6 clients per round: pins the convnet's training path
# (its max pools) and FedAvgM.
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
REL_TOL = 1e-6
# The convnet's second round starts from a model whose loss has blown up (lr 0.1 with momentum), where the
# last bits of the first round move a test example across the decision boundary: one in 10,000.
# The secure run's fixed-point encoding rounds each coordinate stochastically: a last-bit difference in
# training can flip one rounding (a step of 1/s), seen as 1.3e-6 of a tensor's norm on one CPU against
# another. A changed noise draw or cohort moves the weights by far more than 1e-5.
REL_TOLS: dict[str, float] = {FASHION: 1e-3, "distributed-secagg": 1e-5}
_PROJECTIONS = 3


def weights_fingerprint(weights: list[np.ndarray]) -> list[dict[str, Any]]:
    """Per tensor: shape, dtype, L2 norm and ``_PROJECTIONS`` seeded random projections (float64)."""
    rng = np.random.default_rng(0)
    out = []
    for w in weights:
        a = np.asarray(w, dtype=np.float64).ravel()
        proj = rng.standard_normal((_PROJECTIONS, a.size)) @ a
        out.append({"shape": list(np.shape(w)), "dtype": np.asarray(w).dtype.str,
                    "l2": float(np.linalg.norm(a)), "projections": [float(x) for x in proj]})
    return out


def weights_digest(weights: list[np.ndarray]) -> str:
    h = hashlib.sha256()
    for w in weights:
        a = np.ascontiguousarray(w)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def fingerprint(results: dict[str, Any], weights: list[np.ndarray]) -> dict[str, Any]:
    """What must stay the same: results without wall times and paths, plus the weights' fingerprint."""
    out = {k: v for k, v in results.items() if k not in _VOLATILE_KEYS}
    out["rounds"] = [{k: v for k, v in row.items() if k not in _VOLATILE_ROW_KEYS}
                     for row in results["rounds"]]
    out["weights"] = weights_fingerprint(weights)
    out["weights_sha256"] = weights_digest(weights)
    return json.loads(json.dumps(out))  # the JSON form (tuples -> lists), as the file stores it


def differences(got: Any, want: Any, path: str = "", *, rel_tol: float = REL_TOL) -> list[str]:
    """Where ``got`` and ``want`` differ: floats beyond ``rel_tol`` relative (the weights' projections
    relative to their tensor's L2 norm), anything else at all; the SHA-256 is not compared."""
    if isinstance(want, dict) and isinstance(got, dict):
        if set(got) != set(want):
            return [f"{path}: keys {sorted(set(got) ^ set(want))} differ"]
        return [d for k in want if k != "weights_sha256"
                for d in _differences_at(got, want, k, path, rel_tol)]
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return [f"{path}: length {len(got)} != {len(want)}"]
        return [d for i, (g, w) in enumerate(zip(got, want, strict=True))
                for d in differences(g, w, f"{path}[{i}]", rel_tol=rel_tol)]
    if isinstance(want, float) and isinstance(got, float | int) and not isinstance(got, bool):
        return [] if math.isclose(got, want, rel_tol=rel_tol, abs_tol=0.0) else [f"{path}: {got!r} != {want!r}"]
    return [] if got == want else [f"{path}: {got!r} != {want!r}"]


def _differences_at(got: dict[str, Any], want: dict[str, Any], key: str, path: str,
                    rel_tol: float) -> list[str]:
    if key == "projections" and isinstance(want.get("l2"), float):
        scale = max(want["l2"], 1e-12)
        return [f"{path}.{key}[{i}]: {g!r} != {w!r}" for i, (g, w) in enumerate(zip(got[key], want[key], strict=True))
                if abs(g - w) > rel_tol * scale]
    return differences(got[key], want[key], f"{path}.{key}", rel_tol=rel_tol)


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
    bad = [n for n in CONFIGS if differences(got[n], ref.get(n), rel_tol=REL_TOLS.get(n, REL_TOL))]
    print("identical" if not bad else f"differs: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
