"""An in-process Gemini Live, for testing agents and relays without a network.

Like httpx's `MockTransport`, the double plugs into an explicit seam: pass a
`DoubleTransport` as `Gemini(model, transport=...)` and the real connection
code runs unchanged against scripted sessions::

    from connections import double
    from connections.gemini import Gemini

    session = double.ScriptedSession(double.tool_call("get_order", {"id": "A17"}, id="call-1"))
    session.on_tool_response(double.output_transcript("Shipped."), double.turn_complete())
    llm = Gemini("gemini-2.5-flash", transport=double.DoubleTransport(session))
    async with llm.connect(LlmRequest()) as connection:
        ...  # answer the call with send_content(...), read connection.receive()
    assert session.tool_responses[0].function_responses[0].id == "call-1"

docs/testing-with-the-double.md walks through it. The server messages a
script is made of are built by `connections.double_messages` (`double.audio`,
`double.turn_complete`, ...).

A `ScriptedSession` presents google-genai's `AsyncSession` surface:

- **Records** every message sent to it as a typed `types.LiveClientMessage`
  (`realtime_input`, `client_content` or `tool_response`), in order, in `sent`;
  the transport records the model and config of every connect in `connects`.
- **Replays** scripted `types.LiveServerMessage`s (given at construction or
  `push`ed later), and **reacts** to what the client sends: `on(predicate, ...)`
  in general, `on_tool_response`, `on_client_content`, `on_text`,
  `on_activity_end`, `on_audio_stream_end`, `after_audio_chunks(n, ...)`.
  A reaction's reply is a sequence of events or a function of the message.
- **Fails** exactly like the SDK: a `Close(code, reason)` event makes
  `receive()` raise `google.genai.errors.APIError` with that code (1000
  included) and later sends raise `websockets.ConnectionClosed`;
  `drop(code)` closes at once, discarding what was queued, and
  `ScriptedSession(refuse=Close(...))` fails the connect itself.
- **Waits** like a socket whose peer stopped reading: after `hold_sends()`,
  every send waits until `release_sends()` (or raises at a close), and
  `can_send_now()` says False and `send_audio_nowait()` takes nothing, as the
  lean path does on a paused socket.
- `receive()` stops after the message that completes a turn, as the SDK's does.
- Is **as strict as the service** where the documentation says it rejects or
  waits, and takes the strictest plausible reading where it is silent:
  with `historyConfig.initialHistoryInClientContent` on, realtime input before a
  `client_content` with `turn_complete=true` is not processed (counted in
  `ignored`), that seed triggers no reply, and the flag on a resumed session
  closes it with 1007; Gemini 3 closes with 1007 on any other `client_content`;
  activity signals while automatic activity detection is on close with 1007; a
  function response whose id this connection never issued (or already
  answered; one that crossed the call's cancellation is accepted) closes with 1007; a resumable handle pushed while a call is
  unanswered or a reply is being generated goes out with `resumable=false`; on a
  2.5 native-audio model, any realtime input while a call is unanswered closes
  with 1008 "Operation is not implemented, or supported, or enabled.".
  `drop(code, seen_by="sender")` is a close the sending side sees first: sends
  fail at once, while `receive()` sees it only when the client closes.

Waiting is event-driven (anyio events), never polled. Bounds, stated because a
benchmark may drive hundreds of sessions through the double: the script queue
holds what the test pushed (the test bounds it); `sent` grows by one entry per
client message unless `record_audio=False`, which counts audio chunks instead
of keeping them; `DoubleTransport.connects` grows by one entry per connect.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any, TypeAlias

import anyio
import websockets
from google.genai import errors as genai_errors
from google.genai import types
from websockets.frames import Close as _CloseFrame

from connections.double_messages import (
    audio,
    bundle,
    generation_complete,
    go_away,
    input_transcript,
    interrupted,
    output_transcript,
    resumption_update,
    text,
    tool_call,
    tool_call_cancellation,
    tool_calls,
    turn_complete,
    usage,
)
from connections.gemini_wire import fits_template
from live.families import family_of

__all__ = [
    "Close",
    "ConnectRecord",
    "DoubleTransport",
    "Pause",
    "Reply",
    "ScriptedSession",
    "ServerEvent",
    "audio",
    "bundle",
    "generation_complete",
    "go_away",
    "input_transcript",
    "interrupted",
    "output_transcript",
    "resumption_update",
    "text",
    "tool_call",
    "tool_call_cancellation",
    "tool_calls",
    "turn_complete",
    "usage",
]


@dataclasses.dataclass(frozen=True, slots=True)
class Close:
    """The server closes the socket with `code` (1006 means: without a close frame)."""

    code: int = 1000
    reason: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Pause:
    """The server is silent for `seconds` before its next scripted event."""

    seconds: float


ServerEvent: TypeAlias = types.LiveServerMessage | Close | Pause
Reply: TypeAlias = Callable[[types.LiveClientMessage], Iterable[ServerEvent]]


@dataclasses.dataclass(frozen=True, slots=True)
class ConnectRecord:
    """One connect: the model name and config the connection code passed."""

    model: str
    config: types.LiveConnectConfig


@dataclasses.dataclass(slots=True)
class _Reaction:
    when: Callable[[types.LiveClientMessage], bool]
    reply: Reply
    times: int | None


# Prototypes copied per audio chunk: cheaper than building and validating models.
_EMPTY_MESSAGE = types.LiveClientMessage()
_EMPTY_REALTIME = types.LiveClientRealtimeInput()


def _raise_api_error(close: Close) -> None:
    """What the SDK's receive raises for a close: `APIError.raise_error(code, reason)`."""
    reason = close.reason
    if close.code == 1006 and not reason:
        reason = "Abnormal closure."
    genai_errors.APIError.raise_error(close.code, reason, None)


