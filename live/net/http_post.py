"""The HTTP POST routes beside the WebSocket port: carriers' webhooks, the Live API's `auth_tokens`.

Neither of the server's WebSocket layers reads a request other than a GET
upgrade, and some callers must POST: a carrier telling the server a call came
in, an app's backend minting a token with google-genai's
`client.auth_tokens.create`. `PostListener` is the little HTTP/1.1 they need
(h11), on a port of its own (`serve`) or on the connections the WebSocket port
hands it (`handle`, `live.server.posts`): POST routes only, one request per connection,
bounded in size, time and count. A route's handler is a plain function of
(target, headers, body) to an `HttpAnswer`: the decision without I/O.
"""

from __future__ import annotations

import dataclasses
import http
import inspect
import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping
from urllib.parse import urlsplit

import anyio
import anyio.abc
import h11
from anyio.streams.tls import TLSListener

__all__ = ["Handler", "HttpAnswer", "PostListener", "plain"]

log = logging.getLogger("live.http")

# A carrier's webhook is a form of a few dozen short fields, a token request
# one setup: 64 KiB is plenty, and a body past it is refused before it is read further.
MAX_BODY_BYTES = 64 << 10
# Time for a whole request to arrive; a caller sends it at once.
READ_TIMEOUT = 10.0
# Requests being read at once; more are answered 503 and closed.
MAX_CONNECTIONS = 64


@dataclasses.dataclass(frozen=True)
class HttpAnswer:
    """What a route answers: status, body, its type."""

    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


# (target, headers with lower-case names, body) -> the answer, or an awaitable of it.
Handler = Callable[[str, Mapping[str, str], bytes], "HttpAnswer | Awaitable[HttpAnswer]"]


def plain(status: http.HTTPStatus, text: str) -> HttpAnswer:
    return HttpAnswer(status.value, (text + "\n").encode())


class PostListener:
    """A small HTTP/1.1 server: POST routes, one request per connection."""

    def __init__(
        self, routes: Mapping[str, Handler], host: str, port: int, *,
        ssl_context: ssl.SSLContext | None = None, reuse_port: bool = False,
    ) -> None:
        self.routes = dict(routes)
        self.reuse_port = reuse_port
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self.bound_port: int | None = None
        self._open = 0

    async def serve(self, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled; every connection's task is owned by this call's task group."""
        listener: anyio.abc.Listener = await anyio.create_tcp_listener(
            local_host=self.host, local_port=self.port, reuse_port=self.reuse_port
        )
        self.bound_port = int(listener.extra(anyio.abc.SocketAttribute.local_port))
        if self.ssl_context is not None:
            listener = TLSListener(listener, self.ssl_context, standard_compatible=False)
        task_status.started(self.bound_port)
        async with listener, anyio.create_task_group() as tg:
            await listener.serve(self._connection, task_group=tg)

    async def handle(self, stream: anyio.abc.ByteStream) -> None:
        """One connection from its first byte: read within the bounds, answered, closed."""
        await self._connection(stream)

    async def _connection(self, stream: anyio.abc.ByteStream) -> None:
        async with stream:
            if self._open >= MAX_CONNECTIONS:
                await self._send(stream, h11.Connection(h11.SERVER), plain(http.HTTPStatus.SERVICE_UNAVAILABLE, "busy"))
                return
            self._open += 1
            try:
                await self._one_request(stream)
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                pass
            finally:
                self._open -= 1

    async def _one_request(self, stream: anyio.abc.ByteStream) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=16 << 10)
        request: h11.Request | None = None
        body = bytearray()
        with anyio.move_on_after(READ_TIMEOUT) as timer:
            while True:
                try:
                    event = conn.next_event()
                except h11.RemoteProtocolError as exc:
                    # h11's hint: 431 for a head past its bound, 400 for the rest.
                    status = http.HTTPStatus(exc.error_status_hint)
                    await self._send(stream, conn, plain(status, status.phrase.lower()))
                    return
                if event is h11.NEED_DATA:
                    conn.receive_data(await stream.receive(16 << 10))
                    continue
                if isinstance(event, h11.Request):
                    request = event
                    length = dict(event.headers).get(b"content-length")
                    if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
                        await self._send(stream, conn, plain(http.HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "too large"))
                        return
                elif isinstance(event, h11.Data):
                    body += event.data
                    if len(body) > MAX_BODY_BYTES:
                        await self._send(stream, conn, plain(http.HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "too large"))
                        return
                elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                    break
        if timer.cancelled_caught or request is None:
            if request is not None:
                await self._send(stream, conn, plain(http.HTTPStatus.REQUEST_TIMEOUT, "request timeout"))
            return
        target = request.target.decode("ascii", "replace")
        handler = self.routes.get(urlsplit(target).path)
        if handler is None:
            answer = plain(http.HTTPStatus.NOT_FOUND, "not found")
        elif request.method != b"POST":
            answer = plain(http.HTTPStatus.METHOD_NOT_ALLOWED, "POST only")
        else:
            headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in request.headers}
            try:
                answer = handler(target, headers, bytes(body))
                if inspect.isawaitable(answer):
                    answer = await answer
            except Exception:
                log.exception("POST %s failed", urlsplit(target).path)
                answer = plain(http.HTTPStatus.INTERNAL_SERVER_ERROR, "internal server error")
        await self._send(stream, conn, answer)

    @staticmethod
    async def _send(stream: anyio.abc.ByteStream, conn: h11.Connection, answer: HttpAnswer) -> None:
        headers = [
            ("Content-Type", answer.content_type),
            ("Content-Length", str(len(answer.body))),
            ("Connection", "close"),
            ("Cache-Control", "no-store"),
            ("Server", "live"),
        ]
        try:
            data = conn.send(h11.Response(status_code=answer.status, headers=headers))
            data += conn.send(h11.Data(data=answer.body)) + conn.send(h11.EndOfMessage())
        except h11.LocalProtocolError:  # the request was not readable: answer without h11's state
            phrase = http.HTTPStatus(answer.status).phrase
            head = f"HTTP/1.1 {answer.status} {phrase}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
            data = head.encode() + answer.body
        await stream.send(data)
