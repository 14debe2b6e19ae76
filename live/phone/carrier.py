"""What every carrier's media stream door does (sans-I/O), whatever its message names.

Carriers' media streams are alike: JSON text frames; `connected`, `start`
(the stream, the call, the codec, what the webhook's answer passed along),
`media` (base64 audio in 20 ms frames), `dtmf`, `mark` (echoed when the audio
before it has played), `stop`; and back, `media`, `mark`, `clear`.
`CarrierDoor` does all of that once: the caller's audio to the session as
16 kHz PCM, the reply (24 kHz) out in the carrier's codec in 20 ms frames
with a mark every 100 ms and one after each turn's last frame (its echo says
the turn has played: `PlayedOut`), `clear` on barge-in, keys as text, bad
frames as `ProtocolError`s, the call's own token checked, and the call hung
up through the carrier when the session ends on the server's side (`end`). A carrier's door says how its
`start` reads (`_read_start`) and how its outgoing messages are wrapped
(`_envelope`).
"""

from __future__ import annotations

import abc
import binascii
import dataclasses
import logging
from collections.abc import Callable, Sequence

import orjson
import pybase64

from live.doors.base import Capabilities, FrontDoor, Input, Opening, PlayedOut
from live.phone.audio import FrameCutter, Resampler, alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from live.phone.calls import CallTokens
from live.phone.control import CallControl, PhoneCall, current_call
from live.protocol import (
    ErrorEvent,
    GenerationComplete,
    Playback,
    ProtocolError,
    ServerEvent,
    SessionClose,
    SessionStart,
    Text,
    TurnComplete,
    TurnInterrupted,
)

__all__ = ["CODECS", "CarrierDoor", "Codec", "DTMF_DIGITS", "SESSION_INPUT_RATE", "StreamStart", "dtmf_text", "object_field"]

log = logging.getLogger("live.phone")

SESSION_INPUT_RATE = 16_000
REPLY_RATE = 24_000
DTMF_DIGITS = frozenset("0123456789*#ABCD")
# A mark after every this many reply frames (100 ms): what the caller heard is
# known to within that, at one small message per five frames.
FRAMES_PER_MARK = 5


