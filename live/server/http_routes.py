"""The port's plain HTTP: the Host and Origin checks, and the routes that are not a session.

`LiveServer` (`live.server.port`) answers, through this mixin, every request
before a WebSocket handshake: the Host check first, then `/healthz` and
`/livez` (what a load balancer reads), `/metrics` (to this machine or the
addresses `--metrics-allow-ips` names), the browser client's page and files,
and the Origin check of a WebSocket path (which front door a path names).
"""

from __future__ import annotations

import functools
import http
import json
import logging
import math
import mimetypes
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from live.access.addresses import AddressSet, parse_ip
from live.access.auth import HostPolicy, host_name
from live.doors import FrontDoor
from live.net.sockets import limit_messages
from live.server.attachment import peer_address

if TYPE_CHECKING:
    from live.agent import Agent
    from live.fleet.member import Fleet
    from live.net.websocket import WebSocket
    from live.observe.metrics import Metrics
    from live.server.config import ServerConfig

__all__ = ["DoorFactory", "HttpRoutes", "WEB_ROOT", "route_path"]

log = logging.getLogger("live.server")

WEB_ROOT = Path(__file__).resolve().parents[2] / "clients" / "web"  # the checkout, or site-packages

_WILDCARD_HOSTS = ("0.0.0.0", "::", "")

# A front door for each WebSocket path: made per socket, from its handshake.
DoorFactory = Callable[[Request], FrontDoor]


