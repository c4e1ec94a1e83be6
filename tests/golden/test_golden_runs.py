"""The same seeded runs give bit-identical results and ε before and after the issue-14 redesign.

Reference outputs (``runs.json``) were recorded on main at ``8cd920e`` by ``golden.py --write``; see
that module for what is compared and how to re-record after an intended behaviour change.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from golden import CONFIGS, FASHION, REFERENCE, run

from fedprivacy.ml.datasets.fashion_mnist import DEBIAN_DIR, find_idx_dir


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    return json.loads(REFERENCE.read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_seeded_run_is_bit_identical_to_the_reference(name: str, reference: dict[str, Any],
                                                       tmp_path: Path) -> None:
    if name == FASHION and find_idx_dir(DEBIAN_DIR) is None:
        pytest.skip("Debian's dataset-fashion-mnist is not installed (scripts/setup.sh installs it)")
    # Act
    got = run(name, tmp_path)
    # Assert: section by section, so a failure names what changed
    want = reference[name]
    assert got["privacy"] == want["privacy"]
    assert got["rounds"] == want["rounds"]
    assert got["weights_sha256"] == want["weights_sha256"]
    assert got == want
