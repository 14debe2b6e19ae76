"""The session server: HTTP routes, checks and limits, and the pumps of each session.

One client socket drives a sequence of model connections (a new one replaces the
old on go-away, a drop or a stall). The rules of a conversation live in
`live.session.SessionCore`; this module moves bytes between the socket, the core
and the model, and owns every task it starts: each session runs in one anyio task
group, and nothing it started outlives it.

Routes on one port: `/live` (the session WebSocket), `/healthz`, `/` (the browser
client) and `/client/*` (its ES modules).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import gc
import hmac
import http
import json
import logging
import math
import mimetypes
import socket
import ssl
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, cast
from urllib.parse import urlsplit

import anyio
from anyio.abc import TaskStatus
from google.genai import types
from websockets.asyncio.client import connect as ws_connect
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.http11 import Request, Response

from live.agent import Agent, run_tool
from live.auth import Grant, HostPolicy, TokenRefused, host_name, verify_token
from live.errors import (
    ConfigurationError,
    ConnectionClosedError,
    InvalidArgumentError,
    LiveError,
    QuotaExhaustedError,
    RecoverableConnectionError,
)
from live.llm import BaseLlm, BaseLlmConnection, LlmRequest, RealtimeInput
from live.heard import HeardTracker, InterruptedReply
from live.logs import current_session
from live.metrics import Metrics
from live.observe import Measured, Recorded, SessionObserver
from live.record import Recorder, SessionRecord, current_record
from live.protocol import (
    DEFAULT_INPUT_RATE,
    ErrorEvent,
    ProtocolError,
    ServerEvent,
    SessionClose,
    SessionClosed,
    SessionGoAway,
    SessionReattached,
    SessionReconnecting,
    SessionResume,
    SessionResumed,
    SessionStart,
    SessionStarted,
    TranscriptOutput,
    TurnComplete,
    TurnInterrupted,
    encode,
    image_bytes_fitting,
    is_image_message,
    parse_client_message,
)
from live.fleet import Fleet
from live.reattach import ReplayBuffer, new_resume_token, token_digest, token_matches, with_seq
from live.queues import BYTES_PER_SECOND_OUT, ClientOutbox, OutboxOverflow, UpstreamQueue
from live.session import (
    AwaitClientTool,
    CancelTool,
    CloseSession,
    FlushAudio,
    ImageUpstream,
    PlaybackReported,
    ReconnectPolicy,
    RunTool,
    SendAudio,
    SendEvent,
    SessionCore,
    ToUpstream,
)
from live.supervisor import (
    CLOSED,
    GiveUp,
    HandOver,
    Outcome,
    Resume,
    Stall,
    Supervisor,
    Wait,
    wait_seconds,
)
from live.websocket import Server, WebSocket, serve

__all__ = ["LiveServer", "ServerConfig", "tls_context", "tune_gc_for_serving"]

log = logging.getLogger("live.server")

WEB_ROOT = Path(__file__).resolve().parent.parent / "clients" / "web"

# Close codes this server uses (RFC 6455 and IANA registry).
# How long a client that reports its playback has, after `turn.interrupted`, to say
# how much of the reply it played before the server's estimate is used instead.
PLAYBACK_REPORT_WAIT = 0.5

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009
CLOSE_INTERNAL = 1011
_WILDCARD_HOSTS = ("0.0.0.0", "::", "")
CONTROL_SEND_TIMEOUT = 10.0  # seconds a typed turn or tool result may take to reach the model
CLOSE_SERVICE_RESTART = 1012
CLOSE_TRY_LATER = 1013

# Frames a client's socket may buffer before it stops reading from it (its
# queue's high-water mark); each is at most twice `max_frame_bytes`.
WS_QUEUE_FRAMES = 2


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """Limits and checks; every bound says what happens when it is reached.

    - `max_sessions`: sessions beyond it get a `capacity` error and close 1013.
    - `max_frame_bytes`: a larger client frame gets a `frame_too_large` error and
      closes the socket with 1009. With the socket's queue (`WS_QUEUE_FRAMES`
      frames of up to twice this) it sets what one socket can make the server
      hold; the README's limits table has the sum.
    - `idle_timeout`: a session whose client sends nothing for this long ends.
    - `allowed_hosts`: `Host` names answered besides the bind address (or, bound
      to loopback or a wildcard address, localhost, 127.0.0.1 and [::1]); any
      other Host gets 403 before anything else (DNS rebinding). A leading dot
      allows subdomains; `("*",)` allows any.
    - `allowed_origins`: browser Origins allowed besides pages on an allowed
      host; `("*",)` allows any.
    - `token`: a static shared token (for development); when set,
      `session.start` may carry it.
    - `token_secret`: when set, `session.start` (or the handshake's
      `Authorization: Bearer`) must carry a JWT signed with it (`live.auth`);
      with `token` also set, either opens a session.
    - `start_timeout`: a socket that has not started a session this long after
      its handshake is closed (`idle_timeout`, close 1008).
    - `max_pending`: sockets waiting for `session.start` at once; one more gets
      `pending_limit` and close 1013.
    - `max_sessions_per_ip`: sockets (pending or in a session) per client
      address; one more gets `address_limit` and close 1013.
    - `audio_queue_frames`, `audio_queue_bytes`: client audio waiting for the
      model (two seconds of 20 ms frames, enough to cover a change of model
      connection; the bytes: two seconds at 48 kHz); beyond either the oldest is
      dropped and counted.
    - `control_queue_bytes`: typed turns and tool results waiting for the model;
      beyond it the server stops reading from the client until the model side
      catches up.
    - `max_image_bytes`: a larger image is dropped with an `image_too_large`
      error (the session goes on). None: as large as fits in `max_frame_bytes`
      as base64 in its JSON message (about 48 KB at the default 64 KiB); an
      image message over `max_frame_bytes` (up to the socket's cut-off at twice
      it) is refused the same way rather than closing the socket.
    - `max_image_rate`: image frames a second; more are dropped with an
      `image_rate_limited` error (at most one a second).
    - `audio_coalesce_frames`: when client frames wait for the model (it fell
      behind, or its connection is being replaced), up to this many go out as
      one chunk; with nothing waiting each frame goes out alone, at once.
    - `outbound_audio_seconds`: model audio waiting for the client; beyond it the
      server stops reading from the model until the client catches up.
    - `audio_lead`: how far ahead of real time audio is sent to the client
      (None: as fast as the socket takes it).
    - `stall_timeout`: a model that owes a reply (to a user turn or a tool
      result) for this long is reported and the session resumed elsewhere.
    - `handover_margin`: after a go-away, the session moves to a new connection
      at the first safe point, or this long before the deadline at the latest.
    - `reconnect_attempts`: failed resumptions in a row before the session ends;
      the count resets once a connection stayed up `stable_after` seconds.
    - `certfile`, `keyfile`: serve https:// and wss:// with this certificate
      chain and private key (PEM; the key may be in `certfile`).
    - `reattach_grace`: when a client's socket drops without `session.close`,
      the session (and its model connection) waits this long for the client to
      come back with `session.resume`; 0 ends it at once.
    - `drain_timeout`: with a shared store (`--redis`), how long a stopping
      server waits for each session to reach a safe point before it hands the
      session to the fleet anyway.
    - `reattach_audio_seconds`, `reattach_events`: what a session keeps of its
      stream for a client that comes back (`live.reattach.ReplayBuffer`):
      beyond the first, the oldest reply audio is dropped; beyond the second,
      the oldest event. What a replay lacks is reported as `missed`.
    - `near_capacity`: the share of `max_sessions` from which `/healthz`
      answers 503 `near_capacity`, so a load balancer routes new sessions to
      another process before this one refuses them (the sessions here go on).
    - `reuse_port`: share the port with other server processes (SO_REUSEPORT,
      Linux): the kernel spreads new connections across them.
    - `metrics_port`: serve `/metrics` on this port (0: a free one) instead of
      the serving port, so it can stay private.
    """

    host: str = "127.0.0.1"
    port: int = 8765
    max_sessions: int = 100
    max_frame_bytes: int = 64 << 10
    idle_timeout: float = 300.0
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    token: str | None = None
    token_secret: str | None = None
    start_timeout: float = 10.0
    max_pending: int = 32
    max_sessions_per_ip: int = 10
    audio_queue_frames: int = 100
    audio_queue_bytes: int = 192_000
    control_queue_bytes: int = 128 << 10
    max_image_bytes: int | None = None
    max_image_rate: float = 2.0
    audio_coalesce_frames: int = 5
    outbound_audio_seconds: float = 10.0
    audio_lead: float | None = 0.5
    stall_timeout: float = 20.0
    handover_margin: float = 1.0
    reconnect_attempts: int = 5
    stable_after: float = 60.0
    shutdown_grace: float = 2.0
    reattach_grace: float = 30.0
    drain_timeout: float = 30.0
    reattach_audio_seconds: float = 5.0
    reattach_events: int = 512
    reuse_port: bool = False
    near_capacity: float = 0.9
    certfile: str | None = None
    keyfile: str | None = None

    def __post_init__(self) -> None:
        if not 0 < self.near_capacity <= 1:  # also refuses NaN
            raise ValueError(f"near_capacity is a share of max_sessions, more than 0 and at most 1, not {self.near_capacity}")

    @property
    def scheme(self) -> str:
        return "https" if self.certfile else "http"
    metrics_port: int | None = None

    @property
    def metrics_on_serving_port(self) -> bool:
        """`/metrics` is on the serving port unless a port of its own was given."""
        return self.metrics_port is None

    @property
    def image_limit(self) -> int:
        """The largest image accepted: `max_image_bytes`, or what fits in a frame."""
        fitting = image_bytes_fitting(self.max_frame_bytes)
        return fitting if self.max_image_bytes is None else min(self.max_image_bytes, fitting)


def _error_code(exc: LiveError) -> str:
    if isinstance(exc, ConfigurationError):
        return "model_config_error"
    if isinstance(exc, QuotaExhaustedError):
        return "quota_exhausted"
    if isinstance(exc, InvalidArgumentError):
        return "model_invalid_argument"
    if isinstance(exc, RecoverableConnectionError):
        return "model_connection_lost"
    return "model_error"


class _Link:
    """One model connection of a session: its pumps, and how it ended."""

    def __init__(
        self, conn: BaseLlmConnection, scope: anyio.CancelScope, poke: Callable[[], None]
    ) -> None:
        self.conn = conn
        self.sending = anyio.CancelScope()
        self.sender_done = anyio.Event()
        self.go_away_at: float | None = None
        self.outcome: Outcome | None = None
        # Retired from the conversation: what it still receives is discarded.
        self.muted = False
        # Set once the client was told of this connection (session.started or
        # session.resumed): its responses wait until then.
        self.ready = anyio.Event()
        self._scope = scope
        self._poke = poke

    def end(self, outcome: Outcome) -> None:
        """The connection ended (a `LiveError`, or CLOSED for a normal close).

        The first outcome is kept; it is the same whichever pump saw the end.
        """
        if self.outcome is None:
            self.outcome = outcome
        self._scope.cancel()
        self._poke()

    async def stop_sending(self) -> None:
        self.sending.cancel()
        await self.sender_done.wait()

    def stop(self) -> None:
        """Close the connection: its task leaves `connect()`, which closes upstream."""
        self._scope.cancel()


class ClientSession:
    """One client socket and the sequence of model connections it drives."""

    def __init__(self, server: LiveServer, ws: WebSocket) -> None:
        self.server = server
        self.ws = ws
        self.config = server.config
        self.id = uuid.uuid4().hex[:12]
        self.model = server.agent.model
        self.clock = server.clock
        self.peer = _peer(ws)
        self.grant: Grant | None = None
        self.outbox = ClientOutbox(
            max_audio_seconds=self.config.outbound_audio_seconds,
            lead=self.config.audio_lead,
            clock=server.clock,
        )
        self.upstream: UpstreamQueue[types.Content | RealtimeInput] = UpstreamQueue(
            max_audio=self.config.audio_queue_frames,
            max_audio_bytes=self.config.audio_queue_bytes,
            max_control_bytes=self.config.control_queue_bytes,
        )
        self.core: SessionCore | None = None
        self.manual_activity = False
        self.replay = ReplayBuffer(
            max_audio_bytes=int(self.config.reattach_audio_seconds * BYTES_PER_SECOND_OUT)
            if self.config.reattach_grace > 0
            else 0,
            max_events=self.config.reattach_events if self.config.reattach_grace > 0 else 0,
        )
        self.resume_digest: str | None = None
        self.handed_off = False  # this socket's handler gave it to another session
        self.adopted: dict[str, Any] | None = None  # facts of a session taken over from the fleet
        self.to_fleet = False  # handed to another server of the fleet: its state stays stored
        # Taken once per frame to the client and almost never contended: no
        # extra trip through the event loop when it is free.
        self._send_lock = anyio.Lock(fast_acquire=True)
        self._socket_done = anyio.Event()  # the current socket was let go (or the session ended)
        self._away: anyio.CancelScope | None = None
        self.reattaches = 0
        self.end_reason: str | None = None
        self.close_code = CLOSE_NORMAL
        self.audio_frames_in = 0
        # Frames read in the session, counted per frame; the idle watch and the
        # metrics take them from here (a clock read per frame would cost more).
        self.frames_read = 0
        self._frames_watched = 0
        self._last_client_frame = self.clock()
        self._tool_scopes: dict[str, anyio.CancelScope] = {}
        self._scope: anyio.CancelScope | None = None
        self._final_error: ErrorEvent | None = None
        self._reported_drops = 0
        self._log_started = False
        self._news = anyio.Event()
        self.reconnects = 0
        self.record: SessionRecord | None = None
        self.heard = HeardTracker()
        self._heard_event: TranscriptOutput | None = None
        self.reports_playback = False  # set from session.start
        self._awaiting_playback = anyio.CancelScope()
        self._awaited_reply: InterruptedReply | None = None
        self.obs = SessionObserver(
            server.metrics,
            model=self.model,
            agent=server.agent.name,
            tools=[*server.agent.tools_by_name, *(d.name or "" for d in server.agent.client_tools)],
        )

    # ------------------------------------------------------------------ helpers

    async def _send_now(self, event: ServerEvent) -> None:
        """Send outside the outbox (before the pumps run, or after they stopped)."""
        self.obs.event(event)
        frame = encode(event)
        ws = self.ws
        if ws is None:
            return
        try:
            await ws.send(frame)
        except ConnectionClosed:
            return
        self.obs.frame_out(frame, self.clock())
        if self.record is not None:
            self.record.server_frame(frame)

    def finish(
        self, reason: str, close_code: int = CLOSE_NORMAL, error: ErrorEvent | None = None
    ) -> None:
        """End the session (the first reason wins) by cancelling what runs now.

        `error`, when given, is the last event before `session.closed`.
        """
        if self.end_reason is None:
            self.end_reason = reason
            self.close_code = close_code
            self._final_error = error
        if self._scope is not None:
            self._scope.cancel()

    def shutdown(self) -> None:
        self.finish(
            "server shutting down",
            CLOSE_GOING_AWAY,
            ErrorEvent("server_shutdown", "the server is shutting down", True),
        )

    def _frame_too_large(self, size: int) -> None:
        message = f"frame of {size} bytes exceeds the {self.config.max_frame_bytes}-byte limit"
        self.finish(message, CLOSE_TOO_BIG, ErrorEvent("frame_too_large", message, True))

    # ------------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        started = self.clock()
        start: SessionStart | None = None
        current_session.set(self.id)  # this task's context: every line it logs names the session
        self.obs.opened()
        try:
            with anyio.CancelScope() as scope:
                self._scope = scope
                if self.end_reason is not None:
                    scope.cancel()
                try:
                    start = await self._await_start()
                finally:
                    self.server.pending.discard(self)
            if self.end_reason is not None or start is None:
                return
            if isinstance(start, SessionResume):
                adopted = await self.server.reattach(self, start)
                if adopted is None:
                    return
                start = self._adopt(start, adopted)
            self.manual_activity = start.turn_taking == "manual" or self.server.agent_manual_activity
            self._start_record(start)
            self.reports_playback = start.reports_playback
            self.core = SessionCore(
                input_rate=start.input_rate,
                server_tools=frozenset(self.server.agent.tools_by_name),
                client_tool_timeout=self.server.agent.client_tool_timeout,
                manual_activity=self.manual_activity,
                max_image_bytes=self.config.image_limit,
                max_image_rate=self.config.max_image_rate,
                video_capped=not self.server.agent.context_compression,
            )
            if self.adopted is not None:
                self.core.restore(self.adopted.get("core") or {})
            with anyio.CancelScope() as scope:
                # Cancelling this scope ends every task of the session; each model
                # connection's own exit (shielded by the implementation) still
                # closes it upstream.
                self._scope = scope
                if self.end_reason is not None:
                    scope.cancel()
                async with anyio.create_task_group() as tg:
                    self._tg = tg
                    if self.grant is not None and self.grant.max_duration is not None:
                        tg.start_soon(self._limit_duration, self.grant.max_duration)
                    await self._converse(start)
        except* LiveError as group:
            self._model_failed(group.exceptions[0])  # type: ignore[arg-type]
        except* Exception:
            log.exception("session %s failed", self.id)
            self.finish(
                "internal error",
                CLOSE_INTERNAL,
                ErrorEvent("internal_error", "the server failed; see its log", True),
            )
        finally:
            if self.handed_off:
                self.obs.abandon()
                return  # this socket served another session, which closes it
            self.server.live_sessions.pop(self.id, None)
            reason = self.end_reason or "client disconnected"
            with anyio.CancelScope(shield=True), anyio.move_on_after(self.config.shutdown_grace):
                if self.to_fleet:
                    # Another server carries it on: the client reattaches there.
                    if self.ws is not None:
                        await self.ws.close(CLOSE_SERVICE_RESTART, "server restarting: reattach")
                else:
                    if self._final_error is not None:
                        await self._send_now(self._final_error)
                    await self._send_now(SessionClosed(reason))
                    if self.ws is not None:
                        await self.ws.close(self.close_code, reason[:120])
                fleet = self.server.fleet
                if fleet is not None and self.core is not None:
                    await fleet.ended(self.id, keep_state=self.to_fleet)
            self._socket_done.set()
            if self.record is not None:
                self.record.close(reason)
            self._frames_seen()
            self.obs.ended(
                reason,
                self._final_error,
                late_dropped=self.core.late_audio_dropped if self.core else 0,
                flushed=self.outbox.flushed_frames,
            )
            if self._log_started:
                summary = {
                    "model": self.model,
                    "duration": round(self.clock() - started, 1),
                    "reason": reason,
                    "audio_in": self.audio_frames_in,
                    "audio_dropped": self.upstream.dropped_audio,
                    "late_audio_dropped": self.core.late_audio_dropped if self.core else 0,
                    "reconnects": self.reconnects,
                }
                log.info(
                    "session %s ended model=%s duration=%.1fs reason=%s audio_in=%d "
                    "audio_dropped=%d late_audio_dropped=%d reconnects=%d",
                    self.id,
                    *summary.values(),
                    extra={"fields": {"event": "session.ended", **summary}},
                )

    # ------------------------------------------------------------------ the model side

    async def _converse(self, start: SessionStart) -> None:
        """Open the first model connection, start the client pumps, then supervise.

        The client's socket outlives model connections. What to do when one
        ends, stalls or is announced to end is decided by `live.supervisor`;
        this loop performs the steps. Input the client sends meanwhile waits in
        the upstream queue and is sent on the new connection; history is never
        sent again.
        """
        core = self.core
        assert core is not None
        fleet = self.server.fleet
        if self.adopted is None:
            if fleet is not None and not await fleet.admit(self.id):
                limit = fleet.max_sessions_global
                message = f"the service is at its limit of {limit} sessions; try again later"
                self.finish(message, CLOSE_TRY_LATER, ErrorEvent("capacity", message, True))
                return
            link = await self._tg.start(self._connection, self._request(start.history))
            if start.history:
                await link.conn.send_history(list(start.history))
            resume_token = None
            if self.config.reattach_grace > 0:
                resume_token = new_resume_token()
                self.resume_digest = token_digest(resume_token)
                self.server.live_sessions[self.id] = self
            await self._send_now(
                SessionStarted(
                    self.id,
                    self.model,
                    start.input_rate,
                    resume_token=resume_token,
                    max_image_bytes=self.config.image_limit,
                    max_image_rate=self.config.max_image_rate,
                )
            )
            link.ready.set()
            if fleet is not None:
                await fleet.started(self.id, self.durable_state())
        else:
            # Taken over from a server that is gone: resume its model session from
            # the stored handle, and tell the new connection what the old one owed.
            await self._apply(core.connection_lost())
            link = await self._open_resumed(announce=False)
            self.server.live_sessions[self.id] = self
            stored_seq = int(self.adopted.get("last_seq") or 0)
            await self._send_now(
                SessionReattached(self.id, 0, max(0, stored_seq - self.replay.last_seq))
            )
            self.replay.last_seq = max(stored_seq, self.replay.last_seq)
            if fleet is not None:
                await fleet.started(self.id, self.durable_state())
            log.info("session %s taken over from the fleet (handle from the store)", self.id)
        self.obs.started(self.clock())
        log.info("session %s started model=%s input_rate=%d", self.id, self.model, start.input_rate)
        self._log_started = True
        self._tg.start_soon(self._read_client, self.ws)
        self._tg.start_soon(self._write_client)
        self._tg.start_soon(self._watch_idle)
        supervisor = Supervisor(
            handover_margin=self.config.handover_margin,
            stall_timeout=self.config.stall_timeout,
            policy=ReconnectPolicy(
                max_failures=self.config.reconnect_attempts, stable_after=self.config.stable_after
            ),
        )
        supervisor.connected(self.clock())
        while True:
            now = self.clock()
            step = supervisor.next_step(
                now,
                outcome=link.outcome,
                go_away_at=link.go_away_at,
                safe_point=core.at_safe_point,
                awaiting_reply_since=core.awaiting_reply_since,
                has_handle=core.resumption_handle is not None,
            )
            if isinstance(step, Wait):
                await self._wait_for_news(wait_seconds(step, now))
            elif isinstance(step, HandOver):
                link = await self._hand_over(link, supervisor)
            elif isinstance(step, Stall):
                self._event(ErrorEvent("model_stalled", step.message))
                self.obs.reconnecting("stalled")
                link.end(RecoverableConnectionError("the model stalled"))
            elif isinstance(step, Resume):
                link = await self._resume(link, step, supervisor)
            else:
                raise step.error

    def _request(
        self, history: Sequence[types.Content] = (), resume_handle: str | None = None
    ) -> LlmRequest:
        return self.server.agent.request(
            history, resume_handle=resume_handle, manual_activity=self.manual_activity
        )

    async def _wait_for_news(self, timeout: float) -> None:
        """Sleep until something the supervisor acts on may have changed.

        Woken by the connection ending, by a go-away, and (during a go-away or
        while a reply is owed) by each change of turn or tool state; otherwise by
        the timer of the nearest deadline.
        """
        self._news = anyio.Event()
        with anyio.move_on_after(timeout):
            await self._news.wait()

    def _poke(self) -> None:
        self._news.set()

    async def _retire(self, link: _Link) -> None:
        """Take a connection out of the conversation: nothing more goes to it or
        comes from it, and its sender has stopped (the upstream queue has one
        sender at a time). It closes upstream in its own time."""
        link.muted = True
        link.stop()
        await link.sender_done.wait()

    async def _resume(self, link: _Link, step: Resume, supervisor: Supervisor) -> _Link:
        """The connection ended: resume on a new one, retrying as the supervisor says."""
        core = self.core
        assert core is not None
        if link.outcome == CLOSED:
            self.obs.reconnecting("go_away" if link.go_away_at is not None else "closed")
        await self._retire(link)
        await self._apply(core.connection_lost())
        while True:
            self._event(SessionReconnecting(step.reason))
            log.info("session %s reconnecting: %s", self.id, step.reason)
            await anyio.sleep(step.delay)
            try:
                new = await self._open_resumed()
            except LiveError as exc:
                next_step = supervisor.reconnect_failed(
                    self.clock(), exc, has_handle=core.resumption_handle is not None
                )
                if isinstance(next_step, GiveUp):
                    raise next_step.error from exc
                assert isinstance(next_step, Resume)
                step = next_step
                continue
            supervisor.connected(self.clock())
            return new

    async def _hand_over(self, link: _Link, supervisor: Supervisor) -> _Link:
        """Go-away: move to a new connection before the old one is closed.

        The old connection takes nothing more once the hand-over starts, and
        what it still sends is discarded: a reply cut at the deadline ends for
        the client with `turn.complete` (`connection_lost`), and nothing of it
        follows; a call it makes now is one the resumed state never made.
        """
        core = self.core
        assert core is not None
        self._event(SessionReconnecting("the model connection is about to close (go-away)"))
        link.muted = True
        self.obs.reconnecting("go_away")
        await link.stop_sending()
        await self._apply(core.connection_lost())
        try:
            new = await self._open_resumed()
        except LiveError as exc:
            link.end(exc)  # the supervisor decides: retry with backoff, or give up
            return link
        link.stop()
        supervisor.connected(self.clock())
        return new

    async def _open_resumed(self, *, announce: bool = True) -> _Link:
        core = self.core
        assert core is not None
        link = await self._tg.start(self._connection, self._request(resume_handle=core.resumption_handle))
        self.reconnects += 1
        self.obs.resumed()
        if announce:
            self._event(SessionResumed())
        link.ready.set()
        await self._apply(core.connection_resumed(self.clock()))
        log.info("session %s resumed (connection %d)", self.id, self.reconnects + 1)
        return link

    async def _connection(
        self, request: LlmRequest, *, task_status: TaskStatus[_Link] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """One model connection and its two pumps, for as long as it lasts."""
        async with self.server.measured_llm.connect(request) as conn:
            link: _Link | None = None
            try:
                async with anyio.create_task_group() as tg:
                    link = _Link(conn, tg.cancel_scope, self._poke)
                    tg.start_soon(self._send_upstream, link)
                    tg.start_soon(self._receive_upstream, link)
                    task_status.started(link)
            finally:
                if link is not None:
                    link.sender_done.set()

    def durable_state(self) -> dict[str, Any]:
        """What another server of the fleet needs to carry this session on."""
        core = self.core
        return {
            "agent": self.server.agent.name,
            "model": self.model,
            "input_rate": int(core.input_mime.rsplit("=", 1)[1]) if core else 16000,
            "turn_taking": "manual" if self.manual_activity else "auto",
            "resume_digest": self.resume_digest,
            "last_seq": self.replay.last_seq,
            "core": core.snapshot() if core is not None else {},
        }

    def _adopt(self, message: SessionResume, state: dict[str, Any]) -> SessionStart:
        """Become the session `state` describes, on this server, for this socket."""
        self.id = message.session_id
        current_session.set(self.id)
        self.adopted = state
        self.resume_digest = state.get("resume_digest")
        self.replay.last_seq = message.last_seq
        return SessionStart(
            input_rate=int(state.get("input_rate") or DEFAULT_INPUT_RATE),
            turn_taking=str(state.get("turn_taking") or "auto"),
        )

    async def hand_to_fleet(self, time_left: float) -> None:
        """Draining: at the next safe point (or after `time_left`), leave the
        session to another server of the fleet, with its newest facts stored."""
        core = self.core
        fleet = self.server.fleet
        if core is None or fleet is None:
            self.shutdown()
            return
        async with self._send_lock:  # in order with the stream, and sent before the end
            await self._send_now(SessionGoAway(time_left))
        with anyio.move_on_after(time_left):
            while not core.at_safe_point:
                await anyio.sleep(0.05)
        await fleet.save(self.id, self.durable_state())
        self.to_fleet = True
        self.finish("handed to another server of the fleet (this one is stopping)")

    def _start_record(self, start: SessionStart) -> None:
        """With `--record`: open this session's record; the model side finds it too."""
        recorder = self.server.recorder
        if recorder is None:
            return
        self.record = recorder.start(self.id, self.server.record_header(start), input_rate=start.input_rate)
        if self.record is not None:
            current_record.set(self.record)  # read by Recorded(llm) in this session's tasks
            self.record.client_event(start.to_json())

    def _model_failed(self, exc: LiveError) -> None:
        self.finish(f"model: {exc}", CLOSE_INTERNAL, ErrorEvent(_error_code(exc), str(exc), True))

    async def _await_start(self) -> SessionStart | SessionResume | None:
        """Read frames until a valid `session.start` (or `session.resume`);
        everything else gets an error."""
        with anyio.move_on_after(self.config.start_timeout):
            while True:
                try:
                    frame = await self.ws.recv()
                except ConnectionClosed:
                    self.finish("client disconnected before session.start")
                    return None
                self._last_client_frame = self.clock()
                self.obs.frames_in(1)
                if len(frame) > self.config.max_frame_bytes:
                    self._frame_too_large(len(frame))
                    return None
                if isinstance(frame, bytes):
                    await self._send_now(
                        ErrorEvent(
                            "not_started",
                            "audio before session.start was dropped; send "
                            '{"type": "session.start"} first',
                        )
                    )
                    continue
                try:
                    message = parse_client_message(frame)
                except ProtocolError as exc:
                    await self._send_now(ErrorEvent(exc.code, exc.message))
                    continue
                if isinstance(message, SessionClose):
                    self.finish("client closed the session")
                    return None
                if isinstance(message, SessionResume):
                    return message
                if not isinstance(message, SessionStart):
                    await self._send_now(
                        ErrorEvent(
                            "not_started",
                            f"{message.type} before session.start was ignored; send "
                            '{"type": "session.start"} first',
                        )
                    )
                    continue
                refusal = self._authorize(message.token)
                if refusal is not None:
                    log.warning("session %s refused from %s: unauthorized: %s", self.id, self.peer, refusal)
                    self.finish(refusal, CLOSE_POLICY, ErrorEvent("unauthorized", refusal, True))
                    return None
                if self.grant is not None:
                    log.info(
                        "session %s token accepted from %s subject=%s agent=%s max_duration=%s",
                        self.id,
                        self.peer,
                        self.grant.subject,
                        self.grant.agent,
                        self.grant.max_duration,
                    )
                return message
        if self.end_reason is None:
            message_text = f"no session.start within {self.config.start_timeout:g} s"
            log.warning("session %s closed from %s: %s", self.id, self.peer, message_text)
            self.finish(message_text, CLOSE_POLICY, ErrorEvent("idle_timeout", message_text, True))
        return None

    def _authorize(self, token: str | None) -> str | None:
        """None if a session may start (the token's grant kept); otherwise why not.

        Never says or logs the token itself.
        """
        config = self.config
        if config.token is None and config.token_secret is None:
            return None
        if token is None:
            token = _bearer(self.ws)
        if not token:
            return (
                "session.start needs a token (its 'token' field, or Authorization: Bearer "
                "on the handshake)"
            )
        if config.token is not None and hmac.compare_digest(token.encode(), config.token.encode()):
            return None
        if config.token_secret is None:
            return "session.start needs the server's token (this one is wrong)"
        try:
            self.grant = verify_token(token, config.token_secret, agent=self.server.agent.name)
        except TokenRefused as exc:
            return str(exc)
        return None

    async def _limit_duration(self, seconds: float) -> None:
        await anyio.sleep(seconds)
        message = f"the session reached the {seconds:g} s its token allows (max_duration)"
        self.finish(message, CLOSE_NORMAL, ErrorEvent("session_expired", message, True))

    # ------------------------------------------------------------------ the pumps

    async def _read_client(self, ws: WebSocket) -> None:
        """Everything the client sends, in order.

        While this task waits for the next frame, an audio frame is taken by
        the socket's callback itself (`_take_audio`, where the socket offers
        `take_binary`): the same steps, without waking this task.
        """
        core = self.core
        assert core is not None
        max_frame = self.config.max_frame_bytes
        waiting = _frames_waiting(ws)
        # The socket's callback runs outside any task: it runs the lane in a copy
        # of this task's context, so what it logs names the session.
        lane = functools.partial(contextvars.copy_context().run, self._take_audio) if hasattr(ws, "take_binary") else None
        if lane is not None:
            ws.take_binary = lane
        try:
            async for frame in ws:
                self.frames_read += 1
                if len(frame) > max_frame:
                    if isinstance(frame, str) and is_image_message(frame):
                        # An image too large is a dropped frame, not a broken client.
                        self._event(self._image_too_large(len(frame)))
                        continue
                    self._frame_too_large(len(frame))
                    return
                if isinstance(frame, bytes):
                    self._client_audio(frame, behind=waiting() > 0)
                else:
                    if self.record is not None:
                        self.record.client_text(frame)
                    await self._apply(core.client_text(frame, self.clock()))
                    self._poke()
        except ConnectionClosed:
            pass
        finally:
            if lane is not None and ws.take_binary is lane:
                ws.take_binary = None
        if self.end_reason is None:
            self._socket_lost(ws)

    def _take_audio(self, frame: bytes) -> bool:
        """A binary frame from the socket's callback while the reader waits (so
        nothing the client sent earlier is still in hand); False leaves it to the reader.

        It runs in picows' callback: a failure here must end the session as the
        reader's would, not escape into the socket (which would close with 1011).
        """
        if len(frame) > self.config.max_frame_bytes or self.end_reason is not None:
            return False
        self.frames_read += 1
        try:
            self._client_audio(frame, behind=False)
        except Exception:
            log.exception("session %s failed", self.id)
            self.finish(
                "internal error",
                CLOSE_INTERNAL,
                ErrorEvent("internal_error", "the server failed; see its log", True),
            )
        return True

    def _client_audio(self, frame: bytes, *, behind: bool) -> None:
        """One audio frame from the client: to the model at once when its
        connection takes it without waiting, else into the upstream queue.

        At once only when the sender waits on an empty queue (nothing is ahead
        of this frame) and the reader is not `behind` (frames piled up behind
        this one are queued, so the sender joins them into one message).
        """
        if self.record is not None:
            self.record.client_audio(frame)
        if not frame:
            return
        core = self.core
        assert core is not None
        try:
            blob = core.client_audio(frame)
        except ProtocolError as exc:
            self._event(ErrorEvent(exc.code, exc.message))
            return
        self.audio_frames_in += 1
        upstream = self.upstream
        link = cast("_Link | None", upstream.waiting_consumer)
        if link is not None and not behind and not link.muted and link.conn.send_realtime_nowait(blob):
            return
        if upstream.put_audio(blob, len(frame)):
            self.obs.audio_overflow()
            self._report_drops()

    def _socket_lost(self, ws: WebSocket) -> None:
        """The client's socket closed without `session.close`.

        With reattach on, the session goes on without a socket (its model
        connection open, its stream kept) for `reattach_grace` seconds;
        otherwise, or when the server is stopping, it ends.
        """
        if self.ws is not ws or self.end_reason is not None:
            return  # an older socket, or the session is ending anyway
        grace = self.config.reattach_grace
        if grace <= 0 or self.server.stopping or self.resume_digest is None:
            self.finish("client disconnected")
            return
        self.ws = None
        self._socket_done.set()
        log.info("session %s lost its client; waiting %g s for it to come back", self.id, grace)
        self._away = anyio.CancelScope()
        self._tg.start_soon(self._await_return, self._away, grace)

    async def _await_return(self, scope: anyio.CancelScope, grace: float) -> None:
        with scope:
            await anyio.sleep(grace)
            self.finish(f"the client did not come back within {grace:g} s")

    async def attach(self, ws: WebSocket, last_seq: int) -> None:
        """A new socket takes the session over: the frames it missed, then the
        live stream. A socket still attached (its drop not yet noticed) is let go."""
        async with self._send_lock:
            old = self.ws
            if self._away is not None:
                self._away.cancel()
                self._away = None
            frames, missed = self.replay.after(last_seq)
            self.ws = ws
            self._socket_done.set()
            self._socket_done = anyio.Event()
            self._last_client_frame = self.clock()
            self.reattaches += 1
            try:
                await ws.send(encode(SessionReattached(self.id, len(frames), missed)))
                for frame in frames:
                    await ws.send(frame)
            except ConnectionClosed:
                pass
        if old is not None:
            self._tg.start_soon(old.close, CLOSE_NORMAL, "replaced by a newer connection")
        log.info(
            "session %s reattached from %s: %d frame(s) replayed, %d missed",
            self.id, _peer(ws), len(frames), missed,
        )
        self._tg.start_soon(self._read_client, ws)

    async def serve_socket(self, ws: WebSocket) -> None:
        """Wait while `ws` is this session's socket (its handler must stay alive)."""
        while self.ws is ws and self.end_reason is None:
            await self._socket_done.wait()

    def _report_drops(self) -> None:
        dropped = self.upstream.dropped_audio
        # The first drop, then every 50th: the client learns without being flooded.
        if dropped == 1 or dropped - self._reported_drops >= 50:
            self._reported_drops = dropped
            self._event(
                ErrorEvent(
                    "audio_overflow",
                    f"the model is not keeping up: {dropped} audio frame(s) dropped so far "
                    "(the oldest waiting audio is dropped first)",
                )
            )

    def _image_too_large(self, message_size: int) -> ErrorEvent:
        return ErrorEvent(
            "image_too_large",
            f"an image message of {message_size} bytes exceeds the {self.config.max_frame_bytes}-byte "
            f"frame limit (images up to {self.config.image_limit} bytes fit); the frame was "
            "dropped (send a smaller or more compressed image, e.g. 768 px on the long side)",
        )

    def _report_image_drops(self) -> None:
        dropped = self.upstream.dropped_images
        if dropped == 1 or dropped % 10 == 0:
            self._event(
                ErrorEvent(
                    "image_overflow",
                    f"the model is not keeping up: {dropped} image(s) dropped so far "
                    "(a newer image replaces an older one still waiting)",
                )
            )

    async def _write_client(self) -> None:
        """The session's stream to the client, numbered and kept for a replay.

        Without a socket (the client is away) frames are only kept.
        """
        outbox = self.outbox
        replay = self.replay
        sent = self.obs.frame_out
        clock = self.clock
        lock = self._send_lock
        while True:
            frame = await outbox.get()
            if type(frame) is str:
                frame = with_seq(frame, replay.last_seq + 1)
            replay.add(frame)
            async with lock:
                ws = self.ws
                if ws is None:
                    continue
                try:
                    await ws.send(frame)
                except ConnectionClosed:
                    self._socket_lost(ws)
                    continue
            sent(frame, clock())
            if type(frame) is bytes:
                self.heard.audio_sent(len(frame))
            if self.record is not None:
                self.record.server_frame(frame)

    async def _send_upstream(self, link: _Link) -> None:
        """Client input to the model, in order; an item is removed once it was sent."""
        queue = self.upstream
        conn = link.conn
        core = self.core
        assert core is not None
        send_realtime = conn.send_realtime
        coalesce = self.config.audio_coalesce_frames
        try:
            with link.sending:
                while True:
                    is_audio, items = await queue.peek_run(coalesce, waiting_as=link)
                    try:
                        if is_audio:
                            blobs = cast(list[types.Blob], items)
                            await send_realtime(
                                blobs[0] if len(blobs) == 1 else core.joined_audio(blobs)
                            )
                        elif isinstance(items[0], types.Content):
                            # Tool results and turns go whole or not at all.
                            content = core.for_connection(items[0])
                            # Whole or not at all, but not forever: a model that never
                            # takes it is a dead connection (and must not hold a
                            # session's end or a server's stop).
                            with anyio.CancelScope(
                                shield=True, deadline=anyio.current_time() + CONTROL_SEND_TIMEOUT
                            ) as sending:
                                await conn.send_content(content)
                            if sending.cancelled_caught:
                                raise RecoverableConnectionError(
                                    f"the model did not take a message within {CONTROL_SEND_TIMEOUT:g} s"
                                )
                            core.content_sent(content)
                        else:
                            await send_realtime(items[0])
                    except BaseException:
                        queue.release()
                        raise
                    queue.commit()
        except ConnectionClosedError as exc:
            # The close as the receiver would classify it, whoever saw it first.
            link.end(exc.cause if exc.cause is not None else CLOSED)
        except LiveError as exc:
            link.end(exc)
        finally:
            link.sender_done.set()

    async def _receive_upstream(self, link: _Link) -> None:
        core = self.core
        assert core is not None
        try:
            await link.ready.wait()  # the client hears of the connection before anything from it
            async for response in link.conn.receive():
                if link.muted:
                    continue  # retired: nothing of it reaches the conversation
                now = self.clock()
                if response.go_away_time_left is not None:
                    link.go_away_at = now + response.go_away_time_left
                owed = core.awaiting_reply_since
                if response.voice_activity is not None:
                    self.obs.model_response(response, now)
                await self._apply(core.model_response(response, now))
                # Wake the supervisor only for what it acts on: a go-away, or the
                # owed reply arriving (not every audio chunk after it).
                if link.go_away_at is not None or (
                    owed is not None and core.awaiting_reply_since is None
                ):
                    self._poke()
        except LiveError as exc:
            link.end(exc)
            return
        link.end(CLOSED)

    def _frames_seen(self) -> None:
        """The frames read since the last look count, and the client was there then."""
        read = self.frames_read
        if read != self._frames_watched:
            self.obs.frames_in(read - self._frames_watched)
            self._frames_watched = read
            self._last_client_frame = self.clock()

    async def _watch_idle(self) -> None:
        """Ends the session after `idle_timeout` without client input (noticed to
        within a second: it looks at most once a second)."""
        idle = self.config.idle_timeout
        while True:
            self._frames_seen()
            if self.ws is None:  # the client is away: the reattach grace applies
                self._last_client_frame = self.clock()
                await anyio.sleep(1.0)
                continue
            remaining = self._last_client_frame + idle - self.clock()
            if remaining <= 0:
                error = ErrorEvent("idle_timeout", f"no input from the client for {idle:g} s", True)
                self.finish("idle timeout", error=error)
                return
            self.obs.catch_up(self.core.late_audio_dropped if self.core else 0, self.outbox.flushed_frames)
            await anyio.sleep(min(remaining, 1.0))

    # ------------------------------------------------------------------ actions

    def _event(self, event: ServerEvent) -> None:
        self.obs.event(event)
        try:
            self.outbox.put_event(encode(event))
        except OutboxOverflow as exc:
            self.finish(f"client too slow: {exc}", CLOSE_POLICY)

    async def _apply(self, actions: list[Any]) -> None:
        if actions:
            self.obs.actions(actions, self.clock())
        for action in actions:
            if isinstance(action, SendAudio):
                self.heard.audio_queued(len(action.data))
                await self.outbox.put_audio(action.data)
            elif isinstance(action, SendEvent):
                event = action.event
                if isinstance(event, TurnInterrupted):
                    self.outbox.put_urgent(encode(event))
                    if self._heard_event is not None:
                        self._event(self._heard_event)  # what the user heard, right after
                        self._heard_event = None
                else:
                    if type(event) is TranscriptOutput and not event.final:
                        self.heard.fragment(event.text)
                    elif type(event) is TurnComplete:
                        self.heard.reply_ended()
                    self._event(event)
            elif isinstance(action, ToUpstream):
                await self.upstream.put_control(action.item, _control_size(action.item))
            elif isinstance(action, ImageUpstream):
                if self.upstream.put_image(action.blob, len(action.blob.data or b"")):
                    self._report_image_drops()
            elif isinstance(action, FlushAudio):
                self._interrupted(self.heard.interrupted(self.outbox.unplayed_seconds()))
                self.outbox.flush_audio()  # the client is told by the urgent event that follows
            elif isinstance(action, PlaybackReported):
                self._heard_reported(action.played)
            elif isinstance(action, RunTool):
                self._start_tool_task(action.call.id or "", self._run_server_tool, action.call)
            elif isinstance(action, AwaitClientTool):
                self._start_tool_task(
                    action.call.id or "", self._await_client_tool, action.call.id, action.timeout
                )
            elif isinstance(action, CancelTool):
                scope = self._tool_scopes.pop(action.call_id, None)
                if scope is not None:
                    scope.cancel()
            elif isinstance(action, CloseSession):
                self.finish(action.reason)

    # ------------------------------------------------------------------ what the user heard

    def _interrupted(self, reply: InterruptedReply | None) -> None:
        """A reply was cut: say what was heard of it, now or when the client reports."""
        earlier = self._awaited_reply
        if earlier is not None:  # a new barge-in before the last one was reported
            self._awaited_reply = None
            self._awaiting_playback.cancel()
            self._event(_heard_event(earlier.heard()))
        if reply is None:
            return
        if not self.reports_playback:
            self._heard_event = _heard_event(reply.heard())
            return
        scope = self._awaiting_playback = anyio.CancelScope()
        self._tg.start_soon(self._heard_by_deadline, reply, scope)

    async def _heard_by_deadline(self, reply: InterruptedReply, scope: anyio.CancelScope) -> None:
        self._awaited_reply = reply
        with scope:
            await anyio.sleep(PLAYBACK_REPORT_WAIT)
            # No report in time: the server's own estimate.
            self._awaited_reply = None
            self._event(_heard_event(reply.heard()))

    def _heard_reported(self, played: float) -> None:
        reply = self._awaited_reply
        if reply is None:
            return  # none awaited (late, or for a reply already answered for)
        self._awaited_reply = None
        self._awaiting_playback.cancel()
        self._event(_heard_event(reply.heard(played)))

    def _start_tool_task(self, call_id: str, fn: Callable[..., Any], *args: Any) -> None:
        # The scope exists before the task starts, so a cancellation that arrives
        # first still cancels it.
        scope = anyio.CancelScope()
        self._tool_scopes[call_id] = scope
        self._tg.start_soon(self._in_scope, call_id, scope, fn, *args)

    async def _in_scope(
        self, call_id: str, scope: anyio.CancelScope, fn: Callable[..., Any], *args: Any
    ) -> None:
        with scope:
            await fn(*args)
        if self._tool_scopes.get(call_id) is scope:
            del self._tool_scopes[call_id]

    async def _run_server_tool(self, call: types.FunctionCall) -> None:
        agent = self.server.agent
        tool = agent.tools_by_name[call.name or ""]
        response = await run_tool(tool, dict(call.args or {}), agent.tool_timeout)
        assert self.core is not None
        await self._apply(self.core.tool_finished(call.id or "", response, self.clock()))
        self._poke()

    async def _await_client_tool(self, call_id: str, timeout: float) -> None:
        await anyio.sleep(timeout)
        assert self.core is not None
        await self._apply(self.core.client_tool_expired(call_id, self.clock()))
        self._poke()


