"""Telnyx's media streaming messages and webhook signatures, without a socket."""

from __future__ import annotations

import base64
import json
import time

import numpy as np
import pybase64
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from live import protocol as p
from live.phone.audio import alaw_encode, ulaw_decode, ulaw_encode
from live.phone.calls import CallTokens
from live.phone.telnyx import TelnyxDoor, telnyx_signature_problem

CALL = "v3:T02llQxIyaRkhfRKxgAP8nY511EhFLizdvdUKJiSw8d6A9BborherQ"
STREAM = "32de0dea-53cb-4b21-89a4-9884ea3fdea3"


@pytest.fixture(autouse=True)
def no_call_named():
    from live.phone.control import current_call

    token = current_call.set(None)
    yield
    current_call.reset(token)


def start(token: str | None, encoding: str = "PCMU", rate: int = 8000) -> str:
    state = base64.b64encode(token.encode()).decode() if token else None
    return json.dumps({"event": "start", "sequence_number": "1", "stream_id": STREAM,
                       "start": {"user_id": "u", "call_control_id": CALL, "client_state": state,
                                 "media_format": {"encoding": encoding, "sample_rate": rate, "channels": 1}}})


def media(payload: bytes, chunk: int) -> str:
    return json.dumps({"event": "media", "sequence_number": str(chunk + 2), "stream_id": STREAM,
                       "media": {"track": "inbound", "chunk": str(chunk), "timestamp": str(chunk * 20),
                                 "payload": pybase64.b64encode(payload).decode()}})


def tone(rate: int, seconds: float = 1.0, hz: float = 300) -> np.ndarray:
    return (8000 * np.sin(2 * np.pi * hz * np.arange(int(rate * seconds)) / rate)).astype("<i2")


def opened(encoding: str = "PCMU", rate: int = 8000) -> TelnyxDoor:
    tokens = CallTokens(agent="desk")
    door = TelnyxDoor(tokens=tokens)
    assert door.opening(json.dumps({"event": "connected", "version": "1.0.0"})) is None
    assert isinstance(door.opening(start(tokens.mint(CALL), encoding, rate)), p.SessionStart)
    assert door.authorize(None) is None
    return door


def test_a_stream_opens_only_with_its_calls_token_in_client_state():
    tokens = CallTokens(agent="desk")
    for token in (None, "not-a-token", tokens.mint("v3:another")):
        door = TelnyxDoor(tokens=tokens)
        door.opening(start(token))
        assert door.authorize(None) is not None


