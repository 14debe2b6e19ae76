"""The events the server sends, as data, and how frames are written and read.

`encode` writes a client message or a server event as one text frame; a client
reads the server's frames with `parse_server_frame` (a newer server's unknown
event comes back as `UnknownEvent`, never an exception).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any, ClassVar, TypeAlias

from live.images import IMAGE_TYPES
from live.protocol.client import OUTPUT_RATE, ClientMessage, ProtocolError

__all__ = [
    "CodeEvent",
    "CodeResultEvent",
    "DataEvent",
    "encode",
    "ErrorEvent",
    "GenerationComplete",
    "Grounding",
    "ModelSignal",
    "parse_server_event",
    "parse_server_frame",
    "ServerEvent",
    "SessionClosed",
    "SessionGoAway",
    "SessionReattached",
    "SessionReconnecting",
    "SessionResumed",
    "SessionStarted",
    "TextEvent",
    "ToolCallEvent",
    "ToolCancelled",
    "ResumptionPoint",
    "ToolResultEvent",
    "TranscriptInput",
    "TranscriptOutput",
    "TurnComplete",
    "TurnInterrupted",
    "UnknownEvent",
    "Usage",
    "UserMuted",
    "UserSpeaking",
    "UserStopped",
]


@dataclasses.dataclass(frozen=True, slots=True)
class SessionStarted:
    """The session is ready. `resume_token` lets a client reattach to it after its
    socket drops (`session.resume`); it is a credential: keep it like one.
    `max_image_bytes` and `max_image_rate` are the server's limits on `image`
    frames, so a client can size its frames to fit. `voice_consent_signature`
    is what the model returned for a cloned voice's consent audio (the Live
    API door writes it in `setupComplete`; this protocol has no field for it)."""

    type: ClassVar[str] = "session.started"
    session_id: str
    model: str
    input_rate: int
    output_rate: int = OUTPUT_RATE
    resume_token: str | None = None
    max_image_bytes: int | None = None
    max_image_rate: float | None = None
    voice_consent_signature: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": self.type,
            "session_id": self.session_id,
            "model": self.model,
            "input_audio": {"rate": self.input_rate, "encoding": "pcm16le"},
            "output_audio": {"rate": self.output_rate, "encoding": "pcm16le"},
        }
        if self.resume_token is not None:
            out["resume_token"] = self.resume_token
        if self.max_image_bytes is not None:
            out["image"] = {
                "types": list(IMAGE_TYPES),
                "max_bytes": self.max_image_bytes,
                "max_rate": self.max_image_rate,
            }
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> SessionStarted:
        image = obj.get("image") if isinstance(obj.get("image"), dict) else {}
        return cls(
            session_id=obj["session_id"],
            model=obj["model"],
            input_rate=obj["input_audio"]["rate"],
            output_rate=obj["output_audio"]["rate"],
            resume_token=obj.get("resume_token"),
            max_image_bytes=image.get("max_bytes"),
            max_image_rate=image.get("max_rate"),
        )


@dataclasses.dataclass(frozen=True, slots=True)
class SessionReattached:
    """A new socket took the session over; `replayed` frames it missed follow.

    `missed` frames (reply audio first) were no longer kept and are lost: they
    count in the sequence all the same (the stream after the replay goes on
    from `last_seq + missed + replayed`). `resume_token` replaces the one the
    client resumed with, which no longer works.
    """

    type: ClassVar[str] = "session.reattached"
    session_id: str
    replayed: int
    missed: int = 0
    resume_token: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class TranscriptInput:
    """What the user said, as the model heard it. `final` closes the turn's text.

    `fragment`: on a final the model marked finished itself, the text of its
    own message as it came (None on a final put together here); for a door
    that passes the model's fragments on as they came, never on this
    protocol's wire. `fields`: the fragment's other fields as the model wrote
    them (`languageCode`, `speakerLabel`, `words`, `startOffset`,
    `endOffset`), for such a door too."""

    type: ClassVar[str] = "transcript.input"
    text: str
    final: bool
    fragment: str | None = None
    fields: Mapping[str, Any] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class TranscriptOutput:
    """What the model said. `final` closes the turn's text.

    After a barge-in, one more final with `heard` true says what the user heard
    of the interrupted reply: its transcript cut where playback was, `played`
    seconds into the reply. `late` true: the tail of the reply that already
    ended (its final and `turn.complete` came first; Gemini does not order
    transcripts with turns): append it to that reply, not to a new one.
    `fragment`, `fields`: as for `TranscriptInput`.
    """

    type: ClassVar[str] = "transcript.output"
    text: str
    final: bool
    heard: bool | None = None
    played: float | None = None
    late: bool | None = None
    fragment: str | None = None
    fields: Mapping[str, Any] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class TextEvent:
    """A text reply (models asked for text instead of, or besides, audio).
    `thought`: a summary of the model's thinking, not its reply (sent only to
    a door that passes thoughts on; never on this protocol's wire)."""

    type: ClassVar[str] = "text"
    text: str
    partial: bool = False
    thought: bool | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class ToolCallEvent:
    """The model called a tool; `runs_on` says who answers it: "server" or "client"."""

    type: ClassVar[str] = "tool.call"
    id: str
    name: str
    args: dict[str, Any]
    runs_on: str


