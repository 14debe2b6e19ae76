"""Telnyx calls end to end: the Telnyx double's signed webhook, the server's
answer through the REST API, and the call's media stream through the emulator.
The double follows Telnyx's documentation (its docstring quotes it)."""

from __future__ import annotations

import shutil

import anyio
import numpy as np
import pytest

from connections.emulator import Fault, Script, running_emulator
from emulated import gemini_for
from live.agent import Agent
from live.phone.audio import Resampler, alaw_encode, ulaw_decode
from phone_serving import running_telnyx, spoken_ulaw, synthetic_ulaw

pytestmark = pytest.mark.anyio

MODEL = "gemini-live-2.5-flash-preview"
REPLY = "It is sunny in Paris, with a light breeze from the west this afternoon."


@pytest.fixture
def question(tmp_path) -> bytes:
    if shutil.which("espeak-ng") and shutil.which("sox"):
        return spoken_ulaw("What is the weather like in Paris today?", tmp_path)
    return synthetic_ulaw()


def said_in(codec: str, rate: int, ulaw: bytes) -> bytes:
    """The caller's question in the call's own codec (L16: RFC 3551 network byte order; Telnyx does not say)."""
    pcm = ulaw_decode(ulaw)
    if codec == "PCMA":
        return alaw_encode(pcm)
    if codec == "L16":
        up = Resampler(8000, rate)(pcm) if rate != 8000 else pcm
        return np.frombuffer(up, "<i2").astype(">i2").tobytes()
    return ulaw


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(x.astype(float) ** 2)))


@pytest.mark.parametrize(("codec", "rate"), [("PCMU", 8000), ("PCMA", 8000), ("L16", 16000)])
async def test_a_telnyx_caller_hears_the_reply_intact_in_the_codec_the_command_asked_for(question, codec, rate, tmp_path):
    from live.observe.record import Recorder, load

    agent = Agent(name="weather", model=MODEL)
    async with running_emulator(Script(replies=[REPLY])) as emu, running_telnyx(
        agent, gemini_for(emu), codec=codec, recorder=Recorder(tmp_path / "records")
    ) as phone:
        async with phone.call(encoding=codec, rate=rate) as call:
            await call.speak(said_in(codec, rate, question), silence_after=0.2)
            await call.wait_quiet(0.8, timeout=15)
        [session] = emu.sessions
    asked = {name: params for _, name, params in phone.double.actions}
    stream = asked.get("streaming_start") or asked["answer"]
    assert stream["stream_bidirectional_mode"] == "rtp" and stream["stream_bidirectional_codec"] == codec
    assert stream["stream_codec"] == codec  # the caller's audio comes as asked, not "the codec from the call"
    if codec == "L16":
        # `answer` takes no rate, and the guide lists "L16, 16 kHz": asked with streaming_start.
        assert "stream_url" not in asked["answer"] and stream["stream_bidirectional_sampling_rate"] == 16000
    assert len(session.audio) >= 16_000 * 2 * 1.0  # the question reached the model
    assert call.short_chunks == 0  # "Provided chunks of audio can be in a size of 20 milliseconds to 30 seconds."
    heard = call.reply_pcm()  # decoded as Telnyx plays it: the command's codec and rate
    [folder] = list((tmp_path / "records").iterdir())
    meant = np.frombuffer(load(folder).audio("out"), "<i2")  # what the server meant the caller to hear (24 kHz)
    assert abs(len(heard) / call.reply_rate - len(meant) / 24_000) <= 0.1 * len(meant) / 24_000
    assert abs(rms(heard) - rms(meant)) <= 0.1 * rms(meant)


async def test_frames_out_of_order_reach_the_model_in_order(question):
    # "The order of events is not guaranteed and the chunk number can be used to
    # reorder the events": the double swaps neighbouring frames now and then.
    agent = Agent(name="weather", model=MODEL)
    async with running_emulator(Script(replies=["Sunny."])) as emu, running_telnyx(agent, gemini_for(emu)) as phone:
        async with phone.call(reorder=True) as call:
            await call.speak(question, silence_after=0.2)
            await call.wait_for_audio(timeout=10)
            [runner] = phone.server.sessions
            door = runner.door
        [session] = emu.sessions
    assert door.reordered_frames >= 10 and door.late_frames == 0  # put back in place, none dropped
    assert len(session.audio) >= 16_000 * 2 * 1.0


