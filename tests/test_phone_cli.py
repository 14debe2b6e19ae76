"""`live serve --twilio` as an operator runs it: a real process the carrier double calls."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys

import anyio
import pytest

from clients.phone_double import TwilioDouble
from phone_serving import AUTH_TOKEN, synthetic_ulaw

LIVE = [sys.executable, "-m", "live.cli"]


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k not in ("GOOGLE_API_KEY", "GEMINI_API_KEY", "LIVE_TOKEN", "TWILIO_AUTH_TOKEN")}
    out["NO_PROXY"] = "127.0.0.1,localhost"
    return {**out, **extra}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize(("argv", "words"), [
    (["--twilio", "--public-url", "https://x.example"], "TWILIO_AUTH_TOKEN"),
    (["--public-url", "https://x.example"], "add --twilio"),
    (["--telnyx", "--public-url", "https://x.example"], "TELNYX_API_KEY"),
])
def test_phone_set_up_problems_are_one_line(argv, words):
    result = subprocess.run([*LIVE, "serve", *argv], capture_output=True, text=True, env=env(), timeout=30)
    assert result.returncode == 2 and words in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_twilio_without_a_public_url_is_one_line():
    result = subprocess.run([*LIVE, "serve", "--twilio"], capture_output=True, text=True,
                            env=env(TWILIO_AUTH_TOKEN=AUTH_TOKEN), timeout=30)
    assert result.returncode == 2 and "--public-url" in result.stderr


@pytest.mark.anyio
async def test_live_serve_twilio_answers_a_call_and_never_logs_a_secret():
    port, phone_port = free_port(), free_port()
    public = f"http://127.0.0.1:{phone_port}"
    proc = subprocess.Popen(
        [*LIVE, "serve", "--port", str(port), "--twilio", "--public-url", public, "--phone-port", str(phone_port),
         "--stream-url", f"ws://127.0.0.1:{port}/twilio/media", "--log-level", "DEBUG"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(TWILIO_AUTH_TOKEN=AUTH_TOKEN),
    )
    try:
        lines = [await anyio.to_thread.run_sync(proc.stdout.readline) for _ in range(2)]
        assert any(f"{public}/twilio/voice" in line for line in lines), lines
        double = TwilioDouble(AUTH_TOKEN)
        status, _, _ = await double.ring(f"{public}/twilio/voice", signed_with="0" * 32)
        assert status == 403
        status, twiml, _ = await double.ring(f"{public}/twilio/voice")
        _, params = double.stream_of(twiml)
        async with double.call(f"{public}/twilio/voice", stream_url=f"ws://127.0.0.1:{port}/twilio/media") as call:
            await call.speak(synthetic_ulaw(1.0), silence_after=0.3)
            await call.wait_for_audio(timeout=10)  # local/echo says it back
        proc.send_signal(signal.SIGTERM)
        assert await anyio.to_thread.run_sync(lambda: proc.wait(timeout=10)) == 0
        log = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "session" in log and "twilio" in log
    assert AUTH_TOKEN not in log and params["token"] not in log
    assert not re.search(r"eyJ[\w-]{10,}\.", log)  # no signed token of any call


@pytest.mark.anyio
async def test_live_serve_telnyx_answers_a_call_through_the_rest_api_and_never_logs_a_key():
    from clients.telnyx_double import TelnyxDouble

    double = TelnyxDouble()
    port, phone_port = free_port(), free_port()
    public = f"http://127.0.0.1:{phone_port}"
    async with anyio.create_task_group() as tg:
        await tg.start(double.serve_api)
        proc = subprocess.Popen(
            [*LIVE, "serve", "--port", str(port), "--telnyx", "--public-url", public, "--phone-port", str(phone_port),
             "--stream-url", f"ws://127.0.0.1:{port}/telnyx/media", "--log-level", "DEBUG"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env(TELNYX_API_KEY=double.api_key, TELNYX_PUBLIC_KEY=double.public_key, TELNYX_API_BASE_URL=double.api_base_url),
        )
        try:
            lines = [await anyio.to_thread.run_sync(proc.stdout.readline) for _ in range(2)]
            assert any(f"{public}/telnyx/call" in line for line in lines), lines
            async with double.call(f"{public}/telnyx/call") as call:
                await call.speak(synthetic_ulaw(1.0), silence_after=0.3)
                await call.wait_for_audio(timeout=10)  # local/echo says it back
            proc.send_signal(signal.SIGTERM)
            assert await anyio.to_thread.run_sync(lambda: proc.wait(timeout=10)) == 0
            log = proc.stderr.read()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            tg.cancel_scope.cancel()
    assert "telnyx" in log and double.api_key not in log
    [(_, answer, params)] = double.actions
    assert answer == "answer" and params["client_state"] not in log


@pytest.mark.parametrize(("argv", "words"), [
    (["+15551234567"], "--from"),
    (["5551234", "--from", "+15557654321"], "international form"),
    (["+15551234567", "--from", "+15557654321"], "TWILIO_ACCOUNT_SID"),
])
def test_live_call_set_up_problems_are_one_line(argv, words):
    result = subprocess.run([*LIVE, "call", *argv], capture_output=True, text=True, env=env(), timeout=30)
    assert result.returncode == 2 and words in result.stderr and "Traceback" not in result.stderr


@pytest.mark.anyio
async def test_live_call_asks_twilio_to_call_the_number_back_to_the_servers_webhook():
    from live.cli.call import place_call
    from live.phone.control import TwilioCallControl

    double = TwilioDouble(AUTH_TOKEN)
    control = TwilioCallControl(double.account_sid, AUTH_TOKEN, http_client=double.rest)
    sid = await place_call(control, "+15551234567", "+15557654321", "https://voice.example.com/")
    [placed] = double.placed
    assert placed["sid"] == sid
    assert (placed["To"], placed["From"], placed["Url"], placed["Method"]) == (
        "+15551234567", "+15557654321", "https://voice.example.com/twilio/voice", "POST")
    wrong = TwilioCallControl(double.account_sid, "f" * 32, http_client=double.rest)
    with pytest.raises(Exception, match="401|Authenticate"):
        await place_call(wrong, "+15551234567", "+15557654321", "https://voice.example.com")
