"""The documentation site, API reference included, builds with MkDocs in strict mode: 0 warnings.

A broken link or anchor, a docstring that mkdocstrings cannot parse (a parameter the signature does
not have) or a page left out of the navigation fails the build. ``scripts/setup.sh`` installs the
``docs`` extra, so the tools are there wherever the suite runs.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
API_PAGES = ("cli", "config", "python", "flower")


@pytest.mark.slow
def test_the_site_builds_without_a_warning(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    for page in API_PAGES:  # one page per public entry point, each rendering its objects
        html = (tmp_path / "api" / page / "index.html").read_text(encoding="utf-8")
        assert 'class="doc doc-object' in html or "doc-heading" in html, page
