"""Twilio Media Streams as a front door (sans-I/O).

A bidirectional stream (`<Connect><Stream>`) sends JSON text frames:
`connected`, `start` (the stream's and call's ids, the `<Parameter>`s of the
TwiML as `customParameters`, the media format: μ-law, 8 kHz, mono), `media`
(20 ms of base64 μ-law), `dtmf`, `mark` (our marks, echoed when the audio
before them has played) and `stop`. We send `media`, `mark` and `clear`
(drop what is buffered: barge-in). See
twilio.com/docs/voice/media-streams/websocket-messages.

The caller's audio goes to the session as PCM16 at 16 kHz (the model's own
input rate, and what the offline recogniser was trained on); the reply goes
out as μ-law 8 kHz in 20 ms frames, each batch followed by a mark naming how
far into the reply it reaches, so the session learns what the caller heard
when they barge in.
"""

from __future__ import annotations

import binascii
import logging
from collections.abc import Callable, Sequence

import orjson
import pybase64

from live.doors.base import Capabilities, FrontDoor, Input, Opening
from live.phone.audio import CARRIER_RATE, FRAME_BYTES, FrameCutter, Resampler, ulaw_decode, ulaw_encode
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

__all__ = ["DTMF_DIGITS", "SESSION_INPUT_RATE", "TwilioDoor", "dtmf_text"]

log = logging.getLogger("live.phone")

SESSION_INPUT_RATE = 16_000
REPLY_RATE = 24_000
ULAW_SILENCE = 0xFF
DTMF_DIGITS = frozenset("0123456789*#ABCD")
# A mark after every this many reply frames (100 ms): what the caller heard is
# known to within that, at one small message per five frames.
FRAMES_PER_MARK = 5


def dtmf_text(digit: str) -> str:
    """What the model is told when the caller presses a key."""
    return f"[The caller pressed the key {digit} on their phone's keypad.]"


