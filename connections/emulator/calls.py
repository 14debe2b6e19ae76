"""Function calls of an emulated Live session: the calls the model makes, the
responses it takes, and what it does while it waits (or does not).

A blocking call makes the model wait for every response before it answers;
a non-blocking one (gemini-3.8 by default, or a declaration that says
NON_BLOCKING) goes out while the model carries on, and its response is
answered as its `scheduling` asks (see `profiles.Profile.non_blocking_calls`).
A non-blocking call's result may stream: a response with `willContinue`
leaves the call open for more, and the first without it closes it; google-genai's
`FunctionResponse.will_continue`: "Signals that function call continues, and
more responses will be returned, turning the function call into a generator.
Is only applicable to NON_BLOCKING function calls, is ignored otherwise. If
set to false, future responses will not be considered." A response to a call
so closed is taken as not considered: ignored.
`FunctionCalls` is part of `EmulatorSession`; it uses the session's state and
plumbing (`_send`, `_at`, `_start_reply`, ...) and has none of its own I/O.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from connections.emulator.profiles import CHECKING, blocks, scheduling_of
from connections.emulator.script import ToolCall
from connections.emulator.wire import token_count
from live.liveapi import ENTITY_NOT_FOUND, INVALID, get_field, unknown_field

__all__ = ["FunctionCalls", "PendingCalls"]


@dataclasses.dataclass(slots=True)
class PendingCalls:
    """Blocking calls the model waits for: their ids still unanswered, the
    results so far, and whether the toolCall went out yet."""

    group: int
    ids: list[str]
    names: dict[str, str]
    sent: bool = False
    results: list[dict[str, Any]] = dataclasses.field(default_factory=list)


class FunctionCalls:
    """The function-call half of `EmulatorSession`.

    State it keeps on the session: `_tools` (the blocking `PendingCalls`, or
    None), `_async_calls` (non-blocking calls sent and unanswered: id -> name),
    `_answers` (results waiting for the model to be free), `_cancelled_ids`
    (calls cancelled, whose late responses are ignored), `_finished_ids`
    (non-blocking calls whose results ended, whose further responses are not
    considered).
    """

    _tools: PendingCalls | None
    _async_calls: dict[str, str]
    _answers: list[dict[str, Any]]
    _cancelled_ids: set[str]
    _finished_ids: set[str]

    def _call_unanswered(self) -> bool:
        tools = self._tools
        return bool(self._async_calls) or (tools is not None and tools.sent and bool(tools.ids))

    def _cancel_blocking_calls(self) -> None:
        tools, self._tools = self._tools, None
        if tools is None:
            return
        self._cancel(tools.group)
        if tools.sent and tools.ids:
            self._cancelled_ids.update(tools.ids)
            self._send({"toolCallCancellation": {"ids": list(tools.ids)}})

    def _call_tools(self, calls: list[ToolCall], text: str) -> None:
        ids = [f"function-call-{self.index}-{next(self._call_ids)}" for _ in calls]
        names = {i: c.name for i, c in zip(ids, calls, strict=True)}
        function_calls = [
            {"id": i, "name": c.name, "args": dict(c.args)} for i, c in zip(ids, calls, strict=True)
        ]

        def send() -> None:
            self.record.tool_calls.extend(function_calls)
            self._history.append(
                {"role": "model", "parts": [{"functionCall": fc} for fc in function_calls]}
            )
            self._send({"toolCall": {"functionCalls": function_calls}})
            self._fault("after_tool_call")

        if not any(blocks(self.profile, self._behaviours.get(c.name, "")) for c in calls):
            # Non-blocking: the call goes out and the model carries on.
            def send_async() -> None:
                self._async_calls.update(names)
                send()

            self._start_reply(user_text=text, tool_results=(), filler=CHECKING, prelude=send_async)
            return
        group = self._new_group()
        pending = PendingCalls(group, list(ids), names)
        self._tools = pending
        self._not_resumable()

        def send_blocking() -> None:
            pending.sent = True
            send()

        self._at(self._now + self.script.scaled(self.script.first_response_delay), send_blocking, group)

    def _on_tool_response(self, body: Any) -> None:
        unknown = unknown_field("tool_response", body, self.route) if isinstance(body, Mapping) else INVALID
        if unknown is not None:
            self._close(1007, unknown)
            return
        responses = get_field(body, "functionResponses") or []
        if not isinstance(responses, list):
            self._close(1007, INVALID)
            return
        if not all(isinstance(r, Mapping) for r in responses):
            self._close(1007, INVALID)
            return
        self.record.tool_responses.extend(dict(r) for r in responses)
        if self._fault("after_tool_response"):
            return
        if self._dice.after_tool_response():
            self._close(1008, ENTITY_NOT_FOUND)
            return
        pending = self._tools
        answered: list[tuple[dict[str, Any], Mapping[str, Any]]] = []  # non-blocking calls
        for response in responses:
            call_id = get_field(response, "id")
            if call_id in self._cancelled_ids or call_id in self._finished_ids:
                continue  # it crossed the cancellation on the wire, or its results ended
            if call_id in self._async_calls:
                if get_field(response, "willContinue") is True:
                    name = self._async_calls[call_id]  # more results follow: the call stays open
                else:
                    name = self._async_calls.pop(call_id)
                    self._finished_ids.add(call_id)
                answered.append((self._take_result(response, call_id, name), response))
            elif pending is None or call_id not in pending.ids:
                # A response to a call this session never issued, or answered
                # already: the strictest reading of the service.
                self._close(1007, f"Function response for unknown call id {call_id!r}.")
                return
            else:
                pending.ids.remove(call_id)
                pending.results.append(self._take_result(response, call_id, pending.names.get(call_id, "")))
        if answered:
            self._answer(answered)
        if pending is not None and not pending.ids and self._tools is pending:
            self._tools = None
            self._cancel(pending.group)
            self._start_reply(user_text="", tool_results=tuple(pending.results))

    def _take_result(self, response: Mapping[str, Any], call_id: Any, name: str) -> dict[str, Any]:
        """A function response into the conversation, as the model will see it."""
        name = get_field(response, "name") or name
        result = {"id": call_id, "name": name, "response": get_field(response, "response")}
        parts = get_field(response, "parts")
        if parts:
            result["parts"] = parts  # files the result carries, as the model takes them
        self._history.append({"role": "user", "parts": [{"functionResponse": result}]})
        self._ctx_tokens["TEXT"] = self._ctx_tokens.get("TEXT", 0) + token_count(json.dumps(result))
        return result

    def _answer(self, answered: list[tuple[dict[str, Any], Mapping[str, Any]]]) -> None:
        """Results of non-blocking calls, answered as their `scheduling` asks."""
        results = [result for result, r in answered if scheduling_of([r]) != "SILENT"]
        if not results:
            if self._in_progress and not self._more_coming():
                self._turn_complete()  # the interaction is over: say so (IDLE)
                self._idle_point()
            return
        self._answers.extend(results)
        if scheduling_of(r for _, r in answered) == "INTERRUPT" and self._gen is not None:
            self._cut()
        self._next()
