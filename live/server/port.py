"""The server's front door: one port, its HTTP routes, and the sockets it admits.

`LiveServer` answers HTTP (`/healthz`, `/livez`, `/metrics`, the browser client
at `/` and `/client/*`), checks every request's Host and every browser's Origin
before anything else, admits WebSocket connections within its limits, and gives
each to a `SessionRunner` (`live.server.runner`) with the front door (`live.doors`) its
path names: `/live` is the server's own JSON + PCM protocol. With a fleet
(`--redis`) it also finds the session a `session.resume` names, here, on another
server (relaying the socket there), or in the store (taking it over), and hands
its sessions to the fleet when it drains.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import http
import json
import logging
import math
import mimetypes
import socket
import ssl
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import anyio
from anyio.abc import TaskStatus
from google.genai import types
from websockets.asyncio.client import connect as ws_connect
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.http11 import Request, Response

from live.agent import Agent
from live.backends import BackendPool, Target
from live.access.addresses import AddressSet, address_key, forwarded_client, parse_ip
from live.server.attachment import bearer_token, peer_address
from live.access.auth import HostPolicy, host_name
from live.server.config import WS_QUEUE_FRAMES, ServerConfig
from live.protocol.closes import (
    CLOSE_GOING_AWAY,
    CLOSE_NORMAL,
    CLOSE_POLICY,
    CLOSE_SERVICE_RESTART,
    CLOSE_TRY_LATER,
)
from live.doors import FrontDoor, NativeDoor
from live.fleet.member import Fleet, TokenUses
from live.llm import BaseLlm
from live.observe.metrics import Metrics
from live.observe.watch import Measured, Recorded
from live.protocol import ErrorEvent, SessionResume, SessionStart, encode
from live.access.reattach import token_matches
from live.observe.record import Recorder
from live.server.backends import Backends
from live.server.detection import EndOfTurnChecks, VoiceDetection
from live.server.parking import ParkedSessions, park, say_going_away
from live.server.runner import SessionRunner
from live.fleet.store import StoreError
from live.net.loop import tune_gc_for_serving
from live.net.sockets import limit_messages, serve_with
from live.net.http_post import Handler
from live.server.posts import PortPosts

if TYPE_CHECKING:
    from live.net.websocket import Server, WebSocket

__all__ = ["LiveServer", "ServerConfig", "tls_context", "tune_gc_for_serving"]

log = logging.getLogger("live.server")

WEB_ROOT = Path(__file__).resolve().parents[2] / "clients" / "web"  # the checkout, or site-packages

_WILDCARD_HOSTS = ("0.0.0.0", "::", "")

# What the agent is told when its server stops with a call still on.
GOODBYE_INSTRUCTION = (
    "[This call has to end now: the service is restarting. Tell the caller, in one short sentence, "
    "that you have to go and that they can call back, and say goodbye.]"
)

# A front door for each WebSocket path: made per socket, from its handshake.
DoorFactory = Callable[[Request], FrontDoor]
DEFAULT_DOORS: Final[Mapping[str, DoorFactory]] = {"/live": NativeDoor}


class LiveServer:
    """Serves one agent to many clients on one port.

    `agent` is what it serves, `llm` the model its sessions talk to
    (`default_registry().resolve(agent.model)`, or any `BaseLlm`), `config` the
    limits it keeps (`ServerConfig()` when None), `metrics` where it counts,
    `fleet` its part in a fleet (`live serve --redis`; None: alone),
    `recorder` what records every session, `agent_spec` the agent's
    `MODULE:ATTR` (kept in records, for `live replay`), `clock` what every
    deadline reads, `doors` the WebSocket paths and their front doors (default:
    `/live`), `posts` POST routes served on the same port (carriers' webhooks,
    the Live API's `auth_tokens`: handlers as `live.net.http_post` takes them;
    None: the port reads GETs only). `serve()` listens until `stop()`; `url()`
    and `serving_line()` say where (docs/embedding.md).
    """

    def __init__(
        self,
        agent: Agent,
        llm: BaseLlm,
        config: ServerConfig | None = None,
        metrics: Metrics | None = None,
        fleet: Fleet | None = None,
        recorder: Recorder | None = None,
        agent_spec: str | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        doors: Mapping[str, DoorFactory] | None = None,
        pool: BackendPool | None = None,
        llm_at: Callable[[Target], BaseLlm] | None = None,
        posts: Mapping[str, Handler] | None = None,
    ) -> None:
        self.agent = agent
        # The WebSocket paths clients reach a session on, each with its front door.
        self.doors: dict[str, DoorFactory] = dict(DEFAULT_DOORS if doors is None else doors)
        aad = (agent.live_connect_config().realtime_input_config or types.RealtimeInputConfig())
        detection = aad.automatic_activity_detection
        # The agent itself turned the model's voice detection off: every session
        # marks turns with activity signals.
        self.agent_manual_activity = bool(detection is not None and detection.disabled)
        # The seconds every deadline of every session is measured in; the same
        # clock as anyio's sleeps (a test runs sessions in virtual time with
        # trio's MockClock and `trio.current_time`).
        self.clock = clock
        self.llm = llm
        self.config = config or ServerConfig()
        self.metrics = metrics if metrics is not None else Metrics()
        self.recorder = recorder
        self.agent_spec = agent_spec  # MODULE:ATTR, when known: a replay loads the agent from it
        # What the sessions use: the model, recorded when asked, and counted.
        def measured(inner: BaseLlm) -> BaseLlm:
            return Measured(Recorded(inner) if recorder else inner, self.metrics)

        self.measured_llm: BaseLlm = measured(llm)
        # Where sessions run: the agent's (or `pool`'s) backends, each target's
        # model from `llm_at`; without a pool, `llm` is the pool of one.
        pool = pool if pool is not None else agent.backends
        if pool is None:
            self.backends = Backends.single(agent.model, self.measured_llm, metrics=self.metrics)
        else:
            if llm_at is None:
                raise ValueError("a pool of backends needs llm_at: the model instance serving each target")
            self.backends = Backends.of_pool(
                pool, lambda target: measured(llm_at(target)), metrics=self.metrics, agent_model=agent.model
            )
        self._fleet: Fleet | None = None
        self.fleet = fleet
        self._draining = False
        self.sessions: set[SessionRunner] = set()
        # Started sessions a client may reattach to, by id.
        self.live_sessions: dict[str, SessionRunner] = {}
        # Sockets that have not sent session.start yet (in all and per address),
        # and sockets per address, by `address_key`.
        self.pending: set[SessionRunner] = set()
        self.pending_per_address: Counter[str] = Counter()
        self.per_address: Counter[str] = Counter()
        # Sessions counted against the limits, with the address they count under
        # (a reattaching socket hands its count back).
        # (None: a token's own limit counts it instead: `token_admitted`).
        self._counted: dict[SessionRunner, str | None] = {}
        # Sockets a door vouched for (a carrier's stream): not counted per address.
        self._uncounted: set[SessionRunner] = set()
        # The uses of each token: in this process, and in a fleet's store too.
        self.spent_tokens = TokenUses(lambda: self.fleet)
        # Sessions whose client left and may come back later (without a fleet).
        self.parked = ParkedSessions()
        self.trusted_proxies = AddressSet.parse(self.config.forwarded_allow_ips)
        # POST routes on this port (`live.server.posts`): None, GETs only.
        self.post_routes = None if posts is None else PortPosts(posts, self.trusted_proxies)
        self.metrics_readers = AddressSet.parse(self.config.metrics_allow_ips)
        self.port: int | None = None
        self.socket_layer: str | None = None  # the WebSocket layer it listens with, once serving
        self.metrics_port: int | None = None
        self._stop = anyio.Event()
        # The turn models every session that takes its own turns shares
        # (`turn_taking="server"`): run in the server's task group.
        self.voice_detection = VoiceDetection()
        self.end_of_turn = EndOfTurnChecks()
        self._turn_models: dict[bool, str | None] = {}

    def turn_models_missing(self, smart: bool) -> str | None:
        """Why this server cannot take turns itself (`smart`: with Smart Turn),
        or None when it can: their packages are installed, their files intact."""
        if smart not in self._turn_models:
            from live.engine.turns.models import SILERO, SMART_TURN, packaged_file
            from live.extras import MissingExtra, require

            try:
                require("turns", "turn_taking 'server'", "onnxruntime")
                for model in (SILERO, SMART_TURN) if smart else (SILERO,):
                    packaged_file(*model)
                self._turn_models[smart] = None
            except (MissingExtra, RuntimeError) as exc:
                self._turn_models[smart] = f"this server cannot take turns itself: {exc}"
        return self._turn_models[smart]

    @property
    def fleet(self) -> Fleet | None:
        """The fleet this server is part of (`--redis`), whose store also keeps
        the backends' breakers."""
        return self._fleet

    @fleet.setter
    def fleet(self, fleet: Fleet | None) -> None:
        self._fleet = fleet
        if fleet is not None:
            self.backends.share(fleet.store)

    # ------------------------------------------------------------------ HTTP

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

    def record_header(self, start: SessionStart) -> dict[str, Any]:
        """What a record says about its session: enough to replay it."""
        config = self.config
        return {
            "model": self.agent.model,
            "agent": self.agent.name,
            "agent_spec": self.agent_spec,
            "input_rate": start.input_rate,
            "config": {
                "audio_lead": config.audio_lead,
                "stall_timeout": config.stall_timeout,
                "idle_timeout": config.idle_timeout,
                "handover_margin": config.handover_margin,
            },
        }

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

    # ------------------------------------------------------------------ sockets

    def client_address(self, ws: WebSocket) -> str:
        """The client's address: the socket's peer, or behind a trusted proxy the
        client its `X-Forwarded-For` names (`live.access.addresses`)."""
        return self._client(ws)[0]

    def _client(self, ws: WebSocket) -> tuple[str, bool]:
        return self._forwarded(peer_address(ws), getattr(ws, "request", None))

    def _forwarded(self, peer: str, request: Request | None) -> tuple[str, bool]:
        """The client's address (`live.addresses.forwarded_client`): from a
        trusted proxy, the client its `X-Forwarded-For` names; without the
        header, or from any other peer, the peer itself."""
        forwarded = request.headers.get_all("X-Forwarded-For") if request is not None else []
        return forwarded_client(peer, forwarded, self.trusted_proxies)

    def _key(self, session: SessionRunner) -> str:
        """The address a socket counts under in the per-address limits."""
        ws = session.ws
        return address_key(self.client_address(ws)) if ws is not None else "?"

    def _count(self, session: SessionRunner) -> None:
        """Count a socket against the limits: in all, pending, and per address."""
        key = self._key(session)
        self.sessions.add(session)
        self.pending.add(session)
        self._counted[session] = key
        self.per_address[key] += 1
        self.pending_per_address[key] += 1

    def not_pending(self, session: SessionRunner) -> None:
        """A socket's opening was read (or it ended): it waits no more."""
        if session not in self.pending:
            return
        self.pending.discard(session)
        key = self._counted.get(session)
        if key is not None:
            _decrement(self.pending_per_address, key)

    def _release(self, session: SessionRunner) -> None:
        """Stop counting a socket's session; once, whoever asks first."""
        self.not_pending(session)
        self.sessions.discard(session)
        if session not in self._counted:
            return
        key = self._counted.pop(session)
        if session in self._uncounted:
            self._uncounted.discard(session)
        elif key is not None:
            _decrement(self.per_address, key)

    def token_admitted(self, session: SessionRunner) -> None:
        """A session opened with a signed token no longer counts against its
        client's address: the token, minted by the operator's backend for one
        session (or a few), is its limit. A server-side app (a bot server
        reaching the Live API endpoint for its callers) opens many sessions
        from one address."""
        key = self._counted.get(session)
        if key is None:
            return
        self._counted[session] = None
        _decrement(self.per_address, key)

    def vouched(self, session: SessionRunner) -> None:
        """A socket its door authorized as a carrier's stream for a real call:
        it stops counting against its address (a carrier's media server
        brings every call on it from the same few addresses)."""
        key = self._counted.get(session)
        if key is None or session in self._uncounted:
            return
        self._uncounted.add(session)
        _decrement(self.per_address, key)

    def call_refusal(self) -> str | None:
        """None while a new phone call would be taken, else why not: `draining`
        (the server is stopping) or `full`. Asked by the carriers' webhooks, so
        a caller hears a sentence (or a busy tone) rather than a stream refused."""
        if self._draining or self.stopping:
            return "draining"
        if len(self.sessions) >= self.config.max_sessions:
            return "full"
        return None

    async def drain_calls(self) -> None:
        """Stopping: phone calls cannot move to another server, and ending one
        hangs up on a person. No new session is taken; the calls on this
        server go on until they end, for `call_drain_timeout` at most; then
        the agent says goodbye to each caller still on (`goodbye_timeout` at
        most), and the call is hung up."""
        self._draining = True
        config = self.config
        calls = [s for s in self.sessions if s.door.capabilities.call and s.core is not None and s.end_reason is None]
        if not calls:
            return
        log.info("stopping: %d call(s) go on for up to %g s before a goodbye", len(calls), config.call_drain_timeout)
        with anyio.move_on_after(config.call_drain_timeout):
            while any(s in self.sessions for s in calls):
                await anyio.sleep(0.1)
        still = [s for s in calls if s in self.sessions and s.end_reason is None]
        if still:
            log.info("stopping: saying goodbye on %d call(s)", len(still))
        async with anyio.create_task_group() as tg:
            for session in still:
                tg.start_soon(session.say_goodbye, GOODBYE_INSTRUCTION, config.goodbye_timeout)

    def _unnamed_hint(self, session: SessionRunner) -> str:
        """For the log: a socket from a trusted proxy that named no client
        counts as the proxy's own address, with every other such client."""
        ws = session.ws
        if ws is None:
            return ""
        client, via_proxy = self._client(ws)
        if not via_proxy or client != peer_address(ws):
            return ""
        return (
            f" ({client} is a trusted proxy's address and the socket named no client: if it is a "
            "proxy, it must set X-Forwarded-For, or all its clients count as one)"
        )

    async def reattach(
        self, temporary: SessionRunner, message: SessionResume
    ) -> dict[str, Any] | None:
        """A socket asks to take over a live session: attach it here, relay it to
        the server of the fleet that holds it, or (its holder gone) return the
        session's stored facts for `temporary` to carry it on. None: handled.

        Authorized like a start when the server requires tokens (a valid token,
        for the subject that opened the session); the resume token works once:
        a new one goes with `session.reattached`."""
        ws = temporary.ws
        assert ws is not None
        refusal = await temporary.client.authorize(message.token, spend=False)
        if refusal is not None:
            log.warning(
                "resume of session %s refused from %s: unauthorized: %s",
                message.session_id[:40], temporary.peer, refusal,
            )
            temporary.finish(refusal, CLOSE_POLICY, ErrorEvent("unauthorized", refusal, True))
            return None
        session = self.live_sessions.get(message.session_id)
        if session is not None and session.end_reason is None and session.resume_digest:
            await self._reattach_here(temporary, message, session)
            return None
        if self.fleet is not None and not self.stopping:
            return await self._reattach_in_fleet(temporary, message)
        state = self.parked.get(message.session_id)
        if state is not None and not self.stopping:
            if not token_matches(message.resume_token, str(state.get("resume_digest") or "")) or not _same_principal(
                state.get("principal"), temporary.client.principal
            ):
                self._resume_unauthorized(temporary, message)
                return None
            self.parked.discard(message.session_id)
            return state
        self._resume_expired(temporary, message)
        return None

    async def _reattach_here(self, temporary: SessionRunner, message: SessionResume, session: SessionRunner) -> None:
        """Attach the socket to a session this server carries, with a new resume token."""
        ws = temporary.ws
        assert ws is not None
        if not token_matches(message.resume_token, session.resume_digest or "") or not _same_principal(
            session.client.principal, temporary.client.principal
        ):
            self._resume_unauthorized(temporary, message)
            return
        # Rotated before anything awaits: a second socket with the same token loses.
        resume_token = session.client.new_resume_token()
        fleet = self.fleet
        if fleet is not None and session.core is not None:
            # The new token's digest is in the store before the client holds the
            # token: if this server dies the moment after, the server taking the
            # session over accepts the new token, and the spent one nowhere.
            await fleet.save(session.id, session.durable_state())
            if session.end_reason is not None:  # it ended meanwhile
                self._resume_expired(temporary, message)
                return
        temporary.handed_off = True
        self._release(temporary)  # the conversation is counted once, as it was
        await session.client.attach(ws, message.last_seq, resume_token)
        await session.client.serve_socket(ws)

    async def park(self, session: SessionRunner, seconds: float) -> None:
        """Keep a session whose client left and may come back within `seconds`
        (`live.server.parking`): in the fleet's store, or here."""
        await park(session, seconds, self.fleet, self.parked)

    async def _reattach_in_fleet(
        self, temporary: SessionRunner, message: SessionResume
    ) -> dict[str, Any] | None:
        """Find the session in the fleet, waiting (for at most a lease and a beat)
        through what is only a moment: a holder that died but whose lease has not
        run out yet, a holder re-establishing its facts after Redis came back
        empty, Redis itself unreachable."""
        fleet = self.fleet
        assert fleet is not None
        ws = temporary.ws
        assert ws is not None
        session_id = message.session_id
        deadline = anyio.current_time() + fleet.lease_seconds * 4 / 3 + 0.5
        store_down = False
        while True:
            unreachable = False
            session = self.live_sessions.get(session_id)
            if session is not None and session.end_reason is None and session.resume_digest:
                # It was being taken over here (by another socket with the same
                # resume token): the token that took it over is spent now.
                await self._reattach_here(temporary, message, session)
                return None
            try:
                holder, address, state = await fleet.locate(session_id)
                store_down = False
            except StoreError:
                holder = address = state = None
                store_down = True
            if address is not None:
                temporary.handed_off = True
                if message.token is None:
                    # The holder checks the token again; one sent on this handshake
                    # would not reach it otherwise.
                    message = dataclasses.replace(message, token=bearer_token(ws))
                if await self._relay(ws, address, message):
                    return None
                temporary.handed_off = False  # the holder is gone: wait for its lease
                unreachable = True
            elif holder is None and state is not None:
                digest = state.get("resume_digest")
                if (
                    not digest
                    or not token_matches(message.resume_token, digest)
                    or not _same_principal(state.get("principal"), temporary.client.principal)
                ):
                    self._resume_unauthorized(temporary, message)
                    return None
                if state.get("agent") != self.agent.name:
                    break
                if await fleet.take_over(session_id):
                    return state
            if anyio.current_time() >= deadline:
                break
            pause = 0.1
            if unreachable:
                # Wake as its lease runs out, not up to a poll later: the takeover
                # is what the client waits for.
                with contextlib.suppress(StoreError):
                    pause = min(pause, await fleet.lease_left(session_id) + 0.005)
            await anyio.sleep(pause)
        if store_down:
            text = "the servers cannot reach their shared store now: reattach again shortly"
            log.info("resume of %s from %s deferred: store unavailable", session_id[:40], temporary.peer)
            temporary.finish(text, CLOSE_TRY_LATER, ErrorEvent("store_unavailable", text))
            return None
        self._resume_expired(temporary, message)
        return None

    def _resume_expired(self, temporary: SessionRunner, message: SessionResume) -> None:
        text = (
            f"no session {message.session_id[:40]!r} to resume here: it ended, or the "
            "client stayed away longer than the server waits"
        )
        log.info("resume refused from %s: session_expired", temporary.peer)
        temporary.finish(text, CLOSE_NORMAL, ErrorEvent("session_expired", text, True))

    def _durable_state(self, session_id: str) -> dict[str, Any] | None:
        """The facts of a session another server could carry on (one whose client
        can reattach); None for the others, which hold only a lease and a slot."""
        session = self.live_sessions.get(session_id)
        return None if session is None or session.core is None else session.durable_state()

    def _lost_to_fleet(self, session_id: str) -> None:
        """Another server holds this session now: stop driving it here at once;
        its client reattaches there (its facts are that server's now)."""
        session = self.live_sessions.get(session_id)
        if session is not None:
            session.let_go_to_fleet("another server of the fleet carries this session on")

    def _unsure_in_fleet(self, session_id: str) -> None:
        """This server could not renew its leases for most of a lease: a session
        whose client is away may be taken over elsewhere, so it ends here."""
        session = self.live_sessions.get(session_id)
        if session is not None and session.client.ws is None:
            session.let_go_to_fleet("its lease could not be renewed while its client was away")

    def _resume_unauthorized(self, temporary: SessionRunner, message: SessionResume) -> None:
        text = "session.resume: the resume token (or the token's subject) does not match this session"
        log.warning(
            "resume of session %s refused from %s: wrong token",
            message.session_id[:40], temporary.peer,
        )
        temporary.finish(text, CLOSE_POLICY, ErrorEvent("unauthorized", text, True))

    async def _relay(self, ws: WebSocket, address: str, message: SessionResume) -> bool:
        """Carry a client's socket to the server of the fleet that holds its session.

        False when that server cannot be reached (it died, its lease is still
        running): the socket is untouched, and the caller may wait to take over.
        """
        log.info("relaying a resume of session %s to %s", message.session_id[:40], address)
        try:
            # The client's address goes along: a holder that trusts this server
            # (--forwarded-allow-ips) counts the socket against the client, not us.
            headers = {"X-Forwarded-For": self.client_address(ws)}
            upstream = await ws_connect(
                address, max_size=None, compression=None, open_timeout=2, additional_headers=headers
            )
        except (OSError, TimeoutError, InvalidHandshake) as exc:
            log.info("relay to %s failed: %s", address, exc)
            return False
        # How the client left is how the holder hears it left: a goodbye (1000)
        # ends the session there, a drop keeps its reattach grace.
        client_close = CLOSE_GOING_AWAY
        try:
            await upstream.send(encode(message))

            async def pump(source: Any, sink: Any) -> None:
                nonlocal client_close
                try:
                    async for frame in source:
                        await sink.send(frame)
                except ConnectionClosed as closed:
                    if source is ws and closed.rcvd is not None and closed.rcvd.code == CLOSE_NORMAL:
                        client_close = CLOSE_NORMAL
                else:
                    if source is ws and getattr(ws, "close_code", None) == CLOSE_NORMAL:
                        client_close = CLOSE_NORMAL
                tg.cancel_scope.cancel()

            async with anyio.create_task_group() as tg:
                tg.start_soon(pump, ws, upstream)
                tg.start_soon(pump, upstream, ws)
        except (OSError, ConnectionClosed) as exc:
            log.warning("relay to %s broke: %s", address, exc)
        finally:
            with anyio.CancelScope(shield=True):
                await upstream.close(client_close)
        with contextlib.suppress(ConnectionClosed):
            await ws.close(CLOSE_SERVICE_RESTART, "reattach again")
        return True

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

    async def drain(self) -> None:
        """Stop taking sessions and hand every session to the fleet (or end it)."""
        self._draining = True
        timeout = self.config.drain_timeout
        async with anyio.create_task_group() as tg:
            for session in list(self.live_sessions.values()):
                tg.start_soon(session.hand_to_fleet, timeout)

    async def _refuse_socket(self, ws: WebSocket) -> None:
        await ws.close(CLOSE_POLICY, "this port serves /metrics only")

    def _admission(self, session: SessionRunner) -> ErrorEvent | None:
        """Why a new socket may not wait for `session.start`, if it may not."""
        config = self.config
        if self._draining:
            return ErrorEvent(
                "server_draining",
                "this server is stopping and takes no new sessions; try again (another server will)",
                True,
            )
        if len(self.sessions) >= config.max_sessions:
            return ErrorEvent(
                "capacity",
                f"the server is at its limit of {config.max_sessions} sessions; try again later",
                True,
            )
        if len(self.pending) >= config.max_pending:
            return ErrorEvent(
                "pending_limit",
                f"{config.max_pending} sockets are already waiting to start a session; "
                "try again later",
                True,
            )
        key = self._key(session)
        if self.pending_per_address[key] >= config.max_pending_per_ip:
            return ErrorEvent(
                "pending_limit",
                f"your address already has {config.max_pending_per_ip} sockets waiting to start "
                "a session (the server's limit per address); start one and try again",
                True,
            )
        if self.per_address[key] >= config.max_sessions_per_ip:
            return ErrorEvent(
                "address_limit",
                f"your address already has {config.max_sessions_per_ip} sessions open "
                "(the server's limit per address); close one and try again",
                True,
            )
        return None

    async def _handle(self, ws: WebSocket) -> None:
        request = getattr(ws, "request", None)
        path = route_path(request.path) if request is not None else "/live"
        session = SessionRunner(self, ws, self.doors[path](request))
        refusal = self._admission(session)
        if refusal is not None:
            log.warning(
                "refused a socket from %s: %s: %s%s", session.peer, refusal.code, refusal.message,
                self._unnamed_hint(session) if refusal.code in ("pending_limit", "address_limit") else "",
            )
            await session.client.send_now(refusal)
            await ws.close(CLOSE_TRY_LATER, refusal.code)
            session.obs.ended(refusal.code, refusal)
            return
        self._count(session)
        try:
            if self._stop.is_set():
                session.shutdown()
            await session.run()
        finally:
            self._release(session)

    async def serve(self, *, task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until `stop()`; then tell and close every session, and return.

        Runs under `anyio.run` or `asyncio.run` alike (asyncio's loop, or uvloop).
        """
        config = self.config
        self.socket_layer, serve = serve_with(config.sockets)
        async with serve(
            self._handle,
            config.host,
            config.port,
            ssl=tls_context(config.certfile, config.keyfile) if config.certfile else None,
            process_request=self._process_request,
            # Frames up to 2x the limit are read and refused with a clear error;
            # larger ones are cut off by the socket itself (also 1009); a door
            # with a limit of its own has its sockets cut off there.
            max_size=max(self._message_limit(door) for door in (NativeDoor, *self.doors.values())),
            max_queue=WS_QUEUE_FRAMES,
            server_header="live",
            # Browsers offer permessage-deflate; it is never accepted: PCM does
            # not compress, so it would only spend CPU on every audio frame.
            reuse_port=config.reuse_port or None,
            ping_interval=20,
            ping_timeout=20,
            post=self.post_routes.serve if self.post_routes is not None else None,
        ) as server, contextlib.AsyncExitStack() as stack:
            self.port = _bound_port(server)
            if config.metrics_port is not None:
                metrics_server = await stack.enter_async_context(
                    serve(
                        self._refuse_socket,
                        config.metrics_host,
                        config.metrics_port,
                        process_request=self._metrics_only,
                        server_header="live",
                        reuse_port=config.reuse_port or None,
                    )
                )
                self.metrics_port = _bound_port(metrics_server)
            task_status.started(self.port)
            if self.fleet is not None and not self.fleet.address:
                self.fleet.address = self.advertised_url()
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.voice_detection.run)
                tg.start_soon(self.end_of_turn.run)
                if self.fleet is not None:
                    tg.start_soon(
                        functools.partial(
                            self.fleet.run,
                            # Every session counted here, reattachable or not
                            # (a phone call's slot is renewed like any other).
                            lambda: [r.id for r in self.sessions if r.core is not None and not r.handed_off],
                            self._durable_state,
                            on_lost=self._lost_to_fleet,
                            on_unsure=self._unsure_in_fleet,
                        )
                    )
                await self._stop.wait()
                self._draining = True
                if self.fleet is not None:
                    await self.drain()
                for session in list(self.sessions):
                    if not session.door.capabilities.call or session.core is None:
                        session.shutdown()
                await self.drain_calls()
                if self.fleet is not None:
                    await self.fleet.retire()
                else:
                    await say_going_away(self.sessions, config.shutdown_grace)
                tg.cancel_scope.cancel()
            for session in list(self.sessions):
                session.shutdown()
            with anyio.move_on_after(config.shutdown_grace + 1):
                while self.sessions:
                    await anyio.sleep(0.02)
            server.close(close_connections=True)
            await server.wait_closed()

    def url(self, path: str = "/") -> str:
        """`path` on this server as this machine reaches it, once it serves.

        A wildcard bind (0.0.0.0, ::) is shown as loopback, a name the Host
        check always answers; other machines use a name in `allowed_hosts`.
        """
        host = self.config.host
        if host in _WILDCARD_HOSTS:
            host = "::1" if ":" in host else "127.0.0.1"
        shown = f"[{host}]" if ":" in host else host
        scheme = self.config.scheme
        if path.startswith("/live") or path in self.doors:
            scheme = "wss" if scheme == "https" else "ws"
        return f"{scheme}://{shown}:{self.port}{path}"

    def serving_line(self, processes: int = 1) -> str:
        """What `live serve` prints once the port listens: the agent, its model,
        the browser page and the WebSocket a client connects to."""
        count = f" in {processes} processes" if processes > 1 else ""
        return (
            f"live: serving agent {self.agent.name!r} (model {self.agent.model}){count} on "
            f"{self.url('/')}  (WebSocket {self.url('/live')})"
        )

    def advertised_url(self) -> str:
        """The WebSocket URL other servers of a fleet reach this one at."""
        host = self.config.host
        if host in _WILDCARD_HOSTS:
            host = socket.getfqdn()
        shown = f"[{host}]" if ":" in host else host
        scheme = "wss" if self.config.certfile else "ws"
        return f"{scheme}://{shown}:{self.port}/live"

    def stop(self) -> None:
        """End `serve()`: every session is told (`server_shutdown`) and closed."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    async def wait_stopping(self) -> None:
        await self._stop.wait()



def _decrement(counter: Counter[str], key: str) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]


def route_path(target: str) -> str:
    """The path a request target routes by: without its query, and with one
    leading slash (@google/genai dials `wss://host//ws/...` for a base URL
    without a path; read as a URL, `//ws` would be a host)."""
    return "/" + target.split("?", 1)[0].lstrip("/")


def _same_principal(session: str | None, resume: str | None) -> bool:
    """A session opened with a signed token resumes only for that token's subject."""
    return session is None or session == resume


def tls_context(certfile: str, keyfile: str | None = None) -> ssl.SSLContext:
    """A server-side TLS context (Python's defaults: TLS 1.2 or later, no weak ciphers)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certfile, keyfile)
    return context


def _bound_port(server: Server) -> int:
    for sock in server.sockets:
        return int(sock.getsockname()[1])
    raise RuntimeError("the server is not listening")


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
