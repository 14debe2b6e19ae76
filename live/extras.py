"""Optional parts and the extra that installs each.

The base install serves `local/echo` and Gemini. Parts that are heavy or only
sometimes needed come with an extra (`pip install 'live-sessions[voice]'`);
asking for one whose extra is missing is one line that names it, not an
ImportError from deep inside a session.
"""

from __future__ import annotations

import importlib.util

__all__ = ["MissingExtra", "require"]


class MissingExtra(ImportError):
    """A part was asked for whose optional dependencies are not installed."""


def require(extra: str, feature: str, *modules: str) -> None:
    """Raise `MissingExtra` naming `extra` unless every module in `modules` can be imported."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingExtra(
            f"{feature} needs the '{extra}' extra ({', '.join(missing)} not installed): "
            f"pip install 'live-sessions[{extra}]'"
        )
