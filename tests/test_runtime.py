"""fedprivacy.runtime.keep_freed_memory: argument checks and its effect on page faults (glibc)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fedprivacy.runtime import keep_freed_memory

_PROBE = """
import resource, sys
import numpy as np
if sys.argv[1] == "tuned":
    from fedprivacy.runtime import keep_freed_memory
    assert keep_freed_memory()
sizes = [1 << 17, 3 << 15, 1 << 16, 5 << 15, 1 << 15]  # 0.25-1 MiB of float64, like an encoder's
def work():
    alive = [np.ones(n) for n in sizes]  # several temporaries at once, of mixed sizes, then freed
    del alive
for _ in range(3):
    work()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    work()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_freed_temporaries_are_reused_instead_of_faulted_in_again() -> None:
    default, tuned = _faults("default"), _faults("tuned")
    assert tuned < 200 <= default  # glibc 2.36 here: ~21k page faults without, ~0 with
    assert keep_freed_memory() is True  # idempotent in this process too


@pytest.mark.parametrize("kwargs", [{"mmap_mb": 0}, {"trim_mb": 2000}, {"mmap_mb": True}])
def test_arguments_are_checked_and_named(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        keep_freed_memory(**kwargs)
