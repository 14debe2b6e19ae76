"""WebSocket connections on picows, with the surface and exceptions of websockets' asyncio API.

A relay's CPU goes mostly to its sockets: every 20 ms microphone frame and
every reply chunk is a WebSocket frame read on one socket and written on
another. websockets frames in Python (a sans-I/O parser run per read, then a
queue, a future and a task switch per message); picows frames in Cython and
calls back per frame, over aiofastnet's transports and TLS. On a verbatim
relay, moving both sockets to picows halves the CPU per session (README,
Performance).

`WebSocket` is one connection, client or server side, offering what the
server and google-genai use of websockets' connections: `recv()`, `async for`,
`send()`, `close()`, `request`, `remote_address`, and their exceptions
(`websockets.ConnectionClosedOK` / `ConnectionClosedError` with the close
frames as sent and received, `InvalidStatus`, `InvalidURI`, `InvalidHandshake`),
so code written against websockets reads it unchanged. Additions for the hot
path: `can_send_now()` (a frame sent now goes out at once), `send_nowait()`
(the send itself, synchronous), `frames_waiting()` (frames read and not yet
taken), and `take_binary`, a callback that takes binary messages as they
arrive while a reader waits with nothing queued: a relay forwards a frame
inside the socket's own callback, with no task switch, and order is kept
(anything queued, or in the reader's hands, goes first). Frames that arrive
in one read (the process fell behind) all go to the reader, which can join them. `connect()` dials,
`serve()` listens.

Bounded: at most `max_queue` messages wait for `recv()`; past that the socket
stops reading until `recv()` catches up, and TCP pushes back on the peer. A
message over `max_size` closes the connection with 1009; text that is not
UTF-8, with 1007. Keepalive pings go out while nothing arrives for
`ping_interval` seconds; no answer within `ping_timeout` drops the connection.
No permessage-deflate: audio does not compress.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import http
import logging
import socket
import ssl as ssl_module
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final

import anyio
import anyio.abc
import picows
from multidict import CIMultiDict
import websockets
from picows import WSCloseCode, WSListener, WSMsgType
from websockets.datastructures import Headers
from websockets.frames import OK_CLOSE_CODES, Close, CloseCode
from websockets.http11 import Request, Response
from websockets.headers import build_authorization_basic
from websockets.proxy import get_proxy, parse_proxy
from websockets.uri import parse_uri

__all__ = ["Server", "WebSocket", "connect", "serve"]

logger = logging.getLogger(__name__)

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


_picows_log = _PicowsLog(logging.getLogger(f"{__name__}.picows"))

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
                if (
                    kind is WSMsgType.BINARY
                    and waiter is not None
                    and not waiter.done()
                    and self.take_binary is not None
                    and frame.last_in_buffer  # more read at once: the reader is behind; it takes them all
                    and self.take_binary(payload)
                ):
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


# ---------------------------------------------------------------------------- dialing


async def connect(
    uri: str,
    *,
    additional_headers: Any = None,
    ssl: ssl_module.SSLContext | bool | None = None,
    compression: str | None = None,
    proxy: str | bool | None = True,
    open_timeout: float | None = OPEN_TIMEOUT,
    ping_interval: float | None = PING_INTERVAL,
    ping_timeout: float | None = PING_INTERVAL,
    close_timeout: float | None = CLOSE_TIMEOUT,
    max_size: int | None = MAX_SIZE,
    max_queue: int | None = MAX_QUEUE,
) -> WebSocket:
    """A `WebSocket` connected to `uri`; the options mean what they mean to websockets' `connect`.

    The proxy is chosen as websockets chooses it (HTTPS_PROXY, SOCKS_PROXY,
    NO_PROXY): HTTP(S) and SOCKS 4/4a/5/5h. `user:pass@` in `uri` is sent as
    Basic authentication. `open_timeout` covers everything up to the open
    connection: TCP, the proxy, TLS and the upgrade (`TimeoutError`).
    Redirects are not followed: the Live API never redirects, and a redirect
    must not carry the credentials in the headers to another host (a 3xx is
    `websockets.InvalidStatus`). Handshake failures raise websockets'
    exceptions; `compression` must be None.

    Cancelled at any point (or timed out), it leaves no connection behind: a
    connection picows completes after that is closed as soon as it is up.
    """
    if compression is not None:
        raise ValueError("live.net.websocket does not compress: pass compression=None")
    target = parse_uri(uri)  # websockets.InvalidURI for what websockets refuses
    if proxy is True:
        proxy = get_proxy(target)
    headers = list(additional_headers.items()) if hasattr(additional_headers, "items") else list(additional_headers or ())
    if target.user_info:
        if not any(name.lower() == "authorization" for name, _ in headers):
            headers.append(("Authorization", build_authorization_basic(*target.user_info)))
        parts = urllib.parse.urlsplit(uri)
        uri = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    socket_factory = None
    if proxy and proxy.split(":", 1)[0].lower() in _SOCKS:
        socket_factory = _socks_dialer(parse_proxy(proxy))
        proxy = None
    made: list[WebSocket] = []
    gone = False  # cancelled, failed or timed out: nobody will use a connection made now

    def listener() -> WebSocket:
        ws = WebSocket(
            max_size=max_size, max_queue=max_queue, close_timeout=close_timeout,
            ping_interval=ping_interval, ping_timeout=ping_timeout,
        )
        made.append(ws)
        if gone:
            ws._abandon()
        return ws

    try:
        async with asyncio.timeout(open_timeout):
            _, connected = await picows.ws_connect(
                listener,
                uri,
                ssl_context=ssl if isinstance(ssl, ssl_module.SSLContext) else None,
                websocket_handshake_timeout=open_timeout,
                max_frame_size=max_size or (1 << 62),
                extra_headers=headers or None,
                max_redirects=0,
                proxy=proxy or None,
                socket_factory=socket_factory,
                logger_name=_picows_log,
                enable_auto_ping=False,  # the connection's own keepalive (WebSocket._keepalive)
            )
    except BaseException as exc:
        # Cancelled (or failed) mid-handshake: a connection made meanwhile, or
        # one that completes later (picows finishes an upgrade it has begun),
        # has no one to use it.
        gone = True
        for ws in made:
            ws._abandon()
        error = _handshake_error(exc, uri)
        if error is exc:
            raise
        raise error from exc
    if connected is None:  # the peer dropped the connection before answering the upgrade
        raise websockets.InvalidHandshake("the connection closed during the opening handshake")
    return connected


# What websockets makes of a SOCKS proxy URL: the protocol, and whether the
# proxy resolves the host name (the `h` and `a` variants).
_SOCKS: Final = {"socks5h": ("SOCKS5", True), "socks5": ("SOCKS5", False), "socks4a": ("SOCKS4", True), "socks4": ("SOCKS4", False)}


def _socks_dialer(proxy: Any) -> Callable[[Any], Awaitable[socket.socket]]:
    """picows' socket factory for a SOCKS proxy, as websockets connects through one
    (picows' own SOCKS path knows neither `socks5h` nor `socks4a`)."""
    from python_socks import ProxyType
    from python_socks.async_.asyncio import Proxy as SocksProxy

    kind, rdns = _SOCKS[proxy.scheme]
    socks = SocksProxy(ProxyType[kind], proxy.host, proxy.port, proxy.username, proxy.password, rdns)

    async def dial(target: Any) -> socket.socket:
        try:
            return await socks.connect(target.host, target.port)
        except OSError:
            raise
        except Exception as exc:  # python-socks' own errors: the proxy refused or broke
            raise websockets.exceptions.ProxyError(f"the SOCKS proxy {proxy.host}:{proxy.port} failed: {exc}") from exc

    return dial


def _handshake_error(exc: BaseException, uri: str) -> BaseException:
    """picows' failure to connect as websockets' exception for it (others as they are)."""
    if isinstance(exc, picows.WSInvalidStatusError):
        got = exc.response
        assert got is not None
        body = got.body or exc.raw_body or b""
        response = Response(int(got.status), got.status.phrase, Headers(list(got.headers.items())), bytes(body))
        return websockets.InvalidStatus(response)
    if isinstance(exc, picows.WSInvalidURL):
        return websockets.InvalidURI(uri, str(exc))
    if isinstance(exc, picows.WSHandshakeError):
        return websockets.InvalidHandshake(str(exc))
    return exc


# ---------------------------------------------------------------------------- serving


class Server:
    """A listening socket and the handlers of its connections (all owned by `serve()`'s task group)."""

    def __init__(self, raw: asyncio.Server, task_group: anyio.abc.TaskGroup) -> None:
        self._raw = raw
        self._task_group = task_group
        self.connections: set[WebSocket] = set()

    @property
    def sockets(self) -> tuple[Any, ...]:
        return tuple(self._raw.sockets)

    def close(self, close_connections: bool = True) -> None:
        """Stop listening; with `close_connections`, close every connection with 1001 (going away)."""
        self._raw.close()
        if close_connections:
            for ws in list(self.connections):
                self._task_group.start_soon(ws.close, CloseCode.GOING_AWAY, "")

    async def wait_closed(self) -> None:
        await self._raw.wait_closed()


def _upgrade_response(response: Response, server_header: str | None) -> Any:
    """websockets' `Response` as the picows response sent instead of the upgrade
    (picows adds Content-Length for a body, and Connection: close)."""
    answer = picows.WSUpgradeResponse()
    answer.version = b"HTTP/1.1"
    answer.status = http.HTTPStatus(response.status_code)
    answer.headers = CIMultiDict(response.headers.raw_items())
    answer.body = bytes(response.body) if response.body else None
    if answer.body:
        answer.headers.popall("Content-Length", None)
    if server_header and "Server" not in answer.headers:
        answer.headers["Server"] = server_header
    return picows.WSUpgradeResponseWithListener(answer, None)


@contextlib.asynccontextmanager
async def serve(
    handler: Callable[[WebSocket], Awaitable[None]],
    host: str | None,
    port: int | None,
    *,
    process_request: Callable[[Any, Request], Response | None] | None = None,
    ssl: ssl_module.SSLContext | None = None,
    max_size: int | None = MAX_SIZE,
    max_queue: int | None = MAX_QUEUE,
    server_header: str | None = None,
    reuse_port: bool | None = None,
    ping_interval: float | None = PING_INTERVAL,
    ping_timeout: float | None = PING_INTERVAL,
    close_timeout: float | None = CLOSE_TIMEOUT,
    open_timeout: float | None = OPEN_TIMEOUT,
    receive_buffer: int | None = RECEIVE_BUFFER,
) -> AsyncIterator[Server]:
    """Listen on `host`:`port`; every connection runs `handler(ws)` in this block's task group.

    `process_request(ws, request)` sees each HTTP request first (websockets'
    `Request`; `ws` is the connection to be, not connected yet, with only its
    `remote_address`, the peer's): a `Response` is sent instead of the
    upgrade, None goes on to it. When the handler returns the connection closes with 1000; when
    it fails, with 1011. Leaving the block stops listening and closes what is
    still open.

    `receive_buffer` caps each client socket's kernel receive buffer
    (SO_RCVBUF). picows doubles a connection's read buffer whenever a read
    fills it and never shrinks it, so a client that floods would otherwise
    grow it to what the kernel's autotuned buffer hands over in one read
    (megabytes); capped, a read is at most about this much, and the buffer
    stays a few times the largest frame. None leaves the kernel's default.
    """
    extra = {"Server": server_header} if server_header else None
    # Connections picows opened, waiting for their handler task: its callbacks
    # run outside any task, so a task (the acceptor, in this block's task group)
    # starts each handler. Bounded: past it a new connection is closed with 1013.
    opened, accepted = anyio.create_memory_object_stream[WebSocket](ACCEPT_BACKLOG)

    def accept(upgrade: Any, peer: Any = None) -> Any:
        try:
            request = Request(upgrade.path.decode("ascii", "surrogateescape"), Headers(list(upgrade.headers.items())))
        except (UnicodeError, ValueError, websockets.exceptions.InvalidHeader):
            # A header that is not text (bytes that are not ASCII): a bad request, not a failure.
            bad = http.HTTPStatus.BAD_REQUEST
            body = b"bad request: a header is not valid text\n"
            return _upgrade_response(Response(bad.value, bad.phrase, Headers(), body), server_header)
        ws = WebSocket(
            max_size=max_size, max_queue=max_queue, close_timeout=close_timeout, request=request,
            ping_interval=ping_interval, ping_timeout=ping_timeout,
        )
        ws.receive_buffer = receive_buffer
        ws.remote_address = peer
        if process_request is not None:
            try:
                response = process_request(ws, request)
            except Exception:
                # picows would answer with the exception's text; the client gets no internals.
                logger.exception("process_request failed")
                failed = http.HTTPStatus.INTERNAL_SERVER_ERROR
                response = Response(failed.value, failed.phrase, Headers(), b"internal server error\n")
            if response is not None:
                return _upgrade_response(response, server_header)
        ws.on_open = lambda: opened_now(ws)
        return picows.WSUpgradeResponseWithListener(picows.WSUpgradeResponse.create_101_response(extra), ws)

    def opened_now(ws: WebSocket) -> None:
        try:
            opened.send_nowait(ws)
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            ws._transport.send_close(WSCloseCode.TRY_AGAIN_LATER, b"too many connections opening at once")
            ws._transport.disconnect()

    async def acceptor() -> None:
        async with accepted:
            async for ws in accepted:
                server.connections.add(ws)
                tg.start_soon(run, ws)

    async def run(ws: WebSocket) -> None:
        try:
            await handler(ws)
        except Exception:
            logger.exception("connection handler failed")
            await ws.close(CloseCode.INTERNAL_ERROR)
        else:
            await ws.close()
        finally:
            server.connections.discard(ws)

    loop = asyncio.get_running_loop()
    previous_handler = loop.get_exception_handler()
    if ssl is not None:
        loop.set_exception_handler(_quiet_tls_failures(previous_handler))
    try:
        async with opened, anyio.create_task_group() as tg:
            raw = await _create_server(
                accept,
                host,
                port,
                handshake_timeout=open_timeout,
                max_frame_size=max_size or (1 << 62),
                ssl=ssl,
                reuse_port=reuse_port,
                server_header=server_header,
            )
            server = Server(raw, tg)
            tg.start_soon(acceptor)
            try:
                yield server
            finally:
                server.close()
                await server.wait_closed()
                opened.close()
    finally:
        if ssl is not None:
            loop.set_exception_handler(previous_handler)


async def _create_server(
    accept: Callable[[Any, Any], Any],
    host: str | None,
    port: int | None,
    *,
    handshake_timeout: float | None,
    max_frame_size: int,
    ssl: ssl_module.SSLContext | None,
    reuse_port: bool | None,
    server_header: str | None = None,
) -> asyncio.Server:
    """picows' `ws_create_server`, with each request's listener factory also told
    the connection's peer address (picows gives it the request alone), so that
    what a request may see can depend on who asks, not on the Host it names,
    and a request head past picows' limit answered 431 (picows closes without a word).

    Built as picows builds its own server (its protocol, over aiofastnet when
    that is installed); where this picows' protocol cannot be made so, its own
    server, and the peer is unknown (None) to the factory.
    """
    loop = asyncio.get_running_loop()
    try:
        from picows import api as picows_api
        from picows.picows import WSAutoPingStrategy, WSProtocol

        answering = _answering_head_limit(WSProtocol, server_header)

        def make(listener_factory: Callable[[Any], Any]) -> Any:
            return answering(
                None, None, False, listener_factory, _picows_log, True, handshake_timeout,
                False, PING_INTERVAL, PING_INTERVAL, WSAutoPingStrategy.PING_WHEN_IDLE, True,
                max_frame_size, None, 16 * 1024,
            )

        make(lambda upgrade: None)  # this picows' protocol takes these arguments
    except (ImportError, AttributeError, TypeError) as exc:
        logger.warning("picows: serving without peer addresses in process_request (%s)", exc)
        return await picows.ws_create_server(
            accept, host, port, websocket_handshake_timeout=handshake_timeout,
            max_frame_size=max_frame_size, logger_name=_picows_log, ssl=ssl,
            reuse_port=reuse_port, enable_auto_ping=False,
        )

    def protocol() -> Any:
        made: Any = None

        def listener_factory(upgrade: Any) -> Any:
            transport = getattr(made, "transport", None)
            underlying = getattr(transport, "underlying_transport", None)
            peer = underlying.get_extra_info("peername") if underlying is not None else None
            return accept(upgrade, peer)

        made = make(listener_factory)
        return made

    if getattr(picows_api, "_HAS_AIOFASTNET", False):
        import aiofastnet

        return await aiofastnet.create_server(loop, protocol, host=host, port=port, ssl=ssl, reuse_port=reuse_port)
    return await loop.create_server(protocol, host=host, port=port, ssl=ssl, reuse_port=reuse_port)


# picows' fixed limit on a request's head (request line and headers), in its Cython.
HTTP_HEAD_LIMIT: Final = 16 * 1024


def _answering_head_limit(base: type, server_header: str | None) -> type:
    """picows' server protocol, answering 431 to a request whose head reaches
    picows' limit before picows drops the connection.

    picows decides in its Cython (the request line and headers reach 16 KiB, with
    or without their end) and closes the connection gracefully, which sends what
    was written before: this looks at the same bytes as they are read (the
    buffer picows hands the transport) and writes the answer first.
    """
    body = b"request header fields too large\n"
    head = "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; charset=utf-8\r\n"
    head += f"Content-Length: {len(body)}\r\nConnection: close\r\n"
    head += f"Server: {server_header}\r\n\r\n" if server_header else "\r\n"
    answer = head.encode() + body

    class HeadAnswering(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            self._head: bytearray | None = bytearray()  # None once the head was looked at
            self._view: memoryview | None = None

        def get_buffer(self, size_hint: int) -> memoryview:
            view = super().get_buffer(size_hint)
            if self._head is not None:
                self._view = view
            return view

        def buffer_updated(self, nbytes: int) -> None:
            seen, view = self._head, self._view
            if seen is not None and view is not None:
                self._view = None
                start = max(0, len(seen) - 3)
                seen += view[:nbytes]
                end = seen.find(b"\r\n\r\n", start)
                if end >= 0 or len(seen) >= HTTP_HEAD_LIMIT:
                    self._head = None
                    if (end if end >= 0 else len(seen)) >= HTTP_HEAD_LIMIT:
                        self.transport.underlying_transport.write(answer)
            super().buffer_updated(nbytes)

    return HeadAnswering


def _quiet_tls_failures(previous: Any) -> Callable[[asyncio.AbstractEventLoop, dict[str, Any]], None]:
    """The loop's exception handler, with a client's failed TLS handshake as one
    DEBUG line (as asyncio's own TLS reports it), not an ERROR with a traceback:
    scanners and clients that distrust the certificate are everyday events."""

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        # aiofastnet may report the exception's class rather than an instance.
        kind = exc if isinstance(exc, type) else type(exc)
        if context.get("message", "").startswith("SSL handshake failed") and (exc is None or issubclass(kind, OSError)):
            logger.debug("TLS handshake with a client failed: %s", exc)
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    return handle
