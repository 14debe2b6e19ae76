"""What every carrier's media stream door does (sans-I/O), whatever its message names.

Carriers' media streams are alike: JSON text frames; `connected`, `start`
(the stream, the call, the codec, what the webhook's answer passed along),
`media` (base64 audio in 20 ms frames), `dtmf`, `mark` (echoed when the audio
before it has played), `stop`; and back, `media`, `mark`, `clear`.
`CarrierDoor` does all of that once: the caller's audio to the session as
16 kHz PCM; the reply (24 kHz) out in the codec the carrier was asked to play,
in 20 ms frames, with a mark after each reply's last frame (its echo says the
reply has played: `PlayedOut`); `clear` on barge-in; keys gathered into
entries; bad frames as `ProtocolError`s; the call's own token checked; and,
when the session ends on the server's side, the call hung up (`end`). A
carrier's door says how its `start` reads (`_read_start`) and how its
outgoing messages are wrapped (`_envelope`).
"""

from __future__ import annotations

import abc
import binascii
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import orjson
import pybase64
from google.genai import types

from live.agent import KeyEntry
from live.doors.base import Capabilities, FrontDoor, Input, Opening, PlayedOut, SessionTask
from live.observe.logs import current_call_id
from live.phone.audio import (
    FrameCutter,
    Resampler,
    alaw_decode,
    alaw_encode,
    alaw_from_samples,
    alaw_samples,
    ulaw_decode,
    ulaw_encode,
    ulaw_from_samples,
    ulaw_samples,
)
from live.phone.calls import CallTokens
from live.phone.control import CallControl, PhoneCall, current_call
from live.phone.keys import KeyEntries, key_text
from live.protocol import (
    ErrorEvent,
    GenerationComplete,
    ProtocolError,
    ServerEvent,
    SessionClose,
    SessionStart,
    Text,
    TurnComplete,
    TurnInterrupted,
)

__all__ = [
    "CODECS", "CallLine", "CarrierDoor", "Codec", "DTMF_DIGITS", "SESSION_INPUT_RATE", "StreamStart", "dtmf_text",
    "object_field",
]

log = logging.getLogger("live.phone")

SESSION_INPUT_RATE = 16_000
REPLY_RATE = 24_000
DTMF_DIGITS = frozenset("0123456789*#ABCD")
FRAME_MS = 20
dtmf_text = key_text  # what the model is told of one key (kept for the name)


