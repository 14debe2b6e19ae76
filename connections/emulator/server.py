"""The emulator's I/O: a TLS WebSocket server driving one `EmulatorSession` per connection.

The SDK always dials `wss://` and verifies the certificate, so the server makes a
throwaway CA and a certificate for localhost/127.0.0.1/::1 at start and writes the
CA to a file for `SSL_CERT_FILE` (or `ssl_context()` for in-code use).

Each connection runs its reader and a timer task in one task group (see
`_Connection`); when either ends, both end, so nothing outlives the connection.
Sends are awaited, so a client that stops reading slows the session down
instead of growing memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import json
import logging
import os
import ssl
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import anyio
import trustme
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from connections.emulator.core import (
    CloseConnection,
    DropConnection,
    EmulatorSession,
    Handshake,
    SendMessage,
    SessionRecord,
    Settings,
    Shared,
    route,
)
from connections.emulator.faults import Outage
from connections.emulator.script import Script
from connections.emulator.wire import QUOTA_HTTP_BODY, api_key_of
from live.liveapi import UNAVAILABLE

__all__ = ["DEV_API_KEY", "Emulator", "running_emulator"]

log = logging.getLogger(__name__)

DEV_API_KEY = "emulator-dev-key"
"""A key to use with the emulator when any key will do (it accepts any non-empty
key unless started with a specific one)."""

MAX_FRAME_BYTES = 4 * 1024 * 1024
_QUEUE = 64


class Emulator:
    """A running emulator: where it listens, what it trusts, what it heard.

    `script` may be replaced or edited at any time; a connection uses the script
    that was current when it opened. `sessions` holds one `SessionRecord` per
    connection, in the order they were accepted. `session_class` makes each
    connection's protocol state (a load script passes a subclass of
    `EmulatorSession`).
    """

    def __init__(
        self,
        *,
        script: Script | None = None,
        settings: Settings | None = None,
        host: str = "127.0.0.1",
        session_class: Callable[..., EmulatorSession] = EmulatorSession,
    ) -> None:
        self.script = script or Script()
        self.session_class = session_class
        self.settings = settings or Settings()
        self.host = host
        self.port = 0
        self.sessions: list[SessionRecord] = []
        self.ca_file = ""
        self._shared = Shared()
        self._ca = trustme.CA()
        self._server: Server | None = None
        self._open: set[ServerConnection] = set()

    def forget_handles(self) -> None:
        """Refuse every resumption handle issued so far, as the service does
        once a session's state is gone (expired, or lost on its side)."""
        self._shared.store.forget_all()

    # -- a backend's bad day -----------------------------------------------------

    @property
    def outage(self) -> Outage:
        """What this backend cannot do now (`Outage`): change it at any time,
        e.g. `emulator.outage.exhausted_keys.add(key)`."""
        return self._shared.outage

    async def go_down(self, how: str = "refuse") -> None:
        """The backend goes down until `come_back()`: `"refuse"` stops listening
        (connects are refused) and drops every open connection; `"unavailable"`
        closes them with 1011 and answers every setup so."""
        if how not in ("refuse", "unavailable"):
            raise ValueError(f"how is 'refuse' or 'unavailable', not {how!r}")
        self.outage.down = how  # type: ignore[assignment]
        for ws in list(self._open):
            if how == "refuse":
                ws.transport.abort()
            else:
                await ws.close(1011, UNAVAILABLE)
        if how == "refuse" and self._server is not None:
            server, self._server = self._server, None
            server.close(close_connections=False)
            await server.wait_closed()

    async def come_back(self) -> None:
        """Serve again, on the same port, after `go_down()`."""
        self.outage.down = None
        if self._server is None and self.port:
            self._server = await self._listen(self.port)

    # -- addresses and trust --------------------------------------------------

    @property
    def base_url(self) -> str:
        """What to give the SDK as base URL (it turns https into wss itself)."""
        host = "127.0.0.1" if self.host in ("", "0.0.0.0") else self.host
        if host == "::":
            host = "::1"
        if ":" in host:
            host = f"[{host}]"
        return f"https://{host}:{self.port}"

    @property
    def api_key(self) -> str:
        """A key this emulator accepts."""
        return self.settings.api_key or DEV_API_KEY

    def ssl_context(self) -> ssl.SSLContext:
        """A client context that trusts this emulator's certificate."""
        ctx = ssl.create_default_context()
        self._ca.configure_trust(ctx)
        return ctx

    def ws_url(self, api_version: str = "v1beta", *, constrained: bool = False) -> str:
        """The full WebSocket URL of the Live method (for raw WebSocket clients)."""
        method = "BidiGenerateContentConstrained" if constrained else "BidiGenerateContent"
        base = self.base_url.replace("https://", "wss://", 1)
        return f"{base}/ws/google.ai.generativelanguage.{api_version}.GenerativeService.{method}"

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of a process (`live serve`, a script) that talks to this
        emulator through the SDK: `base` (default: this process's) with the key,
        base URL and trusted certificate set, and loopback kept off any proxy."""
        env = dict(os.environ if base is None else base)
        env.pop("GEMINI_API_KEY", None)  # the SDK would prefer it to GOOGLE_API_KEY
        no_proxy = env.get("NO_PROXY")
        env.update(
            GOOGLE_API_KEY=self.api_key,
            GOOGLE_GEMINI_BASE_URL=self.base_url,
            SSL_CERT_FILE=str(self.ca_file),
            NO_PROXY="127.0.0.1,localhost" + (f",{no_proxy}" if no_proxy else ""),
        )
        return env

    @property
    def exports(self) -> str:
        """Shell lines that point the SDK at this emulator."""
        return (
            f"export GOOGLE_GEMINI_BASE_URL={self.base_url}\n"
            f"export SSL_CERT_FILE={self.ca_file}"
        )

    def _server_ssl(self) -> ssl.SSLContext:
        names = ["localhost", "127.0.0.1", "::1"]
        if self.host not in names and self.host not in ("", "0.0.0.0", "::"):
            names.append(self.host)
        cert = self._ca.issue_cert(*names)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        cert.configure_cert(ctx)
        return ctx

    # -- serving ----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def serving(self, port: int = 0) -> AsyncIterator[Emulator]:
        """Listen on `port` (0: a free one) until the context exits."""
        with tempfile.TemporaryDirectory(prefix="live-emulator-") as tmp:
            self.ca_file = os.path.join(tmp, "ca.pem")
            self._ca.cert_pem.write_to_path(self.ca_file)
            self._server = server = await self._listen(port)
            self.port = next(iter(server.sockets)).getsockname()[1]
            try:
                yield self
            finally:
                # Whichever listener serves now (a backend that came back has a new one).
                server, self._server = self._server, None  # type: ignore[assignment]
                if server is not None:
                    server.close()
                    await server.wait_closed()

    async def _listen(self, port: int) -> Server:
        return await serve(
            self._handle,
            self.host,
            port,
            ssl=self._server_ssl(),
            max_size=MAX_FRAME_BYTES,
            max_queue=_QUEUE,
            process_request=self._check_path,
            ping_interval=None,
        )

    def _check_path(self, connection: ServerConnection, request: Request) -> Response | None:
        if route(request.path) is None:
            return _json_response(http.HTTPStatus.NOT_FOUND, {"error": {"code": 404, "message": "Not found.", "status": "NOT_FOUND"}})
        handshake = Handshake(request.path, dict(request.headers.raw_items()))
        if self.outage.quota_gone(api_key_of(handshake)):
            return _json_response(http.HTTPStatus.TOO_MANY_REQUESTS, QUOTA_HTTP_BODY)
        return None

    async def _handle(self, ws: ServerConnection) -> None:
        request = ws.request
        assert request is not None
        index = len(self.sessions)
        session = self.session_class(
            Handshake(request.path, dict(request.headers.raw_items())),
            script=self.script,
            settings=self.settings,
            shared=self._shared,
            index=index,
            now=anyio.current_time(),
        )
        self.sessions.append(session.record)
        self._open.add(ws)
        try:
            await _Connection(ws, session).run()
        finally:
            self._open.discard(ws)
            session.connection_lost(None)


class _Connection:
    """One connection's I/O: frames and time into its session, actions out, in order.

    The reader hands each frame to the session and carries out what it asks;
    a timer task runs what falls due while no frame comes. One lock keeps the
    actions of both in the order the session made them. A send waits while the
    client does not read, and so does the reading: a client that stops reading
    slows its session down instead of growing memory.
    """

    def __init__(self, ws: ServerConnection, session: EmulatorSession) -> None:
        self.ws = ws
        self.session = session
        # websockets' server is asyncio's: its lock takes a free lock without a
        # checkpoint, and its clock is anyio's.
        self._lock = asyncio.Lock()
        self._now = asyncio.get_running_loop().time
        self._rescheduled = anyio.Event()
        self._timer_at: float | None = None  # the deadline the timer task sleeps to

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._clock, tg.cancel_scope)
            await self._read()
            tg.cancel_scope.cancel()

    async def _read(self) -> None:
        ws, session, now = self.ws, self.session, self._now
        try:
            async for frame in ws:
                async with self._lock:
                    if await _act(ws, session.receive(frame, now())):
                        return
                    if await _act(ws, session.poll(now())):
                        return
                deadline = session.next_deadline()
                if deadline is not None and (self._timer_at is None or deadline < self._timer_at):
                    self._rescheduled.set()  # sooner than the timer task sleeps to
            session.connection_lost(ws.close_code, ws.close_reason or "")
        except ConnectionClosed as exc:
            rcvd = exc.rcvd
            session.connection_lost(rcvd.code if rcvd else None, rcvd.reason if rcvd else "")

    async def _clock(self, scope: anyio.CancelScope) -> None:
        session = self.session
        while True:
            async with self._lock:
                if await _act(self.ws, session.poll(self._now())):
                    scope.cancel()
                    return
            self._timer_at = deadline = session.next_deadline()
            self._rescheduled = anyio.Event()
            timeout = None if deadline is None else max(0.0, deadline - self._now())
            with anyio.move_on_after(timeout):
                await self._rescheduled.wait()


def _json_response(status: http.HTTPStatus, payload: dict[str, Any]) -> Response:
    body = json.dumps(payload).encode()
    headers = Headers([("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return Response(status, status.phrase, headers, body)


async def _act(ws: ServerConnection, actions: list[Any]) -> bool:
    """Carry out actions; True when the connection is over."""
    for action in actions:
        if isinstance(action, SendMessage):
            try:
                await ws.send(json.dumps(action.payload, separators=(",", ":")))
            except ConnectionClosed:
                return True
        elif isinstance(action, CloseConnection):
            await ws.close(action.code, action.reason)
            return True
        elif isinstance(action, DropConnection):
            ws.transport.abort()
            return True
    return False


@contextlib.asynccontextmanager
async def running_emulator(
    script: Script | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
    settings: Settings | None = None,
) -> AsyncIterator[Emulator]:
    """Run an emulator in this event loop on `port` (0: a free port).

    `api_key` restricts the accepted key (None: any non-empty key).
    """
    settings = settings or Settings()
    if api_key is not None:
        settings.api_key = api_key
    emulator = Emulator(script=script, settings=settings, host=host)
    async with emulator.serving(port) as running:
        yield running
