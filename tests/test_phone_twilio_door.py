"""Twilio's Media Streams messages, mapped by the door without a socket."""

from __future__ import annotations

import json

import numpy as np
import pybase64
import pytest

from live import protocol as p
from live.phone.audio import ulaw_decode, ulaw_encode
from live.phone.calls import CallTokens
from live.phone.twilio import TwilioDoor

CALL = "CA0123456789abcdef0123456789abcdef"
STREAM = "MZ0123456789abcdef0123456789abcdef"


def start_message(token: str | None, call: str = CALL, encoding: str = "audio/x-mulaw") -> str:
    params = {"token": token} if token else {}
    return json.dumps({
        "event": "start", "sequenceNumber": "1", "streamSid": STREAM,
        "start": {"streamSid": STREAM, "accountSid": "AC1", "callSid": call, "tracks": ["inbound"],
                  "customParameters": params,
                  "mediaFormat": {"encoding": encoding, "sampleRate": 8000, "channels": 1}},
    })


def media_message(ulaw: bytes) -> str:
    return json.dumps({"event": "media", "sequenceNumber": "3", "streamSid": STREAM,
                       "media": {"track": "inbound", "chunk": "1", "timestamp": "5",
                                 "payload": pybase64.b64encode(ulaw).decode()}})


@pytest.fixture(autouse=True)
def no_call_named():
    """A door names its call in the context it runs in (a session's task); here, the test's."""
    from live.phone.control import current_call

    token = current_call.set(None)
    yield
    current_call.reset(token)


@pytest.fixture
def tokens() -> CallTokens:
    return CallTokens(agent="weather")


