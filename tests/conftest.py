"""Suite-wide settings.

Hypothesis profiles: ``ci`` (selected by ``HYPOTHESIS_PROFILE=ci``, which ``.ci/run`` sets) is
derandomised, so a failure seen in CI reproduces on any machine from the same code, and prints the
reproduction blob; the default profile keeps fresh random examples for local runs.

On-disk caches (``fedprivacy.ml.partition``): the suite uses a fresh directory of its own unless
``FEDPRIVACY_CACHE_DIR`` is set, so tests neither read a user's cache nor leave files in it.

Parallel runs (pytest-xdist, a pinned dev dependency: ``pytest -q -n 2 --dist loadgroup``): every
test that starts a Flower engine, Ray, SuperLinks/SuperNodes or a launcher's process tree (``tests/e2e/``
and the files in ``ENGINE_FILES``) is put in one ``xdist_group``, so those run one after the other on
one worker while the other worker takes the rest; two engines never compete for ports, the two cores or
each other's processes (the ``flock /work/.e2e.lock`` rule, inside one run). Native thread pools
(OpenBLAS, OpenMP, MKL) default to one thread per process: two workers that each spin two BLAS threads
on two cores run slower than one thread each, and the library's own training already uses one torch
thread (``fedprivacy.fl.task``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # before numpy/torch load (workers and subprocesses inherit it)
os.environ.setdefault("FEDPRIVACY_CACHE_DIR", tempfile.mkdtemp(prefix="fedprivacy-test-cache-"))

settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


# Tests outside tests/e2e/ that start engines, launchers or watch process trees (slow or not).
ENGINE_FILES = frozenset({
    "engine/test_launcher.py",
    "engine/test_processes.py",
    "engine/test_real_apps.py",
    "engine/test_cli_simulate.py",
    "server/test_flower_accountant_e2e.py",
    "sweep/test_sweep_runs.py",
})
_TESTS = Path(__file__).resolve().parent


def engine_test(rel: str) -> bool:
    """Whether the test file (relative to tests/) starts engines or process trees."""
    return rel in ENGINE_FILES or rel.startswith("e2e/")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if engine_test(item.path.resolve().relative_to(_TESTS).as_posix()):
            item.add_marker(pytest.mark.xdist_group("engines"))
