"""The model side of one session: its sequence of model connections.

A client's conversation outlives model connections: the service ends each after
about ten minutes (with a go-away first), drops some, and a model can stall.
`ModelLink` opens the first connection, then performs what `live.engine.supervisor`
decides about the one in use: wait, hand over to a new connection at a safe
point before a go-away's deadline, resume on a new one after a drop or a stall
(retrying with backoff), move to another backend of the pool (a fresh
connection there, seeded with the transcript: `live.engine.failover`), or give
up. Each connection has two pumps, one sending
the session's queued client input, one feeding the model's responses to the
session core. Input the client sends meanwhile waits in the session's upstream
queue and goes out on the new connection; history is never sent again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, cast

import anyio
import pydantic
from anyio.abc import TaskStatus
from google.genai import types

from live.agent import Agent
from live.backends import Target
from live.engine.failover import failure_label
from live.engine.session import SessionCore
from live.errors import (
    ConfigurationError,
    ConnectionClosedError,
    LiveError,
    QuotaExhaustedError,
    RecoverableConnectionError,
)
from live.families import family_of
from live.llm import BaseLlm, BaseLlmConnection, ClientTurns, ContextChange, LlmRequest, RealtimeInput, RealtimeText
from live.protocol import ErrorEvent, SessionReconnecting, SessionResumed
from live.engine.supervisor import ReconnectPolicy
from live.engine.supervisor import (
    CLOSED,
    GiveUp,
    HandOver,
    Move,
    Outcome,
    Resume,
    Stall,
    Supervisor,
    Wait,
    wait_seconds,
)

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from live.observe.watch import SessionObserver
    from live.protocol import ServerEvent
    from live.server.backends import Backends
    from live.server.config import ServerConfig
    from live.server.queues import UpstreamQueue

__all__ = ["Connection", "LinkHost", "ModelLink", "stored_client_config", "with_client_config"]


class LinkHost(Protocol):
    """What a session's model link needs of its session."""

    id: str
    agent: Agent
    llm: BaseLlm  # the model, as the server measures it
    backends: Backends  # where its model connections may go
    config: ServerConfig
    core: SessionCore
    tg: TaskGroup
    obs: SessionObserver
    upstream: UpstreamQueue[types.Content | ClientTurns | ContextChange | RealtimeText | RealtimeInput]
    manual_activity: bool
    client_config: types.LiveConnectConfig | None
    clock: Callable[[], float]

    async def apply(self, actions: list[Any]) -> None: ...

    def event(self, event: ServerEvent) -> None: ...

    def facts_changed(self) -> None: ...

    def sync_hold(self) -> None: ...

    def reopen_turn(self) -> None: ...

log = logging.getLogger("live.server")

CONTROL_SEND_TIMEOUT = 10.0  # seconds a typed turn or tool result may take to reach the model


class Connection:
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
        # The model answered on it: it got past setup and worked.
        self.worked = False
        # Set once it is closed upstream (its task left `connect()`).
        self.closed = anyio.Event()
        self._scope = scope
        self._poke = poke

    def end(self, outcome: Outcome) -> None:
        """The connection ended (a `LiveError`, or CLOSED for a normal close).

        The first outcome is kept; it is the same whichever pump saw the end.
        A 1008 on a connection that worked is no configuration error (those
        come at setup): the service sends "Requested entity was not found."
        mid-session, right after a tool response (forum #109319). It is
        recoverable, and the result it followed is told again as context.
        """
        if self.outcome is None:
            if self.worked and isinstance(outcome, ConfigurationError) and outcome.close_code == 1008:
                outcome = RecoverableConnectionError(
                    f"the model closed a working connection: {outcome.message}", close_code=1008
                )
            self.outcome = outcome
        self._scope.cancel()
        self._poke()

    async def stop_sending(self) -> None:
        self.sending.cancel()
        await self.sender_done.wait()

    def stop(self) -> None:
        """Close the connection: its task leaves `connect()`, which closes upstream."""
        self._scope.cancel()


