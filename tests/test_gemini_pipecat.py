"""Pipecat's GeminiLiveLLMService, unmodified, against the server's Live API
endpoint: a framework built on google-genai follows once its base URL is ours.

Pipecat pins its own google-genai, so it runs in its own virtual environment
(tests/.pipecat-venv, made by ./test), in a process of its own
(tests/peers/pipecat_gemini_live.py), as an app using it would."""

from __future__ import annotations

import json
import os
from pathlib import Path

import anyio
import pytest
from emulated import MODEL
from gemini_serving import (
    serving,
    token,
)

from connections.emulator import Fault, Script

pytestmark = pytest.mark.anyio

TESTS = Path(__file__).parent
PYTHON = TESTS / ".pipecat-venv" / "bin" / "python"


async def pipecat_turn(url: str, ca_file: Path, key: str, text: str = "hello") -> dict:
    if not PYTHON.exists():
        pytest.skip("Pipecat is not installed (./test makes tests/.pipecat-venv)")
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost"}
    with anyio.fail_after(60):
        done = await anyio.run_process(
            [str(PYTHON), str(TESTS / "peers" / "pipecat_gemini_live.py"), f"https://127.0.0.1:{port}", key, MODEL, text, str(ca_file)],
            env=env,
        )
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


async def test_pipecats_gemini_live_service_talks_through_an_upstream_drop(ca, cert_files, tmp_path, caplog):
    caplog.set_level("INFO", "live.server")
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    # Google's connection drops (1011) as the answer starts; Pipecat never sees it.
    script = Script(speed=20, replies=["Hello from Pipecat."], faults=[Fault("mid_generation", code=1011, n=2, times=1)])
    async with serving(script, **cert_files) as (emu, _, url):
        result = await pipecat_turn(url, ca_file, token())
    assert result["errors"] == []
    # What it heard of the reply before the drop, once: the reply ended as the
    # service ends a cut reply (interrupted), and was not said again (H10).
    assert result["said"] and "Hello from Pipecat.".startswith(result["said"])
    assert result["interruptions"] == 1, result
    assert len(emu.sessions) >= 2  # the server resumed on a new connection to Google
    assert "door=gemini" in caplog.text


async def test_pipecat_with_a_wrong_key_reports_the_services_refusal(ca, cert_files, tmp_path):
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    async with serving(Script(speed=20), **cert_files) as (emu, _, url):
        result = await pipecat_turn(url, ca_file, "not-a-token")
    assert result["responses"] == 0 and result["audio_bytes"] == 0
    assert any("1008" in error and "API key not valid" in error for error in result["errors"]), result
    assert emu.sessions == []
