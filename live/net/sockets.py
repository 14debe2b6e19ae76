"""The WebSocket layer the server listens with: picows where it can be imported,
websockets' own server where it cannot.

picows (`live.net.websocket`) frames in Cython and costs about 0.6x the CPU of
websockets' Python framing per relayed frame; it has no wheels for some
platforms (free-threaded CPython, PyPy). There, the server runs on websockets,
which it was built on before: the same routes, checks, limits and protocol,
only the fast lane for client audio (a frame taken inside the socket's
callback) is not there. `live serve --sockets websockets` chooses it outright.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import websockets.asyncio.server

from live.net.one_port import PostHandler, PostStream, is_post

__all__ = ["LAYERS", "limit_messages", "serve_with"]

log = logging.getLogger("live.server")

LAYERS = ("auto", "picows", "websockets")


def serve_with(layer: str) -> tuple[str, Callable[..., contextlib.AbstractAsyncContextManager[Any]]]:
    """The layer to listen with (`auto`: picows when it imports) and its `serve`."""
    if layer not in LAYERS:
        raise ValueError(f"unknown socket layer {layer!r}: choose one of {', '.join(LAYERS)}")
    if layer != "websockets":
        try:
            from live.net.websocket import serve
        except ImportError as exc:
            if layer == "picows":
                raise
            log.warning("sockets: websockets (picows cannot be imported here: %s); clients are served as before, "
                        "at about 1.6x the CPU per frame", exc)
        else:
            return "picows", serve
    return "websockets", _serve_websockets


def limit_messages(connection: Any, max_size: int) -> None:
    """The largest message `connection` takes from now on (set at its handshake,
    for the path it asked for, within what its server listens with): a larger
    one closes it with 1009, as `serve`'s `max_size` would."""
    protocol = getattr(connection, "protocol", None)
    if protocol is not None and hasattr(protocol, "max_message_size"):  # websockets
        protocol.max_message_size = max_size
    elif hasattr(connection, "_max_size"):  # live.net.websocket
        connection._max_size = max_size


class _ServerConnection(websockets.asyncio.server.ServerConnection):
    """websockets' server connection, reading again when it closes, and
    handing a POST to the POST routes.

    A peer that keeps sending (a phone line: 50 frames a second) fills the
    receive queue of a connection the server is refusing; reading pauses there,
    the peer's close reply is never read, and the closing handshake waits out
    the close timeout. Frames nobody will take are dropped and reading resumes.
    (It reaches into websockets' frame assembler: `recv_messages`.)

    With `posts` (set on a subclass per server), a connection's first bytes say
    what it is (`live.net.one_port`): a POST goes, as a byte stream, to the
    POST routes; websockets' handshake then waits for it to end, and nothing
    of websockets' reads it.
    """

    posts: Callable[[PostStream], None] | None = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._head = b""
        self._post: PostStream | None = None
        self._decided: asyncio.Future[bool] | None = (
            asyncio.get_running_loop().create_future() if self.posts is not None else None
        )

    def data_received(self, data: bytes) -> None:
        decided = self._decided
        if decided is not None and not decided.done():
            self._head += data
            verdict = is_post(self._head[:5])
            if verdict is None:
                return
            data, self._head = self._head, b""
            decided.set_result(verdict)
            if verdict:
                self._post = PostStream(self.transport, self.transport.get_extra_info("peername"))
                self._post.feed(data)
                assert self.posts is not None
                self.posts(self._post)
                return
        if self._post is not None:
            self._post.feed(data)
            return
        super().data_received(data)

    def eof_received(self) -> Any:
        if self._post is not None:
            self._post.feed_eof()
            return True  # the answer is still to be written
        return super().eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._post is not None:
            self._post.lost()
        if self._decided is not None and not self._decided.done():
            self._decided.set_result(False)
        super().connection_lost(exc)

    async def handshake(self, *args: Any, **kwargs: Any) -> None:
        if self._decided is not None and await self._decided and self._post is not None:
            # A POST: no handshake; its connection ends when its answer is written.
            await asyncio.shield(self.connection_lost_waiter)
            return
        await super().handshake(*args, **kwargs)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        messages = self.recv_messages
        # No flow control while closing: what arrives until the peer's close
        # (milliseconds; the close timeout at most) is dropped unread.
        messages.high = messages.low = None
        messages.frames.queue.clear()
        if messages.paused:
            messages.paused = False
            messages.resume()
        await super().close(code, reason)


@contextlib.asynccontextmanager
async def _serve_websockets(
    handler: Callable[[Any], Awaitable[None]],
    host: str | None,
    port: int | None,
    *,
    process_request: Callable[[Any, Any], Any] | None = None,
    ssl: Any = None,
    max_size: int | None = None,
    max_queue: int | None = None,
    server_header: str | None = None,
    reuse_port: bool | None = None,
    ping_interval: float | None = 20.0,
    ping_timeout: float | None = 20.0,
    post: PostHandler | None = None,
    **_: Any,
) -> AsyncIterator[Any]:
    """`live.net.websocket.serve`'s interface on websockets' server."""
    kwargs: dict[str, Any] = {"reuse_port": True} if reuse_port else {}
    async with anyio.create_task_group() as tg:
        # The POST routes' connections are tasks of this block, as on picows.
        connection = _ServerConnection
        if post is not None:
            connection = type("_ServerConnectionWithPosts", (_ServerConnection,),
                              {"posts": staticmethod(lambda stream: tg.start_soon(post, stream))})
        async with websockets.asyncio.server.serve(
            handler,
            host,
            port,
            process_request=process_request,
            ssl=ssl,
            max_size=max_size,
            max_queue=max_queue,
            server_header=server_header,
            compression=None,  # PCM does not compress: it would only spend CPU per frame
            create_connection=connection,
            ping_interval=ping_interval,
            ping_timeout=ping_timeout,
            **kwargs,
        ) as server:
            yield server
        tg.cancel_scope.cancel()
