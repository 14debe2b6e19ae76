"""google-genai's Live socket on picows (`live.net.websocket`) in place of websockets'.

google-genai dials the Live socket itself, with websockets' `connect` (the
module global `google.genai.live.ws_connect`), and offers no seam for another
socket. `dialing()` routes the connects the SDK makes inside it to
`live.net.websocket.connect`; outside it (the SDK's own wire path, any other user
of the SDK in the process) the SDK dials as it always does. The SDK still
writes the setup, reads `setupComplete` and owns the session: only the socket
under it changes, and that socket raises websockets' exceptions, so the SDK's
error mapping and this project's read closes and refusals as before.

Where picows cannot be imported, or the SDK asks for a socket option
`live.net.websocket` does not take (e.g. permessage-deflate, which a client built
by `Gemini` never asks for), the SDK's own socket is used and one log line
says why.

Either way, a dial made inside `dialing()` follows no redirect. The Live API
never redirects; websockets strips only `Authorization` and cookies on a
cross-origin redirect, so google-genai's `x-goog-api-key` header would go to
whatever host a redirect names (seen here with google-genai 3.6). A redirect
is refused instead (`websockets.InvalidStatus` with the 3xx response).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator
from typing import Any, Final

import websockets.asyncio.client
from google.genai import live as genai_live

try:
    from live.net import websocket
except ImportError as exc:  # picows has no wheel for this platform
    _UNAVAILABLE: str | None = f"picows cannot be imported ({exc})"
else:
    _UNAVAILABLE = None

__all__ = ["dialed_here", "dialing"]

logger = logging.getLogger(__name__)

# The options of websockets' `connect` that `live.net.websocket.connect` takes (the
# SDK passes `additional_headers` and its client's `async_client_args`: `ssl`,
# and from `Gemini`, `compression=None`).
_OPTIONS: Final = frozenset({
    "additional_headers", "ssl", "compression", "proxy", "open_timeout", "ping_interval",
    "ping_timeout", "close_timeout", "max_size", "max_queue",
})

# How long the Gemini socket waits, after a ping on a quiet connection, for
# anything from the service before it calls the connection dead. Gemini has
# been seen answering pings after 8-30 s on healthy connections (docs/emulator.md,
# the service's bad days); anything it sends meanwhile counts as an answer (`live.net.websocket`).
PING_TIMEOUT: Final = 60.0

# Inside `dialing()`: which socket the SDK's connects get ("picows" or
# "websockets"); None outside, where the SDK dials as it always does.
_dial_here: contextvars.ContextVar[str | None] = contextvars.ContextVar("live_socket_dial_here", default=None)
_sdk_connect: Any = None
_said: set[str] = set()


def _say_once(why: str) -> None:
    if why not in _said:
        _said.add(why)
        logger.warning("Gemini socket: %s; the SDK's own websockets socket is used", why)


class _Dial:
    """A `live.net.websocket.WebSocket` as the SDK may take websockets' `connect(...)`:
    `async with connect(...) as ws`, or `ws = await connect(...)`."""

    def __init__(self, uri: str, options: dict[str, Any]) -> None:
        self._uri = uri
        self._options = {"ping_timeout": PING_TIMEOUT, **options}
        self._socket: Any = None

    def __await__(self) -> Any:
        return websocket.connect(self._uri, **self._options).__await__()

    async def __aenter__(self) -> Any:
        self._socket = await self
        return self._socket

    async def __aexit__(self, *exc_info: object) -> None:
        if self._socket is not None:
            await self._socket.close()


class _RefusingRedirects(websockets.asyncio.client.connect):
    """websockets' `connect`, following no redirect (see the module's docstring)."""

    def process_redirect(self, exc: Exception) -> Exception | str:
        return exc


def _dial(uri: str, **options: Any) -> Any:
    """What `google.genai.live.ws_connect(...)` is once `dialing()` was first used."""
    mode = _dial_here.get()
    if mode is None:
        return _sdk_connect(uri, **options)
    if mode == "picows":
        unknown = set(options) - _OPTIONS
        if not unknown and options.get("compression", "deflate") is None:
            return _Dial(uri, options)
        _say_once(
            "the SDK asks for socket options live.net.websocket does not take "
            f"({', '.join(sorted(unknown or {'compression'}))})"
        )
    return _RefusingRedirects(uri, **options)


def dialed_here(ws: Any) -> bool:
    """Whether `ws` (a session's socket) is a `live.net.websocket.WebSocket`."""
    return _UNAVAILABLE is None and isinstance(ws, websocket.WebSocket)


@contextlib.contextmanager
def dialing(*, picows: bool = True) -> Iterator[bool]:
    """google-genai's live connects inside this block are this project's: on a
    `live.net.websocket.WebSocket` (with `picows`, where it can be used here), else
    on websockets' socket; either way following no redirect.

    Yields whether the picows socket is used.
    """
    global _sdk_connect
    if _sdk_connect is None:
        current = getattr(genai_live, "ws_connect", None)
        if current is None:
            _say_once("google-genai no longer dials through google.genai.live.ws_connect")
            yield False
            return
        _sdk_connect = current
        genai_live.ws_connect = _dial
    on_picows = picows and _UNAVAILABLE is None
    if picows and not on_picows:
        _say_once(_UNAVAILABLE or "")
    token = _dial_here.set("picows" if on_picows else "websockets")
    try:
        yield on_picows
    finally:
        _dial_here.reset(token)