def _connection_closed(close: Close) -> websockets.ConnectionClosed:
    """What websockets raises from a send on a socket the server closed."""
    if close.code == 1006:
        return websockets.ConnectionClosedError(None, None)
    frame = _CloseFrame(close.code, close.reason)
    if close.code == 1000:
        return websockets.ConnectionClosedOK(frame, frame, True)
    return websockets.ConnectionClosedError(frame, frame, True)


def _ends_turn(message: types.LiveServerMessage) -> bool:
    """The SDK's rule for where `receive()` stops."""
    sc = message.server_content
    if sc is None:
        return False
    status = sc.interaction_status
    if status is not None and status != types.InteractionStatus.INTERACTION_STATUS_UNSPECIFIED:
        return status == types.InteractionStatus.IDLE
    return bool(sc.turn_complete)


def _as_blob(value: Any) -> Any:
    return types.Blob(**value) if isinstance(value, dict) else value


class ScriptedSession:
    """One scripted Live session with the SDK's `AsyncSession` surface.

    Build it with the server events to replay from the start; add more with
    `push`, reactions with `on*`. `model` and `config` are set on connect.
    """

    def __init__(
        self,
        *script: ServerEvent,
        refuse: Close | None = None,
        record_audio: bool = True,
        session_id: str | None = None,
    ) -> None:
        self.refuse = refuse
        self.record_audio = record_audio
        self.session_id = session_id
        self.model: str | None = None
        self.config: types.LiveConnectConfig | None = None
        self.sent: list[types.LiveClientMessage] = []
        self.audio_chunks = 0
        self.audio_bytes = 0
        self.closed_by_client = False
        self.server_close: Close | None = None
        self.ignored = 0  # realtime inputs the service did not process (see the module doc)
        self._send_close: Close | None = None
        self._awaiting_seed = False
        self._aad_on = True
        self._gemini3 = False
        self._no_input_during_calls = False  # 2.5 native audio: 1008 on realtime input while a call is owed
        self._issued: set[str] = set()
        self._cancelled: set[str] = set()
        self._anonymous_calls = 0
        self._generating = False
        self._script: collections.deque[ServerEvent] = collections.deque(script)
        self._reactions: list[_Reaction] = []
        self._wakeup: anyio.Event | None = None
        self._sent_waiters: list[tuple[Callable[[types.LiveClientMessage], bool], anyio.Event]] = []
        self._closed_event: anyio.Event | None = None
        self._receiving = False
        self._held: anyio.Event | None = None  # set: sends wait (see hold_sends)

    def __repr__(self) -> str:
        return (
            f"ScriptedSession(model={self.model!r}, sent={len(self.sent)}, "
            f"audio_chunks={self.audio_chunks}, queued={len(self._script)})"
        )

    # -- scripting ------------------------------------------------------------

    def push(self, *events: ServerEvent) -> ScriptedSession:
        """Queue server events after everything already queued; wakes the receiver."""
        self._script.extend(events)
        self._wake()
        return self

    def close_with(self, code: int, reason: str = "") -> ScriptedSession:
        """Queue a server close: after the queued messages, `receive()` raises APIError(code)."""
        return self.push(Close(code, reason))

    def drop(self, code: int = 1006, reason: str = "", *, seen_by: str = "both") -> ScriptedSession:
        """The server closes now: queued events are discarded, a pending
        `receive()` raises APIError(code) and sends raise ConnectionClosed.

        `seen_by="sender"`: only sends see the close at once; `receive()` goes
        on waiting until the client closes, then raises APIError(code) (the
        race where the sending task notices a dead socket first).
        """
        self._script.clear()
        if seen_by == "sender":
            self._send_close = Close(code, reason)
        elif seen_by == "both":
            self.server_close = Close(code, reason)
        else:
            raise ValueError(f"seen_by must be 'both' or 'sender', not {seen_by!r}")
        if self._held is not None:
            self._held.set()  # waiting sends see the close
        self._wake()
        return self

    def hold_sends(self) -> ScriptedSession:
        """Sends wait from now on, as on a socket whose peer stopped reading,
        until `release_sends()` (a close ends the wait: the send raises).
        `can_send_now()` is False meanwhile."""
        if self._held is None:
            self._held = anyio.Event()
        return self

    def release_sends(self) -> ScriptedSession:
        """Waiting sends go on, in the order they waited."""
        held, self._held = self._held, None
        if held is not None:
            held.set()
        return self

    def send_audio_nowait(self, audio: types.Blob) -> bool:
        """One audio chunk taken at once, as the lean wire's socket takes a frame
        while its buffer has room; False (nothing taken) while sends are held,
        after a close, or for a frame the lean wire would leave to the SDK."""
        if not self.can_send_now() or not fits_template(audio.data, audio.mime_type):
            return False
        self._take_audio(audio)
        return True

    def _take_audio(self, blob: types.Blob) -> None:
        """The hot path: one audio chunk, recorded without validation."""
        if self._awaiting_seed:
            self.ignored += 1
            return
        if self._no_input_during_calls and (self._issued or self._anonymous_calls):
            self._refuse_input_during_call()
            return
        self.audio_chunks += 1
        self.audio_bytes += len(blob.data or b"")
        if not self.record_audio and not self._reactions and not self._sent_waiters:
            return
        message = _EMPTY_MESSAGE.model_copy(
            update={"realtime_input": _EMPTY_REALTIME.model_copy(update={"audio": blob})}
        )
        self._record(message, keep=self.record_audio)

    def can_send_now(self) -> bool:
        """Whether a send made now is taken without waiting (open, not held)."""
        return (
            self._held is None
            and self._send_close is None
            and self.server_close is None
            and not self.closed_by_client
        )

    async def _sends_released(self) -> None:
        while self._held is not None and not self._held.is_set():
            await self._held.wait()

    def _violation(self, reason: str) -> None:
        """What the service does on input it rejects: close with 1007."""
        self.drop(1007, reason)

    def _refuse_input_during_call(self) -> None:
        """What a 2.5 native-audio model does on realtime input while a function
        call it made is unanswered (forum #114644, adk-python#4679, js-genai#1236)."""
        self.drop(1008, "Operation is not implemented, or supported, or enabled.")

    def on(
        self,
        when: Callable[[types.LiveClientMessage], bool],
        *reply: ServerEvent | Reply,
        times: int | None = 1,
    ) -> ScriptedSession:
        """When a client message satisfies `when`, queue `reply`.

        `reply` is server events, or one function from the client message to
        events (to echo ids, for instance). A reaction fires `times` times
        (None: every time); every matching reaction fires, in the order added.
        """
        if len(reply) == 1 and callable(reply[0]):
            handler: Reply = reply[0]  # type: ignore[assignment]
        else:
            events: tuple[ServerEvent, ...] = reply  # type: ignore[assignment]

            def handler(_: types.LiveClientMessage) -> Iterable[ServerEvent]:
                return events

        self._reactions.append(_Reaction(when, handler, times))
        return self

    def on_tool_response(self, *reply: ServerEvent | Reply, times: int | None = 1) -> ScriptedSession:
        """React to the client answering tool calls."""
        return self.on(lambda m: m.tool_response is not None, *reply, times=times)

    def on_client_content(self, *reply: ServerEvent | Reply, times: int | None = 1) -> ScriptedSession:
        """React to a `client_content` message (a turn or the history seed)."""
        return self.on(lambda m: m.client_content is not None, *reply, times=times)

    def on_text(self, *reply: ServerEvent | Reply, times: int | None = 1) -> ScriptedSession:
        """React to realtime text (how Gemini 3 models take mid-session text)."""
        return self.on(
            lambda m: m.realtime_input is not None and m.realtime_input.text is not None,
            *reply,
            times=times,
        )

    def on_activity_end(self, *reply: ServerEvent | Reply, times: int | None = 1) -> ScriptedSession:
        """React to a manual `activity_end` (the user stopped talking)."""
        return self.on(
            lambda m: m.realtime_input is not None and m.realtime_input.activity_end is not None,
            *reply,
            times=times,
        )

    def on_audio_stream_end(self, *reply: ServerEvent | Reply, times: int | None = 1) -> ScriptedSession:
        """React to `audio_stream_end` (the microphone was closed)."""
        return self.on(
            lambda m: m.realtime_input is not None and bool(m.realtime_input.audio_stream_end),
            *reply,
            times=times,
        )

    def after_audio_chunks(self, count: int, *reply: ServerEvent | Reply) -> ScriptedSession:
        """React once, when the `count`-th audio chunk of the session arrives."""
        return self.on(
            lambda m: m.realtime_input is not None
            and m.realtime_input.audio is not None
            and self.audio_chunks >= count,
            *reply,
        )

    # -- what was sent -----------------------------------------------------------

    @property
    def tool_responses(self) -> list[types.LiveClientToolResponse]:
        return [m.tool_response for m in self.sent if m.tool_response is not None]

    @property
    def client_contents(self) -> list[types.LiveClientContent]:
        return [m.client_content for m in self.sent if m.client_content is not None]

    @property
    def realtime_inputs(self) -> list[types.LiveClientRealtimeInput]:
        return [m.realtime_input for m in self.sent if m.realtime_input is not None]

    @property
    def closed(self) -> bool:
        """True once the client closed the session or the server's close was delivered."""
        return self.closed_by_client or self.server_close is not None

    async def wait_for(
        self, predicate: Callable[[types.LiveClientMessage], bool]
    ) -> types.LiveClientMessage:
        """The first recorded client message satisfying `predicate`, waiting for it if needed."""
        while True:
            for message in self.sent:
                if predicate(message):
                    return message
            event = anyio.Event()
            self._sent_waiters.append((predicate, event))
            await event.wait()

    async def wait_closed(self) -> None:
        """Return once the client has closed the session."""
        if self.closed_by_client:
            return
        if self._closed_event is None:
            self._closed_event = anyio.Event()
        await self._closed_event.wait()

    # -- the AsyncSession surface ---------------------------------------------

    async def send_realtime_input(
        self,
        *,
        media: Any = None,
        audio: Any = None,
        audio_stream_end: bool | None = None,
        video: Any = None,
        text: str | None = None,
        activity_start: Any = None,
        activity_end: Any = None,
    ) -> None:
        if self._held is not None:
            await self._sends_released()
        if audio is not None and media is None and video is None and text is None \
                and activity_start is None and activity_end is None and audio_stream_end is None:
            self._check_open()
            self._take_audio(_as_blob(audio))
            return
        given = {
            name: value
            for name, value in (
                ("media", media),
                ("audio", audio),
                ("audio_stream_end", audio_stream_end),
                ("video", video),
                ("text", text),
                ("activity_start", activity_start),
                ("activity_end", activity_end),
            )
            if value is not None
        }
        if len(given) != 1:
            raise ValueError(f"Only one argument can be set, got {len(given)}: {list(given)}")
        self._check_open()
        if self._awaiting_seed:
            self.ignored += 1
            return
        if self._no_input_during_calls and (self._issued or self._anonymous_calls):
            self._refuse_input_during_call()
            return
        if self._aad_on and ("activity_start" in given or "activity_end" in given):
            self._violation(
                "Explicit activity control is not supported when automatic activity "
                "detection is enabled."
            )
            return
        if "media" in given:
            realtime = types.LiveClientRealtimeInput(media_chunks=[_as_blob(media)])
        else:
            realtime = types.LiveClientRealtimeInput(**given)
        self._record(types.LiveClientMessage(realtime_input=realtime))

    async def send_client_content(
        self,
        *,
        turns: types.Content | dict[str, Any] | Sequence[types.Content | dict[str, Any]] | None = None,
        turn_complete: bool = True,
    ) -> None:
        if self._held is not None:
            await self._sends_released()
        self._check_open()
        if turns is None:
            listed: list[Any] | None = None
        elif isinstance(turns, (types.Content, dict)):
            listed = [turns]
        else:
            listed = list(turns)
        content = types.LiveClientContent(turns=listed, turn_complete=turn_complete)
        message = types.LiveClientMessage(client_content=content)
        if self._awaiting_seed:
            # The initial history: recorded, never answered.
            self.sent.append(message)
            if turn_complete:
                self._awaiting_seed = False
            return
        if self._gemini3:
            self._violation("Gemini 3.1 takes client_content only as the initial history.")
            return
        self._record(message)

    async def send_tool_response(
        self,
        *,
        function_responses: types.FunctionResponse
        | dict[str, Any]
        | Sequence[types.FunctionResponse | dict[str, Any]],
    ) -> None:
        if self._held is not None:
            await self._sends_released()
        self._check_open()
        if isinstance(function_responses, (types.FunctionResponse, dict)):
            listed = [function_responses]
        else:
            listed = list(function_responses)
        response = types.LiveClientToolResponse(function_responses=listed)
        for item in response.function_responses or ():
            if item.id is None:
                # The SDK's own check on the Gemini API backend.
                raise ValueError(
                    "FunctionResponse request must have an `id` field from the"
                    " response of a ToolCall.FunctionalCalls in Google AI."
                )
        for item in response.function_responses or ():
            if item.id in self._issued:
                self._issued.discard(item.id)
            elif item.id in self._cancelled:
                pass  # it crossed the cancellation on the wire: issued, so not rejected
            elif self._anonymous_calls > 0:
                self._anonymous_calls -= 1  # a call that came without an id
            else:
                self._record(types.LiveClientMessage(tool_response=response))
                self._violation(
                    f"Function response for call id {item.id!r}, which this session "
                    "never issued or already answered."
                )
                return
        self._record(types.LiveClientMessage(tool_response=response))

    async def receive(self) -> AsyncIterator[types.LiveServerMessage]:
        """Scripted messages up to the end of a turn; a `Close` raises APIError."""
        if self._receiving:
            raise RuntimeError("only one coroutine may be inside receive() at a time")
        self._receiving = True
        try:
            while True:
                event = await self._next_event()
                if isinstance(event, Pause):
                    await anyio.sleep(event.seconds)
                    continue
                event = self._as_served(event)
                yield event
                if _ends_turn(event):
                    return
        finally:
            self._receiving = False

    async def close(self) -> None:
        """The client closes: a pending `receive()` raises APIError(1000), as the SDK's does."""
        if self.closed_by_client:
            return
        self.closed_by_client = True
        if self._held is not None:
            self._held.set()
        self._wake()
        if self._closed_event is not None:
            self._closed_event.set()

    # -- internals ----------------------------------------------------------------

    def _as_served(self, message: types.LiveServerMessage) -> types.LiveServerMessage:
        """Track what the service knows is in flight, and hold handles to its rules."""
        if message.tool_call is not None:
            for call in message.tool_call.function_calls or ():
                if call.id:
                    self._issued.add(call.id)
                else:
                    self._anonymous_calls += 1
        if message.tool_call_cancellation is not None:
            ids = message.tool_call_cancellation.ids or ()
            self._issued.difference_update(ids)
            self._cancelled.update(ids)
        sc = message.server_content
        if sc is not None:
            if sc.model_turn is not None or sc.output_transcription is not None:
                self._generating = True
            if sc.turn_complete or sc.interrupted:
                self._generating = False
        update = message.session_resumption_update
        busy = self._generating or self._issued or self._anonymous_calls
        if update is not None and update.resumable and busy:
            served = update.model_copy(update={"resumable": False})
            return message.model_copy(update={"session_resumption_update": served})
        return message

    async def _next_event(self) -> ServerEvent:
        while True:
            if self.closed_by_client:
                _raise_api_error(self._send_close or Close(1000))
            if self.server_close is not None:
                _raise_api_error(self.server_close)
            if self._script:
                event = self._script.popleft()
                if isinstance(event, Close):
                    self.server_close = event
                    continue
                return event
            self._wakeup = anyio.Event()
            await self._wakeup.wait()

    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()
            self._wakeup = None

    def _check_open(self) -> None:
        if self._send_close is not None:
            raise _connection_closed(self._send_close)
        if self.closed_by_client:
            raise _connection_closed(Close(1000))
        if self.server_close is not None:
            raise _connection_closed(self.server_close)

    def _record(self, message: types.LiveClientMessage, *, keep: bool = True) -> None:
        if keep:
            self.sent.append(message)
        if self._reactions:
            for reaction in list(self._reactions):
                if not reaction.when(message):
                    continue
                if reaction.times is not None:
                    reaction.times -= 1
                    if reaction.times <= 0:
                        self._reactions.remove(reaction)
                self.push(*reaction.reply(message))
        if self._sent_waiters and keep:
            waiting = self._sent_waiters
            self._sent_waiters = []
            for predicate, event in waiting:
                if predicate(message):
                    event.set()
                else:
                    self._sent_waiters.append((predicate, event))

    def _attach(self, model: str, config: types.LiveConnectConfig) -> None:
        self.model = model
        self.config = config
        # A family that takes client content only as its initial history (3.1).
        self._gemini3 = not family_of(model).client_content_mid_session
        self._no_input_during_calls = not family_of(model).realtime_input_while_call_owed
        ric = config.realtime_input_config
        aad = ric.automatic_activity_detection if ric is not None else None
        self._aad_on = not (aad is not None and aad.disabled)
        history = config.history_config
        flag = bool(history is not None and history.initial_history_in_client_content)
        resumed = config.session_resumption is not None and bool(config.session_resumption.handle)
        if flag and resumed:
            self._violation("initialHistoryInClientContent is not accepted on a resumed session.")
        self._awaiting_seed = flag and not resumed


