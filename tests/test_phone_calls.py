"""Phone calls end to end: the carrier double calls the server as Twilio does,
and the server answers through the Live emulator (google-genai over TLS)."""

from __future__ import annotations

import contextlib
import json
import shutil

import anyio
import numpy as np
import pytest

from clients.phone_double import twilio_signature
from connections.emulator import Fault, Script, running_emulator
from emulated import gemini_for
from live.agent import Agent
from live.phone.audio import ulaw_decode
from phone_serving import running_phone, spoken_ulaw, synthetic_ulaw

pytestmark = pytest.mark.anyio

QUESTION = "What is the weather like in Paris today?"


@pytest.fixture
def question(tmp_path) -> bytes:
    if shutil.which("espeak-ng") and shutil.which("sox"):
        return spoken_ulaw(QUESTION, tmp_path)
    return synthetic_ulaw()


def loudness(ulaw: bytes) -> float:
    pcm = np.frombuffer(ulaw_decode(ulaw), "<i2").astype(float)
    return float(np.sqrt(np.mean(pcm ** 2))) if len(pcm) else 0.0


async def test_a_caller_asks_and_hears_the_answer(question):
    agent = Agent(name="weather", model="gemini-live-2.5-flash-preview")
    script = Script(replies=["It is sunny in Paris."], speed=1)
    async with running_emulator(script) as emu, running_phone(agent, gemini_for(emu)) as phone:
        async with phone.call() as call:
            await call.speak(question, silence_after=0.2)
            await call.wait_for_audio(timeout=10)
            await call.silence(0.5)
            await call.wait_quiet(timeout=15)
            exposition = phone.server.metrics.exposition()[0].decode()
            assert 'live_door_sessions_active{door="twilio"} 1.0' in exposition  # counted per carrier
        [session] = emu.sessions
    # The model heard the caller: one second and more of 16 kHz speech.
    assert len(session.audio) >= 16_000 * 2 * 1.0
    # Every message from the server is one Twilio takes ("The messages that your
    # WebSocket server can send back to Twilio are: Media, Mark, Clear").
    kinds = {m["event"] for m in call.heard.frames}
    assert kinds <= {"media", "mark", "clear"} and "media" in kinds
    reply = call.received()
    assert len(reply) >= 8000 * 0.5  # half a second and more of reply
    assert loudness(reply) > 300  # sound, not silence
    # The caller's handset played what came, and echoed the marks as it went.
    assert call.played() == reply[: len(call.played())] and len(call.played()) >= len(reply) - 1600
    assert call.heard.marks_echoed


async def test_a_forged_webhook_is_refused():
    agent = Agent(name="weather", model="gemini-live-2.5-flash-preview")
    async with running_emulator(Script()) as emu, running_phone(agent, gemini_for(emu)) as phone:
        status, body, _ = await phone.double.ring(phone.webhook_url, signed_with="f" * 32)
        assert status == 403 and "token" not in body.lower() and "<Stream" not in body
        # A genuine signature over other fields (a replayed request, altered) is refused too.
        from clients.phone_double import http_post

        form = {"CallSid": "CA" + "1" * 32, "AccountSid": phone.double.account_sid}
        signature = twilio_signature(phone.double.auth_token, phone.webhook_url, form)
        status, _ = await http_post(phone.webhook_url, {**form, "CallSid": "CA" + "2" * 32}, {"X-Twilio-Signature": signature})
        assert status == 403
        status, _ = await http_post(phone.webhook_url, form, {})
        assert status == 403
        # The genuine one is answered with a stream for that call.
        status, body, _ = await phone.double.ring(phone.webhook_url)
        assert status == 200 and "<Connect><Stream" in body
        assert emu.sessions == []


@pytest.mark.usefixtures("both_socket_layers")
async def test_a_media_socket_without_a_valid_token_opens_no_session():
    agent = Agent(name="weather", model="gemini-live-2.5-flash-preview")
    async with running_emulator(Script()) as emu, running_phone(agent, gemini_for(emu)) as phone:
        for forged in ({}, {"token": "eyJhbGciOiJub25lIn0.e30."}):
            async with phone.call(parameters=forged) as call:
                # Refused at once, though the line never stops sending audio.
                with anyio.fail_after(3):
                    while call.closed is None:
                        await anyio.sleep(0.02)
            assert call.closed[0] == 1008
            assert not call.heard.media
        assert emu.sessions == []
        assert not phone.server.sessions


