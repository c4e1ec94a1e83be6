"""opacus 1.6 installs a top-level package named ``benchmarks``; the repository's must win."""

import sys
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[2])
if sys.path[:1] != [REPO]:
    sys.path.insert(0, REPO)
for name in [m for m in sys.modules if m == "benchmarks" or m.startswith("benchmarks.")]:
    if not str(getattr(sys.modules[name], "__file__", "") or "").startswith(REPO):
        del sys.modules[name]
