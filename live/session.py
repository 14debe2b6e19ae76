"""The state of one client conversation, as a plain state machine (no I/O).

`SessionCore` is fed what happens — a client frame, a model response, a tool that
finished — and returns the actions that follow: events and audio for the client,
input for the model, tool tasks to start or cancel, the end of the session. The
I/O layer (`live.server`) carries the actions out. Every rule about turns, tools
and interruptions lives here, where a test can drive it without sockets.

Turn state: `LISTENING -> RESPONDING -> (INTERRUPTED | LISTENING)`. After the model
reports `interrupted`, audio of the interrupted generation is dropped — both what
is still queued for the client (`FlushAudio`) and what arrives late — until the
interrupted turn is closed by `turn_complete`, the client starts a new turn of its
own (text, activity end, tool result), or `late_audio_window` seconds pass (some
servers never close an interrupted turn).

Tool calls: `PENDING -> (ANSWERED | CANCELLED | TIMED_OUT)`. Every call the model
makes gets exactly one response, unless the model cancels it first.
"""

from __future__ import annotations

import dataclasses
import enum
import uuid
from typing import Any, TypeAlias

from google.genai import types

from live.llm import AUDIO_STREAM_END, LlmResponse, RealtimeInput
from live.protocol import (
    ActivityEnd,
    ActivityStart,
    AudioEnd,
    ClientMessage,
    ErrorEvent,
    GenerationComplete,
    ProtocolError,
    ServerEvent,
    SessionClose,
    SessionGoAway,
    SessionStart,
    Text,
    TextEvent,
    ToolCallEvent,
    ToolCancelled,
    ToolResult,
    ToolResultEvent,
    TranscriptInput,
    TranscriptOutput,
    TurnComplete,
    TurnInterrupted,
    Usage,
    parse_client_message,
)

__all__ = [
    "AwaitClientTool",
    "ReconnectPolicy",
    "CancelTool",
    "CloseSession",
    "FlushAudio",
    "RunTool",
    "SendAudio",
    "SendEvent",
    "SessionCore",
    "ToUpstream",
    "ToolState",
    "TurnState",
]


class TurnState(enum.Enum):
    LISTENING = "listening"
    RESPONDING = "responding"
    INTERRUPTED = "interrupted"


class ToolState(enum.Enum):
    PENDING = "pending"
    ANSWERED = "answered"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"


# ------------------------------------------------------------------ actions


@dataclasses.dataclass(frozen=True, slots=True)
class SendEvent:
    """Send a JSON event to the client, ahead of any queued audio."""

    event: ServerEvent


@dataclasses.dataclass(frozen=True, slots=True)
class SendAudio:
    """Queue model audio (PCM16 at 24 kHz) for the client, in order."""

    data: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class FlushAudio:
    """Discard every audio chunk still queued for the client."""


@dataclasses.dataclass(frozen=True, slots=True)
class ToUpstream:
    """Send to the model: a `Content` (user turn or function responses) or realtime input."""

    item: types.Content | RealtimeInput


@dataclasses.dataclass(frozen=True, slots=True)
class RunTool:
    """Start the server-side tool for this call, as a task keyed by the call id."""

    call: types.FunctionCall


@dataclasses.dataclass(frozen=True, slots=True)
class AwaitClientTool:
    """Wait `timeout` seconds for the client's `tool.result`, then answer with an error."""

    call: types.FunctionCall
    timeout: float


@dataclasses.dataclass(frozen=True, slots=True)
class CancelTool:
    """Cancel the task (server tool or client deadline) of this call."""

    call_id: str


@dataclasses.dataclass(frozen=True, slots=True)
class CloseSession:
    """End the session: `reason` goes into `session.closed` and the log."""

    reason: str


Action: TypeAlias = (
    SendEvent | SendAudio | FlushAudio | ToUpstream | RunTool | AwaitClientTool | CancelTool | CloseSession
)


@dataclasses.dataclass(slots=True)
class _ToolCall:
    name: str
    runs_on: str
    state: ToolState = ToolState.PENDING


def function_response_content(call_id: str, name: str, response: dict[str, Any]) -> types.Content:
    """A user content made of one function response: how tool results go to the model."""
    return types.Content(
        role="user",
        parts=[
            types.Part(
                function_response=types.FunctionResponse(id=call_id, name=name, response=response)
            )
        ],
    )


