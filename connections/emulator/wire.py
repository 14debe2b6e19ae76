"""The Live service's surface, as the emulator serves it: routes, handshakes,
policy, resumption handles, what a connection saw, and the service's own words.

The protocol state machine (`connections.emulator.core`) answers with the
actions defined here; the I/O layer (`connections.emulator.server`) performs
them. No I/O here either.
"""

from __future__ import annotations

import base64
import binascii
import collections
import copy
import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias
from urllib.parse import parse_qs, urlsplit

from connections.emulator.script import VideoFrame

__all__ = [
    "Action",
    "CloseConnection",
    "DropConnection",
    "HandleStore",
    "Handshake",
    "Route",
    "SendMessage",
    "SessionRecord",
    "Settings",
    "Shared",
    "route",
]


# --- actions ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class SendMessage:
    """Send `payload` as one JSON text frame."""

    payload: dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class CloseConnection:
    """Close the WebSocket with `code` and `reason`; the session is over."""

    code: int
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class DropConnection:
    """Drop the TCP connection without a close frame (the client sees 1006)."""


Action: TypeAlias = SendMessage | CloseConnection | DropConnection


# --- routing and settings ----------------------------------------------------

_PATH = re.compile(
    r"^/+ws/google\.ai\.generativelanguage\.(?P<version>v1(?:alpha|beta)?)"
    r"\.GenerativeService\.(?P<method>BidiGenerateContent(?:Constrained)?)$"
)


@dataclasses.dataclass(frozen=True, slots=True)
class Route:
    """Which API version and method a request path asked for."""

    api_version: str
    method: str

    @property
    def constrained(self) -> bool:
        return self.method == "BidiGenerateContentConstrained"


def route(path: str) -> Route | None:
    """The route of a request path (query ignored), or None for a 404."""
    match = _PATH.match(urlsplit(path).path)
    if match is None:
        return None
    return Route(match["version"], match["method"])


@dataclasses.dataclass(frozen=True, slots=True)
class Handshake:
    """The parts of the HTTP upgrade request the service looks at."""

    path: str
    headers: Mapping[str, str]

    def header(self, name: str) -> str | None:
        lowered = name.lower()
        for key, value in self.headers.items():
            if key.lower() == lowered:
                return value
        return None

    def query(self, name: str) -> str | None:
        values = parse_qs(urlsplit(self.path).query).get(name)
        return values[0] if values else None


@dataclasses.dataclass(slots=True)
class Settings:
    """Server-wide policy.

    `api_key`: the only key accepted (None: any non-empty key). `tokens`: the
    ephemeral tokens accepted on the Constrained method (None: any
    `auth_tokens/...`). `api_versions`: versions that serve Live.
    `live_model`: decides which model names are Live models.
    """

    api_key: str | None = None
    tokens: frozenset[str] | None = None
    api_versions: frozenset[str] = frozenset({"v1alpha", "v1beta", "v1"})
    live_model: Callable[[str], bool] = dataclasses.field(
        default_factory=lambda: _is_live_model
    )


def _is_live_model(name: str) -> bool:
    return "live" in name or "native-audio" in name


def is_3x(model: str) -> bool:
    return re.search(r"gemini-3", model) is not None


class HandleStore:
    """Resumption handles -> conversation snapshots, shared by all sessions (bounded)."""

    def __init__(self, limit: int = 1000) -> None:
        self._limit = limit
        self._snapshots: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()

    def put(self, handle: str, snapshot: dict[str, Any]) -> None:
        self._snapshots[handle] = snapshot
        self._snapshots.move_to_end(handle)
        while len(self._snapshots) > self._limit:
            self._snapshots.popitem(last=False)

    def get(self, handle: str) -> dict[str, Any] | None:
        snap = self._snapshots.get(handle)
        return copy.deepcopy(snap) if snap is not None else None

    def __contains__(self, handle: object) -> bool:
        return handle in self._snapshots


@dataclasses.dataclass(slots=True)
class Shared:
    """State every session of one emulator shares: handles, fault counters, load."""

    store: HandleStore = dataclasses.field(default_factory=HandleStore)
    fault_fired: collections.Counter[int] = dataclasses.field(default_factory=collections.Counter)
    active: int = 0


# --- what a session saw ------------------------------------------------------

MAX_FRAMES = 5000
MAX_AUDIO = 16 * 1024 * 1024


