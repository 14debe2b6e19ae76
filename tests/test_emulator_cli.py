"""`live emulator` as a process: prints what to export, serves the SDK, stops on Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import anyio
import pytest
from google import genai
from google.genai import types

from connections.emulator.cli import _parser, build_script
from connections.emulator.faults import FaultRates

pytestmark = pytest.mark.anyio


def test_options_build_a_script():
    args = _parser().parse_args(
        [
            "--say", "hello", "--reply", "hi there", "--call", "2:lookup={\"q\": 1}",
            "--tool-args", "get_weather={\"city\": \"Oslo\"}", "--fault", "mid_generation:3=1006",
            "--fault", "after_setup=quota", "--fault", "after_turn=stall", "--go-away-after", "540",
            "--speed", "2",
        ]
    )
    script = build_script(args)
    assert script.user_says == ["hello"] and script.replies == ["hi there"]
    assert script.tool_calls[2][0].name == "lookup" and script.tool_calls[2][0].args == {"q": 1}
    assert script.tool_args == {"get_weather": {"city": "Oslo"}}
    assert [(f.when, f.action, f.code, f.n) for f in script.faults] == [
        ("mid_generation", "close", 1006, 3),
        ("after_setup", "close", 1011, 1),
        ("after_turn", "stall", 1011, 1),
    ]
    assert "RESOURCE_EXHAUSTED" in (script.faults[1].reason or "")
    assert script.go_away_after == 540 and script.speed == 2
    assert (script.audio_keys, script.audio_base64) == ("camel", "standard")  # as the service writes
    other = build_script(_parser().parse_args(["--audio-keys", "snake", "--audio-base64", "urlsafe"]))
    assert (other.audio_keys, other.audio_base64) == ("snake", "urlsafe")
    # Realistic behaviour by model name, no random faults, unless asked.
    assert (script.profile, dict(script.profile_overrides), script.fault_rates) == ("auto", {}, FaultRates())


def test_profile_behaviours_and_faults_from_the_command_line():
    args = _parser().parse_args(
        ["--profile", "gemini-3.8", "--set", "late_transcripts=false", "--set", "handle_ttl=60",
         "--set", "handle_after_setup=on", "--faults", "realistic", "--seed", "42"]
    )
    script = build_script(args)
    assert script.profile == "gemini-3.8"
    assert script.profile_overrides == {"late_transcripts": False, "handle_ttl": 60.0, "handle_after_setup": True}
    assert script.fault_rates == FaultRates.realistic() and script.seed == 42
    for bad in (["--set", "late=false"], ["--set", "late_transcripts=maybe"], ["--set", "late_transcripts"]):
        with pytest.raises(ValueError):
            build_script(_parser().parse_args(bad))
    with pytest.raises(SystemExit):
        _parser().parse_args(["--profile", "gemini-9"])


async def test_process_serves_the_sdk_and_stops_on_sigint(monkeypatch: pytest.MonkeyPatch):
    env = dict(os.environ, NO_PROXY="127.0.0.1,localhost", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "live.cli", "emulator", "--port", "0", "--api-key", "dev", "--speed", "50"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    try:
        lines = [proc.stdout.readline().strip() for _ in range(2)]
        assert lines[0].startswith("export GOOGLE_GEMINI_BASE_URL=https://127.0.0.1:")
        assert lines[1].startswith("export SSL_CERT_FILE=") and lines[1].endswith(".pem")
        exported = dict(line.removeprefix("export ").split("=", 1) for line in lines)
        for name, value in exported.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
        client = genai.Client(api_key="dev", http_options=types.HttpOptions(api_version="v1beta"))
        async with client.aio.live.connect(model="gemini-live-2.5-flash-preview") as session:
            await session.send_realtime_input(text="hello")
            with anyio.fail_after(10):
                async for message in session.receive():
                    pass
            assert message.server_content.turn_complete
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
        assert not os.path.exists(exported["SSL_CERT_FILE"])  # the throwaway CA is removed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
