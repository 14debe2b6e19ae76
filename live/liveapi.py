"""The Live API's wire format, shared by the door that serves Live API apps
(`live.doors.gemini_live`) and the emulator that plays the service
(`connections.emulator`): its paths, how it reads fields and bytes, and its own
words when it refuses. No I/O.

The service accepts each field in camelCase or snake_case (`get_field`), bytes
in standard or URL-safe base64 (`b64decode`), and closes with reasons worded as
below; an app that matches on them sees the same text from either.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

from live.images import InvalidImage, inspect_image

__all__ = [
    "BAD_KEY",
    "BAD_TOKEN",
    "DEADLINE_EXPIRED",
    "DEFAULT_REASONS",
    "ENTITY_NOT_FOUND",
    "Handshake",
    "INTERNAL",
    "INVALID",
    "INVALID_HANDLE",
    "NOT_IMPLEMENTED",
    "Route",
    "SESSION_NOT_FOUND",
    "TOP_LEVEL",
    "UNAVAILABLE",
    "UNREGISTERED",
    "b64decode",
    "check_video",
    "duration_text",
    "get_field",
    "not_found",
    "rate_of",
    "route",
]


# --- routes ------------------------------------------------------------------

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


# --- fields and bytes -------------------------------------------------------

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


def rate_of(mime: str) -> int:
    match = re.search(r"rate\s*=\s*(\d+)", mime or "")
    return int(match.group(1)) if match else 16_000


def duration_text(seconds: float) -> str:
    return f"{seconds:g}s"


# --- the service's own words ------------------------------------------------

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


def not_found(model: str, version: str) -> str:
    return (
        f"{model} is not found for API version {version}, or is not supported for"
        " bidiGenerateContent. Call ListModels to see the list of available models"
        " and their supported methods."
    )