LONG_REPLY = ("Paris is mild today, with a light breeze from the west and clouds that come and go "
              "through the afternoon, and a chance of rain late in the evening near the river.")


@pytest.fixture
def told(monkeypatch) -> list:
    """Every event the sessions told a Twilio door (what a phone cannot show, but a session said)."""
    from live.phone.twilio import TwilioDoor

    seen: list = []
    original = TwilioDoor.event

    def event(self, event):
        seen.append(event)
        return original(self, event)

    monkeypatch.setattr(TwilioDoor, "event", event)
    return seen


async def test_a_caller_who_talks_over_the_reply_gets_clear_at_once_and_the_transcript_says_what_they_heard(question, told):
    from live import protocol as p

    agent = Agent(name="weather", model="gemini-live-2.5-flash-preview")
    script = Script(replies=[LONG_REPLY, "Yes?"], speed=1)
    async with running_emulator(script) as emu, running_phone(agent, gemini_for(emu)) as phone:
        async with phone.call() as call:
            await call.speak(question, silence_after=0.2)
            await call.wait_for_audio(timeout=10)
            await anyio.sleep(1.5)  # the caller hears the start of the reply
            heard_before = len(call.played())
            barge_at = call.now()
            await call.speak(question[: 8000])  # and talks over it
            with anyio.fail_after(5):
                while not call.heard.clears:
                    await anyio.sleep(0.01)
            await anyio.sleep(1.0)
        [session] = emu.sessions
    clear_at = call.heard.clears[0]
    # The emulator hears speech after its first loud frames and interrupts; the
    # clear follows within a few frames of that, not after the buffered reply.
    assert clear_at - barge_at < 0.6, clear_at - barge_at
    assert heard_before > 8000  # over a second of the reply had played
    # What the caller heard is what the session reports as heard: cut, not the whole reply.
    [heard] = [e for e in told if isinstance(e, p.TranscriptOutput) and e.heard]
    assert heard.text and LONG_REPLY.startswith(heard.text.strip()) and len(heard.text) < len(LONG_REPLY)
    assert 1.0 < heard.played < 4.0
    # After the clear no more of the interrupted reply comes: the next audio is
    # the next reply, after the caller's second second of speech has ended.
    after = [t for t, _ in call.heard.media if t > clear_at]
    assert not after or after[0] - clear_at > 0.5, after[:3]


async def test_a_pin_reaches_the_model_as_one_turn_and_an_async_handler_sees_each_key():
    pressed = []

    async def on_key_press(call_id: str, digit: str) -> None:
        await anyio.sleep(0)  # an agent's handler may await (a lookup, a database)
        pressed.append((call_id, digit))

    agent = Agent(name="menu", model="gemini-live-2.5-flash-preview", on_key_press=on_key_press)
    async with running_emulator(Script(replies=["Thank you, your PIN is noted."])) as emu, running_phone(
        agent, gemini_for(emu)
    ) as phone:
        async with phone.call() as call:
            await call.silence(0.3)
            for digit in "1234#":
                await call.press(digit)
                await call.silence(0.15)
            await call.wait_for_audio(timeout=10)
        [session] = emu.sessions
    turns = [json.dumps(f) for f in session.frames if "clientContent" in f or "client_content" in f]
    assert len(turns) == 1 and "entered 1234#" in turns[0], turns  # one turn, not five
    assert pressed == [(call.call_sid, d) for d in "1234#"]


async def test_a_bad_frame_from_the_carrier_is_logged_and_the_call_goes_on(question, caplog):
    agent = Agent(name="weather", model="gemini-live-2.5-flash-preview")
    async with running_emulator(Script(replies=["Sunny."])) as emu, running_phone(agent, gemini_for(emu)) as phone:
        async with phone.call() as call:
            await call.send_raw("{not json")
            await call.send_raw(json.dumps({"event": "media", "streamSid": call.stream_sid, "media": {"payload": "%%%"}}))
            await call.send_raw(json.dumps({"event": "hold_music", "streamSid": call.stream_sid}))
            await call.speak(question, silence_after=0.2)
            await call.wait_for_audio(timeout=10)
        assert call.closed is None  # still up when the caller hung up
    assert len(emu.sessions) == 1
    said = caplog.text
    assert "bad_frame" in said and "bad_audio" in said and "unknown_event" in said


