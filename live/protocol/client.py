"""The messages a client sends, as data: frozen dataclasses and their parser.

Text frames carry one JSON object with a `type`; binary frames carry raw PCM16
little-endian mono audio (see docs/protocol.md). An image frame (camera,
screen) is a JSON `image` message, so a binary frame is always audio. Anything a
client sends that does not fit raises `ProtocolError` with a code and a message
a person can act on.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import re
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeAlias

import pydantic
from google.genai import types

from live.images import IMAGE_TYPES, ImageInfo, InvalidImage, inspect_image

__all__ = [
    "ActivityEnd",
    "ActivityStart",
    "AudioEnd",
    "ClientContent",
    "ClientMessage",
    "ContextUpdate",
    "DEFAULT_INPUT_RATE",
    "Image",
    "image_bytes_fitting",
    "is_image_message",
    "OUTPUT_RATE",
    "parse_client_message",
    "Playback",
    "ProtocolError",
    "SessionClose",
    "SessionResume",
    "SessionStart",
    "Text",
    "ToolResult",
]

DEFAULT_INPUT_RATE = 16_000
OUTPUT_RATE = 24_000
MIN_INPUT_RATE = 8_000
MAX_INPUT_RATE = 48_000
MAX_TEXT_CHARS = 32_768
TURN_TAKING = ("auto", "manual", "server")


class ProtocolError(Exception):
    """A client frame that cannot be acted on.

    `code` is stable and machine-readable; `message` says what was wrong and what
    to send instead; `fatal` is true when the session cannot go on. `hint`, for
    the server's log only (never the client): what the operator could change.
    """

    def __init__(self, code: str, message: str, *, fatal: bool = False, hint: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.fatal = fatal
        self.hint = hint


# ---------------------------------------------------------------- client -> server


@dataclasses.dataclass(frozen=True, slots=True)
class SessionStart:
    """Must come first. `history` seeds the conversation once.

    `turn_taking` is who decides when the user's turn ends: "auto" (the model's
    own voice detection), "manual" (the client sends `activity.start` and
    `activity.end`; the model's detection is turned off for the session) or
    "server" (the server's own voice detection; the model's is off). The
    model takes its own or signals for a whole connection, never both. None:
    as the agent says (`Agent.turn_taking`).
    """

    type: ClassVar[str] = "session.start"
    token: str | None = None
    history: tuple[types.Content, ...] = ()
    input_rate: int = DEFAULT_INPUT_RATE
    turn_taking: str | None = None
    reports_playback: bool = False
    # What the client's own setup asks of the model connections (a door for
    # another service's clients reads it from that service's setup): set
    # fields replace the agent's, and its tools are declared besides the
    # agent's (run by the client). Not on this protocol's wire.
    config: types.LiveConnectConfig | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        if self.token is not None:
            out["token"] = self.token
        if self.history:
            out["history"] = [
                c.model_dump(mode="json", exclude_none=True) for c in self.history
            ]
        out["input_audio"] = {"rate": self.input_rate}
        if self.turn_taking is not None:
            out["turn_taking"] = self.turn_taking
        if self.reports_playback:
            out["reports_playback"] = True
        return out


@dataclasses.dataclass(frozen=True, slots=True)
class Text:
    """A typed user turn. `realtime`: text in the realtime input stream instead
    (a door for Live API apps), answered as the model's activity detection
    decides; not on this protocol's wire."""

    type: ClassVar[str] = "text"
    text: str
    realtime: bool | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class ClientContent:
    """Turns of either role, with any parts, appended to the conversation
    (the Live API's `clientContent`, read by its door; not on this protocol's
    wire). `turn_complete`: the model answers what it now has. `initial`: the
    app's initial history, never answered."""

    type: ClassVar[str] = "client.content"
    turns: tuple[types.Content, ...]
    turn_complete: bool
    initial: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "turns": [turn.model_dump(mode="json", exclude_none=True) for turn in self.turns],
            "turn_complete": self.turn_complete,
            **({"initial": True} if self.initial else {}),
        }


@dataclasses.dataclass(frozen=True, slots=True)
class ContextUpdate:
    """The client's own system instruction or tools change mid-session (the
    Live API's `contextUpdate`, read by its door; not on this protocol's wire).
    `config` holds what changes: `system_instruction`, `tools` (which replace
    the client's earlier ones)."""

    type: ClassVar[str] = "context.update"
    config: types.LiveConnectConfig

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "config": self.config.model_dump(mode="json", exclude_none=True)}


