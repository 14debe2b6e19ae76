"""`live serve --twilio` as an operator runs it: a real process the carrier double calls."""

from __future__ import annotations

import json
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


def test_live_call_with_telnyx_needs_its_call_control_application():
    result = subprocess.run([*LIVE, "call", "+15551234567", "--from", "+15557654321", "--carrier", "telnyx"],
                            capture_output=True, text=True, env=env(), timeout=30)
    assert result.returncode == 2 and "TELNYX_CONNECTION_ID" in result.stderr


@pytest.mark.anyio
@pytest.mark.parametrize(("machine", "answered_by", "talks"), [
    ("hangup", "human", True),
    ("hangup", "machine_start", False),
    ("message", "machine_end_beep", True),
    ("off", None, True),
])
async def test_live_call_places_a_twilio_call_with_machine_detection_and_reports_its_status(machine, answered_by, talks):
    from connections.emulator import Script, running_emulator
    from emulated import gemini_for
    from live.agent import Agent
    from live.cli.call import place_call
    from phone_serving import running_phone

    progress: list[dict] = []
    agent = Agent(name="weather", model="gemini-live-2.5-flash-preview")
    async with running_emulator(Script(replies=["Hello, this is the weather service."])) as emu, running_phone(
        agent, gemini_for(emu), control="double"
    ) as phone:
        phone.lines.twilio_webhook.on_status = progress.append
        public = phone.webhook_url.removesuffix("/twilio/voice")
        sid = await place_call(phone.lines, "+15551234567", "+15557654321", public, machine=machine,
                               control=phone.control, report=progress.append)
        [placed] = phone.double.placed
        assert placed["sid"] == sid and (placed["To"], placed["From"], placed["Url"]) == (
            "+15551234567", "+15557654321", f"{public}/twilio/voice")
        # W-42: "Use Enable if you would like us to return AnsweredBy as soon as the
        # called party is identified. Use DetectMessageEnd, if you would like to leave
        # a message on an answering machine."
        assert placed.get("MachineDetection") == {"hangup": "Enable", "message": "DetectMessageEnd"}.get(machine)
        assert placed["StatusCallback"] == f"{public}/twilio/status"
        async with phone.double.pick_up(placed, answered_by=answered_by, stream_url=phone.media_url) as call:
            if talks:
                assert call is not None
                await call.speak(synthetic_ulaw(1.0), silence_after=0.3)
                await call.wait_for_audio(timeout=10)
            else:
                assert call is None  # hung up on the machine: no stream, no model
        if talks:
            [session] = emu.sessions
            instruction = json.dumps(session.setup)
            assert "+15557654321" in instruction  # told who it called (and from where)
            if answered_by and answered_by != "human":
                assert answered_by in instruction  # told a machine answered: leave a message
        else:
            assert emu.sessions == []
    statuses = [p.get("CallStatus") for p in progress if "CallStatus" in p]
    assert statuses[0] == "queued" and statuses[-1] == "completed" and "in-progress" in statuses
    if answered_by:
        assert {"call": sid, "answered_by": answered_by} in progress


@pytest.mark.anyio
@pytest.mark.parametrize(("result", "talks"), [("human", True), ("machine", False)])
async def test_live_call_places_a_telnyx_call_and_talks_only_to_a_person(result, talks):
    from connections.emulator import Script, running_emulator
    from emulated import gemini_for
    from live.agent import Agent
    from live.cli.call import place_call
    from phone_serving import running_telnyx

    progress: list[dict] = []
    agent = Agent(name="weather", model="gemini-live-2.5-flash-preview")
    async with running_emulator(Script(replies=["Hello, this is the weather service."])) as emu, running_telnyx(
        agent, gemini_for(emu)
    ) as phone:
        public = phone.webhook_url.removesuffix("/telnyx/call")
        call_id = await place_call(phone.lines, "+15551234567", "+15557654321", public, carrier="telnyx",
                                   report=progress.append)
        [dialled] = phone.double.dialled
        # T-28: `connection_id`, `from` ("+E164 format"), `to`; T-40: "The
        # answering_machine_detection value when creating an outbound call ...".
        assert (dialled["to"], dialled["from"], dialled["connection_id"]) == ("+15551234567", "+15557654321", "1234567890")
        assert dialled["answering_machine_detection"] == "detect" and dialled["webhook_url"] == phone.webhook_url
        phone.double.up.add(call_id)
        for event in (phone.double.event("call.initiated", call_id, direction="outgoing"),
                      phone.double.event("call.answered", call_id),
                      # "detect: Only detect if answering machine or human." -> call.machine.detection.ended
                      phone.double.event("call.machine.detection.ended", call_id, result=result)):
            assert await phone.double.deliver(phone.webhook_url, event) == [200]
        with anyio.fail_after(5):
            while not [a for c, a, _ in phone.double.actions if c == call_id]:
                await anyio.sleep(0.02)
        [(action, _)] = [(a, p) for c, a, p in phone.double.actions if c == call_id]
        if talks:
            assert action == "streaming_start"
            async with phone.double.stream(call_id, stream_url=phone.media_url) as call:
                await call.speak(synthetic_ulaw(1.0), silence_after=0.3)
                await call.wait_for_audio(timeout=10)
            assert len(emu.sessions) == 1
        else:
            assert action == "hangup" and emu.sessions == []
    assert {"call": call_id, "answered_by": result} in progress
    assert [p["status"] for p in progress if "status" in p][:2] == ["call.initiated", "call.answered"]
