#!/usr/bin/env bash
# Sets up a virtual environment in .venv with fedprivacy and everything it needs (CPU-only torch).
# Idempotent: a second run only checks that the installed versions still match.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# torch is pinned to the CPU build (an unpinned torch can pull a multi-GB CUDA build);
# constraints.txt pins every other package to the versions the suite was run with.
.venv/bin/python -m pip install --quiet --disable-pip-version-check \
  "torch==2.13.0" -c constraints.txt -e ".[dev]"
echo "fedprivacy environment ready in .venv"
