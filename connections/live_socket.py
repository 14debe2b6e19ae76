"""google-genai's Live socket on picows (`live.websocket`) in place of websockets'.

google-genai dials the Live socket itself, with websockets' `connect` (the
module global `google.genai.live.ws_connect`), and offers no seam for another
socket. `dialing()` routes the connects the SDK makes inside it to
`live.websocket.connect`; outside it (the SDK's own wire path, any other user
of the SDK in the process) the SDK dials as it always does. The SDK still
writes the setup, reads `setupComplete` and owns the session: only the socket
under it changes, and that socket raises websockets' exceptions, so the SDK's
error mapping and this project's read closes and refusals as before.

Where picows cannot be imported, or the SDK asks for a socket option
`live.websocket` does not take (e.g. permessage-deflate, which a client built
by `Gemini` never asks for), the SDK's own socket is used and one log line
says why.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator
from typing import Any, Final

from google.genai import live as genai_live

try:
    from live import websocket
except ImportError as exc:  # picows has no wheel for this platform
    _UNAVAILABLE: str | None = f"picows cannot be imported ({exc})"
else:
    _UNAVAILABLE = None

__all__ = ["dialing"]

logger = logging.getLogger(__name__)

# The options of websockets' `connect` that `live.websocket.connect` takes (the
# SDK passes `additional_headers` and its client's `async_client_args`: `ssl`,
# and from `Gemini`, `compression=None`).
_OPTIONS: Final = frozenset({
    "additional_headers", "ssl", "compression", "proxy", "open_timeout", "ping_interval",
    "ping_timeout", "close_timeout", "max_size", "max_queue",
})

_dial_here: contextvars.ContextVar[bool] = contextvars.ContextVar("live_socket_dial_here", default=False)
_sdk_connect: Any = None
_said: set[str] = set()


def _say_once(why: str) -> None:
    if why not in _said:
        _said.add(why)
        logger.warning("Gemini socket: %s; the SDK's own websockets socket is used", why)


class _Dial:
    """`async with` a `live.websocket.WebSocket`, as the SDK uses websockets' `connect(...)`."""

    def __init__(self, uri: str, options: dict[str, Any]) -> None:
        self._uri = uri
        self._options = options
        self._socket: Any = None

    async def __aenter__(self) -> Any:
        self._socket = await websocket.connect(self._uri, **self._options)
        return self._socket

    async def __aexit__(self, *exc_info: object) -> None:
        if self._socket is not None:
            await self._socket.close()


def _dial(uri: str, **options: Any) -> Any:
    """What `google.genai.live.ws_connect(...)` is once `dialing()` was first used."""
    if _dial_here.get():
        unknown = set(options) - _OPTIONS
        if not unknown and options.get("compression", "deflate") is None:
            return _Dial(uri, options)
        _say_once(
            "the SDK asks for socket options live.websocket does not take "
            f"({', '.join(sorted(unknown or {'compression'}))})"
        )
    return _sdk_connect(uri, **options)


@contextlib.contextmanager
def dialing() -> Iterator[bool]:
    """google-genai's live connects inside this block dial a `live.websocket.WebSocket`.

    Yields False (and the SDK dials as it always does) where that cannot be
    used here.
    """
    global _sdk_connect
    if _UNAVAILABLE is not None:
        _say_once(_UNAVAILABLE)
        yield False
        return
    if _sdk_connect is None:
        current = getattr(genai_live, "ws_connect", None)
        if current is None:
            _say_once("google-genai no longer dials through google.genai.live.ws_connect")
            yield False
            return
        _sdk_connect = current
        genai_live.ws_connect = _dial
    token = _dial_here.set(True)
    try:
        yield True
    finally:
        _dial_here.reset(token)