class DoubleTransport:
    """A `LiveTransport` handing out scripted sessions, one per connect, in order.

    Give the sessions up front, or a `factory` that makes one per connect (for
    benchmarks driving many sessions); given sessions are used first. A
    connect beyond both is a RuntimeError naming how many were scripted.
    """

    def __init__(
        self,
        *sessions: ScriptedSession,
        factory: Callable[[], ScriptedSession] | None = None,
    ) -> None:
        self._pending: collections.deque[ScriptedSession] = collections.deque(sessions)
        self._scripted = len(sessions)
        self._factory = factory
        self.sessions: list[ScriptedSession] = []
        self.connects: list[ConnectRecord] = []

    def __call__(
        self, model: str, config: types.LiveConnectConfig
    ) -> contextlib.AbstractAsyncContextManager[ScriptedSession]:
        return self._connect(model, config)

    @contextlib.asynccontextmanager
    async def _connect(
        self, model: str, config: types.LiveConnectConfig
    ) -> AsyncIterator[ScriptedSession]:
        if self._pending:
            session = self._pending.popleft()
        elif self._factory is not None:
            session = self._factory()
        else:
            raise RuntimeError(
                f"DoubleTransport: connect #{len(self.connects) + 1}, but only "
                f"{self._scripted} session(s) were scripted and no factory was given"
            )
        self.connects.append(ConnectRecord(model, config))
        self.sessions.append(session)
        session._attach(model, config)
        if session.refuse is not None:
            session.server_close = session.refuse
            _raise_api_error(session.refuse)
        try:
            yield session
        finally:
            await session.close()