@pytest.mark.parametrize(("encoding", "rate", "encode"), [
    ("PCMA", 8000, alaw_encode),
    ("L16", 16000, lambda pcm: np.frombuffer(pcm, "<i2").astype(">i2").tobytes()),
])
def test_the_codec_named_in_start_is_the_one_decoded(encoding, rate, encode):
    door = opened(encoding, rate)
    sent = encode(tone(rate).tobytes())
    size = rate // 50 * (2 if encoding == "L16" else 1)
    pcm = b"".join(x for i in range(0, len(sent), size) for x in door.inputs(media(sent[i:i + size], i // size)))
    got = np.frombuffer(pcm, "<i2")[:16000]
    assert len(got) > 14_000
    assert abs(np.argmax(np.abs(np.fft.rfft(got))) * 16000 / len(got) - 300) < 3


def test_an_unknown_codec_is_refused():
    with pytest.raises(p.ProtocolError) as caught:
        TelnyxDoor(tokens=CallTokens()).opening(start("x", "OPUS", 48000))
    assert caught.value.code == "unsupported_media"


def test_frames_out_of_order_are_put_back_in_order():
    # Telnyx: "The order of events is not guaranteed and the chunk number can be
    # used to reorder the events." Each frame here is one level, so the order
    # the session gets them in shows in its audio.
    door = opened()
    levels = [int(2000 * (i + 1)) for i in range(12)]
    frames = [ulaw_encode(np.full(160, level, "<i2").tobytes()) for level in levels]
    order = (0, 1, 2, 3, 5, 4, 6, 8, 7, 9, 10, 11)
    pcm = b"".join(x for i in order for x in door.inputs(media(frames[i], i + 1)) if isinstance(x, bytes))
    got = np.frombuffer(pcm, "<i2")[160::320]  # mid-frame, one sample a frame (16 kHz: 320 a frame)
    steps = np.diff(got.astype(int))
    assert len(got) >= 11 and (steps > 0).all(), got  # every frame in its place: rising, never back
    assert door.late_frames == 0 and door.reordered_frames == 2
    # A frame that comes after its place was played is dropped, and counted.
    for i in range(12, 17):
        door.inputs(media(frames[0], i + 1))
    door.inputs(media(frames[0], 5))
    assert door.late_frames == 1


def test_replies_go_out_as_the_command_asked_telnyx_to_play_them_not_in_the_calls_codec():
    # The caller's stream is A-law (start.media_format), and the answer asked
    # Telnyx to play μ-law: `stream_bidirectional_codec`, "Indicates codec for
    # bidirectional streaming RTP payloads" (default PCMU).
    from live.phone.carrier import CallLine, codec_named

    tokens = CallTokens(agent="desk")
    door = TelnyxDoor(line=CallLine(tokens, reply_codec=codec_named("PCMU")))
    door.opening(start(tokens.mint(CALL), "PCMA"))
    reply = tone(24_000, 0.5, 440).tobytes()
    out = [json.loads(f) for i in range(0, len(reply), 1920) for f in door.audio(reply[i:i + 1920])]
    media_out = [m for m in out if m["event"] == "media"]
    # "The RTP streaming can be sent using media events: {"event": "media", "media": {"payload": ...}}"
    assert media_out and all(set(m) == {"event", "media"} for m in media_out)
    decoded = np.frombuffer(ulaw_decode(b"".join(pybase64.b64decode(m["media"]["payload"]) for m in media_out)), "<i2")
    assert abs(np.argmax(np.abs(np.fft.rfft(decoded))) * 8000 / len(decoded) - 440) < 5
    assert np.sqrt(np.mean(decoded.astype(float) ** 2)) > 4000  # the tone, not A-law bytes read as noise
    assert json.loads(door.event(p.TurnInterrupted())) == {"event": "clear"}


def test_a_carrier_error_is_a_clear_error_and_the_call_goes_on():
    door = opened()
    with pytest.raises(p.ProtocolError) as caught:
        door.inputs(json.dumps({"event": "error", "stream_id": STREAM,
                                "payload": {"code": 100002, "title": "unknown_error", "detail": "boom"}}))
    assert caught.value.code == "carrier_error" and "100002" in caught.value.message
    door.inputs(json.dumps({"event": "dtmf", "stream_id": STREAM, "dtmf": {"digit": "5"}}))


def keypair() -> tuple[Ed25519PrivateKey, str]:
    private = Ed25519PrivateKey.generate()
    public = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return private, base64.b64encode(public).decode()


def test_webhook_signatures_are_checked_with_the_accounts_public_key():
    private, public = keypair()
    body = json.dumps({"data": {"event_type": "call.initiated"}}).encode()
    stamp = str(int(time.time()))
    signature = base64.b64encode(private.sign(stamp.encode() + b"|" + body)).decode()
    assert telnyx_signature_problem(public, body, signature, stamp) is None
    assert "does not match" in telnyx_signature_problem(public, body + b" ", signature, stamp)
    assert "does not match" in telnyx_signature_problem(keypair()[1], body, signature, stamp)
    assert "too far" in telnyx_signature_problem(public, body, signature, str(int(time.time()) - 3600))
    assert "no telnyx" in telnyx_signature_problem(public, body, None, stamp)
    problem = telnyx_signature_problem(public, body, "A" * 88, stamp)
    assert problem and "A" * 20 not in problem