@pytest.mark.parametrize(("said", "twiml"), [
    ("please transfer_call to sales", "<Dial"),
    ("thanks, end_call now", "<Hangup />"),
])
async def test_the_agent_transfers_or_ends_the_call_through_the_carriers_rest_api(question, said, twiml):
    from live.phone.control import end_call, transfer_to

    agent = Agent(name="desk", model="gemini-live-2.5-flash-preview",
                  tools=[end_call, transfer_to({"sales": "+15551234567"})])
    script = Script(user_says=[said], tool_args={"transfer_call": {"destination": "sales"}, "end_call": {}})
    async with running_emulator(script) as emu, running_phone(agent, gemini_for(emu), control="double") as phone:
        async with phone.call() as call:
            await call.speak(question, silence_after=0.2)
            with anyio.fail_after(10):
                while call.closed is None:  # the call left the stream, which closed
                    await anyio.sleep(0.05)
    assert twiml in (call.new_twiml or "")
    assert call.after_stream == []  # it left the stream: the sentence after </Connect> is not said
    [(method, uri, _)] = phone.double.rest.requests
    assert method == "POST" and uri.endswith(f"/Accounts/{phone.double.account_sid}/Calls/{call.call_sid}.json")
    if "Dial" in twiml:
        assert ">+15551234567</Dial>" in call.new_twiml


async def test_local_voice_answers_a_call_offline(question, told):
    pytest.importorskip("pocketsphinx")
    from connections.local_voice import LocalVoice, word_error_rate
    from live import protocol as p
    from samples import weather

    agent = weather.agent.with_model("local/voice")
    async with running_phone(agent, LocalVoice()) as phone:
        async with phone.call() as call:
            await call.speak(question, silence_after=0.3)
            await call.wait_quiet(0.8, timeout=30)
    [heard] = [e.text for e in told if isinstance(e, p.TranscriptInput) and e.final]
    said = [e.text for e in told if isinstance(e, p.TranscriptOutput) and e.final and not e.heard]
    print(f"on a call, local/voice heard {heard!r} (word error rate {word_error_rate(QUESTION, heard):.2f}); said {said}")
    assert heard and said  # it recognised something and answered it aloud
    reply = call.received()
    assert len(reply) >= 8000 and loudness(reply) > 300


async def test_a_call_survives_the_model_dropping_its_connection(question):
    """The model's connection drops after the first answer (1011, as on the
    service's bad days); the caller asks again and is answered on a new one."""
    agent = Agent(name="weather", model="gemini-live-2.5-flash-preview")
    script = Script(replies=["Sunny in Paris.", "Still sunny."], faults=[Fault("after_turn", code=1011, n=1)])
    async with running_emulator(script) as emu, running_phone(agent, gemini_for(emu)) as phone:
        async with phone.call() as call:
            await call.speak(question, silence_after=0.2)
            await call.wait_quiet(0.6, timeout=15)
            first = len(call.heard.media)
            await anyio.sleep(0.5)  # the model's connection is replaced meanwhile
            await call.speak(question, silence_after=0.2)
            await call.wait_quiet(0.6, timeout=15, after=first)
            assert call.closed is None  # the caller never noticed
        assert len(emu.sessions) >= 2  # a second model connection answered
    assert len(call.heard.media) > first + 25  # half a second and more of a second answer


async def test_a_call_is_recorded_like_any_session(question, tmp_path):
    import wave

    from live.observe.record import Recorder, load

    agent = Agent(name="weather", model="gemini-live-2.5-flash-preview")
    async with running_emulator(Script(replies=["Sunny."])) as emu, running_phone(
        agent, gemini_for(emu), recorder=Recorder(tmp_path / "records")
    ) as phone:
        async with phone.call() as call:
            await call.speak(question, silence_after=0.2)
            await call.wait_quiet(0.6, timeout=15)
    [folder] = list((tmp_path / "records").iterdir())
    record = load(folder)
    assert record.header["agent"] == "weather" and record.header["input_rate"] == 16_000
    with wave.open(str(folder / "in.wav")) as wav:  # the caller, as the model heard them
        assert wav.getframerate() == 16_000 and wav.getnframes() >= 16_000 * len(question) / 8000 * 0.9
    assert len(record.audio("out")) > 0  # the reply, before the door made phone frames of it
    assert "eyJ" not in (folder / "events.jsonl").read_text()  # no call token (a JWT) in the record