class HttpRoutes:
    """The port's HTTP requests (a mixin of `LiveServer`)."""

    # What it uses of the server.
    agent: Agent
    config: ServerConfig
    metrics: Metrics
    fleet: Fleet | None
    doors: dict[str, DoorFactory]
    sessions: set[Any]
    metrics_readers: AddressSet
    _draining: bool

    if TYPE_CHECKING:

        def _forwarded(self, peer: str, request: Request | None) -> tuple[str, bool]: ...

    @functools.cached_property
    def host_policy(self) -> HostPolicy:
        config = self.config
        hosts = tuple(config.allowed_hosts)
        if self.fleet is not None and config.host in _WILDCARD_HOSTS:
            # Other servers of the fleet relay sockets here by the name it announces.
            hosts += (socket.getfqdn(),)
        return HostPolicy.for_bind(config.host, hosts, config.allowed_origins)

    def _refuse(
        self, request: Request, status: http.HTTPStatus, why: str, body: str
    ) -> Response:
        # The path without its query: a page may carry a token there (`/?token=...`),
        # and no token is ever logged.
        path = request.path.partition("?")[0].partition("#")[0]
        log.warning("refused HTTP request for %r: %s (%d)", path[:100], why, status.value)
        return _response(status, body.encode())

    @functools.cached_property
    def metrics_host_policy(self) -> HostPolicy:
        """The Host names `--metrics-port` answers to, as for the serving port."""
        return HostPolicy.for_bind(self.config.metrics_host, self.config.allowed_hosts)

    def _host(self, request: Request) -> str | Response:
        """The request's Host name, or the answer to a request without one good Host."""
        hosts = request.headers.get_all("Host")
        if len(hosts) != 1:
            why = "no Host header" if not hosts else f"{len(hosts)} Host headers"
            return self._refuse(request, http.HTTPStatus.BAD_REQUEST, why, f"bad request: {why}\n")
        host = host_name(hosts[0])
        if host is None:
            why = f"malformed Host header {hosts[0][:100]!r}"
            return self._refuse(request, http.HTTPStatus.BAD_REQUEST, why, f"bad request: {why}\n")
        return host

    def _metrics_for(self, connection: WebSocket, request: Request) -> Response:
        """`/metrics`, for a client on this machine or one `--metrics-allow-ips`
        names: by the client's address (behind a trusted proxy, the client it
        names, not the proxy's own loopback), never by the Host it names (which
        anyone can write)."""
        client, _ = self._forwarded(peer_address(connection), request)
        address = parse_ip(client)
        if address is None or not (address.is_loopback or address in self.metrics_readers):
            return self._refuse(
                request,
                http.HTTPStatus.FORBIDDEN,
                f"/metrics asked from {client[:60]}",
                "/metrics is served to this machine only (start the server with "
                "--metrics-allow-ips to name others)\n",
            )
        return self.metrics_response()

    def _process_request(self, connection: WebSocket, request: Request) -> Response | None:
        """Check the Host, then the Origin, then route; refusals come before anything else."""
        host = self._host(request)
        if isinstance(host, Response):
            return host
        path = route_path(request.path)
        policy = self.host_policy
        if not policy.host_allowed(host):
            if path in ("/healthz", "/livez"):
                # Probes address the server by whatever name or IP they have;
                # they learn whether to send sessions here, and nothing else.
                status = self.health() if path == "/healthz" else "alive"
                body = json.dumps({"status": status}).encode()
                return _response(_HEALTH_CODES.get(status, http.HTTPStatus.OK), body, "application/json")
            return self._refuse(
                request,
                http.HTTPStatus.FORBIDDEN,
                f"Host {host[:100]!r} not allowed",
                f"Host {host[:100]!r} is not allowed here (allowed: {policy.describe()}); "
                "if this is the server's name, start it with --allow-host NAME\n",
            )
        if path in self.doors:
            limit_messages(connection, self._message_limit(self.doors[path]))
            origins = request.headers.get_all("Origin")
            if len(origins) > 1:
                why = f"{len(origins)} Origin headers"
                return self._refuse(request, http.HTTPStatus.BAD_REQUEST, why, f"bad request: {why}\n")
            # A request without Origin is not from a browser page (browsers
            # always send it on WebSocket handshakes).
            if origins and not policy.origin_allowed(origins[0]):
                return self._refuse(
                    request,
                    http.HTTPStatus.FORBIDDEN,
                    f"Origin {origins[0][:100]!r} not allowed",
                    "Origin not allowed: start the server with --allow-origin for this page\n",
                )
            return None
        if path == "/healthz":
            status = self.health()
            body = {
                "status": status,
                "sessions": len(self.sessions),
                "max_sessions": self.config.max_sessions,
                "near_capacity_at": self.near_capacity_at,
                "model": self.agent.model,
                "agent": self.agent.name,
            }
            return _response(_HEALTH_CODES[status], json.dumps(body).encode(), "application/json")
        if path == "/livez":
            return _response(http.HTTPStatus.OK, b'{"status": "alive"}', "application/json")
        if path in ("/", "/index.html"):
            page = WEB_ROOT / "index.html"
            if page.is_file():
                return _response(http.HTTPStatus.OK, page.read_bytes(), "text/html; charset=utf-8")
            return _response(http.HTTPStatus.OK, _PLAIN_PAGE.encode(), "text/html; charset=utf-8")
        if path.startswith("/client/"):
            return self._static(path.removeprefix("/client/"))
        if path == "/metrics" and self.config.metrics_on_serving_port:
            return self._metrics_for(connection, request)
        return _response(http.HTTPStatus.NOT_FOUND, b"not found\n")

    def _message_limit(self, door: DoorFactory) -> int:
        """Where a door's sockets cut a client's message off (1009)."""
        return getattr(door, "max_message_bytes", None) or self.config.max_frame_bytes * 2

    def metrics_response(self) -> Response:
        body, content_type = self.metrics.exposition()
        return _response(http.HTTPStatus.OK, body, content_type)

    def _metrics_only(self, connection: WebSocket, request: Request) -> Response:
        """The `--metrics-port` listener: `/metrics` and nothing else, with the
        Host check of the serving port (for its own bind) and the peer check."""
        host = self._host(request)
        if isinstance(host, Response):
            return host
        policy = self.metrics_host_policy
        if not policy.host_allowed(host):
            return self._refuse(
                request,
                http.HTTPStatus.FORBIDDEN,
                f"Host {host[:100]!r} not allowed",
                f"Host {host[:100]!r} is not allowed here (allowed: {policy.describe()})\n",
            )
        if route_path(request.path) == "/metrics":
            return self._metrics_for(connection, request)
        return _response(http.HTTPStatus.NOT_FOUND, b"not found: this port serves /metrics\n")

    def _static(self, name: str) -> Response:
        """A file of the browser client, or 404 for any name that is not one
        (outside the folder, or no file name at all: a NUL, a name too long)."""
        root = WEB_ROOT.resolve()
        try:
            target = (root / name).resolve()
            if root not in target.parents or not target.is_file():
                return _response(http.HTTPStatus.NOT_FOUND, b"not found\n")
            body = target.read_bytes()
        except (OSError, ValueError):
            return _response(http.HTTPStatus.NOT_FOUND, b"not found\n")
        kind = "text/javascript" if target.suffix in (".js", ".mjs") else (
            mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        )
        return _response(http.HTTPStatus.OK, body, kind)

    @property
    def near_capacity_at(self) -> int:
        """The session count from which `/healthz` asks load balancers to route elsewhere."""
        config = self.config
        return max(1, min(config.max_sessions, math.ceil(config.max_sessions * config.near_capacity)))

    def health(self) -> str:
        """`ok`, or why new sessions should go elsewhere: `draining`, `full`, `near_capacity`.

        Only `ok` is HTTP 200 on `/healthz`: a load balancer stops sending new
        sessions to a process that is stopping or about to refuse them, while
        the sessions it holds go on. `/livez` is 200 whenever the process serves.
        """
        if self._draining:
            return "draining"
        count = len(self.sessions)
        if count >= self.config.max_sessions:
            return "full"
        if count >= self.near_capacity_at:
            return "near_capacity"
        return "ok"


def route_path(target: str) -> str:
    """The path a request target routes by: without its query, and with one
    leading slash (@google/genai dials `wss://host//ws/...` for a base URL
    without a path; read as a URL, `//ws` would be a host)."""
    return "/" + target.split("?", 1)[0].lstrip("/")


_HEALTH_CODES: Final = {
    "ok": http.HTTPStatus.OK,
    "alive": http.HTTPStatus.OK,
    "near_capacity": http.HTTPStatus.SERVICE_UNAVAILABLE,
    "full": http.HTTPStatus.SERVICE_UNAVAILABLE,
    "draining": http.HTTPStatus.SERVICE_UNAVAILABLE,
}


def _response(status: http.HTTPStatus, body: bytes, content_type: str = "text/plain; charset=utf-8") -> Response:
    headers = Headers(
        [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("Cache-Control", "no-store"),
            ("X-Content-Type-Options", "nosniff"),
        ]
    )
    return Response(status.value, status.phrase, headers, body)


_PLAIN_PAGE = """<!doctype html>
<meta charset="utf-8">
<title>live</title>
<h1>live session server</h1>
<p>Connect a WebSocket to <code>/live</code> and send
<code>{"type": "session.start"}</code>, then PCM16 audio as binary frames.
See docs/protocol.md, or run <code>live mic</code> from a terminal.</p>
"""
