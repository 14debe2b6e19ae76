"""A session's turn and function calls as data: their states, and how results are told to a model."""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any

from google.genai import types

__all__ = ["ToolCall", "ToolState", "TurnState", "function_response_content", "tool_context_content"]


class TurnState(enum.Enum):
    LISTENING = "listening"
    RESPONDING = "responding"
    INTERRUPTED = "interrupted"


class ToolState(enum.Enum):
    PENDING = "pending"
    ANSWERED = "answered"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"


@dataclasses.dataclass(slots=True)
class ToolCall:
    """One function call the model made, and what became of it."""

    name: str
    runs_on: str
    args: dict[str, Any]
    epoch: int
    state: ToolState = ToolState.PENDING
    response: dict[str, Any] | None = None
    sent_epoch: int | None = None  # the epoch whose connection took the response
    covered: bool = False  # a resumable handle issued after the response holds it
    told: bool = False  # its result reached a model connection (and the transcript)
    # The typed turns owed an answer when the model made this call: the call
    # acts on them, so they are never asked again (the call would run again).
    asked: tuple[Any, ...] = ()
    replied: bool = False  # the model answered after taking its result


def function_response_content(
    call_id: str,
    name: str,
    response: dict[str, Any],
    scheduling: types.FunctionResponseScheduling | None = None,
) -> types.Content:
    """A user content made of one function response: how tool results go to the
    model (`scheduling`: what a model with non-blocking calls does with it)."""
    return types.Content(
        role="user",
        parts=[
            types.Part(
                function_response=types.FunctionResponse(
                    id=call_id, name=name, response=response, scheduling=scheduling
                )
            )
        ],
    )


def tool_context_content(
    results: list[tuple[str, dict[str, Any], dict[str, Any]]],
) -> types.Content:
    """What a model on a new connection is told of tool calls it cannot answer for.

    A user-role text (the one kind of input every model takes mid-session),
    marked as context so the model does not take it for the user's words.
    """
    lines = [
        "[Context, not said by the user: the connection to you was restored. Before "
        "that, you called these tools and they ran; use their results.]"
    ]
    for name, args, response in results:
        lines.append(
            f"- {name}({json.dumps(args, ensure_ascii=False, default=str)}) returned "
            f"{json.dumps(response, ensure_ascii=False, default=str)}"
        )
    return types.Content(role="user", parts=[types.Part(text="\n".join(lines))])
