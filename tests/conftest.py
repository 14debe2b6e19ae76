"""Shared test configuration: async tests run on anyio's asyncio backend."""

from __future__ import annotations

import os

import pytest

# Local servers only: websockets honours HTTPS_PROXY, and no proxy reaches loopback.
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
