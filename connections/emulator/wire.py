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
import itertools
import random
import re
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeAlias
from urllib.parse import parse_qs, urlsplit

from live.images import InvalidImage, inspect_image

if TYPE_CHECKING:
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
    "StoredHandle",
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


@dataclasses.dataclass(frozen=True, slots=True)
class StoredHandle:
    """What a resumable handle stands for: the conversation, who issued it, until when."""

    snapshot: dict[str, Any]
    issuer: int | None = None  # `Shared.connection_ids` of the issuing connection
    expires_at: float | None = None  # on the emulator's clock; None: never


class HandleStore:
    """Resumption handles -> conversation snapshots, shared by all sessions.

    Bounded: past `limit` handles the oldest is forgotten, and each `put`
    forgets the oldest ones that have expired; a forgotten handle resumes
    nothing (the service's "session not found").
    """

    def __init__(self, limit: int = 1000) -> None:
        self._limit = limit
        self._handles: collections.OrderedDict[str, StoredHandle] = collections.OrderedDict()

    def put(
        self,
        handle: str,
        snapshot: dict[str, Any],
        *,
        issuer: int | None = None,
        now: float = 0.0,
        ttl: float | None = None,
    ) -> None:
        expires_at = None if ttl is None else now + ttl
        self._handles[handle] = StoredHandle(snapshot, issuer, expires_at)
        self._handles.move_to_end(handle)
        while len(self._handles) > self._limit:
            self._handles.popitem(last=False)
        while self._handles:
            oldest = next(iter(self._handles.values()))
            if oldest.expires_at is None or oldest.expires_at > now:
                break
            self._handles.popitem(last=False)

    def lookup(self, handle: str, now: float) -> StoredHandle | None:
        """The handle's entry (its snapshot a copy), or None when unknown or expired."""
        entry = self._handles.get(handle)
        if entry is None:
            return None
        if entry.expires_at is not None and entry.expires_at <= now:
            del self._handles[handle]
            return None
        return dataclasses.replace(entry, snapshot=copy.deepcopy(entry.snapshot))

    def get(self, handle: str) -> dict[str, Any] | None:
        """The snapshot of a handle, expiry not considered."""
        entry = self._handles.get(handle)
        return copy.deepcopy(entry.snapshot) if entry is not None else None

    def forget_all(self) -> None:
        """Every handle resumes nothing from now on (the service lost its sessions)."""
        self._handles.clear()

    def __contains__(self, handle: object) -> bool:
        return handle in self._handles

    def __len__(self) -> int:
        return len(self._handles)


@dataclasses.dataclass(slots=True)
class Shared:
    """State every session of one emulator shares: handles, fault counters and
    draws, load, and which connections are open."""

    store: HandleStore = dataclasses.field(default_factory=HandleStore)
    fault_fired: collections.Counter[int] = dataclasses.field(default_factory=collections.Counter)
    active: int = 0
    open_connections: set[int] = dataclasses.field(default_factory=set)
    connection_ids: Iterator[int] = dataclasses.field(default_factory=itertools.count)
    _generators: dict[int, random.Random] = dataclasses.field(default_factory=dict)

    def random(self, seed: int) -> random.Random:
        """The generator every connection draws random faults from, one per seed."""
        generator = self._generators.get(seed)
        if generator is None:
            generator = self._generators[seed] = random.Random(seed)
        return generator


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
    each turn, `sent` every message sent, `handles` the resumable handles issued,
    `profile` the family whose behaviour the session followed, `close` the
    (code, reason) the server closed with (1006 for a drop), or the client's
    close as `client_close`; `opened_at` and `closed_at` when (time.monotonic()).
    """

    index: int
    path: str
    route: Route | None
    headers: dict[str, str]
    setup: dict[str, Any] | None = None
    profile: str | None = None
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
    opened_at: float = dataclasses.field(default_factory=time.monotonic)
    closed_at: float | None = None  # time.monotonic() when it ended, either side

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
NOT_IMPLEMENTED = "Operation is not implemented, or supported, or enabled."
SESSION_NOT_FOUND = "BidiGenerateContent session not found"
INVALID_HANDLE = "Invalid session resumption handle."
ENTITY_NOT_FOUND = "Requested entity was not found."
UNAVAILABLE = "The service is currently unavailable."
DEADLINE_EXPIRED = "Deadline expired before operation could complete."
INTERNAL = "Internal error encountered."
DEFAULT_REASONS = {
    1000: "",
    1007: INVALID,
    1008: "Request violates a policy.",
    1011: INTERNAL,
}


def check_video(blob: Any, where: str) -> tuple[bytes, str, int | None, int | None] | str:
    """A realtime video frame as the service checks it: its bytes, MIME type and
    size (None for a type not read), or why it is refused (a 1007 reason)."""
    mime = str(get_field(blob, "mimeType") or "")
    try:
        data = b64decode(get_field(blob, "data"))
    except ValueError:
        return f"Invalid value at '{where}.data' (TYPE_BYTES), Base64 decoding failed."
    if not mime.startswith(("image/", "video/")):
        return f"Unsupported MIME type for {where}: {mime!r}."
    if mime not in ("image/jpeg", "image/png"):
        return data, mime, None, None
    try:
        info = inspect_image(data, mime)
    except InvalidImage as exc:
        return f"Invalid image at '{where}': {exc}."
    return data, mime, info.width, info.height


def credential_error(handshake: Handshake, route: Route | None, settings: Settings) -> str | None:
    """Why the service refuses this caller (a 1008 reason), or None."""
    key = handshake.header("x-goog-api-key") or handshake.query("key")
    auth = handshake.header("authorization") or ""
    token = auth[6:].strip() if auth[:6].lower() == "token " else handshake.query("access_token")
    if route is not None and route.constrained:
        if not token:
            return UNREGISTERED
        tokens = settings.tokens
        if not token.startswith("auth_tokens/") or (tokens is not None and token not in tokens):
            return BAD_TOKEN
        return None
    if not key:
        return UNREGISTERED
    if settings.api_key is not None and key.strip() != settings.api_key:
        return BAD_KEY
    return None


def usage_metadata(context: Mapping[str, int], modality: str, response_tokens: int) -> dict[str, Any]:
    """The usageMetadata of a completed turn: the context so far in, the reply out."""
    prompt = sum(context.values())
    return {
        "promptTokenCount": prompt,
        "responseTokenCount": response_tokens,
        "totalTokenCount": prompt + response_tokens,
        "promptTokensDetails": [{"modality": m, "tokenCount": c} for m, c in sorted(context.items())],
        "responseTokensDetails": [{"modality": modality, "tokenCount": response_tokens}],
    }


def not_found(model: str, version: str) -> str:
    return (
        f"{model} is not found for API version {version}, or is not supported for"
        " bidiGenerateContent. Call ListModels to see the list of available models"
        " and their supported methods."
    )
