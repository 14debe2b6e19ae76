"""Optional parts and the extra that installs each.

The base install serves `local/echo` and Gemini. Parts that are heavy or only
sometimes needed come with an extra (`voice`, `fleet`, `phone`, `docs`);
asking for one whose extra is missing is one line that says how to install
it where the server runs, not an ImportError from deep inside a session.

The line fits the install it is printed by. From a checkout (`pip install -e
.`) it is the checkout's own extra, `pip install -e '/path/to/checkout[voice]'`;
from a wheel, the extra's packages by their names on the package index, with
the versions this release declares. The distribution's name, `live-sessions`,
is never offered to pip: it is not on the package index, and whoever
registered it there would be installed by everyone who followed the hint.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import shutil
import sys
from pathlib import Path

__all__ = ["DISTRIBUTION", "MissingExtra", "install_hint", "require"]

DISTRIBUTION = "live-sessions"
"""This project's distribution name (pyproject.toml): for its metadata only."""

_EXTRA_MARKER = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


class MissingExtra(ImportError):
    """A part was asked for whose optional dependencies are not installed."""


def require(extra: str, feature: str, *modules: str) -> None:
    """Raise `MissingExtra` naming `extra` unless every module in `modules` can be imported."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingExtra(
            f"{feature} needs the '{extra}' extra ({', '.join(missing)} not installed): {install_hint(extra)}"
        )


def install_hint(extra: str) -> str:
    """The command that installs `extra` into the Python that runs this, as one line."""
    pip = _pip()
    checkout = _editable_checkout()
    if checkout is not None:
        return f"{pip} install -e {shlex.quote(f'{checkout}[{extra}]')}"
    requirements = _requirements(extra)
    if requirements:
        return f"{pip} install {' '.join(shlex.quote(r) for r in requirements)}"
    return f"{pip} install -e '.[{extra}]' (in this project's checkout)"


def _pip() -> str:
    """`pip` when the one on PATH installs into this Python, else this Python's own."""
    found = shutil.which("pip")
    here = os.path.dirname(sys.executable)
    if found is not None and os.path.dirname(found) == here:
        return "pip"
    return f"{shlex.quote(sys.executable)} -m pip"


def _editable_checkout() -> Path | None:
    """The checkout this project was installed from with `pip install -e`, if it was."""
    try:
        text = importlib.metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        text = None
    if text:
        try:
            direct = json.loads(text)
        except ValueError:
            direct = {}
        url = direct.get("url", "")
        if direct.get("dir_info", {}).get("editable") and url.startswith("file://"):
            path = Path(url.removeprefix("file://"))
            if (path / "pyproject.toml").is_file():
                return path
        return None
    # Not installed at all (run from a checkout on PYTHONPATH): the checkout around us.
    root = Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() else None


def _requirements(extra: str) -> list[str]:
    """The packages `extra` adds, as this release declares them (`name>=a,<b`)."""
    try:
        declared = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    wanted = []
    for requirement in declared:
        spec, _, marker = requirement.partition(";")
        name = re.split(r"[\s\[<>=!~;]", spec.strip(), maxsplit=1)[0]
        if extra in _EXTRA_MARKER.findall(marker) and name.lower() != DISTRIBUTION:
            wanted.append(spec.strip())
    return wanted
