"""A session's function calls: the calls the model makes, who runs each, and
the one answer each gets. The `ToolRules` part of `live.engine.session.SessionCore`.

Tool calls: `PENDING -> (ANSWERED | CANCELLED | TIMED_OUT)`. Every call the model
makes gets exactly one response, unless the model cancels it first; a call
whose result streams (`will_continue`) stays pending until its last. A call the
client runs waits for it `client_tool_timeout` seconds (None: as long as the
client takes, as the Live API's service waits for an app's tool). Under
`results_by_id` a client's result is paired with its call by id alone, as the
Live API pairs them, whatever name it gives. No I/O.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from google.genai import types

from live.engine.actions import Action, AwaitClientTool, CancelTool, RunTool, SendEvent, ToUpstream
from live.engine.session_state import ToolCall, ToolState, TurnState, function_response_content
from live.protocol import ErrorEvent, ToolCallEvent, ToolCancelled, ToolResult, ToolResultEvent

if TYPE_CHECKING:
    from live.engine.transcript import Transcript
    from live.families import ModelFamily

__all__ = ["ToolRules"]


class ToolRules:
    """Function calls for `SessionCore` (its state lives on the core)."""

    tools: dict[str, ToolCall]
    server_tools: frozenset[str]
    client_tool_timeout: float | None
    results_by_id: bool
    scheduling: dict[str, types.FunctionResponseScheduling]
    epoch: int
    turn: TurnState
    family: ModelFamily
    holds_realtime: bool
    awaiting_reply_since: float | None
    transcript: Transcript
    _sent_unseen: bool
    _owed: list[types.Content]

    def _end_interruption(self) -> None: ...

    def _client_tool_result(self, message: ToolResult, now: float) -> list[Action]:
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
        if message.name != call.name and not self.results_by_id:
            return [
                SendEvent(
                    ErrorEvent(
                        "invalid_field",
                        f"tool.result for {message.id!r} names {message.name!r}, but the "
                        f"call was to {call.name!r}",
                    )
                )
            ]
        scheduling = _scheduling(message.scheduling)
        if scheduling is not types.FunctionResponseScheduling.SILENT:
            self.awaiting_reply_since = now  # a SILENT result is taken in without a word
        call.response = message.response
        actions: list[Action] = []
        if not message.will_continue:  # else more results follow (a streamed result): still pending
            call.state = ToolState.ANSWERED
            actions.append(CancelTool(message.id))
        parts = [types.FunctionResponsePart.model_validate(part) for part in message.parts] or None
        result = types.FunctionResponse(
            id=message.id,
            name=call.name,
            response=message.response,
            scheduling=scheduling,
            will_continue=message.will_continue,
            parts=parts,
        )
        response = types.Content(role="user", parts=[types.Part(function_response=result)])
        actions.append(ToUpstream(response))
        return actions

    def _tool_call(self, call: types.FunctionCall) -> list[Action]:
        # A new call means a new generation: nothing late can follow the interrupted one.
        self._end_interruption()
        self._sent_unseen = False
        call_id = call.id or f"live-{uuid.uuid4().hex[:12]}"
        if call.id != call_id:
            call = call.model_copy(update={"id": call_id})
        name = call.name or ""
        runs_on = "server" if name in self.server_tools else "client"
        self._forget_closed_calls()
        args = dict(call.args or {})
        # Like a reply, a call acts on the typed turns sent before it.
        self.tools[call_id] = ToolCall(
            name=name, runs_on=runs_on, args=args, epoch=self.epoch, asked=tuple(self._owed)
        )
        self.transcript.call(name, args)
        self._update_hold()
        event = SendEvent(ToolCallEvent(call_id, name, args, runs_on))
        if runs_on == "server":
            return [event, RunTool(call)]
        if self.client_tool_timeout is None:
            return [event]  # the client takes as long as it takes: no deadline task
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
            self._update_hold()
            actions.append(SendEvent(ToolCancelled(tuple(cancelled))))
        return actions

    # -------------------------------------------------------------- tool side

    def tool_finished(self, call_id: str, response: dict[str, Any], now: float) -> list[Action]:
        """A server tool returned (or failed: `response` then holds an `error`)."""
        call = self.tools.get(call_id)
        if call is None or call.state is not ToolState.PENDING:
            return []
        call.state = ToolState.ANSWERED
        call.response = response
        scheduling = self.scheduling.get(call.name)
        if scheduling is not types.FunctionResponseScheduling.SILENT:
            self.awaiting_reply_since = now  # a SILENT result is taken in without a word
        return [
            ToUpstream(function_response_content(call_id, call.name, response, scheduling)),
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
        call.response = response
        return [
            ToUpstream(function_response_content(call_id, call.name, response)),
            SendEvent(ErrorEvent("tool_timeout", f"tool call {call_id!r}: {message}")),
        ]

    @property
    def pending_tool_calls(self) -> list[str]:
        return [i for i, c in self.tools.items() if c.state is ToolState.PENDING]

    @property
    def call_owed(self) -> bool:
        """The current connection made a call that has not been answered on it yet."""
        epoch = self.epoch
        return any(
            c.epoch == epoch and c.sent_epoch != epoch and c.state is not ToolState.CANCELLED
            for c in self.tools.values()
        )

    def _update_hold(self) -> None:
        """`holds_realtime`: realtime input must wait, since this model takes none
        while a call is owed. Kept current where calls are made, answered,
        cancelled, or their connection replaced (read per model message)."""
        self.holds_realtime = not self.family.realtime_input_while_call_owed and self.call_owed

    def _forget_closed_calls(self, keep: int = 256) -> None:
        """Bound the call table: closed calls are kept only to explain late results."""
        if len(self.tools) <= 2 * keep:
            return
        # Never a call whose response is queued or uncovered (it may still have to
        # be told to a new connection), unless the table is far past its bound.
        far_past = len(self.tools) > 4 * keep
        closed = [
            i
            for i, c in self.tools.items()
            if c.state is not ToolState.PENDING and (c.covered or far_past)
        ]
        for call_id in closed[: len(closed) - keep]:
            del self.tools[call_id]


def _scheduling(value: str | None) -> types.FunctionResponseScheduling | None:
    """A result's `scheduling` as the model takes it (None: the model's default)."""
    if value is None:
        return None
    try:
        return types.FunctionResponseScheduling(value)
    except ValueError:
        return None
