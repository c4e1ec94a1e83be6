#!/usr/bin/env bash
# Sets up a virtual environment in .venv with fedprivacy and everything it needs (CPU-only torch),
# and installs the offline Fashion-MNIST data (Debian's dataset-fashion-mnist) when apt is available.
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
  "torch==2.13.0" -c constraints.txt -e ".[dev,docs,tracking]"

# Fashion-MNIST (dataset=fashion-mnist, the benchmark's data): Debian packages it as
# dataset-fashion-mnist (30 MB; IDX files under /usr/share/datasets/fashion-mnist/). Installed only
# when it is missing and apt-get is there; as root directly, otherwise through sudo if that needs no
# password. Elsewhere, point data-dir or FEDPRIVACY_DATA_DIR at the four IDX files (see README).
FMNIST=/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
if [ ! -f "$FMNIST" ] && command -v apt-get >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"; else SUDO=skip; fi
  fi
  if [ "$SUDO" = skip ]; then
    echo "note: Fashion-MNIST not installed (needs root: apt-get install dataset-fashion-mnist)" >&2
  else
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1 \
      || { $SUDO apt-get update -q >/dev/null 2>&1 && $SUDO apt-get install -y -q dataset-fashion-mnist >/dev/null; } \
      || echo "note: could not install dataset-fashion-mnist; dataset=fashion-mnist needs data-dir" >&2
  fi
fi
echo "fedprivacy environment ready in .venv"