class ModelLink:
    """Opens, resumes, hands over and retires the model connections of one session."""

    def __init__(self, runner: LinkHost) -> None:
        self._runner = runner
        self.reconnects = 0
        self.fresh_starts = 0  # new connections seeded from the transcript (no usable handle)
        self._news = anyio.Event()
        self.backends = runner.backends
        self.failover = runner.backends.failover()
        self.target: Target | None = None  # where the connection in use is
        config = runner.config
        self._supervisor = Supervisor(
            handover_margin=config.handover_margin,
            stall_timeout=config.stall_timeout,
            policy=ReconnectPolicy(max_failures=config.reconnect_attempts, stable_after=config.stable_after),
            failover=self.failover,
            retries_here=self.backends.policy.retries_here,
        )

    # ------------------------------------------------------------------ opening

    async def open_first(self, history: Sequence[types.Content]) -> Connection:
        """The session's first connection, seeded with the client's history, on
        the healthiest target of the pool; down the pool if it fails (the
        client was told nothing yet)."""
        await self.backends.refresh(self.failover)
        target = self.failover.first()
        while True:
            try:
                return await self._open_on(target, self._request(history, target=target), list(history))
            except LiveError as exc:
                target = await self._start_failed(target, exc)

    async def _start_failed(self, target: Target, exc: LiveError) -> Target:
        """A session's first connection failed on `target`: where to try next,
        or the error that ends the session."""
        await self._failed(target, exc, fresh=True)
        await self.backends.refresh(self.failover)
        step = self._supervisor.start_failed(self._runner.clock(), exc)
        if isinstance(step, GiveUp):
            raise step.error from exc
        self._moving(target, step)
        return step.target

    async def take_over(self) -> Connection:
        """A session taken over from a server that is gone: resume its model
        session from the stored handle on the backend that issued it (or start
        fresh from the stored transcript), and tell the new connection what
        the old one owed."""
        runner = self._runner
        await self._connection_lost()
        await self.backends.refresh(self.failover)
        target = self._stored_target() or self.failover.first()
        self.failover.current = target
        if runner.core.resumption_handle is not None:
            try:
                return await self._open_next(fresh=False, announce=False, target=target)
            except LiveError as exc:
                # The stored handle resumes nothing (expired, or the service lost the
                # session): the stored transcript still carries the conversation.
                log.info("session %s: its stored handle was refused (%s); starting fresh", runner.id, exc)
        while True:
            try:
                return await self._open_next(fresh=True, announce=False, target=target)
            except LiveError as exc:
                target = await self._start_failed(target, exc)

    def _stored_target(self) -> Target | None:
        """The target a fleet's stored facts name (a handle is bound to it)."""
        adopted = getattr(self._runner, "adopted", None) or {}
        name, model = adopted.get("backend"), adopted.get("backend_model")
        return next((t for t in self.backends.targets if t.name == name and t.model == model), None)

    async def _connection_lost(self) -> None:
        """The connection in use is gone: the session core hears it, and what
        waits goes to the next connection as that one must take it."""
        runner = self._runner
        await runner.apply(runner.core.connection_lost())
        runner.sync_hold()  # the new connection owes no call: nothing waits on it
        runner.reopen_turn()  # a user's turn the server holds open starts again there

    def _request(
        self, history: Sequence[types.Content] = (), resume_handle: str | None = None, *, target: Target
    ) -> LlmRequest:
        runner = self._runner
        request = runner.agent.request(
            history, resume_handle=resume_handle, manual_activity=runner.manual_activity
        )
        if runner.client_config is not None:
            request.live_connect_config = with_client_config(request.live_connect_config, runner.client_config)
        return self.backends.fit(request, target)

    async def _open_on(
        self, target: Target, request: LlmRequest, history: Sequence[types.Content] = ()
    ) -> Connection:
        """A connection on `target` (the model rules of its family apply from now)."""
        self._runner.core.family = family_of(target.model)
        await self.backends.claim(target)
        link = await self._runner.tg.start(self._connection, request, history, target)
        self.target = self.failover.current = target
        await self.backends.connected(target)
        return link

    async def _failed(self, target: Target, exc: LiveError, *, fresh: bool) -> None:
        """A connect on `target` failed: what it says of the backend, counted."""
        label = failure_label(exc, fresh=fresh)
        if label is not None:
            await self.backends.failed(target, label, exc)

    def _moving(self, source: Target, step: Move | Resume) -> None:
        if isinstance(step, Move):
            self.backends.moved(source, step.cause)
            log.warning("session %s moves from %s to %s (%s)", self._runner.id, source, step.target, step.cause)

    # ------------------------------------------------------------------ supervising

    async def supervise(self, link: Connection) -> NoReturn:
        """Perform the supervisor's steps for the connection in use, for as long
        as the session lasts; raises the error that ends it."""
        runner = self._runner
        core = runner.core
        supervisor = self._supervisor
        supervisor.connected(runner.clock())
        while True:
            if link.outcome is not None:
                await self._ended(link)
            now = runner.clock()
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
                runner.event(ErrorEvent("model_stalled", step.message))
                runner.obs.reconnecting("stalled")
                link.end(RecoverableConnectionError("the model stalled"))
            elif isinstance(step, (Resume, Move)):
                if self.target is not None:
                    self._moving(self.target, step)
                link = await self._resume(link, step, supervisor)
            else:
                raise step.error

    async def _wait_for_news(self, timeout: float) -> None:
        """Sleep until something the supervisor acts on may have changed.

        Woken by the connection ending, by a go-away, and (during a go-away or
        while a reply is owed) by each change of turn or tool state; otherwise by
        the timer of the nearest deadline.
        """
        self._news = anyio.Event()
        with anyio.move_on_after(timeout):
            await self._news.wait()

    def poke(self) -> None:
        """Something the supervisor acts on may have changed."""
        self._news.set()

    async def _retire(self, link: Connection) -> None:
        """Take a connection out of the conversation and close it: nothing more
        goes to it or comes from it, its sender has stopped (the upstream queue
        has one sender at a time), and it is closed upstream before another is
        opened (resuming from a handle while the connection that issued it is
        still open can be refused with 1011: sip-to-ai PR 14). A close that
        hangs is not waited for past `shutdown_grace`."""
        link.muted = True
        link.stop()
        await link.sender_done.wait()
        with anyio.move_on_after(self._runner.config.shutdown_grace):
            await link.closed.wait()

    async def _ended(self, link: Connection) -> None:
        """How the connection in use ended, counted against its backend: a drop
        (not the close a go-away announced), or quota gone (its breaker opens)."""
        outcome = link.outcome
        target = self.target
        if target is None or not isinstance(outcome, LiveError):
            return
        if link.go_away_at is not None and outcome.recoverable:
            return  # the close a go-away announced
        if isinstance(outcome, QuotaExhaustedError):
            await self.backends.failed(target, "quota", outcome)
        elif outcome.recoverable:
            self.backends.metrics.backend_failures.labels(target.name, "dropped").inc()
        if self.backends.single_target:
            return
        await self.backends.refresh(self.failover)

    async def _resume(self, link: Connection, step: Resume | Move, supervisor: Supervisor) -> Connection:
        """The connection ended: open a new one, retrying as the supervisor says."""
        runner = self._runner
        if link.outcome == CLOSED:
            runner.obs.reconnecting("go_away" if link.go_away_at is not None else "closed")
        await self._retire(link)
        await self._connection_lost()
        return await self._reconnect(step, supervisor)

    async def _reconnect(self, step: Resume | Move, supervisor: Supervisor, *, told: bool = False) -> Connection:
        """Open a new connection as `step` says, retrying (or moving) as the
        supervisor says. The client hears of it once, however many tries it takes."""
        runner = self._runner
        core = runner.core
        while True:
            if not told:
                runner.event(SessionReconnecting(step.reason))
                told = True
            log.info("session %s reconnecting: %s", runner.id, step.reason)
            await anyio.sleep(step.delay)
            target = step.target if isinstance(step, Move) else self.failover.current
            try:
                new = await self._open_next(fresh=isinstance(step, Move) or step.fresh, target=target)
            except LiveError as exc:
                has_handle = core.resumption_handle is not None
                await self._failed(target, exc, fresh=not has_handle)
                await self.backends.refresh(self.failover)
                next_step = supervisor.reconnect_failed(runner.clock(), exc, has_handle=has_handle)
                if isinstance(next_step, GiveUp):
                    raise next_step.error from exc
                assert isinstance(next_step, (Resume, Move))
                self._moving(target, next_step)
                step = next_step
                continue
            supervisor.connected(runner.clock())
            return new

    async def _hand_over(self, link: Connection, supervisor: Supervisor) -> Connection:
        """Go-away: move to a new connection before the old one's deadline.

        The old connection takes nothing more once the hand-over starts, and
        what it still sends is discarded: a reply cut at the deadline ends for
        the client with `turn.complete` (`connection_lost`), and nothing of it
        follows; a call it makes now is one the resumed state never made. It is
        closed before the new one opens (see `_retire`): what the user says
        meanwhile waits in the upstream queue.
        """
        runner = self._runner
        runner.event(SessionReconnecting("the model connection is about to close (go-away)"))
        link.muted = True
        runner.obs.reconnecting("go_away")
        await link.stop_sending()
        await self._retire(link)
        core = runner.core
        await self._connection_lost()
        target = self.failover.current
        try:
            new = await self._open_next(fresh=False, target=target)
        except LiveError as exc:
            # Refused: retry as the supervisor says (fresh, when the handle is
            # unknown; elsewhere, when this backend cannot serve).
            has_handle = core.resumption_handle is not None
            await self._failed(target, exc, fresh=not has_handle)
            await self.backends.refresh(self.failover)
            step = supervisor.reconnect_failed(runner.clock(), exc, has_handle=has_handle)
            if isinstance(step, GiveUp):
                raise step.error from exc
            assert isinstance(step, (Resume, Move))
            self._moving(target, step)
            return await self._reconnect(step, supervisor, told=True)
        supervisor.connected(runner.clock())
        return new

    async def _open_next(self, *, fresh: bool, announce: bool = True, target: Target | None = None) -> Connection:
        """A new connection for the conversation: resumed from the newest handle,
        or, `fresh` or without one, seeded with the session's transcript; on
        `target` (another than the last: a move, always fresh, since a handle
        is bound to the backend and model that issued it)."""
        runner = self._runner
        core = runner.core
        target = target or self.failover.current
        if self.target is not None and target != self.target:
            fresh = True
        if fresh or core.resumption_handle is None:
            core.resumption_handle = None
            history = core.fresh_start(runner.clock())
            link = await self._open_on(target, self._request(history, target=target), history)
            self.fresh_starts += 1
            how = "fresh, seeded with the conversation so far"
        else:
            link = await self._open_on(target, self._request(resume_handle=core.resumption_handle, target=target))
            how = "resumed"
        self.reconnects += 1
        runner.obs.resumed()
        if announce:
            runner.event(SessionResumed())
        link.ready.set()
        await runner.apply(core.connection_resumed(runner.clock()))
        log.info("session %s on a new model connection (%d) on %s, %s", runner.id, self.reconnects + 1, target, how)
        return link

    # ------------------------------------------------------------------ one connection

    async def _connection(
        self,
        request: LlmRequest,
        history: Sequence[types.Content],
        target: Target,
        *,
        task_status: TaskStatus[Connection] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """One model connection on `target` and its two pumps, for as long as it
        lasts; a history goes first, before anything the pumps send."""
        link: Connection | None = None
        backends = self.backends
        try:
            async with backends.llm(target).connect(request) as conn:
                if history:
                    try:
                        await conn.send_history(list(history))
                    except ConnectionClosedError as exc:
                        # Closed right after setup: as the receiver would classify it.
                        raise exc.cause or RecoverableConnectionError(
                            "the model closed the connection before it took the history"
                        ) from exc
                backends.on(target)
                try:
                    async with anyio.create_task_group() as tg:
                        link = Connection(conn, tg.cancel_scope, self.poke)
                        tg.start_soon(self._send_upstream, link, target)
                        tg.start_soon(self._receive_upstream, link)
                        task_status.started(link)
                finally:
                    backends.off(target)
                    if link is not None:
                        link.sender_done.set()
        finally:
            if link is not None:
                link.closed.set()

    async def _send_upstream(self, link: Connection, target: Target) -> None:
        """Client input to the model, in order; an item is removed once it was sent."""
        runner = self._runner
        queue = runner.upstream
        conn = link.conn
        core = runner.core
        send_realtime = conn.send_realtime
        coalesce = runner.config.audio_coalesce_frames
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
                            runner.facts_changed()
                        elif isinstance(items[0], ContextChange):
                            await self._change_context(conn, items[0], target)
                        elif isinstance(items[0], (ClientTurns, RealtimeText)):
                            # The Live API's client content and realtime text,
                            # whole or not at all, as a typed turn goes.
                            item = items[0]
                            with anyio.CancelScope(
                                shield=True, deadline=anyio.current_time() + CONTROL_SEND_TIMEOUT
                            ) as sending:
                                if isinstance(item, RealtimeText):
                                    await conn.send_realtime_text(item.text)
                                else:
                                    await conn.send_turns(item.turns, turn_complete=item.turn_complete)
                            if sending.cancelled_caught:
                                raise RecoverableConnectionError(
                                    f"the model did not take a message within {CONTROL_SEND_TIMEOUT:g} s"
                                )
                            core.content_sent(item)
                            runner.facts_changed()
                        else:
                            await send_realtime(items[0])
                    except BaseException:
                        queue.release()
                        raise
                    queue.commit()
                    if queue.holding:
                        runner.sync_hold()  # a call answered: what was held may follow it
        except ConnectionClosedError as exc:
            # The close as the receiver would classify it, whoever saw it first.
            link.end(exc.cause if exc.cause is not None else CLOSED)
        except LiveError as exc:
            link.end(exc)
        finally:
            link.sender_done.set()

    async def _change_context(self, conn: BaseLlmConnection, change: ContextChange, target: Target) -> None:
        """The client's own instruction or tools change: the session's config
        takes them (every later connection opens with them), and this
        connection (on `target`, whose model's rules fit them) is told the
        whole instruction or tools that now hold."""
        runner = self._runner
        new = change.config
        update = {name: getattr(new, name) for name in ("system_instruction", "tools") if getattr(new, name) is not None}
        if not update:
            return
        runner.client_config = (runner.client_config or types.LiveConnectConfig()).model_copy(update=update)
        runner.facts_changed()  # a session carried on elsewhere opens with them too
        merged = self._request(target=target).live_connect_config
        instruction = merged.system_instruction if "system_instruction" in update else None
        if isinstance(instruction, str):
            instruction = types.Content(role="user", parts=[types.Part(text=instruction)])
        await conn.send_context_update(
            system_instruction=instruction,
            tools=(merged.tools or []) if "tools" in update else None,
        )

    async def _receive_upstream(self, link: Connection) -> None:
        runner = self._runner
        core = runner.core
        obs = runner.obs
        clock = runner.clock
        apply = runner.apply
        try:
            await link.ready.wait()  # the client hears of the connection before anything from it
            async for response in link.conn.receive():
                if link.muted and not response.late_transcription:
                    # Retired: nothing of it reaches the conversation, but the last
                    # words of a turn that completed on it (they may trail it).
                    continue
                now = clock()
                if response.go_away_time_left is not None:
                    link.go_away_at = now + response.go_away_time_left
                owed = core.awaiting_reply_since
                if response.voice_activity is not None:
                    obs.model_response(response, now)
                if not link.worked and (
                    response.content is not None or response.output_transcription is not None or response.turn_complete
                ):
                    link.worked = True  # the model answered on it: past setup, and working
                handle = core.resumption_handle
                calls = len(core.tools)
                await apply(core.model_response(response, now))
                if core.resumption_handle is not handle or len(core.tools) != calls or response.turn_complete:
                    runner.facts_changed()  # what a takeover resumes from
                if core.holds_realtime is not runner.upstream.holding:
                    runner.sync_hold()
                if response.turn_complete or (link.worked and core.resumption_handle is not handle):
                    # It answered (or, having answered, can be resumed): the attempts paid off.
                    self._supervisor.useful()
                # Wake the supervisor only for what it acts on: a go-away, or the
                # owed reply arriving (not every audio chunk after it).
                if link.go_away_at is not None or (
                    owed is not None and core.awaiting_reply_since is None
                ):
                    self.poke()
        except LiveError as exc:
            link.end(exc)
            return
        link.end(CLOSED)


def with_client_config(
    config: types.LiveConnectConfig, client: types.LiveConnectConfig
) -> types.LiveConnectConfig:
    """The agent's connection config with what a client's own setup asked: its
    set fields replace the agent's; its tools are declared besides the agent's,
    and its system instruction follows the agent's."""
    update = {
        name: getattr(client, name)
        for name in client.model_fields_set
        if getattr(client, name) is not None and name not in ("tools", "system_instruction")
    }
    if client.tools:
        update["tools"] = [*(config.tools or []), *client.tools]
    if client.system_instruction is not None:
        # The agent's instruction (the operator's policy, and what its own tools
        # are for) comes first; the app's follows it, never replaces it.
        update["system_instruction"] = _joined_instructions(config.system_instruction, client.system_instruction)
    return config.model_copy(update=update)


def _joined_instructions(first: Any, then: Any) -> types.Content | Any:
    texts = [_instruction_text(x) for x in (first, then)]
    if not texts[0]:
        return then
    return types.Content(role="user", parts=[types.Part(text="\n\n".join(t for t in texts if t))])


def _instruction_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, types.Content):
        return "".join(part.text or "" for part in value.parts or [])
    if isinstance(value, types.Part):
        return value.text or ""
    if isinstance(value, list):
        return "".join(_instruction_text(item) for item in value)
    return str(value)


def stored_client_config(stored: Any, session_id: str) -> types.LiveConnectConfig | None:
    """A client's config as the fleet stored it; None (and a warning) if this
    server cannot read it (another version of google-genai wrote it)."""
    if not isinstance(stored, dict):
        return None
    try:
        return types.LiveConnectConfig.model_validate(stored)
    except pydantic.ValidationError as exc:
        log.warning("session %s: the client's stored config is unreadable here (%d errors); going on without it", session_id, exc.error_count())
        return None
