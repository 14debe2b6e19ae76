"""Telnyx calls end to end: the Telnyx double's signed webhook, the server's
answer through the REST API, and the call's media stream through the emulator."""

from __future__ import annotations

import shutil

import anyio
import numpy as np
import pytest

from connections.emulator import Script, running_emulator
from emulated import gemini_for
from live.agent import Agent
from live.phone.audio import alaw_decode, ulaw_decode
from phone_serving import running_telnyx, spoken_ulaw, synthetic_ulaw

pytestmark = pytest.mark.anyio

MODEL = "gemini-live-2.5-flash-preview"


@pytest.fixture
def question(tmp_path) -> bytes:
    if shutil.which("espeak-ng") and shutil.which("sox"):
        return spoken_ulaw("What is the weather like in Paris today?", tmp_path)
    return synthetic_ulaw()


@pytest.mark.parametrize("encoding", ["PCMU", "PCMA"])
async def test_a_telnyx_caller_asks_and_hears_the_answer_in_the_calls_codec(question, encoding):
    from live.phone.audio import alaw_encode

    said = question if encoding == "PCMU" else alaw_encode(ulaw_decode(question))
    agent = Agent(name="weather", model=MODEL)
    async with running_emulator(Script(replies=["It is sunny in Paris."])) as emu, running_telnyx(agent, gemini_for(emu)) as phone:
        async with phone.call(encoding=encoding) as call:
            await call.speak(said, silence_after=0.2)
            await call.wait_quiet(0.6, timeout=15)
        [session] = emu.sessions
        [(call_id, action, params)] = phone.double.actions
    assert action == "answer" and params["stream_bidirectional_mode"] == "rtp" and params["client_state"]
    assert len(session.audio) >= 16_000 * 2 * 1.0  # the question reached the model
    assert {len(frame) for _, frame in call.heard.media} == {160}
    decode = ulaw_decode if encoding == "PCMU" else alaw_decode
    pcm = np.frombuffer(decode(call.received()), "<i2").astype(float)
    assert len(pcm) >= 4000 and np.sqrt(np.mean(pcm ** 2)) > 300
    assert all(set(m) <= {"event", "media", "mark"} for m in call.heard.frames)


async def test_a_forged_telnyx_webhook_answers_no_call():
    agent = Agent(name="weather", model=MODEL)
    async with running_emulator(Script()) as emu, running_telnyx(agent, gemini_for(emu)) as phone:
        status, _, _ = await phone.double.ring(phone.webhook_url, forged=True)
        assert status == 403
        assert phone.double.actions == []
        status, _, _ = await phone.double.ring(phone.webhook_url)
        assert status == 200
        with anyio.fail_after(5):  # answered after the webhook's 200, by a task of the server's
            while not phone.double.actions:
                await anyio.sleep(0.02)
        assert [a for _, a, _ in phone.double.actions] == ["answer"]