@dataclasses.dataclass(frozen=True, slots=True)
class ToolResultEvent:
    """The response sent to the model for a call (shown to the client for display)."""

    type: ClassVar[str] = "tool.result"
    id: str
    name: str
    response: dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class ToolCancelled:
    """The model no longer wants these calls answered."""

    type: ClassVar[str] = "tool.cancelled"
    ids: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class TurnInterrupted:
    """The user barged in: flush playback now; no more audio of that reply follows."""

    type: ClassVar[str] = "turn.interrupted"


@dataclasses.dataclass(frozen=True, slots=True)
class UserSpeaking:
    """The server heard the user start speaking (`"turn_taking": "server"`).

    `over_reply` true: while the agent was speaking; it interrupts the reply
    only if it lasts (`turn.interrupted` follows), else `user.stopped` says
    `backchannel` and the reply goes on.
    """

    type: ClassVar[str] = "user.speaking"
    over_reply: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class UserStopped:
    """The user's turn ended (`"turn_taking": "server"`), and why.

    `reason`: `complete` (the end-of-turn model heard a finished sentence),
    `silence` (the silence that ends a turn), `max_wait` (the longest pause a
    turn survives), `max_length` (the longest turn), `audio_end` (the client's
    `audio.end`); or `backchannel`: speech over the agent's reply that was
    not taken as a turn (the model never heard it).
    """

    type: ClassVar[str] = "user.stopped"
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class GenerationComplete:
    """All of the model's audio for this turn has been sent."""

    type: ClassVar[str] = "generation.complete"


@dataclasses.dataclass(frozen=True, slots=True)
class TurnComplete:
    """The model's turn is over; it listens. `usage`: what the turn cost, when
    the session tells it with the turn's end (for a door whose clients expect
    both in one message; never on this protocol's wire, where `usage` follows).
    `interaction`: the model's interaction status sent with it (IN_PROGRESS:
    more is coming; IDLE), for a door that passes it on; not on this wire."""

    type: ClassVar[str] = "turn.complete"
    reason: str | None = None
    usage: Usage | None = None
    interaction: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "reason": self.reason} if self.reason is not None else {"type": self.type}


@dataclasses.dataclass(frozen=True, slots=True)
class Usage:
    """Token counts reported by the model, for cost accounting."""

    type: ClassVar[str] = "usage"
    prompt_tokens: int | None = None
    response_tokens: int | None = None
    total_tokens: int | None = None
    cached_tokens: int | None = None
    thoughts_tokens: int | None = None
    tool_use_prompt_tokens: int | None = None
    by_modality: dict[str, dict[str, int]] | None = None
    """Per kind ("prompt", "response", "cached", "tool_use_prompt"), tokens per
    modality ("AUDIO", "TEXT", ...) where the model reports them: audio and text
    are priced differently."""
    service_tier: str | None = None
    """The service tier the model's service priced the turn at ("standard",
    "flex", "priority"), where it says."""


@dataclasses.dataclass(frozen=True, slots=True)
class Grounding:
    """Sources the model grounded its reply on (Google Search and the like)."""

    type: ClassVar[str] = "grounding"
    metadata: dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class CodeEvent:
    """Code the model wrote and ran (the code-execution tool)."""

    type: ClassVar[str] = "code"
    code: str
    language: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class CodeResultEvent:
    """The outcome and output of code the model ran."""

    type: ClassVar[str] = "code.result"
    output: str
    outcome: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class DataEvent:
    """A non-audio file the model produced (an image, say), as base64."""

    type: ClassVar[str] = "data"
    mime_type: str
    data: str


@dataclasses.dataclass(frozen=True, slots=True)
class ModelSignal:
    """What the model's service said that the session takes no action on (voice
    activity, waiting for input, URL context, interim transcripts, a
    transcript's own fields), as that service's message fields, for a door that
    speaks its protocol (the Live API's passes them on). Never on this
    protocol's wire."""

    type: ClassVar[str] = "model.signal"
    fields: dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class ResumptionPoint:
    """Whether the client could resume its session now, should its socket go:
    `resume_token` a new token to resume with (the one before it stops
    working), None while the model is busy (generating, or a call is
    unanswered). For a door that tells its clients as the session goes (the
    Live API's `sessionResumptionUpdate`); never on this protocol's wire."""

    type: ClassVar[str] = "session.resumable"
    resume_token: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class UnknownEvent:
    """An event type this client does not know (a newer server): kept, not fatal."""

    type: str
    data: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {**self.data, "type": self.type}


