"""The write-ahead journal: a charge is on disk before its release, and recovery never refunds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedprivacy.accounting import (
    Accountant,
    Budget,
    FixedCohortSampling,
    GaussianEvent,
    PoissonSampling,
    PrivacyBudgetExhausted,
    PrivacyEvent,
)
from fedprivacy.accounting.journal import ChargeJournal

DELTA = 1e-5
GAUSS = PrivacyEvent(mechanism=GaussianEvent(noise_multiplier=2.0))
POISSON = PrivacyEvent(
    mechanism=GaussianEvent(noise_multiplier=1.5), sampling=PoissonSampling(rate=0.2)
)


def test_charges_recover_to_the_same_accountant(tmp_path: Path) -> None:
    journal = ChargeJournal.create(tmp_path / "j.jsonl", Accountant())
    for r in range(1, 4):
        journal.charge(POISSON, round=r)
        journal.mark_completed(r)
    journal.charge(GAUSS, round=4)  # charged, never completed
    again = ChargeJournal.recover(tmp_path / "j.jsonl")

    def untimed(acc: Accountant) -> list[dict]:
        return [{k: v for k, v in e.items() if k != "timestamp"} for e in acc.to_json()["entries"]]

    assert untimed(again.accountant) == untimed(journal.accountant)
    # no wall-clock time on disk: charge-to-charge differences would give each round's duration
    assert {e["timestamp"] for e in again.accountant.to_json()["entries"]} == {0.0}
    assert again.accountant.epsilon(delta=DELTA) == journal.accountant.epsilon(delta=DELTA)
    assert again.charged_rounds == (1, 2, 3, 4)
    assert again.unfinished_rounds == (4,)


def test_the_header_keeps_the_plan_the_charges_were_made_with(tmp_path: Path) -> None:
    plan = {"noise_multiplier": 1.5, "event": POISSON.to_dict(), "num_server_rounds": 10}
    ChargeJournal.create(tmp_path / "j.jsonl", Accountant(), plan=plan).charge(POISSON, round=1)
    assert ChargeJournal.recover(tmp_path / "j.jsonl").plan == plan
    ChargeJournal.create(tmp_path / "none.jsonl", Accountant())
    assert ChargeJournal.recover(tmp_path / "none.jsonl").plan is None
    lines = (tmp_path / "j.jsonl").read_text().splitlines()
    head = json.loads(lines[0])
    (tmp_path / "bad.jsonl").write_text(json.dumps({**head, "plan": [1]}) + "\n" + lines[1] + "\n")
    with pytest.raises(ValueError, match="header plan must be a JSON object"):
        ChargeJournal.recover(tmp_path / "bad.jsonl")
    with pytest.raises(TypeError, match="plan must be a mapping"):
        ChargeJournal.create(tmp_path / "t.jsonl", Accountant(), plan=[1])  # type: ignore[arg-type]


def test_a_refused_charge_writes_nothing_and_spends_nothing(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    journal = ChargeJournal.create(path, Accountant(budget=Budget(epsilon=1.0, delta=DELTA)))
    before = path.read_bytes()
    with pytest.raises(PrivacyBudgetExhausted):
        journal.charge(PrivacyEvent(mechanism=GaussianEvent(noise_multiplier=0.5)), round=1)
    with pytest.raises(ValueError, match="unsupported event"):
        journal.charge(
            PrivacyEvent(
                mechanism=GaussianEvent(noise_multiplier=2.0),
                sampling=FixedCohortSampling(cohort=1, population=10),
            ),
            round=1,
        )
    assert path.read_bytes() == before
    assert journal.accountant.steps == 0


def test_a_torn_last_line_is_dropped_and_the_file_mended(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    journal = ChargeJournal.create(path, Accountant())
    journal.charge(GAUSS, round=1)
    full = path.read_bytes()
    line = json.dumps({"kind": "charge", "entry": journal.accountant.ledger[0].to_dict()}) + "\n"
    path.write_bytes(full + line.encode()[: len(line) // 2])  # the crash hit mid-write
    again = ChargeJournal.recover(path)
    assert again.charged_rounds == (1,)
    assert path.read_bytes() == full  # truncated back to the last complete line
    again.charge(GAUSS, round=2)
    assert ChargeJournal.recover(path).charged_rounds == (1, 2)


def test_a_damaged_line_before_the_end_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    journal = ChargeJournal.create(path, Accountant())
    journal.charge(GAUSS, round=1)
    journal.charge(GAUSS, round=2)
    lines = path.read_text().splitlines(keepends=True)
    lines[1] = lines[1][:10] + "\n"
    path.write_text("".join(lines))
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        ChargeJournal.recover(path)
    with pytest.raises(FileExistsError):
        ChargeJournal.create(path, Accountant())


_RECORD = st.lists(st.sampled_from(["charge", "complete"]), min_size=1, max_size=8)


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_RECORD, cut=st.floats(0.0, 1.0))
def test_any_crash_point_keeps_every_completed_write(tmp_path: Path, ops: list[str], cut: float) -> None:
    """Truncating the file anywhere (a crash at that byte) recovers exactly the charges whose line
    was complete, i.e. every charge whose ``charge()`` could have returned before the crash."""
    path = tmp_path / f"j{abs(hash((tuple(ops), cut)))}.jsonl"
    journal = ChargeJournal.create(path, Accountant())
    ends: list[tuple[int, int]] = []  # (byte offset after the charge's line, round)
    rnd = 0
    for op in ops:
        if op == "charge":
            rnd += 1
            journal.charge(GAUSS, round=rnd)
            ends.append((path.stat().st_size, rnd))
        elif rnd:
            journal.mark_completed(rnd)
    data = path.read_bytes()
    header_end = data.index(b"\n") + 1
    offset = header_end + int(cut * (len(data) - header_end))
    path.write_bytes(data[:offset])
    recovered = ChargeJournal.recover(path)
    assert recovered.charged_rounds == tuple(r for end, r in ends if end <= offset)


_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from fedprivacy.accounting import Accountant, GaussianEvent, PrivacyEvent
    from fedprivacy.accounting.journal import ChargeJournal

    path, kill_after = sys.argv[1], int(sys.argv[2])
    journal = ChargeJournal.open(path, Accountant())
    event = PrivacyEvent(mechanism=GaussianEvent(noise_multiplier=2.0))
    for r in range(1, 100):
        journal.charge(event, round=r)
        print(f"released {r}", flush=True)  # the release happens only after charge() returned
        if r == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.mark.parametrize("kill_after", [1, 3])
def test_sigkill_after_a_release_never_loses_its_charge(tmp_path: Path, kill_after: int) -> None:
    path = tmp_path / "j.jsonl"
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), str(kill_after)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    assert proc.returncode == -signal.SIGKILL
    released = [int(line.split()[1]) for line in proc.stdout.splitlines()]
    assert released == list(range(1, kill_after + 1))
    recovered = ChargeJournal.recover(path)
    assert recovered.charged_rounds == tuple(released)
    fresh = Accountant()
    for _ in released:
        fresh.spend(GAUSS)
    assert recovered.accountant.epsilon(delta=DELTA) >= fresh.epsilon(delta=DELTA)
