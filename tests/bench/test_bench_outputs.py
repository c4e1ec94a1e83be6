"""scripts/benchmark.py writes the committed docs only for the full sweep without --out."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "benchmark.py"


def _script():
    spec = importlib.util.spec_from_file_location("benchmark_script_outputs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_never_writes_the_committed_docs(tmp_path: Path) -> None:
    bench = _script()
    committed = {bench.DOCS_MD, bench.IMG_DIR, bench.RESULTS_DIR}

    quick = bench.output_paths(quick=True, out=None, no_docs=False)
    into = bench.output_paths(quick=True, out=tmp_path, no_docs=False)
    full_elsewhere = bench.output_paths(quick=False, out=tmp_path, no_docs=False)

    assert not committed & set(quick)
    assert quick == (bench.QUICK_OUT / "BENCHMARKS.md", bench.QUICK_OUT / "img", bench.QUICK_OUT)
    assert into == full_elsewhere == (tmp_path / "BENCHMARKS.md", tmp_path / "img", tmp_path)
    assert bench.output_paths(quick=False, out=None, no_docs=False) == (
        bench.DOCS_MD, bench.IMG_DIR, bench.RESULTS_DIR)
    assert bench.output_paths(quick=True, out=tmp_path, no_docs=True) == (None, None, None)
