"""One port for WebSockets and POSTs: a connection's first bytes say which it is.

A carrier's webhook (an HTTPS POST) and its media stream (a WebSocket) should
reach the server on one address, so one tunnel or one load-balancer rule
serves a number. Neither WebSocket layer reads a POST, so each hands a
connection whose request line starts with `POST ` to the POST routes'
handling (`live.net.http_post`) before the handshake is parsed: the bytes
read so far and what follows go to a byte stream (`PostStream`) that the
routes' handler reads as it reads its own listener's connections. Anything
else (a WebSocket upgrade, a GET for `/healthz`) goes on to the WebSocket
layer as if nothing had looked.

Bounded: a POST is read into the stream up to `MAX_BUFFERED` bytes (then the
socket stops reading until the handler takes them), and the handler's own
bounds (size, time, connections per address) apply to it as on its own port.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc
from anyio.abc import SocketAttribute

__all__ = ["MAX_BUFFERED", "FirstBytes", "PostHandler", "PostStream", "feed", "is_post"]

# A POST's bytes waiting for its handler; past this the socket stops reading.
MAX_BUFFERED = 128 << 10
# What the first bytes of a POST are (RFC 9112: method SP request-target).
_POST = b"POST "

# What serves a POST that came in on the WebSocket port: the POST routes'
# handling of one connection (its request, its answer).
PostHandler = Callable[[anyio.abc.ByteStream], Awaitable[None]]


def is_post(head: bytes) -> bool | None:
    """True for a POST's first bytes, False for anything else, None while too few to say."""
    if len(head) < len(_POST):
        return None if _POST.startswith(head) else False
    return head.startswith(_POST)


class PostStream(anyio.abc.ByteStream):
    """A connection's bytes as an anyio byte stream, fed by its protocol (`feed`,
    `feed_eof`, `lost`) and written to its transport."""

    def __init__(self, transport: Any, peer: Any = None) -> None:
        self._transport = transport
        self._peer = peer
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._eof = False
        self._closed = False
        self._paused = False
        self._ready = anyio.Event()

    @property
    def extra_attributes(self) -> dict[Any, Callable[[], Any]]:
        peer = self._peer
        if peer is None:
            return {}
        return {SocketAttribute.remote_address: lambda: peer, SocketAttribute.remote_port: lambda: peer[1]}

    # -- fed by the connection's protocol (callbacks, outside any task)

    def feed(self, data: bytes) -> None:
        if self._closed or not data:
            return
        self._chunks.append(bytes(data))
        self._size += len(data)
        if self._size > MAX_BUFFERED and not self._paused:
            self._paused = True
            self._transport.pause_reading()
        self._ready.set()

    def feed_eof(self) -> None:
        self._eof = True
        self._ready.set()

    def lost(self) -> None:
        self._closed = True
        self._ready.set()

    # -- read and written by the handler (a task)

    async def receive(self, max_bytes: int = 65536) -> bytes:
        while not self._chunks:
            if self._closed:
                raise anyio.BrokenResourceError
            if self._eof:
                raise anyio.EndOfStream
            self._ready = anyio.Event()
            await self._ready.wait()
        chunk = self._chunks.popleft()
        if len(chunk) > max_bytes:
            chunk, rest = chunk[:max_bytes], chunk[max_bytes:]
            self._chunks.appendleft(rest)
        self._size -= len(chunk)
        if self._paused and self._size <= MAX_BUFFERED // 2:
            self._paused = False
            self._transport.resume_reading()
        return chunk

    async def send(self, item: bytes) -> None:
        if self._closed or self._transport.is_closing():
            raise anyio.BrokenResourceError
        self._transport.write(item)

    async def send_eof(self) -> None:
        if not self._closed and self._transport.can_write_eof():
            self._transport.write_eof()

    async def aclose(self) -> None:
        self._closed = True
        self._transport.close()


class FirstBytes(asyncio.BufferedProtocol):
    """A connection's protocol until its first bytes say what it is.

    A POST becomes a `PostStream` given to `posts` (which starts its handler);
    anything else is handed to `then`, the WebSocket layer's own protocol,
    with the bytes read so far: from then on it is the connection's protocol,
    as if this one had never been. A connection that says nothing for
    `timeout` seconds is closed.
    """

    def __init__(self, then: asyncio.BaseProtocol, posts: Callable[[PostStream], None], timeout: float | None) -> None:
        self._then = then
        self._posts = posts
        self._timeout = timeout
        self._transport: Any = None
        self._timer: asyncio.TimerHandle | None = None
        self._buffer = bytearray(16 << 10)
        self._view = memoryview(self._buffer)
        self._head = b""
        self._stream: PostStream | None = None

    def connection_made(self, transport: Any) -> None:
        self._transport = transport
        if self._timeout:
            self._timer = asyncio.get_running_loop().call_later(self._timeout, transport.close)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._view

    def buffer_updated(self, nbytes: int) -> None:
        data = bytes(self._view[:nbytes])
        if self._stream is not None:
            self._stream.feed(data)
            return
        self._head += data
        verdict = is_post(self._head[: len(_POST)])
        if verdict is None:
            return
        if self._timer is not None:
            self._timer.cancel()
        transport, head = self._transport, self._head
        self._head = b""
        if verdict:
            self._stream = PostStream(transport, transport.get_extra_info("peername"))
            self._stream.feed(head)
            self._posts(self._stream)
            return
        then = self._then
        transport.set_protocol(then)
        then.connection_made(transport)
        feed(then, head)

    def eof_received(self) -> bool:
        if self._stream is not None:
            self._stream.feed_eof()
            return True  # keep the connection open for the answer
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._stream is not None:
            self._stream.lost()


def feed(protocol: Any, data: bytes) -> None:
    """Give `protocol` bytes as its transport would: through its buffer, or `data_received`."""
    if not isinstance(protocol, asyncio.BufferedProtocol) and not hasattr(protocol, "get_buffer"):
        protocol.data_received(data)
        return
    view = memoryview(data)
    while view:
        buffer = protocol.get_buffer(len(view))
        size = min(len(buffer), len(view))
        buffer[:size] = view[:size]
        protocol.buffer_updated(size)
        view = view[size:]
