"""One WebSocket connection on picows, with the surface and exceptions of websockets' asyncio API.

`WebSocket` is one connection, client or server side (`live.net.websocket`
dials and listens, and hands these out). See that module for why picows, and
for what this class offers beyond websockets' surface on the hot path.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
from collections.abc import Callable
from typing import Any, Final

import picows
import websockets
from picows import WSCloseCode, WSListener, WSMsgType
from websockets.frames import OK_CLOSE_CODES, Close, CloseCode
from websockets.http11 import Request

__all__ = ["WebSocket", "close_reason_bytes"]

logger = logging.getLogger("live.net.websocket")

class _PicowsLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """picows' log lines in this project's terms.

    A connection coming and going, a slow reader pushing back, and a peer
    breaking the protocol (its handler sees that as a close, with the code)
    are everyday events on a server, not warnings or errors: they go to
    DEBUG. Anything else picows reports (a failure in this module's own
    callbacks) keeps its level.
    """

    _EVERYDAY: Final = (
        "New connection accepted", "WS connection established", "Disconnected", "WS parser error",
        "on_ws_frame raised WSProtocolError", "Protocol writing pause", "Protocol writing resume",
        "Handshake timeout", "Disconnect because HTTP request violated",
    )

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        if isinstance(msg, str) and msg.startswith(self._EVERYDAY):
            level = logging.DEBUG
        super().log(level, msg, *args, **kwargs)


_picows_log = _PicowsLog(logging.getLogger("live.net.websocket.picows"))

# websockets' defaults, which callers that pass nothing rely on.
MAX_SIZE: Final = 1 << 20
MAX_QUEUE: Final = 16
PING_INTERVAL: Final = 20.0
OPEN_TIMEOUT: Final = 10.0
CLOSE_TIMEOUT: Final = 10.0
MAX_CLOSE_REASON: Final = 123  # bytes: a close frame's payload is at most 125, two of them the code
ACCEPT_BACKLOG: Final = 1024  # connections open and not yet handed to their handler task
RECEIVE_BUFFER: Final = 64 << 10
"""A client socket's kernel receive buffer: room for 2 s of 16 kHz audio, a
camera frame, or a round trip of 1 s at 64 KB/s (see `serve`)."""


class WebSocket(WSListener):  # type: ignore[misc]
    """One connection: picows calls in with frames; tasks call `recv`, `send` and `close`."""

    def __init__(
        self,
        *,
        max_size: int | None = MAX_SIZE,
        max_queue: int | tuple[int | None, int | None] | None = MAX_QUEUE,
        close_timeout: float | None = CLOSE_TIMEOUT,
        request: Request | None = None,
        ping_interval: float | None = PING_INTERVAL,
        ping_timeout: float | None = PING_INTERVAL,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._transport: Any = None
        self._buffered: Callable[[], int] = lambda: 0
        self._messages: collections.deque[tuple[bytes, bool]] = collections.deque()
        self._fragments: list[bytes] = []
        self._fragments_text = False
        self._fragments_size = 0
        self._max_size = max_size or 0
        # websockets' max_queue: a high-water mark, or (high, low); low defaults to a quarter.
        high, low = max_queue if isinstance(max_queue, tuple) else (max_queue, None)
        self._max_queue = high or 0
        self._max_queue_low = low if low is not None else self._max_queue // 4
        self._reading_paused = False
        self._close_timeout = close_timeout
        self._close_timer: asyncio.TimerHandle | None = None
        self._recv_waiter: asyncio.Future[None] | None = None
        self._drained: asyncio.Future[None] | None = None  # while the write buffer is over its mark
        self._closed: websockets.ConnectionClosed | None = None
        self._disconnected = self._loop.create_future()
        self._abandoned = False
        self.request = request
        self.remote_address: Any = None
        self.on_open: Callable[[], None] | None = None  # called once the connection is up
        # The fast lane: while a reader waits in `recv()` with nothing queued, a
        # binary message goes to this callback first; True means it was taken.
        self.take_binary: Callable[[bytes], bool] | None = None
        # The same for text messages (decoded): a door that reads JSON frames.
        self.take_text: Callable[[str], bool] | None = None
        self.receive_buffer: int | None = None  # SO_RCVBUF once connected (see `serve`)
        # Keepalive: frames received (of any kind), and the ping awaiting an answer.
        self._ping_interval = ping_interval
        self._ping_timeout = ping_timeout
        self._frames_in = 0
        self._frames_at_tick = 0
        self._ping_sent_at: float | None = None
        self._keepalive_timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ picows' side

    def on_ws_connected(self, transport: Any) -> None:
        self._transport = transport
        if self._abandoned:
            transport.disconnect(False)
            return
        underlying = transport.underlying_transport
        self._buffered = underlying.get_write_buffer_size
        self.remote_address = underlying.get_extra_info("peername")
        if self.receive_buffer:
            sock = underlying.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.receive_buffer)
        if self._ping_interval:
            self._keepalive_timer = self._loop.call_later(self._ping_interval, self._keepalive)
        if self.on_open is not None:
            self.on_open()

    def _keepalive(self) -> None:
        """Every `ping_interval`: a ping when nothing arrived since the last look;
        the connection dropped when nothing at all (no pong, no message) arrived
        within `ping_timeout` of a ping. Anything the peer sends proves it alive,
        so a late pong on a connection still delivering never drops it."""
        self._keepalive_timer = None
        transport = self._transport
        if self._closed is not None or transport.is_disconnected:
            return
        now = self._loop.time()
        if self._frames_in != self._frames_at_tick:
            self._frames_at_tick = self._frames_in
            self._ping_sent_at = None
        elif self._ping_sent_at is None:
            transport.send_ping()
            self._ping_sent_at = now
        elif self._ping_timeout is not None and now - self._ping_sent_at >= self._ping_timeout:
            transport.send_close(WSCloseCode.INTERNAL_ERROR, b"keepalive ping timeout")
            transport.disconnect(False)
            return
        delay = self._ping_interval or PING_INTERVAL
        if self._ping_sent_at is not None and self._ping_timeout is not None:
            delay = max(0.0, min(delay, self._ping_sent_at + self._ping_timeout - now))
        self._keepalive_timer = self._loop.call_later(delay, self._keepalive)

    def on_ws_frame(self, transport: Any, frame: Any) -> None:
        self._frames_in += 1
        kind = frame.msg_type
        if kind is WSMsgType.TEXT or kind is WSMsgType.BINARY:
            if self._fragments:
                raise picows.WSProtocolError(WSCloseCode.PROTOCOL_ERROR, "expected a continuation frame")
            if frame.fin:
                if self._max_size and frame.payload_size > self._max_size:
                    raise picows.WSProtocolError(WSCloseCode.MESSAGE_TOO_BIG, "message too big")
                payload = frame.get_payload_as_bytes()
                waiter = self._recv_waiter
                if waiter is not None and not waiter.done() and frame.last_in_buffer:
                    # The reader waits with nothing queued (more read at once: it
                    # is behind, and takes them all): the fast lane may take it.
                    if kind is WSMsgType.BINARY:
                        if self.take_binary is not None and self.take_binary(payload):
                            return
                    elif self.take_text is not None:
                        try:
                            text = payload.decode()
                        except UnicodeDecodeError:
                            text = None  # the reader's recv() closes with 1007
                        if text is not None and self.take_text(text):
                            return
                self._deliver(payload, kind is WSMsgType.TEXT)
                return
            self._fragments_text = kind is WSMsgType.TEXT
            self._fragment(frame)
        elif kind is WSMsgType.CONTINUATION:
            if not self._fragments:
                raise picows.WSProtocolError(WSCloseCode.PROTOCOL_ERROR, "unexpected continuation frame")
            self._fragment(frame)
        elif kind is WSMsgType.CLOSE:
            # A close frame without a code reads as 0 here: the answer says 1000 (0 is not a code to send).
            code = frame.get_close_code()
            transport.send_close(code or WSCloseCode.OK, frame.get_close_message())
            transport.disconnect()

    def _fragment(self, frame: Any) -> None:
        self._fragments.append(frame.get_payload_as_bytes())
        self._fragments_size += frame.payload_size
        if self._max_size and self._fragments_size > self._max_size:
            raise picows.WSProtocolError(WSCloseCode.MESSAGE_TOO_BIG, "message too big")
        if frame.fin:
            payload = b"".join(self._fragments)
            self._fragments = []
            self._fragments_size = 0
            self._deliver(payload, self._fragments_text)

    def _deliver(self, payload: bytes, text: bool) -> None:
        if self._transport.is_close_frame_sent:
            # We are closing: no one reads what comes now, and it must not
            # fill the queue and stop reading before the peer's close arrives.
            return
        # Text stays bytes until `recv()` says how it wants it.
        self._messages.append((payload, text))
        waiter = self._recv_waiter
        if waiter is not None:
            self._recv_waiter = None
            if not waiter.done():
                waiter.set_result(None)
        if self._max_queue and not self._reading_paused and len(self._messages) >= self._max_queue:
            self._reading_paused = True
            self._transport.underlying_transport.pause_reading()

    def on_ws_disconnected(self, transport: Any) -> None:
        self._closed = _closed(transport.close_handshake)
        for timer in (self._close_timer, self._keepalive_timer):
            if timer is not None:
                timer.cancel()
        self._close_timer = self._keepalive_timer = None
        for future in (self._recv_waiter, self._drained):
            if future is not None and not future.done():
                future.set_result(None)
        self._recv_waiter = self._drained = None
        if not self._disconnected.done():
            self._disconnected.set_result(None)

    def pause_writing(self) -> None:
        if self._drained is None or self._drained.done():
            self._drained = self._loop.create_future()

    def resume_writing(self) -> None:
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    # ------------------------------------------------------------------ the tasks' side

    async def recv(self, decode: bool | None = None) -> str | bytes:
        """The next message (text as `str`, binary as `bytes`, unless `decode` says
        otherwise), or websockets' `ConnectionClosed` once none is left."""
        messages = self._messages
        while not messages:
            if self._closed is not None:
                raise self._closed
            if self._recv_waiter is not None:
                raise RuntimeError("recv() is already waiting for the next message")
            waiter = self._recv_waiter = self._loop.create_future()
            try:
                await waiter
            finally:
                if self._recv_waiter is waiter:  # cancelled: no one waits any more
                    self._recv_waiter = None
        payload, text = messages.popleft()
        if self._reading_paused and len(messages) <= self._max_queue_low:
            self._reading_paused = False
            self._resume_reading()
        if text if decode is None else decode:
            try:
                return payload.decode()
            except UnicodeDecodeError:
                self._transport.send_close(WSCloseCode.INVALID_TEXT, b"invalid UTF-8")
                self._transport.disconnect()
                await self._closing()
        return payload

    def __aiter__(self) -> WebSocket:
        return self

    async def __anext__(self) -> str | bytes:
        """Messages until the connection closes: normally ends the loop, otherwise raises."""
        try:
            return await self.recv()
        except websockets.ConnectionClosedOK:
            raise StopAsyncIteration from None

    async def send(self, message: str | bytes) -> None:
        """One message (`str` as text, bytes as binary), written at once; waits only
        while the socket's write buffer is past its mark."""
        transport = self._transport
        if self._closed is not None or transport.is_close_frame_sent:
            await self._closing()
        if type(message) is str:
            transport.send(WSMsgType.TEXT, message.encode())
        else:
            transport.send(WSMsgType.BINARY, message)
        drained = self._drained
        if drained is not None:
            # Shared by every sender waiting: one cancelled waiter must not cancel it for the others.
            await asyncio.shield(drained)
            if self._closed is not None:
                raise self._closed

    def send_nowait(self, message: str | bytes) -> None:
        """`send()` for a caller that knows it need not wait (`can_send_now()`):
        written at once. On a closed connection it is dropped, silently."""
        if type(message) is str:
            self._transport.send(WSMsgType.TEXT, message.encode())
        else:
            self._transport.send(WSMsgType.BINARY, message)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """The closing handshake; the connection is down when the peer answers, or
        after the close timeout at the latest (also when this wait is cancelled)."""
        transport = self._transport
        if not transport.is_close_frame_sent and not transport.is_disconnected:
            transport.send_close(WSCloseCode(code), close_reason_bytes(reason))
            if self._close_timeout is not None:
                self._close_timer = self._loop.call_later(self._close_timeout, transport.disconnect, False)
            if self._reading_paused:
                # A peer that kept sending (a phone line never stops) filled the
                # queue; its close answers only reach us if we read again.
                self._reading_paused = False
                self._resume_reading()
        await self.wait_closed()

    def _resume_reading(self) -> None:
        """Read again; and behind TLS, deliver what the TLS layer already holds.

        aiofastnet (1.x) reads the socket first when reading resumes and, on an
        empty socket, returns before handing over records its TLS buffers still
        hold: frames a client sent in one burst would wait for its next bytes.
        Its read of those buffers is asked for once more, on the next loop turn.
        """
        underlying = self._transport.underlying_transport
        underlying.resume_reading()
        deliver = getattr(underlying, "_do_read", None)
        if deliver is not None:
            self._loop.call_soon(_deliver_buffered, underlying, deliver)

    async def wait_closed(self) -> None:
        """Until the connection is down."""
        await asyncio.shield(self._disconnected)

    def _abandon(self) -> None:
        """No one will use this connection: down at once, now or as soon as it is up."""
        self._abandoned = True
        if self._transport is not None:
            self._transport.disconnect(False)

    async def _closing(self) -> None:
        await asyncio.shield(self._disconnected)
        assert self._closed is not None
        raise self._closed

    def can_send_now(self) -> bool:
        """Open, and nothing waiting in the write buffer: a frame sent now goes out at once."""
        transport = self._transport
        return not (transport.is_close_frame_sent or transport.is_disconnected) and self._buffered() == 0

    @property
    def transport(self) -> asyncio.Transport:
        """The asyncio transport under the connection (as websockets' connections have it)."""
        return self._transport.underlying_transport

    def frames_waiting(self) -> int:
        """Messages read from the socket and not yet taken by `recv()`."""
        return len(self._messages)

    @property
    def close_code(self) -> int | None:
        """The code of the close frame received, once the connection is down (1006 without one)."""
        if self._closed is None:
            return None
        return self._closed.rcvd.code if self._closed.rcvd is not None else CloseCode.ABNORMAL_CLOSURE

    @property
    def close_reason(self) -> str | None:
        if self._closed is None:
            return None
        return self._closed.rcvd.reason if self._closed.rcvd is not None else ""

    async def __aenter__(self) -> WebSocket:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def _close_frame(info: Any) -> Close | None:
    if info is None:
        return None
    # A close frame without a code reads as 1005, websockets' "none given".
    return Close(int(info.code) or CloseCode.NO_STATUS_RCVD, info.reason or "")


