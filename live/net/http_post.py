"""The HTTP POST routes beside the WebSocket port: carriers' webhooks, the Live API's `auth_tokens`.

Neither of the server's WebSocket layers reads a request other than a GET
upgrade, and some callers must POST: a carrier telling the server a call came
in, an app's backend minting a token with google-genai's
`client.auth_tokens.create`. `PostListener` is the little HTTP/1.1 they need
(h11, read by `live.net.http_request`), on a port of its own (`serve`) or on
the connections the WebSocket port hands it (`handle`, `live.server.posts`):
POST routes only, one request per connection, bounded in size, time and count. A route's
handler is a plain function of (target, headers, body) to an `HttpAnswer`:
the decision without I/O.

Anyone can reach the port before any key or signature is checked, so nothing
a connection sends ends more than that connection: its request is read (and,
on TLS, its handshake made) within one deadline; connections are bounded in
all and per address (an IPv6 client by its /64), and one over a bound is
refused at once; refusals are logged once per burst, failed handshakes at
DEBUG.
"""

from __future__ import annotations

import dataclasses
import errno
import http
import inspect
import logging
import ssl
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping

import anyio
import anyio.abc
from anyio.streams.tls import TLSStream

from live.net.http_request import MAX_BODY_BYTES, HttpAnswer, PostRequest, RequestReader, answer_bytes, plain

__all__ = ["MAX_BODY_BYTES", "Handler", "HttpAnswer", "PostListener", "plain"]

log = logging.getLogger("live.http")

# Time for a whole request to arrive, the TLS handshake included; a caller sends it at once.
READ_TIMEOUT = 10.0
# Time for the answer to leave (a few hundred bytes: the kernel takes them at once
# unless the peer stopped reading altogether).
WRITE_TIMEOUT = 10.0
# Connections being served at once; more are refused (503) and closed.
MAX_CONNECTIONS = 64
# Connections from one address (an IPv6 client: its /64) at once; more are
# refused (429): one address cannot hold the whole port.
MAX_PER_ADDRESS = 8
# A burst of refusals ends after this long without one (its count is then logged).
BURST_QUIET = 5.0
RECEIVE_BYTES = 16 << 10
# What a connection can end with on its own: the peer left, reset, or spoke bad TLS.
_GONE = (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)
# accept() failing for want of resources: the listener waits a moment and goes on.
_ACCEPT_PAUSE = 0.1


# (target, headers with lower-case names, body) -> the answer, or an awaitable of it.
Handler = Callable[[str, Mapping[str, str], bytes], "HttpAnswer | Awaitable[HttpAnswer]"]


@dataclasses.dataclass
class _Burst:
    """Refusals for one reason (the port full, or one address at its bound) close together."""

    started: float
    last: float
    what: str  # what was refused, for the line that ends the burst
    count: int = 0