class LiveServer:
    """Serves one agent to many clients on one port."""

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
    ) -> None:
        self.agent = agent
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
        self.measured_llm: BaseLlm = Measured(Recorded(llm) if recorder else llm, self.metrics)
        self.fleet = fleet
        self._draining = False
        self.sessions: set[ClientSession] = set()
        # Started sessions a client may reattach to, by id.
        self.live_sessions: dict[str, ClientSession] = {}
        # Sockets that have not sent session.start yet, and sockets per address.
        self.pending: set[ClientSession] = set()
        self.per_address: Counter[str] = Counter()
        self.port: int | None = None
        self.metrics_port: int | None = None
        self._stop = anyio.Event()

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
        # (The client's address is not known yet at this point of the handshake.)
        log.warning("refused HTTP request for %r: %s (%d)", request.path[:100], why, status.value)
        return _response(status, body.encode())

    def _process_request(self, connection: WebSocket, request: Request) -> Response | None:
        """Check the Host, then the Origin, then route; refusals come before anything else."""
        hosts = request.headers.get_all("Host")
        if len(hosts) != 1:
            why = "no Host header" if not hosts else f"{len(hosts)} Host headers"
            return self._refuse(request, http.HTTPStatus.BAD_REQUEST, why, f"bad request: {why}\n")
        host = host_name(hosts[0])
        if host is None:
            why = f"malformed Host header {hosts[0][:100]!r}"
            return self._refuse(request, http.HTTPStatus.BAD_REQUEST, why, f"bad request: {why}\n")
        path = urlsplit(request.path).path
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
        if path == "/live":
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
            return self.metrics_response()
        return _response(http.HTTPStatus.NOT_FOUND, b"not found\n")

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
        """The `--metrics-port` listener: `/metrics` and nothing else."""
        if urlsplit(request.path).path == "/metrics":
            return self.metrics_response()
        return _response(http.HTTPStatus.NOT_FOUND, b"not found: this port serves /metrics\n")

    def _static(self, name: str) -> Response:
        root = WEB_ROOT.resolve()
        target = (root / name).resolve()
        if root not in target.parents or not target.is_file():
            return _response(http.HTTPStatus.NOT_FOUND, b"not found\n")
        kind = "text/javascript" if target.suffix in (".js", ".mjs") else (
            mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        )
        return _response(http.HTTPStatus.OK, target.read_bytes(), kind)

    # ------------------------------------------------------------------ sockets

    async def reattach(
        self, temporary: ClientSession, message: SessionResume
    ) -> dict[str, Any] | None:
        """A socket asks to take over a live session: attach it here, relay it to
        the server of the fleet that holds it, or (its holder gone) return the
        session's stored facts for `temporary` to carry it on. None: handled."""
        ws = temporary.ws
        assert ws is not None
        session = self.live_sessions.get(message.session_id)
        if session is not None and session.end_reason is None and session.resume_digest:
            if not token_matches(message.resume_token, session.resume_digest):
                self._resume_unauthorized(temporary, message)
                return None
            temporary.handed_off = True
            await session.attach(ws, message.last_seq)
            await session.serve_socket(ws)
            return None
        if self.fleet is not None and not self.stopping:
            address, state = await self.fleet.locate(message.session_id)
            if address is not None:
                temporary.handed_off = True
                await self._relay(ws, address, message)
                return None
            digest = (state or {}).get("resume_digest")
            if state is not None and digest:
                if not token_matches(message.resume_token, digest):
                    self._resume_unauthorized(temporary, message)
                    return None
                if state.get("agent") == self.agent.name and await self.fleet.take_over(
                    message.session_id
                ):
                    return state
        text = (
            f"no session {message.session_id[:40]!r} to resume here: it ended, or the "
            "client stayed away longer than the server waits"
        )
        log.info("resume refused from %s: session_expired", temporary.peer)
        temporary.finish(text, CLOSE_NORMAL, ErrorEvent("session_expired", text, True))
        return None

    def _resume_unauthorized(self, temporary: ClientSession, message: SessionResume) -> None:
        text = "session.resume: the resume token does not match this session"
        log.warning(
            "resume of session %s refused from %s: wrong token",
            message.session_id[:40], temporary.peer,
        )
        temporary.finish(text, CLOSE_POLICY, ErrorEvent("unauthorized", text, True))

    async def _relay(self, ws: WebSocket, address: str, message: SessionResume) -> None:
        """Carry a client's socket to the server of the fleet that holds its session."""
        log.info("relaying a resume of session %s to %s", message.session_id[:40], address)
        try:
            async with ws_connect(address, max_size=None, compression=None, open_timeout=5) as upstream:
                await upstream.send(encode(message))

                async def pump(source: Any, sink: Any) -> None:
                    with contextlib.suppress(ConnectionClosed):
                        async for frame in source:
                            await sink.send(frame)
                    tg.cancel_scope.cancel()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(pump, ws, upstream)
                    tg.start_soon(pump, upstream, ws)
        except (OSError, TimeoutError, InvalidHandshake) as exc:
            log.warning("relay to %s failed: %s", address, exc)
        with contextlib.suppress(ConnectionClosed):
            await ws.close(CLOSE_SERVICE_RESTART, "reattach again")

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

    def _admission(self, session: ClientSession) -> ErrorEvent | None:
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
        if self.per_address[session.peer] >= config.max_sessions_per_ip:
            return ErrorEvent(
                "address_limit",
                f"your address already has {config.max_sessions_per_ip} sessions open "
                "(the server's limit per address); close one and try again",
                True,
            )
        return None

    async def _handle(self, ws: WebSocket) -> None:
        session = ClientSession(self, ws)
        refusal = self._admission(session)
        if refusal is not None:
            log.warning("refused a socket from %s: %s: %s", session.peer, refusal.code, refusal.message)
            await session._send_now(refusal)
            await ws.close(CLOSE_TRY_LATER, refusal.code)
            session.obs.ended(refusal.code, refusal)
            return
        self.sessions.add(session)
        self.pending.add(session)
        self.per_address[session.peer] += 1
        try:
            if self._stop.is_set():
                session.shutdown()
            await session.run()
        finally:
            self.sessions.discard(session)
            self.pending.discard(session)
            self.per_address[session.peer] -= 1
            if self.per_address[session.peer] <= 0:
                del self.per_address[session.peer]

    async def serve(self, *, task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until `stop()`; then tell and close every session, and return."""
        config = self.config
        async with serve(
            self._handle,
            config.host,
            config.port,
            ssl=tls_context(config.certfile, config.keyfile) if config.certfile else None,
            process_request=self._process_request,
            # Frames up to 2x the limit are read and refused with a clear error;
            # larger ones are cut off by the socket itself (also 1009).
            max_size=config.max_frame_bytes * 2,
            max_queue=WS_QUEUE_FRAMES,
            server_header="live",
            # Browsers offer permessage-deflate; it is never accepted: PCM does
            # not compress, so it would only spend CPU on every audio frame.
            reuse_port=config.reuse_port or None,
            ping_interval=20,
            ping_timeout=20,
        ) as server, contextlib.AsyncExitStack() as stack:
            self.port = _bound_port(server)
            if config.metrics_port is not None:
                metrics_server = await stack.enter_async_context(
                    serve(
                        self._refuse_socket,
                        config.host,
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
                if self.fleet is not None:
                    tg.start_soon(
                        self.fleet.run,
                        lambda: {i: s.durable_state() for i, s in self.live_sessions.items()},
                    )
                await self._stop.wait()
                if self.fleet is not None:
                    await self.drain()
                    await self.fleet.retire()
                tg.cancel_scope.cancel()
            for session in list(self.sessions):
                session.shutdown()
            with anyio.move_on_after(config.shutdown_grace + 1):
                while self.sessions:
                    await anyio.sleep(0.02)
            server.close(close_connections=True)
            await server.wait_closed()

    def advertised_url(self) -> str:
        """The WebSocket URL other servers of a fleet reach this one at."""
        host = self.config.host
        if host in _WILDCARD_HOSTS:
            host = socket.getfqdn()
        shown = f"[{host}]" if ":" in host else host
        scheme = "wss" if self.config.certfile else "ws"
        return f"{scheme}://{shown}:{self.port}/live"

    def stop(self) -> None:
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


def _heard_event(heard: tuple[str, float]) -> TranscriptOutput:
    return TranscriptOutput(heard[0], True, heard=True, played=round(heard[1], 3))


def tune_gc_for_serving(young: int = 10_000) -> None:
    """Garbage-collector settings for a process that serves sessions; call once, loaded.

    Every audio frame allocates a few short-lived objects, and with hundreds of
    sessions the objects in flight cross CPython's default young-generation
    threshold (700) dozens of times a second; each crossing collects, and every
    tenth promotes into a full collection of the whole heap, which stops every
    session at once (140 ms pauses at 200 sessions). A threshold of `young`
    net allocations is rarely crossed by objects in flight, only by garbage
    that accumulates, and freezing what was loaded before serving keeps it out
    of every full collection. Process-wide, hence for entry points, not for a
    library: `live serve` calls it.
    """
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, old)


def _frames_waiting(ws: WebSocket) -> Callable[[], int]:
    """How many frames were read from the client's socket and not yet taken, as
    a function; always 0 where the socket does not say (e.g. a test's fake)."""
    return getattr(ws, "frames_waiting", None) or (lambda: 0)


def _peer(connection: WebSocket) -> str:
    try:
        address = connection.remote_address
    except Exception:
        return "?"
    return str(address[0]) if address else "?"


def _control_size(item: types.Content | RealtimeInput) -> int:
    """About what a control item holds in memory: its text and tool-result payloads."""
    if not isinstance(item, types.Content):
        return 0
    size = 0
    for part in item.parts or ():
        if part.text:
            size += len(part.text)
        if part.function_response is not None and part.function_response.response:
            size += len(json.dumps(part.function_response.response, default=str))
    return size


def _bearer(ws: WebSocket) -> str | None:
    """The token of the handshake's `Authorization: Bearer` header (non-browser clients)."""
    request = ws.request
    if request is None:
        return None
    values = request.headers.get_all("Authorization")
    if len(values) != 1:
        return None
    scheme, _, token = values[0].strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


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
