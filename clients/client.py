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

import collections
import contextlib
import dataclasses
import time
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, ClassVar

import anyio
from google.genai import types
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from clients.tails import LATE_TAIL_WAIT, LateTails
from live.protocol import (
    DEFAULT_INPUT_RATE,
    ActivityEnd,
    ActivityStart,
    AudioEnd,
    ErrorEvent,
    Playback,
    Image,
    ServerEvent,
    SessionClose,
    SessionClosed,
    SessionReattached,
    SessionResume,
    SessionStart,
    SessionStarted,
    Text,
    ToolResult,
    encode,
    parse_server_event,
    parse_server_frame,
)

__all__ = ["AudioFrame", "ConnectionLost", "LiveClient", "Reattaching", "SessionRefused"]

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
    """The socket closed without the server's `session.closed`, and the session
    could not be reattached."""


@dataclasses.dataclass(frozen=True, slots=True)
class Reattaching:
    """Client-side news: the socket dropped; attempt `attempt` to reattach follows
    in `delay` seconds. Audio sent meanwhile is dropped; other messages wait."""

    type: ClassVar[str] = "client.reattaching"
    attempt: int
    delay: float
    reason: str


TokenSource = str | Callable[[], "str | Awaitable[str] | None"] | None
"""A session token, or a function (sync or async) that returns a fresh one:
called for `session.start` and for every `session.resume`."""

CLOSE_TIMEOUT = 2.0
"""Seconds `close()` waits for the server's `session.closed`."""

REATTACH_DELAYS = (0.2, 0.5, 1.0, 2.0, 4.0)
"""Backoff between attempts to reattach; the last repeats until `reattach_for`."""


async def _token_from(source: TokenSource) -> str | None:
    if source is None or isinstance(source, str):
        return source
    token = source()
    if inspect.isawaitable(token):
        token = await token
    return token