def _closed(handshake: Any) -> websockets.ConnectionClosed:
    """websockets' exception for a connection that is down, with the close frames as picows saw them.

    OK only when both frames went and both say a normal close (websockets' rule).
    """
    if handshake is None:
        return websockets.ConnectionClosedError(None, None)
    rcvd, sent = _close_frame(handshake.recv), _close_frame(handshake.sent)
    ok = rcvd is not None and sent is not None and rcvd.code in OK_CLOSE_CODES and sent.code in OK_CLOSE_CODES
    kind = websockets.ConnectionClosedOK if ok else websockets.ConnectionClosedError
    return kind(rcvd, sent, bool(handshake.recv_then_sent) if rcvd and sent else None)


def _deliver_buffered(transport: Any, deliver: Callable[[], Any]) -> None:
    """What a TLS transport holds decrypted or undecrypted, handed to its protocol
    (unless the connection went, or reading paused again, meanwhile)."""
    if transport.is_closing():
        return
    try:
        deliver()
    except Exception:  # the transport's own read reports its errors to the protocol
        logger.debug("delivering buffered TLS data failed", exc_info=True)


def close_reason_bytes(reason: str) -> bytes:
    """A close reason as a close frame carries it: UTF-8, at most 123 bytes, cut
    between characters (a frame with more, or with half a character, is a
    protocol error that loses the code and the reason at the peer)."""
    data = reason.encode()
    if len(data) <= MAX_CLOSE_REASON:
        return data
    return data[:MAX_CLOSE_REASON].decode("utf-8", "ignore").encode()