@dataclasses.dataclass(frozen=True, slots=True)
class ActivityStart:
    """The user started speaking (`"turn_taking": "manual"`)."""

    type: ClassVar[str] = "activity.start"


@dataclasses.dataclass(frozen=True, slots=True)
class ActivityEnd:
    """The user stopped speaking (`"turn_taking": "manual"`)."""

    type: ClassVar[str] = "activity.end"


@dataclasses.dataclass(frozen=True, slots=True)
class AudioEnd:
    """The microphone was muted: the model should not wait for more audio."""

    type: ClassVar[str] = "audio.end"


@dataclasses.dataclass(frozen=True, slots=True)
class ToolResult:
    """The answer to a `tool.call` the client runs."""

    type: ClassVar[str] = "tool.result"
    id: str
    name: str
    response: dict[str, Any]
    # The Live API's own fields of a result (its door reads them; not on this
    # protocol's wire): how a non-blocking call's result is taken
    # (SILENT, WHEN_IDLE, INTERRUPT), whether more results follow for the same
    # call, and media parts (FunctionResponsePart objects, as JSON).
    scheduling: str | None = None
    will_continue: bool | None = None
    parts: tuple[dict[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "id": self.id, "name": self.name, "response": self.response}
        if self.scheduling is not None:
            out["scheduling"] = self.scheduling
        if self.will_continue is not None:
            out["will_continue"] = self.will_continue
        if self.parts:
            out["parts"] = list(self.parts)
        return out


@dataclasses.dataclass(frozen=True, slots=True)
class SessionResume:
    """Reattach to a session after the socket dropped: instead of `session.start`.

    `last_seq` is the sequence number of the last frame the client received
    (JSON events carry `seq`; each binary audio frame counts one more).
    `resume_token` is the newest the session gave (each works once). When the
    server requires tokens, `token` is one, as for `session.start` (or
    `Authorization: Bearer` on the handshake), for the same subject.
    """

    type: ClassVar[str] = "session.resume"
    session_id: str
    resume_token: str
    last_seq: int = 0
    token: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class SessionClose:
    """The client is done; the server closes the session and the socket."""

    type: ClassVar[str] = "session.close"


@dataclasses.dataclass(frozen=True, slots=True)
class Image:
    """One frame of what the user sees (camera, screen): a JPEG or PNG.

    On the wire `data` is standard base64 in a JSON text frame; here it is the
    image's bytes, already checked to be what `mime_type` says (`info`).
    `display_name` is the frame's label for the model (the Live API's blob
    `displayName`); this protocol's own `image` message has none.
    """

    type: ClassVar[str] = "image"
    mime_type: str
    data: bytes = dataclasses.field(repr=False)
    info: ImageInfo | None = None
    display_name: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "mime_type": self.mime_type,
            "data": base64.b64encode(self.data).decode("ascii"),
        }


@dataclasses.dataclass(frozen=True, slots=True)
class Playback:
    """After `turn.interrupted`: how many seconds of the interrupted reply the client played.

    Sent by clients that said `reports_playback` in `session.start`; the server
    then cuts the heard transcript at this point rather than at its estimate.
    """

    type: ClassVar[str] = "playback"
    played: float


ClientMessage: TypeAlias = (
    SessionStart
    | SessionResume
    | Text
    | ClientContent
    | ContextUpdate
    | ActivityStart
    | ActivityEnd
    | AudioEnd
    | ToolResult
    | SessionClose
    | Image
    | Playback
)


def _require_str(obj: Mapping[str, Any], key: str, kind: str, *, empty: bool = False) -> str:
    if key not in obj:
        raise ProtocolError("missing_field", f"{kind} needs a {key!r} field (a string)")
    value = obj[key]
    if not isinstance(value, str):
        raise ProtocolError(
            "invalid_field", f"{kind}: {key!r} must be a string, not {type(value).__name__}"
        )
    if not empty and not value:
        raise ProtocolError("invalid_field", f"{kind}: {key!r} must not be empty")
    return value