def started(tokens: CallTokens) -> TwilioDoor:
    door = TwilioDoor(tokens=tokens)
    assert door.opening(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"})) is None
    opening = door.opening(start_message(tokens.mint(CALL)))
    assert isinstance(opening, p.SessionStart) and opening.input_rate == 16_000 and opening.reports_playback
    assert door.authorize(opening.token) is None
    return door


def test_a_stream_opens_only_with_the_token_minted_for_its_call(tokens):
    started(tokens)
    for token, call in ((None, CALL), ("not-a-token", CALL), (tokens.mint("CAother"), CALL),
                        (CallTokens(agent="weather").mint(CALL), CALL)):
        door = TwilioDoor(tokens=tokens)
        door.opening(start_message(token, call))
        refusal = door.authorize(None)
        assert refusal is not None
        if token:
            assert token not in refusal  # a refusal never repeats the credential


def test_a_calls_token_opens_one_stream(tokens):
    token = tokens.mint(CALL)
    first, copy = TwilioDoor(tokens=tokens), TwilioDoor(tokens=tokens)
    first.opening(start_message(token))
    copy.opening(start_message(token))
    assert first.authorize(None) is None
    assert "already opened" in copy.authorize(None)


def test_a_start_in_another_format_is_refused(tokens):
    door = TwilioDoor(tokens=tokens)
    with pytest.raises(p.ProtocolError) as caught:
        door.opening(start_message(tokens.mint(CALL), encoding="audio/l16"))
    assert caught.value.code == "unsupported_media"


def test_caller_audio_reaches_the_session_as_16_khz_pcm(tokens):
    door = started(tokens)
    tone = (8000 * np.sin(2 * np.pi * 300 * np.arange(8000) / 8000)).astype("<i2").tobytes()
    ulaw = ulaw_encode(tone)
    pcm = b"".join(b for i in range(0, len(ulaw), 160) for b in door.inputs(media_message(ulaw[i:i + 160])))
    # One second at 8 kHz becomes one second at 16 kHz, but for the block the
    # filter still holds (under 80 ms: it comes out with the next frames).
    assert 32_000 - 2560 < len(pcm) <= 32_000
    got = np.frombuffer(pcm, "<i2")[:16_000]
    peak = np.argmax(np.abs(np.fft.rfft(got))) * 16_000 / len(got)
    assert abs(peak - 300) < 3


@pytest.mark.parametrize("frame, code", [
    ("{not json", "bad_frame"),
    (json.dumps({"event": "media", "media": {"payload": "***"}}), "bad_audio"),
    (json.dumps({"event": "media"}), "bad_frame"),
    (json.dumps({"event": "surprise"}), "unknown_event"),
    (json.dumps({"event": "dtmf", "dtmf": {"digit": "X"}}), "bad_frame"),
    (b"\x00\x01", "bad_frame"),
])
def test_bad_input_is_a_clear_error_and_the_stream_goes_on(tokens, frame, code):
    door = started(tokens)
    with pytest.raises(p.ProtocolError) as caught:
        door.inputs(frame)
    assert caught.value.code == code and not caught.value.fatal
    # The next frames are read as ever.
    assert b"".join(b for _ in range(10) for b in door.inputs(media_message(b"\x80" * 160)))


def test_a_key_press_reaches_the_model_and_the_agent(tokens):
    pressed = []
    door = TwilioDoor(tokens=tokens, on_dtmf=lambda call, digit: pressed.append((call, digit)))
    door.opening(start_message(tokens.mint(CALL)))
    [text] = door.inputs(json.dumps({"event": "dtmf", "streamSid": STREAM, "dtmf": {"track": "inbound_track", "digit": "7"}}))
    assert isinstance(text, p.Text) and "7" in text.text
    assert pressed == [(CALL, "7")]


def test_stop_ends_the_session(tokens):
    door = started(tokens)
    assert door.inputs(json.dumps({"event": "stop", "streamSid": STREAM, "stop": {"callSid": CALL}})) == [p.SessionClose()]


def reply_frames(frames) -> list[dict]:
    return [json.loads(f) for f in frames]


def test_reply_audio_leaves_as_20_ms_ulaw_frames_with_marks(tokens):
    door = started(tokens)
    second = (6000 * np.sin(2 * np.pi * 440 * np.arange(24_000) / 24_000)).astype("<i2").tobytes()
    out = []
    for i in range(0, len(second), 1920):  # 40 ms chunks, as the session paces them
        out += reply_frames(door.audio(second[i:i + 1920]))
    out += reply_frames([door.event(p.GenerationComplete())])
    media = [m for m in out if m["event"] == "media"]
    assert all(m["streamSid"] == STREAM for m in out)
    payloads = [pybase64.b64decode(m["media"]["payload"]) for m in media]
    assert {len(x) for x in payloads} == {160}
    assert abs(sum(map(len, payloads)) - 8000) <= 160  # one second, to a frame
    decoded = np.frombuffer(ulaw_decode(b"".join(payloads)), "<i2")
    peak = np.argmax(np.abs(np.fft.rfft(decoded))) * 8000 / len(decoded)
    assert abs(peak - 440) < 3
    marks = [m["mark"]["name"] for m in out if m["event"] == "mark"]
    assert len(marks) >= 8 and marks[-1].startswith("0:")
    assert [int(m.split(":")[1]) for m in marks] == sorted(int(m.split(":")[1]) for m in marks)


def test_barge_in_clears_and_reports_what_the_caller_heard(tokens):
    door = started(tokens)
    chunk = (6000 * np.sin(2 * np.pi * 440 * np.arange(1920) / 24_000)).astype("<i2").tobytes() * 2
    marks = []
    for _ in range(10):
        marks += [m["mark"]["name"] for m in reply_frames(door.audio(chunk)) if m["event"] == "mark"]
    heard = marks[len(marks) // 2]
    door.inputs(json.dumps({"event": "mark", "streamSid": STREAM, "mark": {"name": heard}}))
    clear = json.loads(door.event(p.TurnInterrupted()))
    assert clear == {"event": "clear", "streamSid": STREAM}
    # Twilio echoes the marks it dropped: they do not count as heard.
    inputs = door.inputs(json.dumps({"event": "mark", "streamSid": STREAM, "mark": {"name": marks[-1]}}))
    [report] = [i for i in inputs if isinstance(i, p.Playback)]
    assert report.played == pytest.approx(int(heard.split(":")[1]) / 8000)
    # The next reply starts its own count.
    assert not [i for i in door.inputs(media_message(b"\xff" * 160)) if isinstance(i, p.Playback)]


@pytest.mark.anyio
async def test_call_control_tools_say_what_is_wrong_outside_a_call_or_with_a_bad_number():
    from live.phone.control import PhoneCall, current_call, end_call, transfer_call

    # end_call is end_session under a phone's name: it needs a conversation, not call control.
    with pytest.raises(RuntimeError, match="not in a conversation"):
        await end_call()
    token = current_call.set(PhoneCall("twilio", CALL, None))
    try:
        with pytest.raises(RuntimeError, match="no call control"):
            await transfer_call("+15551234567")
        assert "international form" in (await transfer_call("555-1234"))["error"]
    finally:
        current_call.reset(token)


def test_the_stream_names_its_call_for_the_sessions_tools(tokens):
    import contextvars

    from live.phone.control import current_call

    def open_stream():
        started(tokens)
        return current_call.get()

    call = contextvars.copy_context().run(open_stream)
    assert (call.carrier, call.call_id) == ("twilio", CALL)
    assert current_call.get() is None  # only in that session's context