def _l16_decode(data: bytes) -> bytes:
    """L16 is big-endian (RFC 3551); the session's PCM is little-endian."""
    import numpy as np

    return np.frombuffer(data[: len(data) // 2 * 2], ">i2").astype("<i2").tobytes()


def _l16_encode(pcm: bytes) -> bytes:
    import numpy as np

    return np.frombuffer(pcm, "<i2").astype(">i2").tobytes()


@dataclasses.dataclass(frozen=True)
class Codec:
    """A carrier's audio format: how its bytes become PCM16 and back, at what rate."""

    name: str
    rate: int
    sample_bytes: int
    decode: Callable[[bytes], bytes]
    encode: Callable[[bytes], bytes]
    silence: bytes  # one sample of silence

    @property
    def frame_bytes(self) -> int:
        return self.rate // 50 * self.sample_bytes  # 20 ms


PCMU = Codec("PCMU", 8_000, 1, ulaw_decode, ulaw_encode, b"\xff")
PCMA = Codec("PCMA", 8_000, 1, alaw_decode, alaw_encode, b"\xd5")
CODECS: dict[str, Codec] = {"PCMU": PCMU, "PCMA": PCMA}


def l16(rate: int) -> Codec:
    return Codec("L16", rate, 2, _l16_decode, _l16_encode, b"\x00\x00")


def object_field(message: dict, key: str) -> dict:
    """A message's field that the carrier sends as an object (absent: an empty
    one); anything else is a frame this door cannot read."""
    value = message.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ProtocolError("bad_frame", f"'{key}' is not an object")
    return value


def dtmf_text(digit: str) -> str:
    """What the model is told when the caller presses a key."""
    return f"[The caller pressed the key {digit} on their phone's keypad.]"


@dataclasses.dataclass(frozen=True)
class StreamStart:
    """What a carrier's `start` says: the stream, the call, the codec, the call's token."""

    stream_id: str
    call_id: str | None
    codec: Codec
    token: str | None


class CarrierDoor(FrontDoor):
    """One carrier media stream: one phone call (see the module's docstring)."""

    capabilities = Capabilities(reports_played_out=True)
    checks_own_credentials = True
    carrier: str  # the carrier's name, for messages and the log

    def __init__(
        self, request=None, *, tokens: CallTokens, on_dtmf: Callable[[str, str], None] | None = None,
        control: CallControl | None = None,
    ) -> None:
        super().__init__(request)
        self.tokens = tokens
        self.control = control  # the carrier's REST API, for the call-control tools
        self.on_dtmf = on_dtmf  # (call id, digit): an agent's own handler, if it has one
        self.stream_id: str | None = None
        self.call_id: str | None = None
        self.codec = PCMU  # until `start` names it
        self._token: str | None = None
        self._inbound = self._outbound = Resampler(1, 1)
        self._frames = FrameCutter(PCMU.frame_bytes)
        # Reply accounting for the heard transcript: the reply's number, the
        # carrier's bytes of it sent, and how far the caller's marks say they heard.
        self._reply = 0
        self._reply_sent = 0
        self._reply_heard = 0
        self._unmarked = 0
        self._playback_owed: float | None = None
        # Turn marks: after each turn's last frame one mark (numbered); its echo,
        # with no audio sent after it, says everything sent has played.
        self._marks_sent = 0
        self._marks_cleared = 0  # marks up to this number came back with a clear, not by playing
        self._sent_since_mark = False
        self.stopped = False  # the carrier said `stop`: the call left the stream
        self._ended = False
        self._errors: dict[str, int] = {}  # errors told, by code: the log says the first few

    # ------------------------------------------------------------------ reading

    def _message(self, frame: str | bytes) -> dict:
        if isinstance(frame, bytes):
            raise ProtocolError("bad_frame", f"{self.carrier} media streams send JSON text frames, not binary")
        try:
            message = orjson.loads(frame)
        except orjson.JSONDecodeError:
            raise ProtocolError("bad_frame", f"a frame that is not JSON: {frame[:60]!r}") from None
        if not isinstance(message, dict) or not isinstance(message.get("event"), str):
            raise ProtocolError("bad_frame", "a message without an 'event' name")
        return message

    def opening(self, frame: str | bytes) -> Opening | ErrorEvent | None:
        message = self._message(frame)
        event = message["event"]
        if event == "connected":
            return None
        if event == "stop":
            self.stopped = True
            return SessionClose()
        if event != "start":
            raise ProtocolError("not_started", f"'{event}' before 'start' was ignored")
        start = self._read_start(message)
        self.stream_id, self.call_id, self.codec, self._token = start.stream_id, start.call_id, start.codec, start.token
        self._inbound = Resampler(self.codec.rate, SESSION_INPUT_RATE)
        self._outbound = Resampler(REPLY_RATE, self.codec.rate)
        self._frames = FrameCutter(self.codec.frame_bytes)
        if self.call_id is not None:
            # Set in the session's own task before its task group starts: every
            # task of this call (its tools) sees which call it is.
            current_call.set(PhoneCall(self.name, self.call_id, self.control))
        return SessionStart(token=None, input_rate=SESSION_INPUT_RATE, reports_playback=True)

    def authorize(self, token: str | None) -> str | None:
        return self.tokens.check(self._token, self.call_id)

    def line_rate(self) -> int | None:
        return self.codec.rate if self.codec.rate < SESSION_INPUT_RATE else None

    @abc.abstractmethod
    def _read_start(self, message: dict) -> StreamStart:
        """The carrier's `start` message, read; `ProtocolError` for one this door cannot take."""

    @abc.abstractmethod
    def _envelope(self, message: dict) -> dict:
        """An outgoing message (`media`, `mark`, `clear`) as the carrier wants it addressed."""

    def _owed(self) -> list[Input]:
        """What the session is owed before this frame's inputs: the playback report after a clear."""
        owed: list[Input] = []
        if self._playback_owed is not None:
            owed.append(Playback(self._playback_owed))
            self._playback_owed = None
        return owed

    def inputs(self, frame: str | bytes | dict) -> Sequence[Input]:
        message = frame if isinstance(frame, dict) else self._message(frame)
        owed = self._owed()
        event = message["event"]
        if event == "media":
            media = message.get("media")
            if not isinstance(media, dict):
                raise ProtocolError("bad_frame", "'media' without its 'media' object")
            if media.get("track", "inbound") != "inbound":
                return owed  # only the caller's side is for the model
            payload = media.get("payload")
            if not isinstance(payload, str):
                raise ProtocolError("bad_frame", "'media' without a payload")
            try:
                audio = pybase64.b64decode(payload, validate=True)
            except (binascii.Error, ValueError):
                raise ProtocolError("bad_audio", "a 'media' payload that is not base64") from None
            pcm = self._inbound(self.codec.decode(audio))
            if pcm:
                owed.append(pcm)
            return owed
        if event == "mark":
            owed.extend(self._marked(object_field(message, "mark").get("name")))
            return owed
        if event == "dtmf":
            digit = str(object_field(message, "dtmf").get("digit", ""))
            if digit not in DTMF_DIGITS:
                raise ProtocolError("bad_frame", f"a DTMF digit that is not one: {digit[:8]!r}")
            if self.on_dtmf is not None:
                self.on_dtmf(self.call_id or "", digit)
            owed.append(Text(dtmf_text(digit)))
            return owed
        if event == "stop":
            self.stopped = True
            owed.append(SessionClose())
            return owed
        if event in ("connected", "start"):
            raise ProtocolError("bad_frame", f"a second '{event}' on a started stream was ignored")
        raise ProtocolError("unknown_event", f"unknown event {event[:40]!r} was ignored")

    def _marked(self, name: object) -> list[Input]:
        """The caller's side played our audio up to a mark: `reply:bytes`, or
        `end:n` after a turn's last frame (or a clear sent it back)."""
        if not isinstance(name, str):
            return []
        reply, _, position = name.partition(":")
        if reply == "end" and position.isdigit():
            number = int(position)
            if number <= self._marks_cleared or number != self._marks_sent or self._sent_since_mark:
                return []  # sent back by a clear, or more audio went out after it
            return [PlayedOut()]
        if reply == str(self._reply) and position.isdigit():
            self._reply_heard = max(self._reply_heard, int(position))
        return []

    # ------------------------------------------------------------------ writing

    def event(self, event: ServerEvent) -> str | None:
        if isinstance(event, TurnInterrupted):
            # Twilio drops what it buffered; the session is told how much of
            # the reply had played by the marks echoed so far (on the next frame).
            self._playback_owed = self._reply_heard / (self.codec.rate * self.codec.sample_bytes)
            self._marks_cleared = self._marks_sent  # the carrier sends them back with the clear
            self._sent_since_mark = False
            self._next_reply()
            self._outbound.reset()
            self._frames.clear()
            return self._encode(self._envelope({"event": "clear"}))
        if isinstance(event, GenerationComplete):
            last = self._frames.flush(self.codec.silence)
            if last is None:
                return None
            self._reply_sent += len(last)
            self._sent_since_mark = True
            return self._media(last)
        if isinstance(event, TurnComplete):
            self._next_reply()
            self._marks_sent += 1
            self._sent_since_mark = False
            return self._encode(self._envelope({"event": "mark", "mark": {"name": f"end:{self._marks_sent}"}}))
        if isinstance(event, ErrorEvent):
            self._log_error(event)
        return None  # transcripts, tool calls: a phone has no screen

    def _log_error(self, event: ErrorEvent) -> None:
        """A carrier cannot read an error: the operator's log says it, a few times per kind."""
        count = self._errors[event.code] = self._errors.get(event.code, 0) + 1
        if count <= 3 or count in (10, 100, 1000, 10_000):
            log.warning(
                "%s call %s: %s: %s%s", self.carrier, (self.call_id or "?")[:40], event.code, event.message[:200],
                f" ({count} so far)" if count > 3 else "",
            )

    def _next_reply(self) -> None:
        self._reply += 1
        self._reply_sent = self._reply_heard = self._unmarked = 0

    def audio(self, pcm: bytes) -> Sequence[str]:
        frames = self._frames(self.codec.encode(self._outbound(pcm)))
        out = [self._media(frame) for frame in frames]
        if frames:
            self._sent_since_mark = True
        self._reply_sent += self.codec.frame_bytes * len(frames)
        self._unmarked += len(frames)
        if self._unmarked >= FRAMES_PER_MARK:
            self._unmarked -= FRAMES_PER_MARK
            out.append(self._encode(self._envelope({"event": "mark", "mark": {"name": f"{self._reply}:{self._reply_sent}"}})))
        return out

    def _media(self, audio: bytes) -> str:
        return self._encode(self._envelope({"event": "media", "media": {"payload": pybase64.b64encode(audio).decode("ascii")}}))

    @staticmethod
    def _encode(message: dict) -> str:
        return orjson.dumps(message).decode()

    # ------------------------------------------------------------------ ending

    async def end(self, reason: str) -> None:
        """The session ended here: hang up (once), unless the caller already did.
        Without call control (`--twilio` with no account sid), the stream's
        close ends a Twilio call that has no TwiML after `<Connect>`."""
        if self._ended or self.stopped or self.call_id is None or self.control is None:
            return
        self._ended = True
        try:
            await self.control.hang_up(self.call_id)
        except Exception as exc:  # the carrier's refusal or the network: logged, the session is over anyway
            log.warning("%s call %s: hanging up failed: %s", self.carrier, self.call_id[:40],
                        str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
        else:
            log.info("%s call %s hung up (%s)", self.carrier, self.call_id[:40], reason[:100])
