"""Pytest fixtures for the Live emulator.

Load with `pytest_plugins = ["connections.emulator.pytest_plugin"]` in a
conftest, or `-p connections.emulator.pytest_plugin`.

- `live_emulator`: a running `Emulator` (fresh per test, free port, fast pacing:
  `Script(speed=20)`, each model family's real behaviour, bad days included:
  see docs/emulator.md); change `live_emulator.script` to script it.
- `live_emulator_client`: a `genai.Client` for it (v1beta, trust configured in
  code, no environment changes).
- `live_emulator_env`: sets GOOGLE_GEMINI_BASE_URL and SSL_CERT_FILE for code
  that builds its own client from the environment; restored after the test.

The fixtures are async and run under anyio's pytest plugin (mark tests with
`@pytest.mark.anyio`).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import pytest

from connections.emulator.client import emulator_client
from connections.emulator.script import Script
from connections.emulator.server import Emulator, running_emulator

TEST_SPEED = 20.0


@pytest.fixture
async def live_emulator() -> AsyncIterator[Emulator]:
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
    async with running_emulator(Script(speed=TEST_SPEED)) as emulator:
        yield emulator


@pytest.fixture
def live_emulator_client(live_emulator: Emulator):  # type: ignore[no-untyped-def]
    return emulator_client(live_emulator)


@pytest.fixture
def live_emulator_env(live_emulator: Emulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[Emulator]:
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", live_emulator.base_url)
    monkeypatch.setenv("SSL_CERT_FILE", live_emulator.ca_file)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    yield live_emulator
