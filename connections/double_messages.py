"""The Live API's server messages, built for the double's scripts.

Each returns a `types.LiveServerMessage` as google-genai parses it from the
wire; `bundle` merges several into one, as Gemini 3 sends them. Any message
built by hand works in a script too. `connections.double` offers them all
(`double.audio(...)`, `double.turn_complete()`).
"""

from __future__ import annotations

from typing import Any

from google.genai import types

__all__ = [
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



def audio(pcm: bytes, *, rate: int = 24000) -> types.LiveServerMessage:
    """A chunk of model audio: PCM16 mono at `rate` (Gemini sends 24 kHz)."""
    blob = types.Blob(data=pcm, mime_type=f"audio/pcm;rate={rate}")
    return types.LiveServerMessage(
        server_content=types.LiveServerContent(
            model_turn=types.Content(role="model", parts=[types.Part(inline_data=blob)])
        )
    )


def text(value: str) -> types.LiveServerMessage:
    """A chunk of model text (text-modality sessions)."""
    return types.LiveServerMessage(
        server_content=types.LiveServerContent(
            model_turn=types.Content(role="model", parts=[types.Part(text=value)])
        )
    )


def output_transcript(value: str, *, finished: bool | None = None) -> types.LiveServerMessage:
    """A fragment of the transcript of what the model says."""
    return types.LiveServerMessage(
        server_content=types.LiveServerContent(
            output_transcription=types.Transcription(text=value, finished=finished)
        )
    )


def input_transcript(value: str, *, finished: bool | None = None) -> types.LiveServerMessage:
    """A fragment of the transcript of what the user says."""
    return types.LiveServerMessage(
        server_content=types.LiveServerContent(
            input_transcription=types.Transcription(text=value, finished=finished)
        )
    )


def tool_calls(*calls: types.FunctionCall) -> types.LiveServerMessage:
    """One `toolCall` message asking for several calls at once (parallel calls)."""
    return types.LiveServerMessage(
        tool_call=types.LiveServerToolCall(function_calls=list(calls))
    )


def tool_call(
    name: str, args: dict[str, Any] | None = None, *, id: str | None = None
) -> types.LiveServerMessage:
    """A `toolCall` for one function; `id=None` omits the id, as some servers do."""
    return tool_calls(types.FunctionCall(name=name, args=args or {}, id=id))


def tool_call_cancellation(*ids: str) -> types.LiveServerMessage:
    """The model no longer wants these calls answered."""
    return types.LiveServerMessage(
        tool_call_cancellation=types.LiveServerToolCallCancellation(ids=list(ids))
    )


def turn_complete(
    *,
    reason: types.TurnCompleteReason | None = None,
    waiting_for_input: bool | None = None,
) -> types.LiveServerMessage:
    """The model finished its turn (the SDK's `receive()` stops after this)."""
    return types.LiveServerMessage(
        server_content=types.LiveServerContent(
            turn_complete=True,
            turn_complete_reason=reason,
            waiting_for_input=waiting_for_input,
        )
    )


def generation_complete() -> types.LiveServerMessage:
    """The model's output for this turn is complete (turnComplete comes later)."""
    return types.LiveServerMessage(
        server_content=types.LiveServerContent(generation_complete=True)
    )


def interrupted() -> types.LiveServerMessage:
    """The user barged in; the current generation is abandoned."""
    return types.LiveServerMessage(server_content=types.LiveServerContent(interrupted=True))


def go_away(seconds: float | str) -> types.LiveServerMessage:
    """The server will close this connection in `seconds` (a number or `"9.5s"`)."""
    left = seconds if isinstance(seconds, str) else f"{seconds:g}s"
    return types.LiveServerMessage(go_away=types.LiveServerGoAway(time_left=left))


def resumption_update(handle: str | None, *, resumable: bool = True) -> types.LiveServerMessage:
    """A new session-resumption handle (usable only when `resumable`)."""
    return types.LiveServerMessage(
        session_resumption_update=types.LiveServerSessionResumptionUpdate(
            new_handle=handle, resumable=resumable
        )
    )


def usage(
    *, prompt: int = 0, response: int = 0, total: int | None = None
) -> types.LiveServerMessage:
    """Token counts for cost accounting (`total` defaults to prompt + response)."""
    return types.LiveServerMessage(
        usage_metadata=types.UsageMetadata(
            prompt_token_count=prompt,
            response_token_count=response,
            total_token_count=prompt + response if total is None else total,
        )
    )


def bundle(*messages: types.LiveServerMessage) -> types.LiveServerMessage:
    """One message carrying every field of `messages`, as Gemini 3 sends them.

    Model-turn parts are concatenated in order; other fields are merged, later
    messages winning where both set the same one.
    """
    merged: dict[str, Any] = {}
    for message in messages:
        _merge(merged, message.model_dump(exclude_none=True))
    return types.LiveServerMessage.model_validate(merged)


def _merge(into: dict[str, Any], other: dict[str, Any]) -> None:
    for key, value in other.items():
        if key == "parts" and key in into:
            into[key] = [*into[key], *value]
        elif isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