class PostListener:
    """A small HTTP/1.1 server: POST routes, one request per connection."""

    def __init__(
        self, routes: Mapping[str, Handler], host: str, port: int, *,
        ssl_context: ssl.SSLContext | None = None, reuse_port: bool = False,
        client_key: Callable[[str], str] | None = None,
    ) -> None:
        """`client_key`: what the per-address bound counts a peer's address under
        (`live serve` passes `live.access.addresses.address_key`: an IPv6 client
        by its /64); by default the address itself."""
        self.routes = dict(routes)
        self.client_key = client_key or str
        self.reuse_port = reuse_port
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self.bound_port: int | None = None
        self._open = 0
        self._per_address: Counter[str] = Counter()
        self._bursts: dict[str, _Burst] = {}  # by reason: "full", "accept", or the address key

    async def serve(self, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled; every connection's task is owned by this call's task group."""
        listener = await anyio.create_tcp_listener(
            local_host=self.host, local_port=self.port, reuse_port=self.reuse_port
        )
        self.bound_port = int(listener.extra(anyio.abc.SocketAttribute.local_port))
        task_status.started(self.bound_port)
        async with listener, anyio.create_task_group() as tg:
            for each in listener.listeners:
                tg.start_soon(self._accept, each, tg)
            tg.start_soon(self._end_bursts)

    async def _accept(self, listener: anyio.abc.Listener[anyio.abc.SocketStream], tg: anyio.abc.TaskGroup) -> None:
        """Accept connections, each in a task of its own; a failed accept (a peer that
        reset while queued, no file descriptors left) is waited out, never the end."""
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._refused("accept", f"accept() failed ({errno.errorcode.get(exc.errno or 0, exc.errno)}): waiting", "accept() failure(s)")
                    await anyio.sleep(_ACCEPT_PAUSE)
                continue
            tg.start_soon(self._connection, stream)

    async def handle(self, stream: anyio.abc.ByteStream) -> None:
        """One connection another listener handed over from its first byte (the
        WebSocket port's POSTs, `live.server.posts`): held to this port's bounds."""
        await self._connection(stream)

    async def _connection(self, stream: anyio.abc.SocketStream) -> None:
        try:
            async with stream:
                peer = _peer(stream)
                key = self.client_key(peer)
                refusal = self._admit(key)
                if refusal is not None:
                    if self.ssl_context is None:  # a TLS client could not read a plain answer
                        with anyio.move_on_after(1):
                            await stream.send(answer_bytes(refusal))
                    return
                try:
                    await self._serve_one(stream, peer)
                finally:
                    self._leave(key)
        except _GONE:
            pass  # the peer left or broke the connection: nothing more to say to it
        except Exception:  # a fault of this server's: that connection ends, the port goes on
            log.exception("POST port: a connection failed")

    def _admit(self, key: str) -> HttpAnswer | None:
        """Count a connection in, or say why it is refused."""
        if self._open >= MAX_CONNECTIONS:
            self._refused("full", f"{MAX_CONNECTIONS} connections open, its limit: refusing more (503)", "connection(s) refused while full")
            return plain(http.HTTPStatus.SERVICE_UNAVAILABLE, "busy: try again shortly")
        if self._per_address[key] >= MAX_PER_ADDRESS:
            self._refused(
                key, f"{key} has {MAX_PER_ADDRESS} connections open, the limit per address: refusing more (429)",
                f"connection(s) from {key} refused",
            )
            return plain(http.HTTPStatus.TOO_MANY_REQUESTS, "too many connections from your address: try again shortly")
        self._open += 1
        self._per_address[key] += 1
        return None

    def _leave(self, key: str) -> None:
        self._open -= 1
        self._per_address[key] -= 1
        if self._per_address[key] <= 0:
            del self._per_address[key]

    def _refused(self, key: str, why: str, what: str) -> None:
        """A refusal: the first of a burst is logged, the rest counted (`_end_bursts`)."""
        now = anyio.current_time()
        burst = self._bursts.get(key)
        if burst is None:
            burst = self._bursts[key] = _Burst(started=now, last=now, what=what)
            log.warning("POST port: %s", why)
        burst.count += 1
        burst.last = now

    async def _end_bursts(self) -> None:
        """Log each burst of refusals once it is over: how many, over how long."""
        while True:
            await anyio.sleep(1)
            now = anyio.current_time()
            for key, burst in list(self._bursts.items()):
                if now - burst.last >= BURST_QUIET:
                    del self._bursts[key]
                    log.warning("POST port: %d %s over %.0f s", burst.count, burst.what, burst.last - burst.started)

    async def _serve_one(self, stream: anyio.abc.ByteStream, peer: str) -> None:
        reader = RequestReader(max_body_bytes=MAX_BODY_BYTES)
        outcome: PostRequest | HttpAnswer | None = None
        with anyio.move_on_after(READ_TIMEOUT):
            if self.ssl_context is not None:
                try:
                    stream = await TLSStream.wrap(stream, server_side=True, ssl_context=self.ssl_context, standard_compatible=False)
                except _GONE as exc:
                    log.debug("POST port: TLS handshake with %s failed: %s", peer, exc)
                    return
            while outcome is None:
                try:
                    data = await stream.receive(RECEIVE_BYTES)
                except anyio.EndOfStream:
                    data = b""
                outcome = reader.feed(data)
        if outcome is None:
            if not reader.started:
                return  # nothing was asked: nothing to answer
            outcome = plain(http.HTTPStatus.REQUEST_TIMEOUT, "request timeout")
        answer = outcome if isinstance(outcome, HttpAnswer) else await self._route(outcome)
        with anyio.move_on_after(WRITE_TIMEOUT):
            await stream.send(reader.respond(answer))

    async def _route(self, request: PostRequest) -> HttpAnswer:
        handler = self.routes.get(request.path)
        if handler is None:
            return plain(http.HTTPStatus.NOT_FOUND, "not found")
        if request.method != "POST":
            return plain(http.HTTPStatus.METHOD_NOT_ALLOWED, "POST only")
        try:
            answer = handler(request.target, request.headers, request.body)
            if inspect.isawaitable(answer):
                answer = await answer
        except Exception:
            log.exception("POST %s failed", request.path)
            return plain(http.HTTPStatus.INTERNAL_SERVER_ERROR, "internal server error")
        return answer


def _peer(stream: anyio.abc.SocketStream) -> str:
    """The peer's address ("?" when the socket cannot say)."""
    try:
        address = stream.extra(anyio.abc.SocketAttribute.remote_address)
    except (anyio.TypedAttributeLookupError, OSError):
        return "?"
    return str(address[0]) if isinstance(address, tuple) else str(address)
