"""Per-test CPU time report for the accounting tests (wall time is meaningless on a shared machine)."""

from __future__ import annotations

import os
import time

import pytest

_CPU: dict[str, float] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):  # type: ignore[no-untyped-def]
    c0 = time.process_time()
    yield
    _CPU[item.nodeid] = time.process_time() - c0


def pytest_terminal_summary(terminalreporter):  # type: ignore[no-untyped-def]
    if not os.environ.get("FEDPRIVACY_CPU_REPORT") or not _CPU:
        return
    terminalreporter.write_line(f"accounting tests CPU total: {sum(_CPU.values()):.1f}s")
    for nodeid, cpu in sorted(_CPU.items(), key=lambda kv: -kv[1])[:15]:
        terminalreporter.write_line(f"{cpu:7.2f}s cpu  {nodeid}")