def _parse_history(value: Any) -> tuple[types.Content, ...]:
    if not isinstance(value, list):
        raise ProtocolError(
            "invalid_field", "session.start: 'history' must be a list of Content objects"
        )
    contents = []
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            raise ProtocolError(
                "invalid_field",
                f"session.start: history[{index}] must be an object like "
                '{"role": "user", "parts": [{"text": "..."}]}',
            )
        try:
            content = types.Content.model_validate(item)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ProtocolError(
                "invalid_field",
                f"session.start: history[{index}] is not a valid Content "
                f"({where}: {first['msg']})",
            ) from None
        if content.role not in ("user", "model"):
            raise ProtocolError(
                "invalid_field",
                f"session.start: history[{index}].role must be 'user' or 'model'",
            )
        contents.append(content)
    return tuple(contents)


def _parse_input_rate(value: Any) -> int:
    if not isinstance(value, dict):
        raise ProtocolError(
            "invalid_field", "session.start: 'input_audio' must be an object like {\"rate\": 16000}"
        )
    rate = value.get("rate", DEFAULT_INPUT_RATE)
    if isinstance(rate, bool) or not isinstance(rate, int):
        raise ProtocolError("invalid_field", "session.start: input_audio.rate must be an integer")
    if not MIN_INPUT_RATE <= rate <= MAX_INPUT_RATE:
        raise ProtocolError(
            "invalid_field",
            f"session.start: input_audio.rate must be between {MIN_INPUT_RATE} and "
            f"{MAX_INPUT_RATE} Hz, not {rate}",
        )
    return rate


def _utf8(value: str, kind: str, key: str) -> str:
    """A credential or an id as text that is UTF-8 (JSON can carry lone surrogates)."""
    try:
        value.encode()
    except UnicodeEncodeError:
        raise ProtocolError("invalid_field", f"{kind}: {key!r} is not valid text") from None
    return value


def _optional_token(obj: Mapping[str, Any], kind: str) -> str | None:
    token = obj.get("token")
    if token is not None and not isinstance(token, str):
        raise ProtocolError("invalid_field", f"{kind}: 'token' must be a string")
    return token if token is None else _utf8(token, kind, "token")


def _parse_session_start(obj: Mapping[str, Any]) -> SessionStart:
    token = _optional_token(obj, "session.start")
    history = _parse_history(obj["history"]) if obj.get("history") is not None else ()
    rate = (
        _parse_input_rate(obj["input_audio"])
        if obj.get("input_audio") is not None
        else DEFAULT_INPUT_RATE
    )
    turn_taking = obj.get("turn_taking")
    if turn_taking is not None and turn_taking not in TURN_TAKING:
        raise ProtocolError(
            "invalid_field",
            f"session.start: 'turn_taking' must be one of {', '.join(map(repr, TURN_TAKING))}",
        )
    reports_playback = obj.get("reports_playback", False)
    if not isinstance(reports_playback, bool):
        raise ProtocolError("invalid_field", "session.start: 'reports_playback' must be true or false")
    return SessionStart(
        token=token,
        history=history,
        input_rate=rate,
        turn_taking=turn_taking,
        reports_playback=reports_playback,
    )


def _parse_text(obj: Mapping[str, Any]) -> Text:
    text = _require_str(obj, "text", "text")
    if len(text) > MAX_TEXT_CHARS:
        raise ProtocolError(
            "invalid_field", f"text: at most {MAX_TEXT_CHARS} characters, got {len(text)}"
        )
    return Text(text=text)


def _parse_tool_result(obj: Mapping[str, Any]) -> ToolResult:
    call_id = _require_str(obj, "id", "tool.result")
    name = _require_str(obj, "name", "tool.result")
    if "response" not in obj:
        raise ProtocolError(
            "missing_field", "tool.result needs a 'response' field (a JSON object)"
        )
    response = obj["response"]
    if not isinstance(response, dict):
        raise ProtocolError(
            "invalid_field",
            "tool.result: 'response' must be a JSON object, e.g. {\"result\": ...}",
        )
    return ToolResult(id=call_id, name=name, response=response)


def _parse_session_resume(obj: Mapping[str, Any]) -> SessionResume:
    session_id = _utf8(_require_str(obj, "session_id", "session.resume"), "session.resume", "session_id")
    resume_token = _utf8(_require_str(obj, "resume_token", "session.resume"), "session.resume", "resume_token")
    token = _optional_token(obj, "session.resume")
    last_seq = obj.get("last_seq", 0)
    if isinstance(last_seq, bool) or not isinstance(last_seq, int) or last_seq < 0:
        raise ProtocolError(
            "invalid_field", "session.resume: 'last_seq' must be a non-negative integer"
        )
    return SessionResume(session_id=session_id, resume_token=resume_token, last_seq=last_seq, token=token)


