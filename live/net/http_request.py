"""One HTTP/1.1 request read from bytes, or the status that refuses it (sans-I/O).

The POST listener (`live.net.http_post`) hands a `RequestReader` whatever its
socket reads; the reader answers with the whole request once it has it, with
the answer that refuses it (a status and a word, never a traceback), or with
None while it needs more. Anything h11 lets through is read here without
trusting it: a request target is taken in origin form (`/path?query`) or
absolute form (`http://host/path`) and refused with 400 otherwise (h11
accepts `http://[`, which no URL parser reads); headers past 16 KiB are 431,
a body past its bound 413. `answer_bytes` writes an answer without h11's
state, for a connection refused before it was read.
"""

from __future__ import annotations

import dataclasses
import http
import re
from collections.abc import Mapping
from urllib.parse import urlsplit

import h11

__all__ = ["MAX_BODY_BYTES", "MAX_HEAD_BYTES", "HttpAnswer", "PostRequest", "RequestReader", "answer_bytes", "plain"]

# The request line and headers together; past it, 431.
MAX_HEAD_BYTES = 16 << 10
# A carrier's webhook is a form of a few dozen short fields, a token request
# one setup: 64 KiB is plenty, and a body past it is refused before it is read further.
MAX_BODY_BYTES = 64 << 10
# The statuses h11's hints may name; any other hint is answered 400.
_HINTED = frozenset({400, 413, 414, 431, 501, 505})
_ABSOLUTE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


@dataclasses.dataclass(frozen=True)
class HttpAnswer:
    """What a route answers: status, body, its type."""

    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


def plain(status: http.HTTPStatus, text: str) -> HttpAnswer:
    return HttpAnswer(status.value, (text + "\n").encode())


@dataclasses.dataclass(frozen=True)
class PostRequest:
    """A whole request: `target` in origin form (the path and its query, as sent),
    `headers` with lower-case names, a repeated field's values joined by ", "
    (RFC 9110, 5.3: what the field means as one)."""

    method: str
    target: str
    path: str
    headers: Mapping[str, str]
    body: bytes


def origin_form(target: bytes) -> str | None:
    """A request target as `/path?query`, or None for one that is not a path
    (authority or asterisk form, or an absolute URL no parser reads)."""
    text = target.decode("ascii", "replace")
    if text.startswith("/"):
        return text
    if not _ABSOLUTE.match(text):
        return None
    try:
        parts = urlsplit(text)
    except ValueError:  # `http://[`: a host that never closes
        return None
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


class RequestReader:
    """Reads one request from a connection's bytes (see the module's docstring)."""

    def __init__(self, *, max_head_bytes: int = MAX_HEAD_BYTES, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        # h11 bounds a head that has not ended yet; one that arrived whole is measured here.
        self._conn = h11.Connection(h11.SERVER, max_incomplete_event_size=max_head_bytes)
        self._max_head = max_head_bytes
        self._max_body = max_body_bytes
        self._request: h11.Request | None = None
        self._body = bytearray()
        self.started = False  # bytes of a request arrived

    def feed(self, data: bytes) -> PostRequest | HttpAnswer | None:
        """Bytes read (b"": the peer closed its side): the request, the answer
        that refuses it, or None until more arrives."""
        self.started = self.started or bool(data)
        try:
            self._conn.receive_data(data)
            while True:
                event = self._conn.next_event()
                if event is h11.NEED_DATA:
                    return None
                if isinstance(event, h11.Request):
                    refusal = self._head(event)
                    if refusal is not None:
                        return refusal
                elif isinstance(event, h11.Data):
                    self._body += event.data
                    if len(self._body) > self._max_body:
                        return plain(http.HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "too large")
                elif isinstance(event, h11.EndOfMessage):
                    return self._whole()
                else:  # ConnectionClosed before a request, or PAUSED: nothing more is read
                    return plain(http.HTTPStatus.BAD_REQUEST, "bad request: no request")
        except h11.RemoteProtocolError as exc:
            status = exc.error_status_hint if exc.error_status_hint in _HINTED else 400
            if status == http.HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE:
                return plain(http.HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request header fields too large")
            return plain(http.HTTPStatus(status), "bad request")

    def _head(self, request: h11.Request) -> HttpAnswer | None:
        self._request = request
        head = len(request.method) + len(request.target) + sum(len(n) + len(v) + 4 for n, v in request.headers)
        if head > self._max_head:
            return plain(http.HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request header fields too large")
        if origin_form(request.target) is None:
            return plain(http.HTTPStatus.BAD_REQUEST, "bad request: the target is not a path")
        lengths = [value for name, value in request.headers if name == b"content-length"]
        if lengths and int(lengths[0]) > self._max_body:  # h11 checked they are one number
            return plain(http.HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "too large")
        return None

    def _whole(self) -> PostRequest:
        request = self._request
        assert request is not None
        target = origin_form(request.target)
        assert target is not None
        headers: dict[str, str] = {}
        for name, value in request.headers:
            key, text = name.decode("latin-1"), value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        return PostRequest(
            method=request.method.decode("ascii", "replace"),
            target=target,
            path=target.partition("?")[0],
            headers=headers,
            body=bytes(self._body),
        )

    def respond(self, answer: HttpAnswer) -> bytes:
        """The bytes that answer this connection's request (one answer, then it closes)."""
        try:
            data = self._conn.send(h11.Response(status_code=answer.status, headers=_headers(answer)))
            assert data is not None
            return data + (self._conn.send(h11.Data(data=answer.body)) or b"") + (self._conn.send(h11.EndOfMessage()) or b"")
        except h11.LocalProtocolError:  # the request was not readable: answer without h11's state
            return answer_bytes(answer)


def answer_bytes(answer: HttpAnswer) -> bytes:
    """An answer's bytes, whatever was read (or not) before it."""
    phrase = http.HTTPStatus(answer.status).phrase
    head = f"HTTP/1.1 {answer.status} {phrase}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in _headers(answer)) + "\r\n"
    return head.encode() + answer.body


def _headers(answer: HttpAnswer) -> list[tuple[str, str]]:
    return [
        ("Content-Type", answer.content_type),
        ("Content-Length", str(len(answer.body))),
        ("Connection", "close"),
        ("Cache-Control", "no-store"),
        ("Server", "live"),
    ]
