"""Watching sessions: the model side as decorators, the client side as an observer.

`Measured(llm)` and `Recorded(llm)` are `BaseLlm`s that wrap another: the first
counts what crosses the model connection (connects, messages, tokens from
usage metadata), the second writes it to a session record. They hold no
per-session state, so they work for any model and for in-process use of the
contract without the server. `SessionObserver` is the server's half: it is
told what one client session does (frames, actions of the session core, the
end) and turns it into metrics: turn latency, interruptions, tool outcomes,
errors, drops.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

from google.genai import types

from live.errors import LiveError
from live.llm import BaseLlm, BaseLlmConnection, ClientTurns, LlmRequest, LlmResponse, RealtimeInput, RealtimeText
from live.observe.metrics import Metrics, end_reason_code
from live.protocol import (
    ErrorEvent,
    ServerEvent,
    ToolCallEvent,
    ToolCancelled,
    TurnComplete,
    TurnInterrupted,
    UserStopped,
)
from live.observe.record import SessionRecord, current_record
from live.engine.actions import SendAudio, SendEvent, ToUpstream

__all__ = ["Measured", "Recorded", "SessionObserver", "WrappedConnection"]


class WrappedConnection(BaseLlmConnection):
    """A connection that forwards everything to `inner`; decorators override parts."""

    def __init__(self, inner: BaseLlmConnection) -> None:
        self.inner = inner

    async def send_history(self, history: Sequence[types.Content]) -> None:
        await self.inner.send_history(history)

    async def send_content(self, content: types.Content) -> None:
        await self.inner.send_content(content)

    async def send_turns(self, turns: Sequence[types.Content], *, turn_complete: bool) -> None:
        await self.inner.send_turns(turns, turn_complete=turn_complete)

    async def send_realtime_text(self, text: str) -> None:
        await self.inner.send_realtime_text(text)

    async def send_context_update(
        self, *, system_instruction: types.Content | None = None, tools: Sequence[types.Tool] | None = None
    ) -> None:
        await self.inner.send_context_update(system_instruction=system_instruction, tools=tools)

    async def send_realtime(self, input: RealtimeInput) -> None:
        await self.inner.send_realtime(input)

    def send_realtime_nowait(self, input: RealtimeInput) -> bool:
        return self.inner.send_realtime_nowait(input)

    @property
    def voice_consent_signature(self) -> str | None:
        return self.inner.voice_consent_signature

    def receive(self) -> AsyncIterator[LlmResponse]:
        return self.inner.receive()

    async def close(self) -> None:
        await self.inner.close()


class _MeasuredConnection(WrappedConnection):
    """Messages each way are counted here and added to the metrics in steps of
    `COUNT_STEP` and when the connection ends: not a lock and a counter per
    audio frame."""

    COUNT_STEP = 50  # a second of microphone frames, two of reply chunks

    def __init__(self, inner: BaseLlmConnection, metrics: Metrics, model: str) -> None:
        super().__init__(inner)
        self._metrics = metrics
        self._model = model
        self._out = metrics.model_messages.labels(model, "out")
        self._in = metrics.model_messages.labels(model, "in")
        self._sent = 0  # not yet in `_out`
        self._received = 0  # not yet in `_in`

    def _count_sent(self) -> None:
        self._sent += 1
        if self._sent >= self.COUNT_STEP:
            self._out.inc(self._sent)
            self._sent = 0

    def count_all(self) -> None:
        """Add every message counted so far to the metrics."""
        if self._sent:
            self._out.inc(self._sent)
            self._sent = 0
        if self._received:
            self._in.inc(self._received)
            self._received = 0

    async def send_history(self, history: Sequence[types.Content]) -> None:
        await self.inner.send_history(history)
        self._count_sent()

    async def send_content(self, content: types.Content) -> None:
        await self.inner.send_content(content)
        self._count_sent()

    async def send_turns(self, turns: Sequence[types.Content], *, turn_complete: bool) -> None:
        await self.inner.send_turns(turns, turn_complete=turn_complete)
        self._count_sent()

    async def send_realtime_text(self, text: str) -> None:
        await self.inner.send_realtime_text(text)
        self._count_sent()

    async def send_realtime(self, input: RealtimeInput) -> None:
        await self.inner.send_realtime(input)
        self._count_sent()

    def send_realtime_nowait(self, input: RealtimeInput) -> bool:
        if self.inner.send_realtime_nowait(input):
            self._count_sent()
            return True
        return False

    async def receive(self) -> AsyncIterator[LlmResponse]:  # type: ignore[override]
        try:
            async for response in self.inner.receive():
                self._received += 1
                if self._received >= self.COUNT_STEP:
                    self._in.inc(self._received)
                    self._received = 0
                if response.usage_metadata is not None:
                    self._metrics.count_usage(self._model, response.usage_metadata)
                yield response
        finally:
            self.count_all()


class Measured(BaseLlm):
    """`inner`, with its connections counted in `metrics` (default: the process's).

    Counts connects (and their outcome and time), messages each way, and tokens
    from usage metadata by kind and modality, labelled with the model name.
    """

    def __init__(self, inner: BaseLlm, metrics: Metrics | None = None) -> None:
        super().__init__(inner.model)
        self.inner = inner
        self.metrics = metrics if metrics is not None else Metrics.default()

    @contextlib.asynccontextmanager
    async def connect(self, request: LlmRequest) -> AsyncIterator[BaseLlmConnection]:
        model = request.model or self.model
        started = time.monotonic()
        opened = False
        try:
            async with self.inner.connect(request) as conn:
                opened = True
                self.metrics.model_connects.labels(model, "ok").inc()
                self.metrics.model_connect_seconds.labels(model).observe(time.monotonic() - started)
                measured = _MeasuredConnection(conn, self.metrics, model)
                try:
                    yield measured
                finally:
                    measured.count_all()
        except BaseException as exc:
            if not opened:
                self.metrics.model_connects.labels(model, type(exc).__name__).inc()
            raise


def _tool_outcome(response: dict[str, Any], timed_out: bool) -> str:
    if timed_out:
        return "timeout"
    error = response.get("error")
    if error is None:
        return "ok"
    if isinstance(error, str) and "did not finish within" in error:
        return "timeout"  # run_tool's words for a server tool past its deadline
    return "error"


class SessionObserver:
    """Metrics of one client session, fed by the server's hooks.

    Turn latency runs from the end of the user's turn (`activity.end`, a typed
    turn, or the model's own voice detection saying speech ended) to the first
    reply audio that left for the client; a turn answered without audio is not
    timed. `tools` names the tools the agent declares: calls to anything else
    are labelled `other`, so a model cannot grow the label set.
    """

    __slots__ = (
        "_metrics", "_model", "_agent", "_tools", "_frames_in", "_frames_out",
        "_turn_end", "_reply_audio_queued", "_started_at", "_calls",
        "_reconnect_cause", "_counted_late", "_counted_flushed", "_opened",
        "_frames_in_kept", "_frames_out_kept", "_door",
    )

    def __init__(self, metrics: Metrics, *, model: str, agent: str, tools: Iterable[str], door: str = "live") -> None:
        self._metrics = metrics
        self._door = door  # the front door's name: which wire (a carrier) the session came through
        self._model = model
        self._agent = agent
        self._tools = frozenset(tools)
        self._frames_in = metrics.frames_in.inc
        self._frames_out = metrics.frames_out.inc
        self._turn_end: float | None = None
        self._reply_audio_queued = False
        self._started_at: float | None = None
        self._calls: dict[str, tuple[str, str, float]] = {}
        self._reconnect_cause = "connection_lost"
        self._counted_late = 0
        self._counted_flushed = 0
        self._opened = False
        # Frames are counted here and added to the metrics by `catch_up`
        # (every second, and at the end): not a lock and a counter per frame.
        self._frames_in_kept = 0
        self._frames_out_kept = 0

    # -- life ------------------------------------------------------------------

    def opened(self) -> None:
        self._opened = True
        self._metrics.sessions_active.inc()
        self._metrics.door_sessions_active.labels(self._door).inc()

    def abandon(self) -> None:
        """This socket turned out to serve another session (a reattach): not a session."""
        self._count_frames()
        if self._opened:
            self._opened = False
            self._metrics.sessions_active.dec()
            self._metrics.door_sessions_active.labels(self._door).dec()

    def started(self, now: float) -> None:
        """`session.start` was accepted: the first reply audio is timed from here."""
        self._started_at = now

    def ended(
        self,
        reason: str,
        error: ErrorEvent | None,
        *,
        late_dropped: int = 0,
        flushed: int = 0,
    ) -> None:
        self.catch_up(late_dropped, flushed)
        code = end_reason_code(reason, error)
        self._metrics.sessions.labels(self._model, self._agent, code).inc()
        self._metrics.door_sessions.labels(self._door, code).inc()
        if self._opened:
            self._opened = False
            self._metrics.sessions_active.dec()
            self._metrics.door_sessions_active.labels(self._door).dec()

    def catch_up(self, late_dropped: int, flushed: int) -> None:
        """Bring what the session counts itself up to date in the metrics: its
        frames, and its reply-audio drops (up to the session's totals). The
        server calls it every second and at the session's end."""
        self._count_frames()
        if late_dropped > self._counted_late:
            self._metrics.dropped_late.inc(late_dropped - self._counted_late)
            self._counted_late = late_dropped
        if flushed > self._counted_flushed:
            self._metrics.dropped_interrupted.inc(flushed - self._counted_flushed)
            self._counted_flushed = flushed

    # -- frames ----------------------------------------------------------------

    def _count_frames(self) -> None:
        if self._frames_in_kept:
            self._frames_in(self._frames_in_kept)
            self._frames_in_kept = 0
        if self._frames_out_kept:
            self._frames_out(self._frames_out_kept)
            self._frames_out_kept = 0

    def frames_in(self, count: int) -> None:
        self._frames_in_kept += count

    def frame_out(self, frame: str | bytes, now: float) -> None:
        self._frames_out_kept += 1
        if type(frame) is bytes:
            if self._started_at is not None:
                self._metrics.first_audio.observe(now - self._started_at)
                self._started_at = None
            if self._turn_end is not None:
                self._metrics.turn_latency.observe(now - self._turn_end)
                self._turn_end = None

    def audio_overflow(self) -> None:
        self._metrics.dropped_overflow.inc()

    def audio_dropped_while_held(self) -> None:
        """Client audio dropped while the model could take none (a call was owed)."""
        self._metrics.dropped_held.inc()

    def event(self, event: ServerEvent) -> None:
        """An event is on its way to the client (every error is counted here)."""
        if type(event) is ErrorEvent:
            self._metrics.errors.labels(event.code).inc()
        elif type(event) is UserStopped:
            self._metrics.user_turns.labels(event.reason).inc()

    # -- the model and the session core ------------------------------------------

    def model_response(self, response: LlmResponse, now: float) -> None:
        activity = response.voice_activity
        if (
            activity is not None
            and activity.voice_activity_type is types.VoiceActivityType.ACTIVITY_END
        ):
            self._user_turn_ended(now)

    def actions(self, actions: list[Any], now: float) -> None:
        """What the session core decided; called before the server carries it out."""
        for action in actions:
            kind = type(action)
            if kind is SendAudio:
                self._reply_audio_queued = True
            elif kind is SendEvent:
                self._on_event(action.event, actions, now)
            elif kind is ToUpstream:
                self._on_upstream(action.item, actions, now)

    def _on_event(self, event: ServerEvent, actions: list[Any], now: float) -> None:
        kind = type(event)
        if kind is TurnInterrupted:
            self._metrics.interruptions.inc()
        elif kind is ToolCallEvent:
            assert isinstance(event, ToolCallEvent)
            name = event.name if event.name in self._tools else "other"
            self._calls[event.id] = (name, event.runs_on, now)
        elif kind is ToolCancelled:
            assert isinstance(event, ToolCancelled)
            for call_id in event.ids:
                self._tool_done(call_id, "cancelled", now)
        elif kind is TurnComplete and not self._reply_audio_queued:
            self._turn_end = None  # answered without audio: nothing to time

    def _on_upstream(self, item: Any, actions: list[Any], now: float) -> None:
        if isinstance(item, types.ActivityEnd):
            self._user_turn_ended(now)
            return
        if not isinstance(item, types.Content) or not item.parts:
            return
        responses = [p.function_response for p in item.parts if p.function_response is not None]
        if not responses:
            if item.role == "user" and any(p.text for p in item.parts):
                self._user_turn_ended(now)
            return
        timed_out = any(
            type(a) is SendEvent and type(a.event) is ErrorEvent and a.event.code == "tool_timeout"
            for a in actions
        )
        for response in responses:
            self._tool_done(response.id or "", _tool_outcome(response.response or {}, timed_out), now)

    def _user_turn_ended(self, now: float) -> None:
        self._turn_end = now
        self._reply_audio_queued = False

    def _tool_done(self, call_id: str, outcome: str, now: float) -> None:
        call = self._calls.pop(call_id, None)
        if call is None:
            return
        name, runs_on, started = call
        self._metrics.tool_calls.labels(name, runs_on, outcome).inc()
        self._metrics.tool_duration.labels(name).observe(now - started)

    # -- reconnects --------------------------------------------------------------

    def reconnecting(self, cause: str) -> None:
        """Why the session is moving to a new model connection (counted once it has)."""
        self._reconnect_cause = cause

    def resumed(self) -> None:
        self._metrics.reconnects.labels(self._reconnect_cause).inc()
        self._reconnect_cause = "connection_lost"


class _RecordedConnection(WrappedConnection):
    def __init__(self, inner: BaseLlmConnection, record: SessionRecord, conn: int) -> None:
        super().__init__(inner)
        self._record = record
        self._conn = conn
        self.error: LiveError | None = None
        self.model_closed = False

    async def send_history(self, history: Sequence[types.Content]) -> None:
        await self.inner.send_history(history)
        self._record.model_sent(self._conn, list(history))

    async def send_content(self, content: types.Content) -> None:
        await self.inner.send_content(content)
        self._record.model_sent(self._conn, content)

    async def send_turns(self, turns: Sequence[types.Content], *, turn_complete: bool) -> None:
        await self.inner.send_turns(turns, turn_complete=turn_complete)
        self._record.model_sent(self._conn, ClientTurns(tuple(turns), turn_complete))

    async def send_realtime_text(self, text: str) -> None:
        await self.inner.send_realtime_text(text)
        self._record.model_sent(self._conn, RealtimeText(text))

    async def send_realtime(self, input: RealtimeInput) -> None:
        await self.inner.send_realtime(input)
        self._record.model_sent(self._conn, input)

    def send_realtime_nowait(self, input: RealtimeInput) -> bool:
        if self.inner.send_realtime_nowait(input):
            self._record.model_sent(self._conn, input)
            return True
        return False

    async def receive(self) -> AsyncIterator[LlmResponse]:  # type: ignore[override]
        record, conn = self._record, self._conn
        try:
            async for response in self.inner.receive():
                record.model_response(conn, response)
                yield response
        except LiveError as exc:
            self.error = exc
            raise
        self.model_closed = True


class Recorded(BaseLlm):
    """`inner`, with what crosses each connection written to a session record.

    The record is `record` when given (in-process use of the contract), else
    the one the server set for the session being served (`current_record`);
    with neither, connections pass through unrecorded.
    """

    def __init__(self, inner: BaseLlm, record: SessionRecord | None = None) -> None:
        super().__init__(inner.model)
        self.inner = inner
        self.record = record

    @contextlib.asynccontextmanager
    async def connect(self, request: LlmRequest) -> AsyncIterator[BaseLlmConnection]:
        record = self.record if self.record is not None else current_record.get()
        if record is None:
            async with self.inner.connect(request) as conn:
                yield conn
            return
        resumption = request.live_connect_config.session_resumption
        number = record.model_connect(
            {"model": request.model or self.model, "resumed": bool(resumption and resumption.handle)}
        )
        wrapped: _RecordedConnection | None = None
        failure: BaseException | None = None
        try:
            async with self.inner.connect(request) as conn:
                wrapped = _RecordedConnection(conn, record, number)
                yield wrapped
        except BaseException as exc:
            failure = exc
            raise
        finally:
            if wrapped is None:
                record.model_end(number, failure, "connect_failed")
            elif wrapped.error is not None:
                record.model_end(number, wrapped.error, "error")
            else:
                record.model_end(number, None, "model_closed" if wrapped.model_closed else "server_closed")