def _usage_event(usage: types.UsageMetadata) -> Usage:
    return Usage(
        prompt_tokens=usage.prompt_token_count,
        response_tokens=usage.response_token_count,
        total_tokens=usage.total_token_count,
        cached_tokens=usage.cached_content_token_count,
        thoughts_tokens=usage.thoughts_token_count,
        tool_use_prompt_tokens=usage.tool_use_prompt_token_count,
    )


class SessionCore:
    """Turn, tool and interruption bookkeeping for one started session.

    `server_tools` names the tools the server runs; calls for any other name go to
    the client. `client_tool_timeout` bounds how long a client-run call may take.
    """

    def __init__(
        self,
        *,
        input_rate: int,
        server_tools: frozenset[str] = frozenset(),
        client_tool_timeout: float = 30.0,
        late_audio_window: float = 1.5,
    ) -> None:
        self.input_mime = f"audio/pcm;rate={input_rate}"
        # Copied per frame: half the cost of model_construct, the same Blob.
        self._audio_blob = types.Blob.model_construct(data=b"", mime_type=self.input_mime)
        self.server_tools = server_tools
        self.client_tool_timeout = client_tool_timeout
        self.late_audio_window = late_audio_window
        self.turn = TurnState.LISTENING
        self.tools: dict[str, _ToolCall] = {}
        self.resumption_handle: str | None = None
        self.late_audio_dropped = 0
        self.awaiting_reply_since: float | None = None
        self._owed_turn: types.Content | None = None
        self._replay: types.Content | None = None
        self._interrupted_at = 0.0

    # -------------------------------------------------------------- client side

    def client_audio(self, data: bytes) -> types.Blob:
        """Validate one binary frame of PCM16 audio; the hot path, kept minimal.

        Raises `ProtocolError` (not fatal) for an odd number of bytes.
        """
        if len(data) & 1:
            raise ProtocolError(
                "invalid_audio",
                f"audio frames are PCM16: an even number of bytes, got {len(data)}; "
                "the frame was dropped",
            )
        return self._audio_blob.model_copy(update={"data": data})

    def joined_audio(self, blobs: list[types.Blob]) -> types.Blob:
        """Consecutive client frames as one chunk (they share the session's rate)."""
        return self._audio_blob.model_copy(update={"data": b"".join(b.data or b"" for b in blobs)})

    def client_text(self, raw: str, now: float) -> list[Action]:
        """Handle one client text frame; bad input becomes an `error` event."""
        try:
            message = parse_client_message(raw)
        except ProtocolError as exc:
            return [SendEvent(ErrorEvent(exc.code, exc.message, exc.fatal))]
        return self.client_message(message, now)

    def client_message(self, message: ClientMessage, now: float) -> list[Action]:
        if isinstance(message, SessionStart):
            return [
                SendEvent(
                    ErrorEvent(
                        "already_started",
                        "session.start was already received; this one was ignored",
                    )
                )
            ]
        if isinstance(message, SessionClose):
            return [CloseSession("client closed the session")]
        if isinstance(message, AudioEnd):
            return [ToUpstream(AUDIO_STREAM_END)]
        if isinstance(message, ActivityStart):
            return [ToUpstream(types.ActivityStart())]
        # What follows starts a new user turn of the client's own: late audio of an
        # interrupted reply can no longer be on its way, and the model owes a reply.
        self._end_interruption()
        self.awaiting_reply_since = now
        if isinstance(message, ActivityEnd):
            return [ToUpstream(types.ActivityEnd())]
        if isinstance(message, Text):
            content = types.Content(role="user", parts=[types.Part(text=message.text)])
            return [ToUpstream(content)]
        assert isinstance(message, ToolResult)
        return self._client_tool_result(message)

    def _client_tool_result(self, message: ToolResult) -> list[Action]:
        call = self.tools.get(message.id)
        if call is None or call.runs_on != "client":
            return [
                SendEvent(
                    ErrorEvent(
                        "unknown_tool_call",
                        f"tool.result for {message.id!r}: no call with that id is waiting "
                        "for the client",
                    )
                )
            ]
        if call.state is not ToolState.PENDING:
            return [
                SendEvent(
                    ErrorEvent(
                        "tool_call_closed",
                        f"tool.result for {message.id!r} came too late: the call was "
                        f"already {call.state.value}",
                    )
                )
            ]
        if message.name != call.name:
            return [
                SendEvent(
                    ErrorEvent(
                        "invalid_field",
                        f"tool.result for {message.id!r} names {message.name!r}, but the "
                        f"call was to {call.name!r}",
                    )
                )
            ]
        call.state = ToolState.ANSWERED
        return [
            CancelTool(message.id),
            ToUpstream(function_response_content(message.id, call.name, message.response)),
        ]

    # -------------------------------------------------------------- model side

    def model_response(self, response: LlmResponse, now: float) -> list[Action]:
        """Map one model response to actions, looking at every field."""
        actions: list[Action] = []
        if (
            response.content is not None
            or response.output_transcription is not None
            or response.turn_complete
            or response.interrupted
            or response.generation_complete
        ):
            self.awaiting_reply_since = None  # the model is answering
            self._owed_turn = None
        if response.interrupted:
            # First: audio bundled with the interruption belongs to the old reply.
            self.turn = TurnState.INTERRUPTED
            self._interrupted_at = now
            actions.append(FlushAudio())
            actions.append(SendEvent(TurnInterrupted()))
        elif (
            self.turn is TurnState.INTERRUPTED
            and now - self._interrupted_at > self.late_audio_window
        ):
            self._end_interruption()

        content = response.content
        if content is not None and content.parts:
            for part in content.parts:
                self._map_part(part, response.partial, actions)
        if response.output_transcription is not None and self.turn is TurnState.LISTENING:
            self.turn = TurnState.RESPONDING  # a reply has begun, audio or not

        if response.input_transcription is not None:
            t = response.input_transcription
            if t.text or t.finished:
                actions.append(SendEvent(TranscriptInput(t.text or "", bool(t.finished))))
        if response.output_transcription is not None:
            t = response.output_transcription
            if t.text or t.finished:
                actions.append(SendEvent(TranscriptOutput(t.text or "", bool(t.finished))))
        if response.cancelled_tool_call_ids:
            actions.extend(self._cancel_tools(response.cancelled_tool_call_ids))
        if response.generation_complete:
            actions.append(SendEvent(GenerationComplete()))
        if response.turn_complete:
            self.turn = TurnState.LISTENING
            reason = response.turn_complete_reason
            actions.append(SendEvent(TurnComplete(reason.value if reason else None)))
        if response.usage_metadata is not None:
            actions.append(SendEvent(_usage_event(response.usage_metadata)))
        if response.go_away_time_left is not None:
            actions.append(SendEvent(SessionGoAway(response.go_away_time_left)))
        update = response.session_resumption_update
        if update is not None and update.resumable and update.new_handle:
            self.resumption_handle = update.new_handle
            self._owed_turn = None  # the state behind this handle holds the turn
        if response.error_code or response.error_message:
            actions.append(
                SendEvent(
                    ErrorEvent(
                        "model_error",
                        f"{response.error_code or 'error'}: {response.error_message or ''}".strip(),
                    )
                )
            )
        return actions

    def _map_part(self, part: types.Part, partial: bool, actions: list[Action]) -> None:
        blob = part.inline_data
        if blob is not None and blob.data:
            if (blob.mime_type or "audio/").startswith("audio/"):
                if self.turn is TurnState.INTERRUPTED:
                    self.late_audio_dropped += 1
                    return
                self.turn = TurnState.RESPONDING
                actions.append(SendAudio(blob.data))
            return
        if part.function_call is not None:
            actions.extend(self._tool_call(part.function_call))
            return
        if part.text and not part.thought:
            if self.turn is TurnState.LISTENING:
                self.turn = TurnState.RESPONDING
            actions.append(SendEvent(TextEvent(part.text, partial)))

    def _tool_call(self, call: types.FunctionCall) -> list[Action]:
        # A new call means a new generation: nothing late can follow the interrupted one.
        self._end_interruption()
        call_id = call.id or f"live-{uuid.uuid4().hex[:12]}"
        if call.id != call_id:
            call = call.model_copy(update={"id": call_id})
        name = call.name or ""
        runs_on = "server" if name in self.server_tools else "client"
        self._forget_closed_calls()
        self.tools[call_id] = _ToolCall(name=name, runs_on=runs_on)
        event = SendEvent(ToolCallEvent(call_id, name, dict(call.args or {}), runs_on))
        if runs_on == "server":
            return [event, RunTool(call)]
        return [event, AwaitClientTool(call, self.client_tool_timeout)]

    def _cancel_tools(self, ids: tuple[str, ...]) -> list[Action]:
        actions: list[Action] = []
        cancelled = []
        for call_id in ids:
            call = self.tools.get(call_id)
            if call is None or call.state is not ToolState.PENDING:
                continue
            call.state = ToolState.CANCELLED
            cancelled.append(call_id)
            actions.append(CancelTool(call_id))
        if cancelled:
            actions.append(SendEvent(ToolCancelled(tuple(cancelled))))
        return actions

    # -------------------------------------------------------------- tool side

    def tool_finished(self, call_id: str, response: dict[str, Any], now: float) -> list[Action]:
        """A server tool returned (or failed: `response` then holds an `error`)."""
        call = self.tools.get(call_id)
        if call is None or call.state is not ToolState.PENDING:
            return []
        call.state = ToolState.ANSWERED
        self.awaiting_reply_since = now
        return [
            ToUpstream(function_response_content(call_id, call.name, response)),
            SendEvent(ToolResultEvent(call_id, call.name, response)),
        ]

    def client_tool_expired(self, call_id: str, now: float) -> list[Action]:
        """The client did not answer a call in time: the model still gets an answer."""
        call = self.tools.get(call_id)
        if call is None or call.state is not ToolState.PENDING:
            return []
        call.state = ToolState.TIMED_OUT
        self.awaiting_reply_since = now
        message = (
            f"the client did not return a result for {call.name!r} within "
            f"{self.client_tool_timeout:g} s"
        )
        response = {"error": message}
        return [
            ToUpstream(function_response_content(call_id, call.name, response)),
            SendEvent(ErrorEvent("tool_timeout", f"tool call {call_id!r}: {message}")),
        ]

    @property
    def pending_tool_calls(self) -> list[str]:
        return [i for i, c in self.tools.items() if c.state is ToolState.PENDING]

    def content_sent(self, content: types.Content) -> None:
        """A content reached the model; a typed user turn is then owed a reply."""
        if content.role == "user" and content.parts and content.parts[0].text is not None:
            self._owed_turn = content

    def connection_lost(self) -> list[Action]:
        """The model connection is going away; a new one (resumed) will follow.

        A reply cut short will not go on: the client hears `turn.complete` with
        reason `connection_lost`. A typed turn the model never answered, and that
        no handle issued since holds, is kept to be sent again on resume.
        """
        actions: list[Action] = []
        if self.turn is not TurnState.LISTENING:
            actions.append(SendEvent(TurnComplete("connection_lost")))
        self.turn = TurnState.LISTENING
        if self._owed_turn is not None:
            self._replay, self._owed_turn = self._owed_turn, None
        return actions

    def connection_resumed(self, now: float) -> list[Action]:
        """A resumed connection took over: resend the unanswered typed turn.

        Pending tool calls stay pending (their results go to the new
        connection), and a reply still owed is timed from now.
        """
        if self.awaiting_reply_since is not None:
            self.awaiting_reply_since = now
        replay, self._replay = self._replay, None
        return [ToUpstream(replay)] if replay is not None else []

    @property
    def at_safe_point(self) -> bool:
        """Nothing in flight: no reply owed or being generated, no call unanswered.

        The moment to replace the model connection without losing anything.
        """
        return (
            self.turn is TurnState.LISTENING
            and self.awaiting_reply_since is None
            and not self.pending_tool_calls
        )

    def stalled(self, now: float, timeout: float) -> bool:
        """The model owes a reply (to a user turn or a tool result) for too long."""
        since = self.awaiting_reply_since
        return since is not None and now - since > timeout

    def _forget_closed_calls(self, keep: int = 256) -> None:
        """Bound the call table: closed calls are kept only to explain late results."""
        if len(self.tools) <= 2 * keep:
            return
        closed = [i for i, c in self.tools.items() if c.state is not ToolState.PENDING]
        for call_id in closed[: len(closed) - keep]:
            del self.tools[call_id]

    def _end_interruption(self) -> None:
        if self.turn is TurnState.INTERRUPTED:
            self.turn = TurnState.LISTENING


@dataclasses.dataclass
class ReconnectPolicy:
    """When to try the model connection again after it failed, and when to give up.

    Delays grow from `base_delay` to `max_delay`; after `max_failures` failures in
    a row the session ends. A connection that stayed up `stable_after` seconds
    resets the count, so a long conversation is not failed by drops hours apart.
    """

    max_failures: int = 5
    base_delay: float = 0.25
    max_delay: float = 5.0
    stable_after: float = 60.0
    failures: int = 0
    _connected_at: float | None = None

    def connected(self, now: float) -> None:
        self._connected_at = now

    def failed(self, now: float) -> float | None:
        """Record a failure; the delay before the next attempt, or None to give up."""
        if self._connected_at is not None and now - self._connected_at >= self.stable_after:
            self.failures = 0
        self._connected_at = None
        self.failures += 1
        if self.failures > self.max_failures:
            return None
        return min(self.max_delay, self.base_delay * 2 ** (self.failures - 1))
