"""Shared test configuration: async tests run on anyio's asyncio backend."""

from __future__ import annotations

import os

import pytest

# Local servers only: websockets honours HTTPS_PROXY, and no proxy reaches loopback.
_loopback = "127.0.0.1,localhost"
os.environ["NO_PROXY"] = f"{_loopback},{os.environ['NO_PROXY']}" if os.environ.get("NO_PROXY") else _loopback

pytest_plugins = ["connections.emulator.pytest_plugin"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
