"""Exceptions shared across the library's layers (a leaf module: it imports nothing)."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A run configuration that is refused before anything starts (exit code 2 on the command line).

    The message is one line naming the kebab-case key, the rule, the value and how to fix it.
    """
