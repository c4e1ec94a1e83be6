"""Checkpoints: the last complete round wins; leftovers of an interrupted write are ignored."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedprivacy.accounting import Accountant, GaussianEvent, NoSampling, PrivacyEvent
from fedprivacy.fl.checkpoint import load_checkpoint, save_checkpoint


def test_last_complete_round_is_loaded_and_old_files_removed(tmp_path: Path) -> None:
    acc = Accountant(backend="rdp")
    event = PrivacyEvent(mechanism=GaussianEvent(noise_multiplier=1.0), sampling=NoSampling())
    for r in (1, 2):
        acc.spend(event, round=r)
        save_checkpoint(tmp_path, round=r, weights=[np.full(3, r, np.float32)], accountant=acc,
                        rows=[{"round": i} for i in range(1, r + 1)], config={"seed": 1})
    # an interrupted write of round 3: model file and a temp file, but no new state.json
    (tmp_path / "model-00003.npz").write_bytes(b"partial")
    (tmp_path / ".state.json.123.tmp").write_text("{")
    ckpt = load_checkpoint(tmp_path)
    assert ckpt is not None and ckpt.round == 2
    np.testing.assert_array_equal(ckpt.weights[0], np.full(3, 2, np.float32))
    assert [row["round"] for row in ckpt.rows] == [1, 2]
    restored = Accountant.load(ckpt.ledger_path)
    assert restored.epsilon(delta=1e-5) == acc.epsilon(delta=1e-5)
    assert not (tmp_path / "model-00001.npz").exists() and not (tmp_path / "ledger-00001.json").exists()


def test_no_checkpoint_is_none(tmp_path: Path) -> None:
    assert load_checkpoint(tmp_path) is None
