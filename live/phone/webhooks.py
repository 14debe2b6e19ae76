"""The carriers' webhooks: what answers "a call came in; what now?".

The answer for Twilio is TwiML that connects the call to a bidirectional media
stream on this server, with a token for that one call (`live.phone.calls`).
Every request must carry the carrier's signature of itself: a request that
does not (a forged one, a replay to another URL) is refused with 403 and
nothing else is said.

`TwilioVoiceWebhook.answer` is the decision, without I/O. `WebhookListener`
is the HTTP it needs: carriers POST their webhooks with a form body, and
neither of the server's WebSocket layers reads a POST, so webhooks have a
small HTTP/1.1 listener of their own (h11), one request per connection,
bounded in size, time and count.
"""

from __future__ import annotations

import dataclasses
import http
import logging
import ssl
import inspect
from collections.abc import Awaitable, Callable, Mapping
from urllib.parse import parse_qsl, urlsplit

import anyio
import anyio.abc
import h11
from anyio.streams.tls import TLSListener

from live.phone.calls import CallTokens

__all__ = ["HttpAnswer", "TwilioVoiceWebhook", "WebhookListener", "stream_url_for"]

log = logging.getLogger("live.phone")

# A carrier's webhook is a form of a few dozen short fields: 64 KiB is plenty,
# and a body past it is refused before it is read further.
MAX_BODY_BYTES = 64 << 10
# Time for a whole request to arrive; a carrier sends it at once.
READ_TIMEOUT = 10.0
# Requests being read at once; more are answered 503 and closed.
MAX_CONNECTIONS = 64


@dataclasses.dataclass(frozen=True)
class HttpAnswer:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


# (target, headers with lower-case names, body) -> the answer, or an awaitable of it.
Handler = Callable[[str, Mapping[str, str], bytes], "HttpAnswer | Awaitable[HttpAnswer]"]


def _plain(status: http.HTTPStatus, text: str) -> HttpAnswer:
    return HttpAnswer(status.value, (text + "\n").encode())


def stream_url_for(public_url: str, path: str) -> str:
    """The wss:// URL of a media path, from the public https:// URL of the server."""
    parts = urlsplit(public_url)
    scheme = {"https": "wss", "http": "ws"}.get(parts.scheme, parts.scheme)
    return f"{scheme}://{parts.netloc}{path}"


class _Form(dict[str, str]):
    """A form's fields with every value of a repeated name (what the signature covers)."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        super().__init__(pairs)
        self._all: dict[str, list[str]] = {}
        for name, value in pairs:
            self._all.setdefault(name, []).append(value)

    def getlist(self, name: str) -> list[str]:
        return self._all.get(name, [])


class TwilioVoiceWebhook:
    """`POST /twilio/voice`: check Twilio's signature, answer `<Connect><Stream>` with a call token."""

    def __init__(self, auth_token: str, public_url: str, tokens: CallTokens, *, media_path: str = "/twilio/media") -> None:
        from twilio.request_validator import RequestValidator

        self._validator = RequestValidator(auth_token)
        self.public_url = public_url.rstrip("/")
        self.stream_url = stream_url_for(self.public_url, media_path)
        self.tokens = tokens

    def __repr__(self) -> str:  # never the auth token
        return f"TwilioVoiceWebhook(public_url={self.public_url!r})"

    def answer(self, target: str, headers: Mapping[str, str], body: bytes) -> HttpAnswer:
        signature = headers.get("x-twilio-signature")
        try:
            form = _Form(parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False))
        except UnicodeDecodeError:
            return _plain(http.HTTPStatus.BAD_REQUEST, "the form is not UTF-8")
        # Twilio signs the URL it was given, which is the public one (a tunnel's,
        # a proxy's), not the address this listener sees.
        url = self.public_url + target
        if not signature or not self._validator.validate(url, form, signature):
            log.warning("twilio webhook refused: %s for %s", "bad signature" if signature else "no signature", url[:200])
            return _plain(http.HTTPStatus.FORBIDDEN, "forbidden")
        call_sid = form.get("CallSid", "")
        if not call_sid:
            return _plain(http.HTTPStatus.BAD_REQUEST, "the webhook names no CallSid")
        from twilio.twiml.voice_response import Connect, VoiceResponse

        connect = Connect()
        stream = connect.stream(url=self.stream_url)
        stream.parameter(name="token", value=self.tokens.mint(call_sid))
        response = VoiceResponse()
        response.append(connect)
        log.info("twilio call %s (%s) connected to %s", call_sid[:40], form.get("Direction", "?")[:20], self.stream_url)
        return HttpAnswer(http.HTTPStatus.OK.value, str(response).encode(), "text/xml; charset=utf-8")


class WebhookListener:
    """A small HTTP/1.1 server for carriers' webhooks: POST routes, one request per connection."""

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

    async def _connection(self, stream: anyio.abc.ByteStream) -> None:
        async with stream:
            if self._open >= MAX_CONNECTIONS:
                await self._send(stream, h11.Connection(h11.SERVER), _plain(http.HTTPStatus.SERVICE_UNAVAILABLE, "busy"))
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
                except h11.RemoteProtocolError:
                    await self._send(stream, conn, _plain(http.HTTPStatus.BAD_REQUEST, "bad request"))
                    return
                if event is h11.NEED_DATA:
                    conn.receive_data(await stream.receive(16 << 10))
                    continue
                if isinstance(event, h11.Request):
                    request = event
                    length = dict(event.headers).get(b"content-length")
                    if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
                        await self._send(stream, conn, _plain(http.HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "too large"))
                        return
                elif isinstance(event, h11.Data):
                    body += event.data
                    if len(body) > MAX_BODY_BYTES:
                        await self._send(stream, conn, _plain(http.HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "too large"))
                        return
                elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                    break
        if timer.cancelled_caught or request is None:
            if request is not None:
                await self._send(stream, conn, _plain(http.HTTPStatus.REQUEST_TIMEOUT, "request timeout"))
            return
        target = request.target.decode("ascii", "replace")
        handler = self.routes.get(urlsplit(target).path)
        if handler is None:
            answer = _plain(http.HTTPStatus.NOT_FOUND, "not found")
        elif request.method != b"POST":
            answer = _plain(http.HTTPStatus.METHOD_NOT_ALLOWED, "POST only")
        else:
            headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in request.headers}
            try:
                answer = handler(target, headers, bytes(body))
                if inspect.isawaitable(answer):
                    answer = await answer
            except Exception:
                log.exception("webhook %s failed", urlsplit(target).path)
                answer = _plain(http.HTTPStatus.INTERNAL_SERVER_ERROR, "internal server error")
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
