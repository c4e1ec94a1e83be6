"""Suite-wide settings.

Hypothesis profiles: ``ci`` (selected by ``HYPOTHESIS_PROFILE=ci``, which ``.ci/run`` sets) is
derandomised, so a failure seen in CI reproduces on any machine from the same code, and prints the
reproduction blob; the default profile keeps fresh random examples for local runs.

On-disk caches (``fedprivacy.ml.partition``): the suite uses a fresh directory of its own unless
``FEDPRIVACY_CACHE_DIR`` is set, so tests neither read a user's cache nor leave files in it.
"""

from __future__ import annotations

import os
import tempfile

from hypothesis import settings

os.environ.setdefault("FEDPRIVACY_CACHE_DIR", tempfile.mkdtemp(prefix="fedprivacy-test-cache-"))

settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
