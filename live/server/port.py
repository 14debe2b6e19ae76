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
import functools
import logging
import socket
import ssl
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import anyio
from anyio.abc import TaskStatus
from google.genai import types

from live.agent import Agent
from live.backends import BackendPool, Target
from live.access.addresses import AddressSet
from live.server.config import WS_QUEUE_FRAMES, ServerConfig
from live.protocol.closes import CLOSE_POLICY, CLOSE_TRY_LATER
from live.doors import NativeDoor
from live.fleet.member import Fleet, TokenUses
from live.llm import BaseLlm
from live.observe.metrics import Metrics
from live.observe.watch import Measured, Recorded
from live.protocol import SessionStart
from live.observe.record import Recorder
from live.server.backends import Backends
from live.server.detection import EndOfTurnChecks, VoiceDetection
from live.server.parking import ParkedSessions, say_going_away, told_going_away
from live.server.runner import SessionRunner
from live.net.loop import tune_gc_for_serving
from live.net.sockets import serve_with
from live.net.http_post import Handler
from live.server.posts import PortPosts
from live.server.admission import SessionAdmission
from live.server.draining import Draining
from live.server.http_routes import _WILDCARD_HOSTS, DoorFactory, HttpRoutes, route_path
from live.server.resumes import SessionResumes

if TYPE_CHECKING:
    from live.net.websocket import Server, WebSocket

__all__ = ["LiveServer", "ServerConfig", "tls_context", "tune_gc_for_serving"]

log = logging.getLogger("live.server")

# The WebSocket paths a server serves unless told otherwise, each with its front door.
DEFAULT_DOORS: Final[Mapping[str, DoorFactory]] = {"/live": NativeDoor}


class LiveServer(HttpRoutes, SessionAdmission, SessionResumes, Draining):
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

    Its jobs beside serving are mixins, each in a module of its own: the plain
    HTTP routes and the Host and Origin checks (`live.server.http_routes`), the
    admission limits and their counts (`live.server.admission`), where a
    `session.resume` goes (`live.server.resumes`), and draining
    (`live.server.draining`).
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
        turn_cpu = self.metrics.turn_taking_cpu
        self.voice_detection = VoiceDetection(on_cpu=turn_cpu.labels("voice_detection").inc)
        self.end_of_turn = EndOfTurnChecks(on_cpu=turn_cpu.labels("end_of_turn").inc)
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

    # ------------------------------------------------------------------ sockets

    async def _refuse_socket(self, ws: WebSocket) -> None:
        await ws.close(CLOSE_POLICY, "this port serves /metrics only")

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
                # Without a fleet to carry them on, the clients whose door has a
                # go-away of its own (a Live API app: the service's goAway before
                # it closes a connection) hear it first, and their sessions end
                # once what is in flight is done (within the drain's time).
                told = [] if self.fleet is not None else told_going_away(self.sessions)
                if self.fleet is not None:
                    await self.drain()
                for session in list(self.sessions):
                    if (not session.door.capabilities.call or session.core is None) and session not in told:
                        session.shutdown()
                async with anyio.create_task_group() as stopping:
                    stopping.start_soon(say_going_away, told, config.drain_timeout)
                    stopping.start_soon(self.drain_calls)
                if self.fleet is not None:
                    await self.fleet.retire()
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


def tls_context(certfile: str, keyfile: str | None = None) -> ssl.SSLContext:
    """A server-side TLS context (Python's defaults: TLS 1.2 or later, no weak ciphers)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certfile, keyfile)
    return context


def _bound_port(server: Server) -> int:
    for sock in server.sockets:
        return int(sock.getsockname()[1])
    raise RuntimeError("the server is not listening")
