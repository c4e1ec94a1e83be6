"""The same seeded runs give the reference results and ε (to the last bits a CPU may change).

Reference outputs (``runs.json``) are recorded by ``golden.py --write``; see that module for what is
compared, with which tolerance, and how to re-record after an intended behaviour change.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from golden import CONFIGS, FASHION, REFERENCE, REL_TOL, REL_TOLS, differences, run

from fedprivacy.ml.datasets.fashion_mnist import DEBIAN_DIR, find_idx_dir


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    return json.loads(REFERENCE.read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_seeded_run_matches_the_reference(name: str, reference: dict[str, Any],
                                                       tmp_path: Path) -> None:
    if name == FASHION and find_idx_dir(DEBIAN_DIR) is None:
        pytest.skip("Debian's dataset-fashion-mnist is not installed (scripts/setup.sh installs it)")
    # Act
    got = run(name, tmp_path)
    # Assert: section by section, so a failure names what changed
    want = reference[name]
    tol = REL_TOLS.get(name, REL_TOL)
    for section in ("privacy", "rounds", "weights"):
        assert differences(got[section], want[section], section, rel_tol=tol) == []
    assert differences(got, want, rel_tol=tol) == []


def test_the_comparison_catches_a_change_beyond_the_last_bits(reference: dict[str, Any]) -> None:
    # Arrange: the reference of one run, then copies that move one figure a little and a lot
    want = reference["central-poisson"]
    eps = want["privacy"]["epsilon"]
    near = json.loads(json.dumps(want))
    near["privacy"]["epsilon"] = eps * (1 + 1e-9)
    far = json.loads(json.dumps(want))
    far["privacy"]["epsilon"] = eps * (1 + 1e-4)
    moved = json.loads(json.dumps(want))
    moved["weights"][0]["projections"][0] += 1e-3 * moved["weights"][0]["l2"]
    # Act / Assert
    assert differences(near, want) == []
    assert differences(far, want) == [f".privacy.epsilon: {eps * (1 + 1e-4)!r} != {eps!r}"]
    assert len(differences(moved, want)) == 1