_IMAGE_MESSAGE_OVERHEAD = 64  # {"type":"image","mime_type":"image/jpeg","data":""}, with room


def image_bytes_fitting(max_frame_bytes: int) -> int:
    """The largest image whose `image` message (base64 in JSON) fits in one frame."""
    return max(0, (max_frame_bytes - _IMAGE_MESSAGE_OVERHEAD) // 4 * 3)


def is_image_message(raw: str) -> bool:
    """Whether a text frame is an `image` message (for one too large to handle)."""
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        return False
    return isinstance(obj, dict) and obj.get("type") == "image"


def _parse_image(obj: Mapping[str, Any]) -> Image:
    mime_type = _require_str(obj, "mime_type", "image")
    if mime_type not in IMAGE_TYPES:
        raise ProtocolError(
            "unsupported_image_type",
            f"image: mime_type {mime_type!r} is not accepted; send "
            f"{' or '.join(IMAGE_TYPES)}. The frame was dropped",
        )
    text = _require_str(obj, "data", "image")
    if text.startswith("data:"):
        raise ProtocolError(
            "invalid_image",
            "image: 'data' must be the base64 of the image alone, without a "
            "'data:...;base64,' prefix. The frame was dropped",
        )
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError(
            "invalid_image", "image: 'data' is not standard base64. The frame was dropped"
        ) from None
    try:
        info = inspect_image(data, mime_type)
    except InvalidImage as exc:
        raise ProtocolError("invalid_image", f"image: {exc}. The frame was dropped") from None
    return Image(mime_type=mime_type, data=data, info=info)


def _parse_playback(obj: Mapping[str, Any]) -> Playback:
    if "played" not in obj:
        raise ProtocolError("missing_field", "playback needs a 'played' field (seconds, a number)")
    played = obj["played"]
    if isinstance(played, bool) or not isinstance(played, (int, float)) or not 0 <= played <= 86_400:
        raise ProtocolError("invalid_field", "playback: 'played' must be a number of seconds, 0 or more")
    return Playback(played=float(played))


_CLIENT_PARSERS: dict[str, Callable[[Mapping[str, Any]], ClientMessage]] = {
    "session.start": _parse_session_start,
    "session.resume": _parse_session_resume,
    "text": _parse_text,
    "activity.start": lambda obj: ActivityStart(),
    "activity.end": lambda obj: ActivityEnd(),
    "audio.end": lambda obj: AudioEnd(),
    "tool.result": _parse_tool_result,
    "session.close": lambda obj: SessionClose(),
    "image": _parse_image,
    "playback": _parse_playback,
}


def parse_client_message(raw: str | bytes) -> ClientMessage:
    """Parse one client text frame; raises `ProtocolError` on anything unusable."""
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(
            "invalid_json", f"text frames must be JSON objects; this one is not JSON ({exc})"
        ) from None
    except RecursionError:
        raise ProtocolError(
            "invalid_json", "text frames must be JSON objects; this one is nested too deeply"
        ) from None
    if not isinstance(obj, dict):
        raise ProtocolError(
            "invalid_json", f"text frames must be JSON objects, not {type(obj).__name__}"
        )
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise ProtocolError("missing_field", "every message needs a 'type' field (a string)")
    parser = _CLIENT_PARSERS.get(kind)
    if parser is None:
        known = ", ".join(_CLIENT_PARSERS)
        raise ProtocolError("unknown_type", f"unknown message type {kind!r}; known types: {known}")
    message = parser(obj)
    if _SURROGATE_ESCAPE.search(raw if isinstance(raw, str) else raw.decode("ascii", "replace")) and not _is_text(obj):
        # JSON can spell half of a UTF-16 pair (\ud800) on its own: no text holds
        # that, and nothing could send it on (to the model, back to the client).
        raise ProtocolError(
            "invalid_json",
            f"{kind}: the message holds a lone surrogate escape (such as \\ud800), which is "
            "not text; it was dropped",
        )
    return message


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _is_text(obj: Any) -> bool:
    """Whether every string in a parsed JSON value is text that UTF-8 can carry."""
    try:
        json.dumps(obj, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return False
    return True
