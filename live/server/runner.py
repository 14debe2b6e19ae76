"""One conversation, from its opening to its end: the session runner.

The rules of a conversation live in `live.engine.session.SessionCore`, a state machine
that answers what happens with actions. The runner feeds it (client input from
the `ClientAttachment`, model responses from the `ModelLink`, tool outcomes from
`ToolTasks`) and carries its actions out: audio and events into the outbox,
input into the upstream queue, tool tasks started or cancelled, the end of the
session. It owns every task the session starts, in one anyio task group:
cancelling the session's scope ends them all, and nothing outlives it.

The runner never knows which front door its client came through: the door
(`live.doors`) turns frames into session inputs and events into frames.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

import anyio
from google.genai import types

from live.engine.actions import (
    AwaitClientTool,
    CancelTool,
    CloseSession,
    FlushAudio,
    ImageUpstream,
    PlaybackReported,
    RunTool,
    SendAudio,
    SendEvent,
    ToUpstream,
)
from live.agent import session_control
from live.server.attachment import ClientAttachment
from live.protocol.closes import (
    CLOSE_GOING_AWAY,
    CLOSE_INTERNAL,
    CLOSE_NORMAL,
    CLOSE_POLICY,
    CLOSE_SERVICE_RESTART,
    CLOSE_TOO_BIG,
    CLOSE_TRY_LATER,
)
from live.doors.base import FrontDoor, SessionTask
from live.errors import (
    ConfigurationError,
    InvalidArgumentError,
    LiveError,
    QuotaExhaustedError,
    RecoverableConnectionError,
)
from live.families import family_of
from live.fleet.member import Admission
from live.engine.heard import HeardTracker, InterruptedReply
from live.engine.turns.controller import TurnController
from live.llm import ClientTurns, ContextChange, RealtimeInput, RealtimeText
from live.observe.logs import current_session
from live.server.model_link import ModelLink
from live.observe.watch import SessionObserver
from live.protocol import (
    ErrorEvent,
    ServerEvent,
    SessionClosed,
    SessionReattached,
    SessionResume,
    SessionStart,
    SessionStarted,
    Text,
    TranscriptOutput,
    TurnComplete,
    TurnInterrupted,
    encode,
)
from live.server.policies import SessionPolicies, plan_for, session_ends_at
from live.server.queues import ClientOutbox, OutboxOverflow, UpstreamQueue, control_size
from live.observe.record import SessionRecord, current_record
from live.engine.session import SessionCore
from live.server.tool_tasks import ToolTasks
from live.server.client_input import ClientInput
from live.server.fleet_handover import FleetHandover
from live.server.heard_replies import HeardReplies
from live.server.server_turns import ServerTurns

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from live.agent import Agent
    from live.fleet.member import Fleet, TokenUses
    from live.llm import BaseLlm
    from live.net.websocket import WebSocket
    from live.observe.metrics import Metrics
    from live.observe.record import Recorder
    from live.server.backends import Backends
    from live.server.config import ServerConfig
    from live.server.detection import EndOfTurnChecks, VoiceDetection

__all__ = ["SessionRunner", "SessionServer"]


class SessionServer(Protocol):
    """What a session runner needs of the server that admitted it."""

    agent: Agent
    agent_manual_activity: bool
    config: ServerConfig
    clock: Callable[[], float]
    metrics: Metrics
    measured_llm: BaseLlm
    backends: Backends
    fleet: Fleet | None
    recorder: Recorder | None
    spent_tokens: TokenUses
    live_sessions: dict[str, SessionRunner]

    def not_pending(self, session: SessionRunner) -> None: ...
    voice_detection: VoiceDetection
    end_of_turn: EndOfTurnChecks

    def turn_models_missing(self, smart: bool) -> str | None: ...

    @property
    def stopping(self) -> bool: ...

    def client_address(self, ws: Any) -> str: ...

    def record_header(self, start: SessionStart) -> dict[str, Any]: ...

    async def reattach(self, session: SessionRunner, message: SessionResume) -> dict[str, Any] | None: ...

    def token_admitted(self, session: SessionRunner) -> None: ...

    async def park(self, session: SessionRunner, seconds: float) -> None: ...

    def vouched(self, session: SessionRunner) -> None: ...

log = logging.getLogger("live.server")


class SessionRunner(ClientInput, ServerTurns, HeardReplies, FleetHandover):
    """One client's conversation and the sequence of model connections it drives.

    Its jobs beside the conversation's own are mixins, each in a module of its
    own: reading the client's frames (`live.server.client_input`), the server's
    own turn-taking (`live.server.server_turns`), what the user heard of an
    interrupted reply (`live.server.heard_replies`), and its part in a fleet
    (`live.server.fleet_handover`).
    """

    def __init__(self, server: SessionServer, ws: WebSocket, door: FrontDoor) -> None:
        self.server = server
        self.config = config = server.config
        self.id = uuid.uuid4().hex[:12]
        self.agent = server.agent
        self.llm = server.measured_llm
        self.backends = server.backends
        self.spent_tokens = server.spent_tokens
        self.peer_of = server.client_address
        self.model = server.agent.model
        self.clock = server.clock
        self.door = door
        # The largest message its client may send, and the largest image in one.
        self.frame_limit = door.max_message_bytes or config.max_frame_bytes
        self.image_limit = config.image_limit_within(self.frame_limit)
        self.outbox = ClientOutbox(
            max_audio_seconds=config.outbound_audio_seconds,
            lead=config.audio_lead,
            clock=server.clock,
        )
        self.upstream: UpstreamQueue[types.Content | ClientTurns | RealtimeText | RealtimeInput] = UpstreamQueue(
            max_audio=config.audio_queue_frames,
            max_audio_bytes=config.audio_queue_bytes,
            max_control_bytes=config.control_queue_bytes,
        )
        self.core: SessionCore = cast(SessionCore, None)  # set once the session starts
        # Who ends the user's turns: "auto" (the model), "manual" (the client),
        # "server" (`turns`, this server's voice detection). The model's own
        # detection is off (`manual_activity`) for the last two.
        self.turn_taking = "auto"
        self.manual_activity = False
        self.turns: TurnController | None = None
        self.client_config: types.LiveConnectConfig | None = None  # from the client's setup, if its door reads one
        self.handed_off = False  # this socket's handler gave it to another session
        self.adopted: dict[str, Any] | None = None  # facts of a session taken over from the fleet
        self.to_fleet = False  # handed to another server of the fleet: its state stays stored
        self.parked = False  # its client left and may come back: its facts are kept (`park`)
        self.ends_at: float | None = None  # wall-clock end its token sets (max_duration, ends_at)
        self.end_reason: str | None = None
        self.close_code = CLOSE_NORMAL
        self.audio_frames_in = 0
        self.tg: TaskGroup = cast("TaskGroup", None)  # the session's task group, once it runs
        self._scope: anyio.CancelScope | None = None
        self._final_error: ErrorEvent | None = None
        self._reported_drops = 0
        self._held_from = 0  # dropped_while_held when the current hold began
        self._log_started = False
        self.record: SessionRecord | None = None
        self.heard = HeardTracker()
        self._heard_event: TranscriptOutput | None = None
        self.reports_playback = False  # set from session.start
        # Replies the model completed, and the door's reports that what was sent
        # before them has played (`PlayedOut`): what a goodbye waits for.
        self.turns_completed = 0
        self.played_out = 0
        self._played = anyio.Event()
        self._awaiting_playback = anyio.CancelScope()
        self._awaited_reply: InterruptedReply | None = None
        # Conversation policies (live.server.policies), once the session starts:
        # what they hold of the user's input, and their hook on each audio frame.
        self.policies: SessionPolicies = cast(SessionPolicies, None)
        self.input_held = False
        self._held_for_calls = False
        self.hears: Callable[[bytes], bool] | None = None
        agent = server.agent
        self.obs = SessionObserver(
            server.metrics,
            model=self.model,
            agent=agent.name,
            tools=[*agent.tools_by_name, *(d.name or "" for d in agent.client_tools)],
            door=door.name,
        )
        self.client = ClientAttachment(self, ws, door)
        self.link = ModelLink(self)
        self.tools = ToolTasks(self)

    @property
    def server_stopping(self) -> bool:
        return self.server.stopping

    # The client's socket, address and resume digest, as the server asks for them.

    @property
    def ws(self) -> WebSocket | None:
        return self.client.ws

    @property
    def peer(self) -> str:
        return self.client.peer

    @property
    def resume_digest(self) -> str | None:
        return self.client.resume_digest

    # ------------------------------------------------------------------ ending

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

    def internal_error(self) -> None:
        self.finish(
            "internal error",
            CLOSE_INTERNAL,
            ErrorEvent("internal_error", "the server failed; see its log", True),
        )

    def frame_too_large(self, size: int) -> None:
        message = f"frame of {size} bytes exceeds the {self.frame_limit}-byte limit"
        self.finish(message, CLOSE_TOO_BIG, ErrorEvent("frame_too_large", message, True))

    def _model_failed(self, exc: LiveError) -> None:
        self.finish(f"model: {exc}", CLOSE_INTERNAL, ErrorEvent(_error_code(exc), str(exc), True))

    # ------------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        started = self.clock()
        start: SessionStart | SessionResume | None = None
        client = self.client
        current_session.set(self.id)  # this task's context: every line it logs names the session
        self.obs.opened()
        try:
            with anyio.CancelScope() as scope:
                self._scope = scope
                if self.end_reason is not None:
                    scope.cancel()
                try:
                    start = await client.await_opening()
                finally:
                    self.server.not_pending(self)
                if client.grant is not None:
                    self.server.token_admitted(self)
            if self.end_reason is not None or start is None:
                return
            if self.door.checks_own_credentials and isinstance(start, SessionStart):
                # A carrier's stream for a real call: not a client address's socket.
                self.server.vouched(self)
            if isinstance(start, SessionResume):
                adopted = await self.server.reattach(self, start)
                if adopted is None:
                    return
                start = self._adopt(start, adopted)
            if not self._choose_turn_taking(start):
                return
            self.client_config = start.config
            self._start_record(start)
            self.reports_playback = start.reports_playback
            agent = self.server.agent
            caps = self.door.capabilities
            self.core = SessionCore(
                input_rate=start.input_rate,
                server_tools=frozenset(agent.tools_by_name),
                client_tool_timeout=agent.client_tool_timeout if caps.client_tool_deadline else None,
                results_by_id=caps.results_by_id,
                cut_replies_repeated=caps.cut_replies_repeated,
                manual_activity=self.manual_activity,
                server_turns=self.turn_taking == "server",
                max_image_bytes=self.image_limit,
                max_image_rate=self.config.max_image_rate,
                video_capped=not agent.context_compression,
                family=family_of(self.model),
                usage_with_turn_end=caps.usage_with_turn_end,
            )
            self.core.scheduling.update(agent.tool_scheduling)
            if self.adopted is not None:
                self.core.restore(self.adopted.get("core") or {})
            else:
                self.core.transcript.seed(start.history)
            if self.turn_taking == "server":
                self._take_turns(start)
            with anyio.CancelScope() as scope:
                # Cancelling this scope ends every task of the session; each model
                # connection's own exit (shielded by the implementation) still
                # closes it upstream.
                self._scope = scope
                if self.end_reason is not None:
                    scope.cancel()
                async with anyio.create_task_group() as tg:
                    self.tg = tg
                    grant = client.grant
                    # A session taken over keeps the end the token that opened it set
                    # (`ends_at`, stored), not one from the token its resume carried.
                    if self.adopted is None and grant is not None:
                        self.ends_at = grant.ends_at
                        if grant.max_duration is not None:
                            self.ends_at = min(self.ends_at or math.inf, time.time() + grant.max_duration)
                    if self.adopted is None:  # and the agent's own limit (stored: it holds on takeover)
                        self.ends_at = session_ends_at(agent, self.door, self.ends_at)
                    self._start_policies(start)
                    if self.ends_at is not None:
                        tg.start_soon(self._limit_duration, self.ends_at)
                    await self._converse(start)
        except* LiveError as group:
            self._model_failed(group.exceptions[0])  # type: ignore[arg-type]
        except* Exception:
            log.exception("session %s failed", self.id)
            self.internal_error()
        finally:
            if self.turns is not None:
                self.server.voice_detection.remove(self.turns.stream)
            if self.policy_voice_stream is not None:
                self.server.voice_detection.remove(self.policy_voice_stream)
            if self.handed_off:
                self.obs.abandon()
                return  # this socket served another session, which closes it
            await self._close(started)

    async def _close(self, started: float) -> None:
        """Tell the client how the session ended, close its socket, and account."""
        self.server.live_sessions.pop(self.id, None)
        client = self.client
        reason = self.end_reason or "client disconnected"
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.config.shutdown_grace):
            ws = client.ws
            if self.to_fleet:
                # Another server carries it on: the client reattaches there.
                if ws is not None:
                    await ws.close(CLOSE_SERVICE_RESTART, "server restarting: reattach")
            else:
                if self.core is not None:
                    # Ended here, not by the client: end what it is on (a call is hung up).
                    await self.door.end(reason)
                if self._final_error is not None:
                    await client.send_now(self._final_error)
                await client.send_now(SessionClosed(reason))
                if ws is not None:
                    code, text = self.door.closing(self.close_code, reason, self._final_error)
                    # A close frame carries at most 123 bytes of reason.
                    await ws.close(code, text.encode()[:123].decode("utf-8", "ignore"))
            fleet = self.server.fleet
            if self.parked and self.core is not None:
                await self.server.park(self, self.door.kept_after_leaving or 0.0)
            elif fleet is not None and self.core is not None:
                await fleet.ended(self.id, keep_state=self.to_fleet)
        client.let_go()
        if self.record is not None:
            self.record.close(reason)
        client.frames_seen()
        core = self.core
        self.obs.ended(
            reason,
            self._final_error,
            late_dropped=core.late_audio_dropped if core else 0,
            flushed=self.outbox.flushed_frames,
        )
        if self._log_started:
            summary = {
                "model": self.model,
                "duration": round(self.clock() - started, 1),
                "reason": reason,
                "audio_in": self.audio_frames_in,
                "audio_dropped": self.upstream.dropped_audio,
                "late_audio_dropped": core.late_audio_dropped if core else 0,
                "reconnects": self.link.reconnects,
                "tokens": core.tokens_used if core else 0,
                "token_id": client.grant.token_id if client.grant else None,
            }
            log.info(
                "session %s ended model=%s duration=%.1fs reason=%s audio_in=%d "
                "audio_dropped=%d late_audio_dropped=%d reconnects=%d tokens=%d token_id=%s",
                self.id,
                *summary.values(),
                extra={"fields": {"event": "session.ended", **summary}},
            )

    def _start_policies(self, start: SessionStart) -> None:
        """The conversation policies this session runs (live.server.policies), and
        where its tools reach them (`end_session`, `play_must_hear`)."""
        push_to_talk = self.turn_taking == "manual"
        ends_at = None if self.ends_at is None else self.clock() + (self.ends_at - time.time())
        plan = plan_for(self.agent, self.door, start, ends_at=ends_at, opened=self.adopted is not None,
                        push_to_talk=push_to_talk)
        self.policies = SessionPolicies(self, plan, input_rate=start.input_rate)
        session_control.set(self.policies)

    async def _converse(self, start: SessionStart) -> None:
        """Open the first model connection, start the client's pumps, then
        supervise the model side until the session ends."""
        client = self.client
        fleet = self.server.fleet
        if self.adopted is None:
            admission = Admission.ADMITTED if fleet is None else await fleet.admit(self.id)
            if admission is not Admission.ADMITTED:
                if admission is Admission.FULL:
                    message = f"the service is at its limit of {fleet.max_sessions_global} sessions; try again later"
                else:  # the limit is a promise: no count, no new session
                    message = "the service cannot count its sessions right now; try again shortly"
                self.finish(message, CLOSE_TRY_LATER, ErrorEvent("capacity", message, True))
                return
            link = await self.link.open_first(start.history)
            # The session opens now: only now does it spend a use of its token.
            refusal = await client.spend_token()
            if refusal is not None:
                log.warning("session %s refused from %s: unauthorized: %s", self.id, client.peer, refusal)
                self.finish(refusal, CLOSE_POLICY, ErrorEvent("unauthorized", refusal, True))
                return
            resume_token = None
            if self.config.reattach_grace > 0 and self.door.resumable():
                if not self.door.capabilities.reattach:
                    client.keep_for_reattach()
                resume_token = client.new_resume_token()
                self.server.live_sessions[self.id] = self
            if fleet is not None:
                # Its lease and facts (its resume token's digest) are in the store
                # before the client holds the token.
                await fleet.started(self.id, self.durable_state())
            await client.send_now(
                SessionStarted(
                    self.id,
                    self.model,
                    start.input_rate,
                    resume_token=resume_token,
                    max_image_bytes=self.image_limit,
                    max_image_rate=self.config.max_image_rate,
                    voice_consent_signature=link.conn.voice_consent_signature,
                )
            )
            link.ready.set()
        else:
            link = await self.link.take_over()
            self.server.live_sessions[self.id] = self
            if not self.door.capabilities.reattach:
                client.keep_for_reattach()
            stored_seq = int(self.adopted.get("last_seq") or 0)
            replay = client.replay
            missed = max(0, stored_seq - replay.last_seq)
            replay.last_seq = max(stored_seq, replay.last_seq)
            # The stored token worked once; the client gets the next, once its
            # digest is in the store (this server may die the moment after).
            resume_token = client.new_resume_token()
            if fleet is not None:
                await fleet.started(self.id, self.durable_state())
            await client.send_now(SessionReattached(self.id, 0, missed, resume_token))
            log.info("session %s taken over from the fleet (handle from the store)", self.id)
        self.obs.started(self.clock())
        log.info(
            "session %s started model=%s input_rate=%d door=%s", self.id, self.model, start.input_rate, self.door.name
        )
        self._log_started = True
        tg = self.tg
        tg.start_soon(client.read_client, client.ws)
        tg.start_soon(client.write_client)
        tg.start_soon(self._watch_idle)
        self.policies.start()
        await self.link.supervise(link)

    def poke(self) -> None:
        """Something the model link's supervisor acts on may have changed."""
        self.link.poke()

    def sync_hold(self) -> None:
        """Hold realtime input while the model takes none (a call is owed, on a
        model that closes the connection on input then), and let it go after;
        say what a long hold dropped."""
        upstream = self.upstream
        hold = self.core.holds_realtime or self.input_held  # or a must-hear segment plays
        if hold == upstream.holding:
            return
        upstream.hold(hold)
        if hold:
            self._held_from = upstream.dropped_while_held
            self._held_for_calls = self.core.holds_realtime
            return
        dropped = upstream.dropped_while_held - self._held_from
        if dropped and self._held_for_calls:
            self.event(
                ErrorEvent(
                    "input_held",
                    f"this model takes no audio while it waits for a tool's result: what you said "
                    f"meanwhile was held, and {dropped} frame(s) beyond the last two seconds were dropped",
                )
            )

    # ------------------------------------------------------------------ limits

    def _start_record(self, start: SessionStart) -> None:
        """With `--record`: open this session's record; the model side finds it too."""
        recorder = self.server.recorder
        if recorder is None:
            return
        header = {**self.server.record_header(start), "door": self.door.name, **self.door.record_header()}
        if start.config is not None:  # what the client's own setup asked of the model
            header["client_config"] = start.config.model_dump(mode="json", exclude_none=True)
        self.record = recorder.start(self.id, header, input_rate=start.input_rate)
        if self.record is not None:
            current_record.set(self.record)  # read by Recorded(llm) in this session's tasks
            self.record.client_event(start.to_json())

    async def _limit_duration(self, ends_at: float) -> None:
        """End the session when its time runs out (`ends_at`: the agent's max_duration, or its
        token's max_duration or end, wall-clock: it holds on whichever server of a fleet
        carries it). The agent's goodbye (live.engine.policies) comes before, where it applies."""
        await anyio.sleep(max(0.0, ends_at - time.time()))
        message = "the session reached its time limit (its token's or its agent's max_duration, or the end its token names)"
        self.finish(message, CLOSE_NORMAL, ErrorEvent("session_expired", message, True))

    async def _watch_idle(self) -> None:
        """Ends the session after `idle_timeout` without client input (noticed to
        within a second: it looks at most once a second)."""
        idle = self.config.idle_timeout
        client = self.client
        while True:
            client.frames_seen()
            if client.ws is None:  # the client is away: the reattach grace applies
                client.last_client_frame = self.clock()
                await anyio.sleep(1.0)
                continue
            remaining = client.last_client_frame + idle - self.clock()
            if remaining <= 0:
                error = ErrorEvent("idle_timeout", f"no input from the client for {idle:g} s", True)
                self.finish("idle timeout", error=error)
                return
            self.obs.catch_up(self.core.late_audio_dropped if self.core else 0, self.outbox.flushed_frames)
            await anyio.sleep(min(remaining, 1.0))

    # ------------------------------------------------------------------ actions

    def event(self, event: ServerEvent) -> None:
        """An event for the client, in order with the stream.

        An event whose frames depend on the audio before it (the door's
        `in_step_events`) waits in the outbox as itself; the writer asks the
        door for its frames when its turn comes in the paced stream."""
        self.obs.event(event)
        if type(event) is TurnComplete:
            self.turns_completed += 1
        frame: object = event if type(event) in self.door.in_step_events else self.door.event(event)
        if frame is None:
            if self.record is not None:
                self.record.unsent_event(encode(event))  # what a phone cannot show, kept (a heard transcript)
            return
        try:
            for each in frame if isinstance(frame, tuple) else (frame,):
                self.outbox.put_event(each)
        except OutboxOverflow as exc:
            self.finish(f"client too slow: {exc}", CLOSE_POLICY)

    async def apply(self, actions: list[Any]) -> None:
        """Carry out what the session core decided."""
        if actions:
            self.obs.actions(actions, self.clock())
            if self.policies.tracking:
                self.policies.seen(actions)
        for action in actions:
            if isinstance(action, SendAudio):
                self.heard.audio_queued(len(action.data))
                await self.outbox.put_audio(action.data)
            elif isinstance(action, SendEvent):
                event = action.event
                if isinstance(event, TurnInterrupted):
                    frame = self.door.event(event)
                    if frame is None:
                        self.outbox.flush_audio()
                    else:
                        self.outbox.put_urgent(frame)
                    if self._heard_event is not None:
                        self.event(self._heard_event)  # what the user heard, right after
                        self._heard_event = None
                else:
                    if type(event) is TranscriptOutput and not event.final and not event.late:
                        self.heard.fragment(event.text)
                    elif type(event) is TurnComplete:
                        self.heard.reply_ended()
                    self.event(event)
            elif isinstance(action, ToUpstream):
                item = action.item
                await self.upstream.put_control(
                    item, control_size(item), realtime=not isinstance(item, (types.Content, ClientTurns, ContextChange))
                )
            elif isinstance(action, ImageUpstream):
                if self.upstream.put_image(action.blob, len(action.blob.data or b"")):
                    self._report_image_drops()
            elif isinstance(action, FlushAudio):
                self._interrupted(self.heard.interrupted(self.outbox.unplayed_seconds()))
                self.outbox.flush_audio()  # the client is told by the urgent event that follows
            elif isinstance(action, PlaybackReported):
                self._heard_reported(action.played)
            elif isinstance(action, RunTool):
                self.tools.run_server_tool(action.call)
            elif isinstance(action, AwaitClientTool):
                self.tools.await_client_tool(action.call.id or "", action.timeout)
            elif isinstance(action, CancelTool):
                self.tools.cancel(action.call_id)
            elif isinstance(action, CloseSession):
                self.finish(action.reason)
        if self.client.tells_resumption:
            self.client.resumption_point(self.core.at_safe_point)

    # ------------------------------------------------------------------ the door's signals

    def _played_out(self) -> None:
        """The door says the client played everything sent so far."""
        if self.policies is not None:  # None before the session started
            self.policies.played_out()
        self.played_out += 1
        self._played.set()
        self._played = anyio.Event()

    async def _door_task(self, task: SessionTask) -> None:
        """What a door asked the session to run (an agent's async key handler):
        its failure is logged, never the session's end."""
        try:
            await task.run()
        except Exception:
            log.exception("session %s: %s failed", self.id, task.name)

    async def wait_played_out(self) -> None:
        """Until the door next says the client played all it was sent."""
        await self._played.wait()

    async def say_goodbye(self, instruction: str, timeout: float) -> None:
        """Have the agent say goodbye (`instruction` tells it so), wait until the
        client has heard it (or `timeout`), then end the session: for a phone
        call, the door hangs up."""
        if self.core is None or self.end_reason is not None:
            return
        with anyio.move_on_after(timeout):
            done = self.turns_completed
            await self.apply(self.core.client_message(Text(instruction), self.clock()))
            self.poke()
            while self.turns_completed <= done and self.end_reason is None:
                await anyio.sleep(0.05)
            if self.door.capabilities.reports_played_out:
                await self.wait_played_out()

        self.finish("server stopping: the call ended with a goodbye", CLOSE_GOING_AWAY)


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
