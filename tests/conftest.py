"""Shared test configuration: async tests run on anyio's asyncio backend."""

from __future__ import annotations

import os

import pytest

# Local servers only: websockets honours HTTPS_PROXY, and no proxy reaches loopback.
_loopback = "127.0.0.1,localhost"
os.environ["NO_PROXY"] = f"{_loopback},{os.environ['NO_PROXY']}" if os.environ.get("NO_PROXY") else _loopback

# The emulator's fixtures, and the TLS ones every test of the Live API endpoint
# uses (`ca`, `cert_files`, `trusted`: tests/gemini_serving.py).
pytest_plugins = ["connections.emulator.pytest_plugin", "gemini_serving"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["picows", "websockets"])
def both_socket_layers(request, monkeypatch) -> str:
    """Run the test once on each WebSocket layer the server can listen with
    (`tests.serving.running` reads LIVE_SOCKETS)."""
    monkeypatch.setenv("LIVE_SOCKETS", request.param)
    return request.param
