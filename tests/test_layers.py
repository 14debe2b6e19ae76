"""The house's layers, as import-linter contracts in pyproject.toml.

Each layer of `live/` imports only the layers below it, nothing in the engine,
the server or the doors imports a model implementation, and no package has an
import cycle among its modules. `docs/architecture.md` shows the same layers:
its table is drawn from the contracts, so the page cannot drift from the code.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN = "<!-- layers: drawn from pyproject.toml's import-linter contracts by tests/test_layers.py -->"
END = "<!-- end of layers -->"


def contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def summary(module: str) -> str:
    """The first line of a module's or package's docstring."""
    path = ROOT / Path(*module.split("."))
    source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    doc = ast.get_docstring(ast.parse(source.read_text())) or ""
    return doc.split("\n\n")[0].replace("\n", " ").strip()


def layers_table() -> str:
    """The layers contract as the table docs/architecture.md shows, top to bottom."""
    (layers,) = [c["layers"] for c in contracts() if c["type"] == "layers"]
    rows = ["| layer | modules | what each holds |", "|---|---|---|"]
    for i, layer in enumerate(layers, 1):
        for j, name in enumerate(n.strip() for n in layer.replace(":", "|").split("|")):
            rows.append(f"| {i if j == 0 else ''} | `{name}` | {summary(name)} |")
    return "\n".join(rows)


def test_every_contract_is_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    run = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"Contracts: {len(contracts())} kept, 0 broken." in run.stdout


def test_the_architecture_page_shows_the_layers_of_the_contracts():
    page = (ROOT / "docs" / "architecture.md").read_text()
    expected = f"{BEGIN}\n\n{layers_table()}\n\n{END}"
    assert expected in page, f"docs/architecture.md should hold, between its layer markers:\n\n{expected}"


def test_live_offers_the_server_without_loading_it_on_import():
    """`from live import LiveServer, ServerConfig` works; `import live` alone (an
    agent module, a model implementation) does not load the server."""
    code = (
        "import sys, live\n"
        "assert 'live.server.port' not in sys.modules and 'live.server.config' not in sys.modules\n"
        "from live import LiveServer, ServerConfig\n"
        "import live.server.port, live.server.config\n"
        "assert LiveServer is live.server.port.LiveServer and ServerConfig is live.server.config.ServerConfig\n"
        "assert {'LiveServer', 'ServerConfig'} <= set(live.__all__) <= set(dir(live))\n"
        "try:\n"
        "    live.NoSuchThing\n"
        "except AttributeError:\n"
        "    pass\n"
        "else:\n"
        "    raise AssertionError('an unknown name must raise AttributeError')\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
