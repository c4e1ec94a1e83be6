"""Shared fixtures for the in-process engine tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TOYAPP_DIR = Path(__file__).parent / "toyapp"
REPO_DIR = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session", autouse=True)
def _one_thread() -> None:
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


@pytest.fixture(scope="session")
def toyapp_dir() -> Path:
    return TOYAPP_DIR