@dataclasses.dataclass(frozen=True, slots=True)
class SessionGoAway:
    """The upstream connection will close in `time_left` seconds."""

    type: ClassVar[str] = "session.go_away"
    time_left: float | None


@dataclasses.dataclass(frozen=True, slots=True)
class SessionReconnecting:
    """The upstream connection is being replaced; audio sent meanwhile is held."""

    type: ClassVar[str] = "session.reconnecting"
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class SessionResumed:
    """The conversation goes on over a new upstream connection."""

    type: ClassVar[str] = "session.resumed"


@dataclasses.dataclass(frozen=True, slots=True)
class UserMuted:
    """The agent stopped listening to the user (`muted`), or listens again.

    A listening window the agent asked for: `reason` is `tool` (a tool call
    runs) or `must_hear` (a segment the user must hear in full plays). What
    the user says meanwhile is dropped: a client may show a muted microphone.
    """

    type: ClassVar[str] = "user.muted"
    muted: bool
    reason: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class ErrorEvent:
    """Something went wrong; `fatal` says whether the session ends because of it."""

    type: ClassVar[str] = "error"
    code: str
    message: str
    fatal: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class SessionClosed:
    """The last event of a session."""

    type: ClassVar[str] = "session.closed"
    reason: str


ServerEvent: TypeAlias = (
    SessionStarted
    | TranscriptInput
    | TranscriptOutput
    | TextEvent
    | ToolCallEvent
    | ToolResultEvent
    | ToolCancelled
    | TurnInterrupted
    | UserSpeaking
    | UserStopped
    | GenerationComplete
    | TurnComplete
    | Usage
    | Grounding
    | CodeEvent
    | CodeResultEvent
    | DataEvent
    | ModelSignal
    | ResumptionPoint
    | SessionGoAway
    | SessionReconnecting
    | SessionResumed
    | SessionReattached
    | UserMuted
    | ErrorEvent
    | SessionClosed
    | UnknownEvent
)

_SERVER_EVENTS: dict[str, type[Any]] = {
    cls.type: cls
    for cls in (
        SessionStarted,
        TranscriptInput,
        TranscriptOutput,
        TextEvent,
        ToolCallEvent,
        ToolResultEvent,
        ToolCancelled,
        TurnInterrupted,
        UserSpeaking,
        UserStopped,
        GenerationComplete,
        TurnComplete,
        Usage,
        Grounding,
        CodeEvent,
        CodeResultEvent,
        DataEvent,
        SessionGoAway,
        SessionReconnecting,
        SessionResumed,
        SessionReattached,
        UserMuted,
        ErrorEvent,
        SessionClosed,
    )
}

_DUMPS = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode


def _to_json(message: Any) -> dict[str, Any]:
    custom = getattr(message, "to_json", None)
    if custom is not None:
        return custom()
    out: dict[str, Any] = {"type": message.type}
    for field in dataclasses.fields(message):
        value = getattr(message, field.name)
        if value is None:
            continue
        out[field.name] = list(value) if isinstance(value, tuple) else value
    return out


def encode(message: ClientMessage | ServerEvent) -> str:
    """One text frame for a client message or a server event."""
    return _DUMPS(_to_json(message))


def parse_server_frame(raw: str | bytes) -> tuple[ServerEvent, int | None]:
    """A server text frame and its sequence number (None for frames outside the
    numbered stream, such as `session.started` and `session.reattached`)."""
    event = parse_server_event(raw)
    seq = _SEQ.match(raw) if isinstance(raw, str) else None
    return event, int(seq.group(1)) if seq else None


_SEQ = re.compile(r'\{"seq":(\d+),')


def parse_server_event(raw: str | bytes) -> ServerEvent:
    """Parse one server text frame (for clients).

    An event of a type this version does not know, or whose fields it cannot
    read, comes back as `UnknownEvent` rather than an exception: a newer server
    must not break an older client. Only a frame that is not a JSON object
    raises `ProtocolError`.
    """
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError("invalid_json", f"server frame is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("invalid_json", "server frame is not a JSON object")
    kind = obj.get("type")
    cls = _SERVER_EVENTS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        return UnknownEvent(str(kind), obj)
    try:
        return _event_from_json(cls, obj)
    except (KeyError, TypeError, ValueError):
        return UnknownEvent(str(kind), obj)


def _event_from_json(cls: type[Any], obj: Mapping[str, Any]) -> ServerEvent:
    from_json = getattr(cls, "from_json", None)
    if from_json is not None:
        return from_json(obj)
    kwargs = {}
    for field in dataclasses.fields(cls):
        if field.name in obj:
            value = obj[field.name]
            kwargs[field.name] = tuple(value) if isinstance(value, list) and field.name == "ids" else value
    return cls(**kwargs)
