"""Suite-wide settings.

Hypothesis profiles: ``ci`` (selected by ``HYPOTHESIS_PROFILE=ci``, which ``.ci/run`` sets) is
derandomised, so a failure seen in CI reproduces on any machine from the same code, and prints the
reproduction blob; the default profile keeps fresh random examples for local runs.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