def _l16_decode(data: bytes) -> bytes:
    """L16 is big-endian (RFC 3551: network byte order); the session's PCM is little-endian."""
    return np.frombuffer(data[: len(data) // 2 * 2], ">i2").astype("<i2").tobytes()


def _l16_encode(pcm: bytes) -> bytes:
    return np.frombuffer(pcm, "<i2").astype(">i2").tobytes()


def _l16_samples(data: bytes) -> np.ndarray:
    return np.frombuffer(data[: len(data) // 2 * 2], ">i2")


def _l16_from_samples(pcm: np.ndarray) -> bytes:
    return pcm.astype(">i2").tobytes()


@dataclasses.dataclass(frozen=True)
class Codec:
    """A carrier's audio format: how its bytes become PCM16 and back, at what rate
    (`samples` and `from_samples`: the same with numpy arrays, for a resampler)."""

    name: str
    rate: int
    sample_bytes: int
    decode: Callable[[bytes], bytes]
    encode: Callable[[bytes], bytes]
    silence: bytes  # one sample of silence
    samples: Callable[[bytes], np.ndarray]
    from_samples: Callable[[np.ndarray], bytes]

    @property
    def frame_bytes(self) -> int:
        return self.rate // 50 * self.sample_bytes  # 20 ms


PCMU = Codec("PCMU", 8_000, 1, ulaw_decode, ulaw_encode, b"\xff", ulaw_samples, ulaw_from_samples)
PCMA = Codec("PCMA", 8_000, 1, alaw_decode, alaw_encode, b"\xd5", alaw_samples, alaw_from_samples)
CODECS: dict[str, Codec] = {"PCMU": PCMU, "PCMA": PCMA}


def l16(rate: int) -> Codec:
    return Codec("L16", rate, 2, _l16_decode, _l16_encode, b"\x00\x00", _l16_samples, _l16_from_samples)


def object_field(message: dict, key: str) -> dict:
    """A message's field that the carrier sends as an object (absent: an empty
    one); anything else is a frame this door cannot read."""
    value = message.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ProtocolError("bad_frame", f"'{key}' is not an object")
    return value


def codec_named(name: str, rate: int = 8_000) -> Codec:
    """PCMU, PCMA (8 kHz) or L16 (8 or 16 kHz) by its carrier name; ValueError for another."""
    if name in CODECS and rate == 8_000:
        return CODECS[name]
    if name == "L16" and rate in (8_000, 16_000):
        return l16(rate)
    raise ValueError(f"{name} at {rate} Hz: this door takes PCMU or PCMA at 8 kHz, or L16 at 8 or 16 kHz")


@dataclasses.dataclass(frozen=True)
class StreamStart:
    """What a carrier's `start` says: the stream, the call, the codec, the call's
    token, and who called whom (with the webhook's parameters, where the
    carrier passes them along)."""

    stream_id: str
    call_id: str | None
    codec: Codec
    token: str | None
    caller: str | None = None
    called: str | None = None
    direction: str | None = None
    parameters: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class CallLine:
    """What every call on one carrier's line shares (the door of each call gets it).

    - `tokens`: the calls' own tokens (`live.phone.calls`).
    - `control`: the carrier's REST API, to hang up and transfer (None: the
      operator gave no credentials for it).
    - `on_key_press`, `key_entry`: the agent's key handler and how keys reach
      the model.
    - `reply_codec`: what the carrier was asked to play (Telnyx: the command's
      `stream_bidirectional_codec` and rate; Twilio: always μ-law, 8 kHz).
    - `destinations`: transfer names the operator allows, and their numbers.
    - `handshake`: why a stream's WebSocket handshake is not the carrier's
      (None: it is); for carriers that sign it.
    """

    tokens: CallTokens
    control: CallControl | None = None
    on_key_press: Callable[[str, str], object] | None = None
    key_entry: KeyEntry = dataclasses.field(default_factory=KeyEntry)
    reply_codec: Codec = PCMU
    destinations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    handshake: Callable[[object], str | None] | None = None


class CarrierDoor(FrontDoor):
    """One carrier media stream: one phone call (see the module's docstring)."""

    capabilities = Capabilities(call=True, reports_played_out=True)
    checks_own_credentials = True
    in_step_events = (GenerationComplete, TurnComplete)
    carrier: str  # the carrier's name, for messages and the log

    def __init__(
        self, request=None, *, line: CallLine | None = None, tokens: CallTokens | None = None,
        on_dtmf: Callable[[str, str], object] | None = None, control: CallControl | None = None,
    ) -> None:
        super().__init__(request)
        if line is None:
            if tokens is None:
                raise TypeError("a carrier door needs its line (or at least the line's tokens)")
            line = CallLine(tokens, control=control, on_key_press=on_dtmf)
        self.line = line
        self.tokens = line.tokens
        self.control = line.control
        self.stream_id: str | None = None
        self.call_id: str | None = None
        self.call: PhoneCall | None = None
        self.codec = PCMU  # the caller's audio, once `start` names it
        self.reply_codec = line.reply_codec  # what the carrier plays
        self._token: str | None = None
        self._inbound = Resampler(PCMU.rate, SESSION_INPUT_RATE)
        self._outbound = Resampler(REPLY_RATE, self.reply_codec.rate)
        self._frames = FrameCutter(self.reply_codec.frame_bytes)
        self._keys = KeyEntries(line.key_entry)
        self._media_ms = 0.0  # the call's clock: the caller's audio so far, by its timestamps
        # Reply marks: after each reply's last frame, one mark (numbered); its
        # echo, unless a clear sent it back, says everything before it played.
        self._marks_sent = 0
        self._marks_cleared = 0  # marks up to this number were echoed by a clear, not by playing
        self._sent_since_mark = False
        self._replying = False  # reply audio went out since the last reply's end
        self.stopped = False  # the carrier said the call's stream stopped (the caller hung up)
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
        config = None
        if self.call_id is not None:
            self.call = PhoneCall(
                self.name, self.call_id, self.control, caller=start.caller, called=start.called,
                direction=start.direction, parameters=dict(start.parameters), destinations=self.line.destinations,
            )
            # Set in the session's own task before its task group starts: every
            # task of this call (its tools) sees which call it is, and every line
            # it logs carries the call's id.
            current_call.set(self.call)
            current_call_id.set(self.call_id)
            config = types.LiveConnectConfig(system_instruction=self.call.describe())
        return SessionStart(token=None, input_rate=SESSION_INPUT_RATE, config=config)

    def authorize(self, token: str | None) -> str | None:
        if self.line.handshake is not None:
            problem = self.line.handshake(self.request)
            if problem is not None:
                return problem
        return self.tokens.check(self._token, self.call_id)

    async def redeem(self) -> str | None:
        return await self.tokens.spend(self._token)

    def line_rate(self) -> int | None:
        return self.codec.rate if self.codec.rate < SESSION_INPUT_RATE else None

    def record_header(self) -> dict:
        call = self.call
        if call is None:
            return {}
        return {"call": {"carrier": call.carrier, "id": call.call_id, "from": call.caller, "to": call.called,
                         "direction": call.direction}}

    @abc.abstractmethod
    def _read_start(self, message: dict) -> StreamStart:
        """The carrier's `start` message, read; `ProtocolError` for one this door cannot take."""

    @abc.abstractmethod
    def _envelope(self, message: dict) -> dict:
        """An outgoing message (`media`, `mark`, `clear`) as the carrier wants it addressed."""

    def inputs(self, frame: str | bytes | dict) -> Sequence[Input]:
        message = frame if isinstance(frame, dict) else self._message(frame)
        event = message["event"]
        if event == "media":
            return self._media(message)
        if event == "mark":
            return self._marked(object_field(message, "mark").get("name"))
        if event == "dtmf":
            digit = str(object_field(message, "dtmf").get("digit", ""))
            if digit not in DTMF_DIGITS:
                raise ProtocolError("bad_frame", f"a DTMF digit that is not one: {digit[:8]!r}")
            return self._key(digit)
        if event == "stop":
            self.stopped = True
            return [SessionClose()]
        if event in ("connected", "start"):
            raise ProtocolError("bad_frame", f"a second '{event}' on a started stream was ignored")
        raise ProtocolError("unknown_event", f"unknown event {event[:40]!r} was ignored")

    def _media(self, message: dict) -> list[Input]:
        media = message.get("media")
        if not isinstance(media, dict):
            raise ProtocolError("bad_frame", "'media' without its 'media' object")
        if media.get("track", "inbound") not in ("inbound", "inbound_track"):
            return []  # only the caller's side is for the model
        payload = media.get("payload")
        if not isinstance(payload, str):
            raise ProtocolError("bad_frame", "'media' without a payload")
        try:
            audio = pybase64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise ProtocolError("bad_audio", "a 'media' payload that is not base64") from None
        out: list[Input] = []
        pcm = self._inbound.samples(self.codec.samples(audio)).tobytes()
        if pcm:
            out.append(pcm)
        # The call's clock moves with the caller's audio: a pause between keys
        # is this much audio without one.
        duration = len(audio) * 1000 / (self.codec.rate * self.codec.sample_bytes)
        stamp = media.get("timestamp")
        try:
            end = float(stamp) + duration  # where this frame ends, by the carrier's own stamp
        except (TypeError, ValueError):
            end = self._media_ms + duration
        self._media_ms = max(self._media_ms, end)
        entry = self._keys.tick(self._media_ms)
        if entry is not None:
            out.append(Text(entry))
        return out

    def _key(self, digit: str) -> list[Input]:
        out: list[Input] = []
        hook = self.line.on_key_press
        if hook is not None:
            out.extend(self._run_hook(hook, digit))
        entry = self._keys.press(digit, self._media_ms)
        if entry is not None:
            out.append(Text(entry))
        return out

    def _run_hook(self, hook: Callable[[str, str], object], digit: str) -> list[Input]:
        """The agent's key handler: called now, or (`async`) run as a task of the session."""
        import inspect

        call_id = self.call_id or ""
        if inspect.iscoroutinefunction(hook) or inspect.iscoroutinefunction(getattr(hook, "__call__", None)):
            return [SessionTask(lambda: hook(call_id, digit), f"on_key_press({digit!r})")]
        result = hook(call_id, digit)
        if inspect.isawaitable(result):
            async def awaited() -> None:
                await result

            return [SessionTask(awaited, f"on_key_press({digit!r})")]
        return []

    def _marked(self, name: object) -> list[Input]:
        """A mark came back: the carrier played our audio up to it (or a clear dropped it)."""
        if not isinstance(name, str):
            return []
        kind, _, number = name.partition(":")
        if kind != "end" or not number.isdigit():
            return []
        number_ = int(number)
        if number_ <= self._marks_cleared or number_ != self._marks_sent or self._sent_since_mark:
            return []  # sent back by a clear, or more audio went out after it
        return [PlayedOut()]

    # ------------------------------------------------------------------ writing

    def event(self, event: ServerEvent) -> str | tuple[str, ...] | None:
        if isinstance(event, TurnInterrupted):
            # The carrier drops what it buffered, and sends back the marks with it.
            self._marks_cleared = self._marks_sent
            self._sent_since_mark = False
            self._replying = False
            self._outbound.reset()
            self._frames.clear()
            return self._encode(self._envelope({"event": "clear"}))
        if isinstance(event, (GenerationComplete, TurnComplete)):
            return self._reply_end()
        if isinstance(event, ErrorEvent):
            self._log_error(event)
        return None  # transcripts, tool calls: a phone has no screen

    def _reply_end(self) -> tuple[str, ...] | None:
        """The reply's last audio (what waits in the resampler and the last frame,
        padded with silence), then a mark whose echo says it has played."""
        if not self._replying:
            return None
        self._replying = False
        tail = self._frames.whole(self.reply_codec.from_samples(np.frombuffer(self._outbound.flush(), "<i2")))
        last = self._frames.flush(self.reply_codec.silence)
        if last is not None:
            tail += last
        self._marks_sent += 1
        self._sent_since_mark = False
        mark = self._encode(self._envelope({"event": "mark", "mark": {"name": f"end:{self._marks_sent}"}}))
        return (self._media_frame(tail), mark) if tail else (mark,)

    def _log_error(self, event: ErrorEvent) -> None:
        """A carrier cannot read an error: the operator's log says it, a few times per kind."""
        count = self._errors[event.code] = self._errors.get(event.code, 0) + 1
        if count <= 3 or count in (10, 100, 1000, 10_000):
            log.warning(
                "%s call %s: %s: %s%s", self.carrier, (self.call_id or "?")[:40], event.code, event.message[:200],
                f" ({count} so far)" if count > 3 else "",
            )

    def audio(self, pcm: bytes) -> Sequence[str]:
        # Whole 20 ms frames in one message: Twilio takes audio "of any size",
        # Telnyx "20 milliseconds to 30 seconds"; a message per frame was 50 a
        # second of JSON and base64 for nothing. The remainder waits for the next.
        audio = self._frames.whole(self.reply_codec.from_samples(self._outbound.samples(np.frombuffer(pcm, "<i2"))))
        if not audio:
            return ()
        self._replying = True
        self._sent_since_mark = True
        return (self._media_frame(audio),)

    def _media_frame(self, audio: bytes) -> str:
        return self._encode(self._envelope({"event": "media", "media": {"payload": pybase64.b64encode(audio).decode("ascii")}}))

    @staticmethod
    def _encode(message: dict) -> str:
        return orjson.dumps(message).decode()

    # ------------------------------------------------------------------ ending

    async def end(self, reason: str) -> None:
        """The session ended here: hang up, unless the caller already did."""
        if self.stopped or self.call_id is None or self.control is None:
            return
        try:
            await self.control.hang_up(self.call_id)
        except Exception as exc:  # the carrier's refusal or the network: logged, the session is over anyway
            log.warning("%s call %s: hanging up failed: %s", self.carrier, self.call_id[:40],
                        str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
        else:
            log.info("%s call %s hung up (%s)", self.carrier, self.call_id[:40], reason[:100])