async def test_a_session_that_ends_on_the_servers_side_hangs_the_call_up(question):
    # Telnyx: "When your call is established, Telnyx takes the call media and forks
    # it" -- the stream is a fork: closing it leaves the call up; `hangup` ("Hang up
    # the call.") ends it. The double keeps a call up until it gets one.
    agent = Agent(name="weather", model=MODEL)
    # The model takes the first turn, then refuses every connection after it: the session ends here.
    script = Script(replies=["Sunny."], faults=[Fault("after_turn", code=1011), *(Fault("after_setup", code=1008, reason="Policy violation", connection=n) for n in range(1, 8))])
    async with running_emulator(script) as emu, running_telnyx(agent, gemini_for(emu)) as phone:
        async with phone.call() as call:
            await call.speak(question, silence_after=0.2)
            with anyio.fail_after(15):
                while call.closed is None:
                    await anyio.sleep(0.05)
            assert call.call_sid not in phone.double.up
        assert phone.double.hangups[call.call_sid] == "application"
        hangups = [params for call_id, action, params in phone.double.actions if action == "hangup"]
        assert hangups and hangups[0]["command_id"].startswith("hangup:")
        del emu


async def test_webhooks_delivered_twice_and_at_once_answer_the_call_once_and_all_get_200(question):
    # "you may encounter: out-of-order webhooks; simultaneous (or near simultaneous)
    # webhooks; duplicate webhooks." "The server must return an HTTP 200, otherwise
    # we will reattempt delivery at the failover webhook URL."
    agent = Agent(name="weather", model=MODEL)
    async with running_emulator(Script(replies=["Sunny."])) as emu, running_telnyx(agent, gemini_for(emu)) as phone:
        call_id = "v3:duplicated-" + "x" * 20
        event = phone.double.event("call.initiated", call_id, direction="incoming", **{"from": "+15550100001"},
                                   to="+15550100002", state="parked")
        statuses = await phone.double.deliver(phone.webhook_url, event, times=3)
        statuses += await phone.double.deliver(phone.webhook_url, phone.double.event(
            "call.initiated", call_id, direction="incoming", **{"from": "+15550100001"}, to="+15550100002"), times=2)
        assert statuses == [200] * 5
        with anyio.fail_after(5):
            while not phone.double.actions:
                await anyio.sleep(0.02)
        await anyio.sleep(0.3)
        answers = [params for cid, action, params in phone.double.actions if action == "answer"]
        assert len(answers) == 1 and answers[0]["command_id"] == f"answer:{call_id}"
        assert not [r for r in phone.double.refused if r[1] == "answer"]  # no second answer to be refused
        async with phone.double.stream(call_id, stream_url=phone.media_url) as call:
            await call.speak(question, silence_after=0.2)
            await call.wait_for_audio(timeout=10)
        del emu


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


async def test_a_full_server_answers_a_telnyx_call_with_words_or_a_busy_reject():
    agent = Agent(name="weather", model=MODEL)
    async with running_emulator(Script()) as emu, running_telnyx(agent, gemini_for(emu), max_sessions=1) as phone:

        async def commands_for(call_id: str, count: int) -> list[tuple[str, dict]]:
            with anyio.fail_after(5):
                while len(found := [(a, p) for c, a, p in phone.double.actions if c == call_id]) < count:
                    await anyio.sleep(0.02)
            return found

        async with phone.call() as first:
            await first.silence(0.3)
            # Full: a sentence ("speak": "Convert text to speech and play it back on
            # the call"), then, once Telnyx says it was spoken, a hang-up.
            status, _, call_id = await phone.double.ring(phone.webhook_url)
            assert status == 200
            said = await commands_for(call_id, 2)
            assert [a for a, _ in said] == ["answer", "speak"] and "busy" in said[1][1]["payload"]
            assert "stream_url" not in said[0][1]  # no stream to refuse
            ended = phone.double.event("call.speak.ended", call_id, client_state=said[1][1]["client_state"])
            assert await phone.double.deliver(phone.webhook_url, ended) == [200]
            assert [a for a, _ in await commands_for(call_id, 3)][-1] == "hangup"
            # Or a busy signal: "Reject an incoming call", cause USER_BUSY.
            phone.lines.telnyx_webhook.busy = "reject"
            status, _, call_id = await phone.double.ring(phone.webhook_url)
            [(action, params)] = await commands_for(call_id, 1)
            assert action == "reject" and params["cause"] == "USER_BUSY"
        del emu
