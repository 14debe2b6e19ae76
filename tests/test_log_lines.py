"""`live serve`'s log as an operator reads it: one line per record, whatever a
client puts in the strings that reach it."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys

import anyio
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from test_phone_cli import env, free_port

pytestmark = pytest.mark.anyio

SECRET = "a-token-secret-long-enough-for-hs256-signing"
# What a client would write to pass a line of its own for the server's.
FORGED = "2026-12-03 11:00:00,000 ERROR live.server: forged"


async def log_of_serve(log_format: str, session_ids: list[str]) -> str:
    """`live serve` (tokens required) asked to resume each of `session_ids` with a
    bad token, which it refuses and logs, naming the session; its stderr."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "live.cli", "serve", "--port", str(port), "--log-format", log_format],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(LIVE_TOKEN_SECRET=SECRET),
    )
    try:
        await anyio.to_thread.run_sync(proc.stdout.readline)
        for session_id in session_ids:
            async with connect(f"ws://127.0.0.1:{port}/live") as ws:
                await ws.send(json.dumps({"type": "session.resume", "session_id": session_id, "resume_token": "x", "token": "bad"}))
                with anyio.fail_after(10), contextlib.suppress(ConnectionClosed):
                    async for _ in ws:
                        pass
        proc.send_signal(signal.SIGTERM)
        assert await anyio.to_thread.run_sync(lambda: proc.wait(timeout=10)) == 0
        return proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# What ends a line for someone reading the log: a terminal, `str.splitlines`
# (a Python log shipper), an escape sequence that erases the line before it.
BREAKERS = ["\n", "\r\n", "\r", "\u2028", "\x85", "\x1b[2K\r"]


async def test_a_session_id_cannot_forge_a_text_log_line():
    log = await log_of_serve("text", [f"abc{i}{breaker}{FORGED}" for i, breaker in enumerate(BREAKERS)])
    lines = log.splitlines()
    for i in range(len(BREAKERS)):
        assert len([line for line in lines if "refused" in line and f"abc{i}" in line]) == 1, lines
    assert not any(line.startswith(FORGED[:10]) and "forged" in line for line in lines), lines
    assert "\x1b" not in log


async def test_a_session_id_cannot_forge_a_json_log_line():
    forged = json.dumps({"level": "ERROR", "message": "forged"})
    log = await log_of_serve("json", [f"abc{i}{breaker}{forged}" for i, breaker in enumerate(BREAKERS)])
    records = [json.loads(line) for line in log.splitlines()]  # every line is one whole record
    for i in range(len(BREAKERS)):
        assert any(f"abc{i}" in r["message"] and "ERROR" in r["message"] for r in records)
    assert "\x1b" not in log
