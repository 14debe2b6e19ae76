"""The Live service's surface, as the emulator serves it: routes, handshakes,
policy, resumption handles, what a connection saw, and the service's own words.

The protocol state machine (`connections.emulator.core`) answers with the
actions defined here; the I/O layer (`connections.emulator.server`) performs
them. No I/O here either.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import hashlib
import itertools
import random
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

from connections.emulator.faults import Outage
from live.liveapi import (
    BAD_KEY,
    BAD_TOKEN,
    TOP_LEVEL,
    UNREGISTERED,
    Handshake,
    Route,
    get_field,
)

if TYPE_CHECKING:
    from connections.emulator.script import VideoFrame

__all__ = [
    "Action",
    "CloseConnection",
    "DropConnection",
    "HandleStore",
    "SendMessage",
    "SessionRecord",
    "Settings",
    "Shared",
    "StoredHandle",
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
    draws, load, which connections are open, and its outage."""

    store: HandleStore = dataclasses.field(default_factory=HandleStore)
    fault_fired: collections.Counter[int] = dataclasses.field(default_factory=collections.Counter)
    active: int = 0
    open_connections: set[int] = dataclasses.field(default_factory=set)
    connection_ids: Iterator[int] = dataclasses.field(default_factory=itertools.count)
    _generators: dict[int, random.Random] = dataclasses.field(default_factory=dict)
    outage: Outage = dataclasses.field(default_factory=Outage)

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
    instructions: list[str] = dataclasses.field(default_factory=list)  # contextUpdate's, in order
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

def setup_complete(setup: Mapping[str, Any]) -> dict[str, Any]:
    """The `setupComplete` body for `setup`. Its `voiceConsentSignature` is
    "populated when the request has a ReplicatedVoiceConfig with consent_audio
    set, if the consent verification was successful" (google-genai,
    `LiveServerSetupComplete`): here every consent is verified, and the
    signature, opaque as the service's, is drawn from the consent audio."""
    voice: Any = setup
    for name in ("generationConfig", "speechConfig", "voiceConfig", "replicatedVoiceConfig"):
        voice = get_field(voice, name) if isinstance(voice, Mapping) else None
    consent = get_field(voice, "consentAudio") if isinstance(voice, Mapping) else None
    if not isinstance(consent, str) or not consent:
        return {}
    return {"voiceConsentSignature": {"signature": "vcs-" + hashlib.sha256(consent.encode()).hexdigest()[:32]}}


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


def text_of(content: Any) -> str:
    parts = get_field(content, "parts") or []
    return "".join(str(get_field(p, "text") or "") for p in parts if isinstance(p, Mapping))


def token_count(text: str) -> int:
    return max(1, len(text) // 4) if text else 0


AUDIO_TOKENS_PER_S = 25

def api_key_of(handshake: Handshake) -> str | None:
    """The API key a caller presented (header, or `key=` in the query)."""
    return handshake.header("x-goog-api-key") or handshake.query("key")


QUOTA_HTTP_BODY = {
    "error": {"code": 429, "message": "Resource has been exhausted (e.g. check quota).", "status": "RESOURCE_EXHAUSTED"}
}
"""What the service answers a connect on a key whose quota is gone (HTTP 429)."""


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


def usage_metadata(
    context: Mapping[str, int], modality: str, response_tokens: int, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The usageMetadata of a completed turn: the context so far in, the reply
    out, and `extra` fields as given (the thoughts' and the tools' tokens count
    in the total, as google-genai's UsageMetadata.total_token_count says)."""
    prompt = sum(context.values())
    usage: dict[str, Any] = {
        "promptTokenCount": prompt,
        "responseTokenCount": response_tokens,
        "totalTokenCount": prompt + response_tokens,
        "promptTokensDetails": [{"modality": m, "tokenCount": c} for m, c in sorted(context.items())],
        "responseTokensDetails": [{"modality": modality, "tokenCount": response_tokens}],
    }
    if extra:
        usage.update(copy.deepcopy(dict(extra)))
        usage["totalTokenCount"] += sum(int(extra.get(k) or 0) for k in ("thoughtsTokenCount", "toolUsePromptTokenCount"))
    return usage