class TwilioDoor(FrontDoor):
    """One Twilio media stream: one phone call."""

    name = "twilio"
    capabilities = Capabilities()
    checks_own_credentials = True
    # Where a new stream's messages are read from; the carrier's own words for it.
    carrier = "Twilio"

    def __init__(
        self, request=None, *, tokens: CallTokens, on_dtmf: Callable[[str, str], None] | None = None,
        control: CallControl | None = None,
    ) -> None:
        super().__init__(request)
        self.tokens = tokens
        self.control = control  # the carrier's REST API, for the call-control tools
        self.on_dtmf = on_dtmf  # (call id, digit): an agent's own handler, if it has one
        self.stream_sid: str | None = None
        self.call_sid: str | None = None
        self._token: str | None = None
        self._inbound = Resampler(CARRIER_RATE, SESSION_INPUT_RATE)
        self._outbound = Resampler(REPLY_RATE, CARRIER_RATE)
        self._frames = FrameCutter(FRAME_BYTES)
        # Reply accounting for the heard transcript: the reply's number, the
        # 8 kHz bytes of it sent, and how far the caller's marks say they heard.
        self._reply = 0
        self._reply_sent = 0
        self._reply_heard = 0
        self._unmarked = 0
        self._playback_owed: float | None = None
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
            return SessionClose()
        if event != "start":
            raise ProtocolError("not_started", f"'{event}' before 'start' was ignored")
        start = message.get("start")
        if not isinstance(start, dict):
            raise ProtocolError("bad_frame", "'start' without its 'start' object")
        media = start.get("mediaFormat") or {}
        if (media.get("encoding"), media.get("sampleRate"), media.get("channels", 1)) != ("audio/x-mulaw", CARRIER_RATE, 1):
            raise ProtocolError("unsupported_media", f"media format {media!r}: this door takes μ-law, 8 kHz, mono")
        self.stream_sid = str(start.get("streamSid") or message.get("streamSid") or "") or None
        self.call_sid = str(start.get("callSid") or "") or None
        if self.stream_sid is None:
            raise ProtocolError("bad_frame", "'start' names no streamSid")
        parameters = start.get("customParameters") or {}
        token = parameters.get("token") if isinstance(parameters, dict) else None
        self._token = token if isinstance(token, str) else None
        if self.call_sid is not None:
            # Set in the session's own task before its task group starts: every
            # task of this call (its tools) sees which call it is.
            current_call.set(PhoneCall(self.name, self.call_sid, self.control))
        return SessionStart(token=None, input_rate=SESSION_INPUT_RATE, reports_playback=True)

    def authorize(self, token: str | None) -> str | None:
        return self.tokens.check(self._token, self.call_sid)

    def inputs(self, frame: str | bytes) -> Sequence[Input]:
        message = self._message(frame)
        owed: list[Input] = []
        if self._playback_owed is not None:
            owed.append(Playback(self._playback_owed))
            self._playback_owed = None
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
                ulaw = pybase64.b64decode(payload, validate=True)
            except (binascii.Error, ValueError):
                raise ProtocolError("bad_audio", "a 'media' payload that is not base64") from None
            pcm = self._inbound(ulaw_decode(ulaw))
            if pcm:
                owed.append(pcm)
            return owed
        if event == "mark":
            self._marked((message.get("mark") or {}).get("name"))
            return owed
        if event == "dtmf":
            digit = str((message.get("dtmf") or {}).get("digit", ""))
            if digit not in DTMF_DIGITS:
                raise ProtocolError("bad_frame", f"a DTMF digit that is not one: {digit[:8]!r}")
            if self.on_dtmf is not None:
                self.on_dtmf(self.call_sid or "", digit)
            owed.append(Text(dtmf_text(digit)))
            return owed
        if event == "stop":
            owed.append(SessionClose())
            return owed
        if event in ("connected", "start"):
            raise ProtocolError("bad_frame", f"a second '{event}' on a started stream was ignored")
        raise ProtocolError("unknown_event", f"unknown event {event[:40]!r} was ignored")

    def _marked(self, name: object) -> None:
        """The caller's side played our audio up to a mark: `reply:bytes`."""
        if not isinstance(name, str):
            return
        reply, _, position = name.partition(":")
        if reply == str(self._reply) and position.isdigit():
            self._reply_heard = max(self._reply_heard, int(position))

    # ------------------------------------------------------------------ writing

    def event(self, event: ServerEvent) -> str | None:
        if isinstance(event, TurnInterrupted):
            # Twilio drops what it buffered; the session is told how much of
            # the reply had played by the marks echoed so far (on the next frame).
            self._playback_owed = self._reply_heard / CARRIER_RATE
            self._next_reply()
            self._outbound.reset()
            self._frames.clear()
            return self._encode({"event": "clear", "streamSid": self.stream_sid})
        if isinstance(event, GenerationComplete):
            last = self._frames.flush(ULAW_SILENCE)
            if last is None:
                return None
            self._reply_sent += len(last)
            return self._media(last)
        if isinstance(event, TurnComplete):
            self._next_reply()
            return None
        if isinstance(event, ErrorEvent):
            self._log_error(event)
        return None  # transcripts, tool calls: a phone has no screen

    def _log_error(self, event: ErrorEvent) -> None:
        """A carrier cannot read an error: the operator's log says it, a few times per kind."""
        count = self._errors[event.code] = self._errors.get(event.code, 0) + 1
        if count <= 3 or count in (10, 100, 1000, 10_000):
            log.warning(
                "%s call %s: %s: %s%s", self.carrier, (self.call_sid or "?")[:40], event.code, event.message[:200],
                f" ({count} so far)" if count > 3 else "",
            )

    def _next_reply(self) -> None:
        self._reply += 1
        self._reply_sent = self._reply_heard = self._unmarked = 0

    def audio(self, pcm: bytes) -> Sequence[str]:
        frames = self._frames(ulaw_encode(self._outbound(pcm)))
        out = [self._media(frame) for frame in frames]
        self._reply_sent += FRAME_BYTES * len(frames)
        self._unmarked += len(frames)
        if self._unmarked >= FRAMES_PER_MARK:
            self._unmarked -= FRAMES_PER_MARK
            out.append(self._encode({"event": "mark", "streamSid": self.stream_sid,
                                     "mark": {"name": f"{self._reply}:{self._reply_sent}"}}))
        return out

    def _media(self, ulaw: bytes) -> str:
        return self._encode({"event": "media", "streamSid": self.stream_sid,
                             "media": {"payload": pybase64.b64encode(ulaw).decode("ascii")}})

    @staticmethod
    def _encode(message: dict) -> str:
        return orjson.dumps(message).decode()
