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
taken), and `take_binary` (`take_text`), a callback that takes binary (text)
messages as they arrive while a reader waits with nothing queued: a relay forwards a frame
inside the socket's own callback, with no task switch, and order is kept
(anything queued, or in the reader's hands, goes first). Frames that arrive
in one read (the process fell behind) all go to the reader, which can join them. `connect()` dials,
`serve()` listens (here); the connection itself is
`live.net.websocket_connection.WebSocket`, offered here too.

Bounded: at most `max_queue` messages wait for `recv()`; past that the socket
stops reading until `recv()` catches up, and TCP pushes back on the peer. A
message over `max_size` closes the connection with 1009; text that is not
UTF-8, with 1007. Keepalive pings go out while nothing arrives for
`ping_interval` seconds; no answer within `ping_timeout` drops the connection.
No permessage-deflate: audio does not compress.
"""

from __future__ import annotations

import asyncio
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
from picows import WSCloseCode
from websockets.datastructures import Headers
from websockets.frames import Close, CloseCode
from websockets.http11 import Request, Response
from websockets.headers import build_authorization_basic
from websockets.proxy import get_proxy, parse_proxy
from websockets.uri import parse_uri

from live.net.one_port import FirstBytes, PostHandler, PostStream
from live.net.websocket_connection import (
    ACCEPT_BACKLOG,
    CLOSE_TIMEOUT,
    MAX_QUEUE,
    MAX_SIZE,
    OPEN_TIMEOUT,
    PING_INTERVAL,
    RECEIVE_BUFFER,
    WebSocket,
    _picows_log,
    close_reason_bytes,
)

__all__ = ["Server", "WebSocket", "close_reason_bytes", "connect", "serve"]

logger = logging.getLogger(__name__)

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
    post: PostHandler | None = None,
) -> AsyncIterator[Server]:
    """Listen on `host`:`port`; every connection runs `handler(ws)` in this block's task group.

    `post(stream)`: a connection whose request is a POST is read by it, as a
    byte stream, in this block's task group (`live.net.one_port`): one port for
    WebSockets and POST routes. None: only GETs are read, as picows reads them.

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
                posts=(lambda stream: tg.start_soon(post, stream)) if post is not None else None,
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
    posts: Callable[[PostStream], None] | None = None,
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
        logger.warning("picows: serving without peer addresses in process_request%s (%s)",
                       ", nor POST routes on this port" if posts is not None else "", exc)
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
        if posts is not None:  # its first bytes say whether it is picows' or a POST's
            return FirstBytes(made, posts, handshake_timeout)
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