class LiveClient:
    """One session with a live server. Create it with `LiveClient.connect`.

    When the socket drops without `session.closed`, `events()` reattaches by
    itself (`session.resume` with the last sequence number it received), with
    backoff, for up to `reattach_for` seconds: it yields a `Reattaching` before
    each attempt, then the server's `session.reattached`, then the events the
    client missed, and goes on.
    """

    def __init__(
        self,
        ws: ClientConnection,
        started: SessionStarted,
        *,
        url: str = DEFAULT_URL,
        origin: str | None = None,
        open_timeout: float = 10.0,
        reattach_for: float = 30.0,
        token: TokenSource = None,
        late_tail_wait: float | None = LATE_TAIL_WAIT,
    ) -> None:
        self._ws = ws
        self._token = token
        self.session = started
        self.closed_reason: str | None = None
        self.last_seq = 0
        self.reattaches = 0
        self._url = url
        self._origin = origin
        self._open_timeout = open_timeout
        self._reattach_for = reattach_for
        self._up = anyio.Event()
        self._up.set()
        self._closing = False
        self._receiving = False
        self._ended = anyio.Event()  # events() read session.closed, or the socket's end
        self._ready: collections.deque[ServerEvent | AudioFrame] = collections.deque()
        self._tails: LateTails[ServerEvent | AudioFrame] | None = (
            None if late_tail_wait is None else LateTails(late_tail_wait)
        )

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(
        cls,
        url: str = DEFAULT_URL,
        *,
        token: TokenSource = None,
        history: Sequence[types.Content] = (),
        input_rate: int = DEFAULT_INPUT_RATE,
        turn_taking: str | None = None,
        origin: str | None = None,
        open_timeout: float = 10.0,
        reattach_for: float = 30.0,
        start_timeout: float = 15.0,
        reports_playback: bool = False,
        late_tail_wait: float | None = LATE_TAIL_WAIT,
    ) -> AsyncIterator[LiveClient]:
        """Open the socket, start the session, and close both when done.

        `turn_taking` is who ends the user's turns: "auto" (the model's voice
        detection), "manual" (this client, with `activity_start()` /
        `activity_end()`), "server" (the server's voice detection; `user.speaking`
        and `user.stopped` events say what it heard), or None: as the agent says. `reattach_for=0` turns reattaching off. `open_timeout`
        bounds the WebSocket handshake, `start_timeout` the wait for
        `session.started` after it (a stuck server raises `SessionRefused` with
        the code "timeout"). `token` is a string or a function returning a
        fresh one; a server that requires tokens wants one on every reattach
        too (a string works while it is valid, a function for as long as it
        returns good ones). `late_tail_wait` is how long `events()` waits after
        a turn's end for the last words of its transcript, to give the reply
        whole (`clients.tails`); None: events exactly as the server sends them.
        """
        first_token = await _token_from(token)
        ws = await cls._open(url, origin, open_timeout)
        try:
            with contextlib.suppress(ConnectionClosed):  # a refusal may come first
                await ws.send(
                    encode(
                        SessionStart(
                            token=first_token,
                            history=tuple(history),
                            input_rate=input_rate,
                            turn_taking=turn_taking,
                            reports_playback=reports_playback,
                        )
                    )
                )
            started = None
            with anyio.move_on_after(start_timeout):
                started = await cls._await_started(ws)
            if started is None:
                raise SessionRefused(
                    "timeout", f"the server did not start a session within {start_timeout:g} s"
                )
        except BaseException:
            await ws.close()
            raise
        client = cls(
            ws, started, url=url, origin=origin, open_timeout=open_timeout, reattach_for=reattach_for,
            token=token, late_tail_wait=late_tail_wait,
        )
        try:
            yield client
        finally:
            await client.close()

    @staticmethod
    async def _open(url: str, origin: str | None, open_timeout: float) -> ClientConnection:
        return await ws_connect(
            url,
            origin=origin,  # type: ignore[arg-type]
            open_timeout=open_timeout,
            max_size=None,
            compression=None,  # audio does not compress; spare both sides the CPU
        )

    @staticmethod
    async def _await_started(ws: ClientConnection) -> SessionStarted | None:
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

    async def _reattach(self) -> AsyncIterator[Reattaching | SessionReattached]:
        """Reattach with backoff; yields news; raises ConnectionLost when it cannot."""
        if self.session.resume_token is None or self._reattach_for <= 0 or self._closing:
            raise ConnectionLost("the connection to the server was lost")
        self._up = anyio.Event()
        started = time.monotonic()
        attempt = 0
        reason = "the connection to the server was lost"
        while time.monotonic() - started < self._reattach_for:
            delay = REATTACH_DELAYS[min(attempt, len(REATTACH_DELAYS) - 1)]
            attempt += 1
            yield Reattaching(attempt, delay, reason)
            await anyio.sleep(delay)
            try:
                ws = await self._open(self._url, self._origin, self._open_timeout)
            except (OSError, TimeoutError, InvalidHandshake) as exc:
                reason = f"{type(exc).__name__}: {exc}"
                continue
            try:
                credential = await _token_from(self._token)
                await ws.send(
                    encode(
                        SessionResume(
                            self.session.session_id, self.session.resume_token or "", self.last_seq, credential
                        )
                    )
                )
                frame = await ws.recv()
                event = parse_server_event(frame) if isinstance(frame, str) else None
            except ConnectionClosed as exc:
                reason = f"the server closed the new socket ({exc.rcvd.code if exc.rcvd else 1006})"
                await ws.close()
                continue
            if isinstance(event, SessionReattached):
                self._ws = ws
                self.reattaches += 1
                # Frames the server no longer had are numbered all the same: the
                # replay after this goes on from past them.
                self.last_seq += event.missed
                if event.resume_token:  # the one just used works no more
                    self.session = dataclasses.replace(self.session, resume_token=event.resume_token)
                self._up.set()
                yield event
                return
            await ws.close()
            if isinstance(event, ErrorEvent):
                if event.code in ("session_expired", "unauthorized"):
                    raise ConnectionLost(f"{event.code}: {event.message}")
                reason = f"{event.code}: {event.message}"
        raise ConnectionLost(f"could not reattach within {self._reattach_for:g} s: {reason}")

    # ------------------------------------------------------------------ sending

    async def send_audio(self, pcm16: bytes) -> None:
        """One frame of microphone audio (PCM16 LE mono at the session's input rate).

        While the client is reattaching, audio is dropped: it would be stale."""
        if not self._up.is_set():
            return
        with contextlib.suppress(ConnectionClosed):
            await self._ws.send(pcm16)

    async def _send(self, frame: str) -> None:
        """A control message: while reattaching it waits, then goes on the new socket."""
        await self._up.wait()
        await self._ws.send(frame)

    async def send_text(self, text: str) -> None:
        await self._send(encode(Text(text)))

    async def send_image(self, data: bytes, mime_type: str = "image/jpeg") -> None:
        """One frame of what the user sees: a JPEG or PNG (`image/jpeg`, `image/png`).

        The model takes it as realtime video, in order with the audio; it samples
        about one frame a second. The server checks the bytes, their size and the
        rate, and answers a frame it drops with a non-fatal `error` event.
        """
        await self._ws.send(encode(Image(mime_type=mime_type, data=bytes(data))))

    async def activity_start(self) -> None:
        await self._send(encode(ActivityStart()))

    async def activity_end(self) -> None:
        await self._send(encode(ActivityEnd()))

    async def audio_end(self) -> None:
        """The microphone was muted."""
        await self._send(encode(AudioEnd()))

    async def report_playback(self, played: float) -> None:
        """After `turn.interrupted`: how many seconds of the cut reply were played
        (for sessions started with `reports_playback=True`)."""
        await self._send(encode(Playback(played)))

    async def send_tool_result(self, call_id: str, name: str, response: dict[str, Any]) -> None:
        await self._send(encode(ToolResult(call_id, name, response)))

    async def send_raw(self, frame: str | bytes) -> None:
        """Send a frame as is (for testing how a server handles arbitrary input)."""
        await self._ws.send(frame)

    # ------------------------------------------------------------------ receiving

    async def events(self) -> AsyncIterator[ServerEvent | AudioFrame | Reattaching]:
        """Everything the server sends, in order, until `session.closed`.

        A reply's final transcript comes whole: the tail Gemini may send after
        the turn ended (`late: true`) is folded into it, and its `turn.complete`
        follows (see `clients.tails`; `late_tail_wait=None` at `connect` turns
        that off). Reattaches by itself when the socket drops (see the class);
        raises `ConnectionLost` when that fails.
        """
        tails = self._tails
        # Read, not yet yielded (a turn's held end at most): kept on the client, so
        # a loop that breaks and calls events() again misses none of it.
        ready = self._ready
        while True:
            while ready:
                item = ready.popleft()
                yield item
                if isinstance(item, SessionClosed):
                    return
            if self.closed_reason is not None:
                self._ended.set()
                return
            try:
                deadline = tails.deadline if tails is not None else None
                if deadline is None:
                    frame = await self._receive()
                else:
                    frame = None
                    with anyio.move_on_after(deadline - anyio.current_time()):
                        frame = await self._receive()
                    if frame is None:
                        ready.extend(tails.expire(anyio.current_time()))  # type: ignore[union-attr]
                        continue
            except ConnectionClosed:
                if tails is not None:
                    ready.extend(tails.flush())
                if self.closed_reason is not None or self._closing:
                    self._ended.set()
                    while ready:
                        yield ready.popleft()
                    return
                while ready:
                    yield ready.popleft()
                async for news in self._reattach():
                    yield news
                continue
            if isinstance(frame, bytes):
                self.last_seq += 1
                item = AudioFrame(frame)
            else:
                item, seq = parse_server_frame(frame)
                if seq is not None:
                    self.last_seq = seq
                if isinstance(item, SessionClosed):
                    self.closed_reason = item.reason
                    self._ended.set()
            if tails is None:
                ready.append(item)
            else:
                ready.extend(tails.feed(item, anyio.current_time()))

    async def _receive(self) -> str | bytes:
        """The next frame; `close()` knows someone is waiting for one."""
        self._receiving = True
        try:
            return await self._ws.recv()
        finally:
            self._receiving = False

    async def wait_closed(self) -> int | None:
        """Wait until the socket is closed; returns the close code the server sent."""
        await self._ws.wait_closed()
        return self._ws.close_code

    async def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Ask the server to end the session, hear it end, then close the socket. Idempotent.

        The server answers `session.close` with `session.closed` (which its
        record keeps, so the record replays as the session went); this waits
        up to `timeout` seconds for it. What arrives meanwhile is dropped,
        unless a task is reading `events()`: then that task reads it.
        """
        if self._closing:
            await self._ws.close()
            return
        self._closing = True
        if self.closed_reason is None:  # else the session has ended already
            with contextlib.suppress(ConnectionClosed):
                await self._ws.send(encode(SessionClose()))
            with anyio.move_on_after(timeout):
                if self._receiving:
                    await self._ended.wait()
                else:
                    await self._hear_closed()
        await self._ws.close()

    async def _hear_closed(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            while True:
                frame = await self._ws.recv()
                if isinstance(frame, str):
                    event, _ = parse_server_frame(frame)
                    if isinstance(event, SessionClosed):
                        self.closed_reason = event.reason
                        return