async def test_a_full_server_answers_the_call_with_words_never_a_dead_stream():
    from clients.phone_double import TwilioDouble

    agent = Agent(name="weather", model="gemini-live-2.5-flash-preview")
    async with running_emulator(Script()) as emu, running_phone(agent, gemini_for(emu), max_sessions=1) as phone:
        # An answer got while a line was free, for a stream that comes once it is not.
        status, early, early_sid = await phone.double.ring(phone.webhook_url)
        assert status == 200 and "<Stream" in early
        async with phone.call() as first:
            await first.silence(0.3)
            # Full: the webhook says so. Twilio: "Any other response will result in
            # an answered call", so a sentence, then <Hangup/>.
            status, twiml, _ = await phone.double.ring(phone.webhook_url)
            assert status == 200 and TwilioDouble.verbs(twiml) == [
                ("Say", "Sorry, all our lines are busy. Please call again later."), ("Hangup", "")]
            # Or, as the operator chose: "Selecting busy will play a busy signal to the caller".
            phone.lines.twilio_webhook.busy = "reject"
            status, twiml, _ = await phone.double.ring(phone.webhook_url)
            assert TwilioDouble.verbs(twiml) == [("Reject", "busy")]
            # The stream of the earlier answer is refused (1013); "Twilio executes the
            # remaining TwiML instructions only after your server closes the WebSocket
            # connection": the caller hears the sentence after </Connect>.
            async with phone.double.call(phone.webhook_url, stream_url=phone.media_url, answer=early,
                                         call_sid=early_sid) as late:
                with anyio.fail_after(3):
                    while late.closed is None:
                        await anyio.sleep(0.02)
            assert late.closed[0] == 1013
            assert [verb for verb, _ in late.after_stream] == ["Say"] and late.after_stream[0][1]
            assert first.closed is None


async def test_eleven_calls_from_one_carrier_address_are_all_held():
    # Twilio: "Configure your firewall rules to allow secure WebSocket connections
    # (TCP port 443) from Twilio to your WebSocket servers": every call's stream
    # comes from Twilio's media servers, a few addresses for all callers. Here
    # all come from 127.0.0.1, with the limit of 10 sockets per address.
    agent = Agent(name="weather", model="gemini-live-2.5-flash-preview")
    async with running_emulator(Script()) as emu, running_phone(agent, gemini_for(emu), max_sessions_per_ip=10) as phone:
        async with contextlib.AsyncExitStack() as stack:
            calls = [await stack.enter_async_context(phone.call()) for _ in range(11)]
            await anyio.sleep(1.0)
            assert [c.closed for c in calls] == [None] * 11
            assert len(phone.server.sessions) == 11
        del emu


async def test_the_caller_hears_the_reply_exactly_as_spoken_when_the_model_is_faster_than_real_time(question, tmp_path):
    import math

    from live.observe.record import Recorder, load
    from live.phone.audio import Resampler, ulaw_encode

    agent = Agent(name="weather", model="gemini-live-2.5-flash-preview")
    script = Script(replies=[LONG_REPLY], speed=math.inf)  # the whole reply at once, ten seconds of it
    async with running_emulator(script) as emu, running_phone(
        agent, gemini_for(emu), recorder=Recorder(tmp_path / "records"), audio_lead=0.5
    ) as phone:
        async with phone.call() as call:
            await call.speak(question, silence_after=0.2)
            await call.wait_quiet(0.8, timeout=30)
        del emu
    [folder] = list((tmp_path / "records").iterdir())
    meant = load(folder).audio("out")  # the reply the model spoke, 24 kHz
    # What the carrier should get: that audio at 8 kHz in μ-law, in order, to its
    # last sample (the last 20 ms frame padded with silence).
    down = Resampler(24_000, 8_000)
    expected = ulaw_encode(down(meant) + down.flush())
    got = call.received()
    assert got[: len(expected)] == expected  # no frame out of place, no click
    assert set(got[len(expected):]) <= {0xFF}  # then only the padding
    # One mark, after the reply's last frame ("When that media message's playback is
    # complete, Twilio sends a mark message to your server using the same mark.name").
    marks = [i for i, m in enumerate(call.heard.frames) if m["event"] == "mark"]
    assert len(marks) == 1 and marks[0] == len(call.heard.frames) - 1
    assert call.heard.marks_echoed == [call.heard.frames[marks[0]]["mark"]["name"]]


