"""MkDocs hook: a fence's info string is its language, then the run marker of the doc-example test.

``tests/test_docs_examples.py`` reads ``no-run: <reason>`` and ``run-by: <test>`` after a code block's
language; Markdown renderers that take only a language would otherwise not see a code block.
"""

from __future__ import annotations

import re
from typing import Any

_FENCE = re.compile(r"^(?P<open>[ \t]*```[\w+-]+)[ \t]+(?:no-run|run-by):[^\n]*$", re.M)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """The page with every fence's info string cut to its language."""
    return _FENCE.sub(r"\g<open>", markdown)