@dataclasses.dataclass(slots=True)
class SessionRecord:
    """What one connection received and how it went, for assertions.

    `frames` are the client frames as parsed JSON (first `MAX_FRAMES`; a video
    frame's data replaced by its length), `audio` the decoded input PCM (first
    16 MiB), `video` the image frames received as realtime video (first
    `MAX_FRAMES`; `video_frames` counts them all, `last_video` holds the newest
    one's bytes), `user_turns`/`model_turns` the text of
    each turn, `sent` every message sent, `close` the (code, reason) the server
    closed with (1006 for a drop), or the client's close as `client_close`.
    """

    index: int
    path: str
    route: Route | None
    headers: dict[str, str]
    setup: dict[str, Any] | None = None
    frames: list[Any] = dataclasses.field(default_factory=list)
    audio: bytearray = dataclasses.field(default_factory=bytearray)
    audio_chunks: int = 0
    video: list[VideoFrame] = dataclasses.field(default_factory=list)
    video_frames: int = 0
    last_video: bytes = b""
    user_turns: list[str] = dataclasses.field(default_factory=list)
    model_turns: list[str] = dataclasses.field(default_factory=list)
    tool_calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    tool_responses: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    sent: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    handles: list[str] = dataclasses.field(default_factory=list)
    resumed_from: str | None = None
    ignored_realtime: int = 0  # realtime input sent before the initial history completed
    close: tuple[int, str] | None = None
    client_close: tuple[int, str] | None = None
    stalled: bool = False

    @property
    def model(self) -> str | None:
        return None if self.setup is None else get_field(self.setup, "model")

    def describe_video(self) -> str:
        """What video input arrived, in words: how many frames, and the newest."""
        if not self.video_frames:
            return "no video frames"
        newest = self.video[-1] if self.video else None
        what = f"; the newest: {newest.describe()}" if newest is not None else ""
        return f"{self.video_frames} video frame(s){what}"

    def sent_of(self, key: str) -> list[dict[str, Any]]:
        """The sent messages that carry top-level `key` (e.g. `toolCall`)."""
        return [m for m in self.sent if key in m]


# --- helpers -----------------------------------------------------------------

_SNAKE = re.compile(r"([A-Z])")


def get_field(obj: Any, camel: str, default: Any = None) -> Any:
    """`obj[camel]` or `obj[snake_case(camel)]`: the service accepts both."""
    if not isinstance(obj, Mapping):
        return default
    if camel in obj:
        return obj[camel]
    snake = _SNAKE.sub(lambda m: "_" + m.group(1).lower(), camel)
    return obj.get(snake, default)


def b64decode(text: str) -> bytes:
    """Standard or URL-safe base64, padding optional (as the service accepts)."""
    if not isinstance(text, str):
        raise ValueError("not a string")
    cleaned = text.strip().translate(str.maketrans("-_", "+/"))
    cleaned += "=" * (-len(cleaned) % 4)
    try:
        return base64.b64decode(cleaned, validate=True)
    except binascii.Error as exc:
        raise ValueError(str(exc)) from None


def without_video_data(frame: Any) -> Any:
    """A client frame to keep, with any video data replaced by its length (memory)."""
    if not isinstance(frame, dict) or len(frame) != 1:
        return frame
    (key, body), = frame.items()
    if TOP_LEVEL.get(key) != "realtimeInput" or not isinstance(body, dict):
        return frame
    video = body.get("video")
    if not isinstance(video, dict) or not isinstance(video.get("data"), str):
        return frame
    kept = {**video, "data": f"<{len(video['data'])} base64 characters>"}
    return {key: {**body, "video": kept}}


def rate_of(mime: str) -> int:
    match = re.search(r"rate\s*=\s*(\d+)", mime or "")
    return int(match.group(1)) if match else 16_000


def duration_text(seconds: float) -> str:
    return f"{seconds:g}s"


def text_of(content: Any) -> str:
    parts = get_field(content, "parts") or []
    return "".join(str(get_field(p, "text") or "") for p in parts if isinstance(p, Mapping))


def token_count(text: str) -> int:
    return max(1, len(text) // 4) if text else 0


AUDIO_TOKENS_PER_S = 25

INVALID = "Request contains an invalid argument."
UNREGISTERED = (
    "Method doesn't allow unregistered callers (callers without established identity)."
    " Please use API Key or other form of API consumer identity to call this API."
)
BAD_KEY = "API key not valid. Please pass a valid API key."
BAD_TOKEN = "The ephemeral auth token is invalid or has expired."
TOP_LEVEL = {
    "setup": "setup",
    "clientContent": "clientContent",
    "client_content": "clientContent",
    "realtimeInput": "realtimeInput",
    "realtime_input": "realtimeInput",
    "toolResponse": "toolResponse",
    "tool_response": "toolResponse",
    "contextUpdate": "contextUpdate",
    "context_update": "contextUpdate",
}
DEFAULT_REASONS = {
    1000: "",
    1007: INVALID,
    1008: "Request violates a policy.",
    1011: "Internal error encountered.",
}


def not_found(model: str, version: str) -> str:
    return (
        f"{model} is not found for API version {version}, or is not supported for"
        " bidiGenerateContent. Call ListModels to see the list of available models"
        " and their supported methods."
    )