async def test_a_call_is_recorded_with_its_id_and_what_the_caller_heard_and_its_log_lines_name_it(question, tmp_path):
    import logging

    from live.observe.logs import JsonFormatter, _SessionFilter
    from live.observe.record import Recorder, load, timeline

    handler = logging.StreamHandler(stream := __import__("io").StringIO())
    handler.addFilter(_SessionFilter())
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("live")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    agent = Agent(name="weather", model="gemini-live-2.5-flash-preview")
    script = Script(replies=[LONG_REPLY, "Yes?"], speed=1)
    try:
        async with running_emulator(script) as emu, running_phone(
            agent, gemini_for(emu), recorder=Recorder(tmp_path / "records")
        ) as phone:
            async with phone.call() as call:
                await call.speak(question, silence_after=0.2)
                await call.wait_for_audio(timeout=10)
                await anyio.sleep(1.5)
                await call.speak(question[:8000])  # talks over the reply
                with anyio.fail_after(5):
                    while not call.heard.clears:
                        await anyio.sleep(0.01)
                await anyio.sleep(1.0)
            del emu
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    [folder] = list((tmp_path / "records").iterdir())
    record = load(folder)
    assert record.header["call"] == {"carrier": "twilio", "id": call.call_sid, "from": "+15550100001",
                                     "to": "+15550100002", "direction": "inbound"}
    shown = "\n".join(timeline(record))
    assert call.call_sid in shown
    heard = [line for line in shown.splitlines() if "agent   said (heard):" in line]
    assert heard and LONG_REPLY.startswith(heard[0].split(": ", 1)[1].strip("'\" "))
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    session_lines = [line for line in lines if line.get("session")]
    assert session_lines and all(line.get("call") == call.call_sid for line in session_lines)


async def test_the_agent_knows_who_is_calling():
    from live.phone.control import current_call

    seen = []

    def who_is_calling() -> dict:
        """Who is on the line."""
        call = current_call.get()
        seen.append(call)
        return {"caller": call.caller, "city": call.parameters.get("FromCity")}

    agent = Agent(name="desk", model="gemini-live-2.5-flash-preview", tools=[who_is_calling])
    script = Script(user_says=["who_is_calling please"], tool_args={"who_is_calling": {}})
    async with running_emulator(script) as emu, running_phone(agent, gemini_for(emu)) as phone:
        async with phone.call(ring={"FromCity": "PARIS", "CallerName": "ADA LOVELACE"}) as call:
            await call.speak(synthetic_ulaw(), silence_after=0.2)
            await call.wait_for_audio(timeout=10)
        [session] = emu.sessions
    instruction = json.dumps(session.setup)
    # In the model's instruction: the number, the call's id, the caller ID name.
    assert "+15550100001" in instruction and call.call_sid in instruction and "ADA LOVELACE" in instruction
    # And for the agent's tools, as session data.
    [call_seen] = seen
    assert (call_seen.caller, call_seen.called, call_seen.call_id) == ("+15550100001", "+15550100002", call.call_sid)
    assert call_seen.parameters["FromCity"] == "PARIS" and call_seen.direction == "inbound"


async def test_a_restart_lets_calls_finish_then_the_agent_says_goodbye_and_hangs_up(question):
    from clients.phone_double import TwilioDouble

    agent = Agent(name="weather", model="gemini-live-2.5-flash-preview")
    script = Script(replies=["Sunny in Paris.", "Still sunny.", "I have to go now, please call back. Goodbye!"])
    async with running_emulator(script) as emu, running_phone(
        agent, gemini_for(emu), control="double", call_drain_timeout=8.0
    ) as phone:
        async with phone.call() as call:
            await call.speak(question, silence_after=0.2)
            await call.wait_quiet(0.6, timeout=15)
            phone.server.stop()  # a deploy: SIGTERM
            await anyio.sleep(0.3)
            # No new call: a sentence, not a stream.
            status, twiml, _ = await phone.double.ring(phone.webhook_url)
            assert status == 200 and [v for v, _ in TwilioDouble.verbs(twiml)] == ["Say", "Hangup"]
            # This call goes on: the caller asks again and is answered.
            first = len(call.heard.media)
            await call.speak(question, silence_after=0.2)
            await call.wait_quiet(0.6, timeout=15, after=first)
            assert call.closed is None
            second = len(call.heard.media)
            # At the drain timeout, a goodbye, heard to its end, then the hang-up.
            with anyio.fail_after(30):
                while call.closed is None:
                    await anyio.sleep(0.05)
        transcripts = [t for s in emu.sessions for t in s.user_turns]
    assert any("has to end now" in t for t in transcripts), transcripts
    assert len(call.heard.media) > second + 25  # the goodbye: half a second and more
    assert call.played() == call.received()  # every frame played before the line dropped
    assert "<Hangup" in (call.new_twiml or "")  # hung up through the REST API, not a dead stream
    assert call.after_stream == []
