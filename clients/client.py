"""`LiveClient`: the Python side of the client protocol.

Connect, start a session, send audio, images, text and tool results, and iterate over
what the server sends. Message definitions come from `live.protocol`, the same
module the server uses.

    async with LiveClient.connect("ws://127.0.0.1:8765/live") as client:
        await client.send_text("Hello!")
        async for event in client.events():
            if isinstance(event, AudioFrame):
                play(event.data)
            elif isinstance(event, TurnComplete):
                break
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence
from typing import Any

from google.genai import types
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from live.protocol import (
    DEFAULT_INPUT_RATE,
    ActivityEnd,
    ActivityStart,
    AudioEnd,
    ErrorEvent,
    Image,
    ServerEvent,
    SessionClose,
    SessionClosed,
    SessionStart,
    SessionStarted,
    Text,
    ToolResult,
    encode,
    parse_server_event,
)

__all__ = ["AudioFrame", "ConnectionLost", "LiveClient", "SessionRefused"]

DEFAULT_URL = "ws://127.0.0.1:8765/live"


@dataclasses.dataclass(frozen=True, slots=True)
class AudioFrame:
    """Reply audio: PCM16 little-endian mono at the session's output rate (24 kHz)."""

    data: bytes


class SessionRefused(Exception):
    """The server did not start the session (bad token, capacity, model error)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class ConnectionLost(Exception):
    """The socket closed without the server's `session.closed`."""


class LiveClient:
    """One session with a live server. Create it with `LiveClient.connect`."""

    def __init__(self, ws: ClientConnection, started: SessionStarted) -> None:
        self._ws = ws
        self.session = started
        self.closed_reason: str | None = None

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(
        cls,
        url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        history: Sequence[types.Content] = (),
        input_rate: int = DEFAULT_INPUT_RATE,
        turn_taking: str = "auto",
        origin: str | None = None,
        open_timeout: float = 10.0,
    ) -> AsyncIterator[LiveClient]:
        """Open the socket, start the session, and close both when done.

        `turn_taking="manual"` means this client marks the user's turns itself
        with `activity_start()` / `activity_end()`; with "auto" the model's voice
        detection decides.
        """
        async with ws_connect(
            url,
            origin=origin,  # type: ignore[arg-type]
            open_timeout=open_timeout,
            max_size=None,
            compression=None,  # audio does not compress; spare both sides the CPU
        ) as ws:
            with contextlib.suppress(ConnectionClosed):  # a refusal may come first
                await ws.send(
                    encode(
                        SessionStart(
                            token=token,
                            history=tuple(history),
                            input_rate=input_rate,
                            turn_taking=turn_taking,
                        )
                    )
                )
            started = await cls._await_started(ws)
            client = cls(ws, started)
            try:
                yield client
            finally:
                await client.close()

    @staticmethod
    async def _await_started(ws: ClientConnection) -> SessionStarted:
        error: ErrorEvent | None = None
        try:
            async for frame in ws:
                if isinstance(frame, bytes):
                    continue
                event = parse_server_event(frame)
                if isinstance(event, SessionStarted):
                    return event
                if isinstance(event, ErrorEvent):
                    error = event
                if isinstance(event, SessionClosed):
                    break
        except ConnectionClosed:
            pass
        if error is not None:
            raise SessionRefused(error.code, error.message)
        raise SessionRefused("closed", "the server closed the socket before the session started")

    # ------------------------------------------------------------------ sending

    async def send_audio(self, pcm16: bytes) -> None:
        """One frame of microphone audio (PCM16 LE mono at the session's input rate)."""
        await self._ws.send(pcm16)

    async def send_text(self, text: str) -> None:
        await self._ws.send(encode(Text(text)))

    async def send_image(self, data: bytes, mime_type: str = "image/jpeg") -> None:
        """One frame of what the user sees: a JPEG or PNG (`image/jpeg`, `image/png`).

        The model takes it as realtime video, in order with the audio; it samples
        about one frame a second. The server checks the bytes, their size and the
        rate, and answers a frame it drops with a non-fatal `error` event.
        """
        await self._ws.send(encode(Image(mime_type=mime_type, data=bytes(data))))

    async def activity_start(self) -> None:
        await self._ws.send(encode(ActivityStart()))

    async def activity_end(self) -> None:
        await self._ws.send(encode(ActivityEnd()))

    async def audio_end(self) -> None:
        """The microphone was muted."""
        await self._ws.send(encode(AudioEnd()))

    async def send_tool_result(self, call_id: str, name: str, response: dict[str, Any]) -> None:
        await self._ws.send(encode(ToolResult(call_id, name, response)))

    async def send_raw(self, frame: str | bytes) -> None:
        """Send a frame as is (for testing how a server handles arbitrary input)."""
        await self._ws.send(frame)

    # ------------------------------------------------------------------ receiving

    async def events(self) -> AsyncIterator[ServerEvent | AudioFrame]:
        """Everything the server sends, in order, until `session.closed`.

        Raises `ConnectionLost` if the socket closes without `session.closed`.
        """
        try:
            async for frame in self._ws:
                if isinstance(frame, bytes):
                    yield AudioFrame(frame)
                    continue
                event = parse_server_event(frame)
                if isinstance(event, SessionClosed):
                    self.closed_reason = event.reason
                    yield event
                    return
                yield event
        except ConnectionClosed:
            pass
        if self.closed_reason is None:
            raise ConnectionLost("the connection to the server was lost")

    async def wait_closed(self) -> int | None:
        """Wait until the socket is closed; returns the close code the server sent."""
        await self._ws.wait_closed()
        return self._ws.close_code

    async def close(self) -> None:
        """Ask the server to end the session, then close the socket. Idempotent."""
        with contextlib.suppress(ConnectionClosed):
            await self._ws.send(encode(SessionClose()))
        await self._ws.close()
