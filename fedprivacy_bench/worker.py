"""Run one benchmark spec in this (fresh) process and write its record as JSON.

``python -m fedprivacy_bench.worker --spec '<json>' --out PATH``. ``scripts/benchmark.py`` starts one
worker per configuration so that start-up costs, imports and peak memory belong to that
configuration alone, and samples the memory of the worker's whole process tree (Ray starts
several processes) while it runs (``fedprivacy_bench.memory``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from fedprivacy_bench.spec import BenchSpec, make_record


def run_spec(spec: BenchSpec, *, keep_dir: Path | None = None) -> dict[str, Any]:
    """Dispatch ``spec`` to its runner (``keep_dir``: keep a fedprivacy row's final model there)."""
    if spec.framework == "torch":
        from fedprivacy_bench.torch_loop import run_torch_loop

        return run_torch_loop(spec)
    if spec.framework == "flower":
        from fedprivacy_bench.flower_baselines.run import run_flower_baseline

        return run_flower_baseline(spec)
    from fedprivacy_bench.fedprivacy_runner import run_fedprivacy

    return run_fedprivacy(spec, keep_dir=keep_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", required=True, help="BenchSpec as JSON")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--keep-model-dir", type=Path, default=None,
                        help="keep a fedprivacy row's final global model here (fedprivacy_bench.kept_models)")
    args = parser.parse_args(argv)
    spec = BenchSpec.from_dict(json.loads(args.spec))
    t0 = time.perf_counter()
    try:
        record = run_spec(spec, keep_dir=args.keep_model_dir)
    except Exception as exc:  # a failed config becomes a row saying why, the sweep goes on
        record = make_record(spec, status="failed",
                             note=f"{type(exc).__name__}: {exc}".splitlines()[0][:300])
        traceback.print_exc(file=sys.stderr)
    if record.get("wall_seconds") is None:
        record["wall_seconds"] = time.perf_counter() - t0
    args.out.write_text(json.dumps(record, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
