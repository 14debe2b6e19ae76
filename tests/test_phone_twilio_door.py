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


def started(tokens: CallTokens, **door) -> TwilioDoor:
    door = TwilioDoor(tokens=tokens, **door)
    assert door.opening(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"})) is None
    opening = door.opening(start_message(tokens.mint(CALL)))
    assert isinstance(opening, p.SessionStart) and opening.input_rate == 16_000
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


@pytest.mark.anyio
async def test_a_calls_token_opens_one_stream(tokens):
    token = tokens.mint(CALL)
    first, copy = TwilioDoor(tokens=tokens), TwilioDoor(tokens=tokens)
    first.opening(start_message(token))
    copy.opening(start_message(token))
    assert first.authorize(None) is None and await first.redeem() is None
    assert copy.authorize(None) is None  # a good token...
    assert "already opened" in await copy.redeem()  # ...that opened its one stream already


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


def dtmf(digit: str) -> str:
    # "A dtmf message is sent when someone presses a touch-tone number key in the
    # inbound stream"; `dtmf.track`: "Value is always inbound_track".
    return json.dumps({"event": "dtmf", "streamSid": STREAM, "sequenceNumber": "9",
                       "dtmf": {"track": "inbound_track", "digit": digit}})


def silence_frames(n: int, start: int = 0) -> list[str]:
    # Twilio sends the caller's line all along, 20 ms a frame: `media.timestamp`,
    # "Presentation Timestamp in Milliseconds from the start of the stream".
    return [json.dumps({"event": "media", "sequenceNumber": str(i + 3), "streamSid": STREAM,
                        "media": {"track": "inbound", "chunk": str(i + 1), "timestamp": str(20 * i),
                                  "payload": pybase64.b64encode(b"\xff" * 160).decode()}})
            for i in range(start, start + n)]


def texts(inputs) -> list[str]:
    return [i.text for i in inputs if isinstance(i, p.Text)]


def test_a_pin_is_one_turn_for_the_model_not_four(tokens):
    from live.agent import KeyEntry
    from live.phone.carrier import CallLine

    pressed = []
    line = CallLine(tokens, on_key_press=lambda call, digit: pressed.append((call, digit)))
    door = started(tokens, line=line)
    said = []
    for digit in "1234#":
        said += texts(door.inputs(dtmf(digit)))
    assert said == ["[The caller entered 1234# on their phone's keypad (ending with #).]"]
    assert pressed == [(CALL, d) for d in "1234#"]  # the agent's handler sees every key as it comes
    # Without a terminator, a pause ends the entry: two seconds of the line's audio with no key.
    for frame in silence_frames(10):
        door.inputs(frame)
    for digit in "56":
        said += texts(door.inputs(dtmf(digit)))
    for frame in silence_frames(99, start=10):
        said += texts(door.inputs(frame))
    assert said[1:] == []
    said += texts(door.inputs(silence_frames(1, start=110)[0]))
    assert said[1:] == ["[The caller entered 56 on their phone's keypad (then paused).]"]
    # An agent that wants each key as its own turn says so.
    each = started(tokens, line=CallLine(tokens, key_entry=KeyEntry(pause=0)))
    assert texts(each.inputs(dtmf("7"))) == ["[The caller pressed the key 7 on their phone's keypad.]"]


def test_an_async_key_handler_runs_as_a_task_of_the_session(tokens):
    from live.doors.base import SessionTask
    from live.phone.carrier import CallLine

    pressed = []

    async def on_key(call: str, digit: str) -> None:
        pressed.append((call, digit))

    door = started(tokens, line=CallLine(tokens, on_key_press=on_key))
    [task] = [i for i in door.inputs(dtmf("9")) if isinstance(i, SessionTask)]
    assert pressed == []  # not called in the door: the session runs it
    import anyio

    anyio.run(task.run)
    assert pressed == [(CALL, "9")]


def test_stop_ends_the_session(tokens):
    door = started(tokens)
    assert door.inputs(json.dumps({"event": "stop", "streamSid": STREAM, "stop": {"callSid": CALL}})) == [p.SessionClose()]


def reply_frames(frames) -> list[dict]:
    if isinstance(frames, str):
        frames = [frames]
    return [json.loads(f) for f in frames or ()]


def test_reply_audio_leaves_as_ulaw_in_few_messages_and_one_mark_after_its_end(tokens):
    door = started(tokens)
    second = (6000 * np.sin(2 * np.pi * 440 * np.arange(24_000) / 24_000)).astype("<i2").tobytes()
    out = []
    for i in range(0, len(second), 1920):  # 40 ms chunks, as the session paces them
        out += reply_frames(door.audio(second[i:i + 1920]))
    assert not [m for m in out if m["event"] == "mark"]  # no mark in the middle of a reply
    end = reply_frames(door.event(p.GenerationComplete()))
    out += end
    # "When your server sends a media message, it should then send a mark message to
    # Twilio. When that media message's playback is complete, Twilio sends a mark
    # message to your server using the same mark.name": one, after the reply's last frame.
    assert end[-1]["event"] == "mark" and [m["event"] for m in end[:-1]] == ["media"] * (len(end) - 1)
    assert door.event(p.TurnComplete()) is None  # the reply ended once
    media = [m for m in out if m["event"] == "media"]
    assert all(m["streamSid"] == STREAM for m in out)
    payloads = [pybase64.b64decode(m["media"]["payload"]) for m in media]
    # "The payload must be encoded audio/x-mulaw with a sample rate of 8000 and must
    # be base64 encoded. The audio can be of any size": a message per chunk the
    # session paces out (40 ms here), not one per 20 ms.
    assert len(media) <= 26
    assert abs(sum(map(len, payloads)) - 8000) <= 160  # one second, to a frame
    decoded = np.frombuffer(ulaw_decode(b"".join(payloads)), "<i2")
    peak = np.argmax(np.abs(np.fft.rfft(decoded))) * 8000 / len(decoded)
    assert abs(peak - 440) < 3
    # Twilio echoes the mark once the reply has played: the session hears that all of it did.
    echo = json.dumps({"event": "mark", "streamSid": STREAM, "sequenceNumber": "80", "mark": end[-1]["mark"]})
    from live.doors.base import PlayedOut

    assert door.inputs(echo) == [PlayedOut()]


def test_barge_in_clears_and_the_marks_it_sends_back_are_not_played_out(tokens):
    from live.doors.base import PlayedOut

    door = started(tokens)
    chunk = (6000 * np.sin(2 * np.pi * 440 * np.arange(1920) / 24_000)).astype("<i2").tobytes() * 2
    for _ in range(10):
        door.audio(chunk)
    [end_mark] = [m for m in reply_frames(door.event(p.GenerationComplete())) if m["event"] == "mark"]
    clear = json.loads(door.event(p.TurnInterrupted()))
    assert clear == {"event": "clear", "streamSid": STREAM}
    # "If your server sends a clear message, Twilio empties the audio buffer and
    # sends back mark messages matching any remaining mark messages from your server."
    echo = json.dumps({"event": "mark", "streamSid": STREAM, "mark": end_mark["mark"]})
    assert PlayedOut() not in door.inputs(echo)
    # The next reply starts its own: its mark, echoed as played, is.
    door.audio(chunk)
    [second] = [m for m in reply_frames(door.event(p.TurnComplete())) if m["event"] == "mark"]
    assert door.inputs(json.dumps({"event": "mark", "streamSid": STREAM, "mark": second["mark"]})) == [PlayedOut()]


@pytest.mark.anyio
async def test_call_control_tools_say_what_is_wrong_outside_a_call_or_with_a_bad_number():
    from live.phone.control import PhoneCall, current_call, end_call, transfer_call

    # end_call is end_session under a phone's name: it needs a conversation, not call control.
    with pytest.raises(RuntimeError, match="not in a conversation"):
        await end_call()
    token = current_call.set(PhoneCall("twilio", CALL, None, destinations={"sales": "+15551234567"}))
    try:
        with pytest.raises(RuntimeError, match="no call control"):
            await transfer_call("sales")
        # A number is not a destination: only the operator's names are.
        assert "not a transfer destination" in (await transfer_call("+15551234567"))["error"]
        assert "sales" in (await transfer_call("+1900 555 0000"))["error"]  # the names the model may use
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
