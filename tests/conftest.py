"""Suite-wide settings.

Hypothesis profiles: ``ci`` (selected by ``HYPOTHESIS_PROFILE=ci``, which ``.ci/run`` sets) is
derandomised, so a failure seen in CI reproduces on any machine from the same code, and prints the
reproduction blob; the default profile keeps fresh random examples for local runs.

On-disk caches (``fedprivacy.ml.partition``): the suite uses a fresh directory of its own unless
``FEDPRIVACY_CACHE_DIR`` is set, so tests neither read a user's cache nor leave files in it. The clients'
durable memory (a SuperNode's default directory, ``FEDPRIVACY_CLIENT_MEMORY_DIR``, and a simulation's
run-temporary area, ``FEDPRIVACY_RUN_TEMP``) is a directory of each test's own under pytest's temporary
root (removed with it): one test's charges never reach another's clients, nor a user's.

Parallel runs (pytest-xdist, a pinned dev dependency: ``pytest -q -n 2 --dist loadgroup``): every
test that starts a Flower engine, Ray, SuperLinks/SuperNodes or a launcher's process tree (``tests/e2e/``
and the files in ``ENGINE_FILES``) is put in one ``xdist_group``, so those run one after the other on
one worker while the other worker takes the rest; two engines never compete for ports, the two cores or
each other's processes. Native thread pools
(OpenBLAS, OpenMP, MKL) default to one thread per process: two workers that each spin two BLAS threads
on two cores run slower than one thread each, and the library's own training already uses one torch
thread (``fedprivacy.fl.task``).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # before numpy/torch load (workers and subprocesses inherit it)
if "FEDPRIVACY_CACHE_DIR" not in os.environ:  # the suite's own cache, removed at exit
    os.environ["FEDPRIVACY_CACHE_DIR"] = tempfile.mkdtemp(prefix="fedprivacy-test-cache-")
    atexit.register(shutil.rmtree, os.environ["FEDPRIVACY_CACHE_DIR"], ignore_errors=True)
# the clients' durable memory of what runs outside a test (module fixtures): the suite's own, removed at exit
_MEMORY_ROOT = tempfile.mkdtemp(prefix="fedprivacy-test-client-memory-")
atexit.register(shutil.rmtree, _MEMORY_ROOT, ignore_errors=True)
os.environ["FEDPRIVACY_CLIENT_MEMORY_DIR"] = os.path.join(_MEMORY_ROOT, "supernode")
os.environ["FEDPRIVACY_RUN_TEMP"] = os.path.join(_MEMORY_ROOT, "run-temp")

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
    "test_docs_examples.py",
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


@pytest.fixture(autouse=True)
def _client_memory(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's clients keep their durable memory in a directory of that test's own (subprocesses
    and engines started by the test inherit it)."""
    root = tmp_path_factory.mktemp("client-memory")
    monkeypatch.setenv("FEDPRIVACY_CLIENT_MEMORY_DIR", str(root / "supernode"))
    monkeypatch.setenv("FEDPRIVACY_RUN_TEMP", str(root / "run-temp"))
