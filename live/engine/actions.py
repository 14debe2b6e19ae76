"""What the session core decides: the actions its I/O layer carries out.

`live.engine.session.SessionCore` answers each thing that happens with a list of these;
`live.server.runner.SessionRunner` performs them in order. Plain values, no behaviour.
"""

from __future__ import annotations

import dataclasses
from typing import TypeAlias

from google.genai import types

from live.llm import RealtimeInput
from live.protocol import ServerEvent

__all__ = [
    "Action",
    "AwaitClientTool",
    "CancelTool",
    "CloseSession",
    "FlushAudio",
    "ImageUpstream",
    "PlaybackReported",
    "RunTool",
    "SendAudio",
    "SendEvent",
    "ToUpstream",
]


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
class ImageUpstream:
    """Send an image frame to the model as realtime video, in order with the audio.

    Unlike `ToUpstream`, it may be dropped on the way if the model falls behind
    (`live.server.queues.UpstreamQueue`): a newer frame of the same view replaces it.
    """

    blob: types.Blob


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
class PlaybackReported:
    """The client says how many seconds of the interrupted reply it played."""

    played: float


@dataclasses.dataclass(frozen=True, slots=True)
class CloseSession:
    """End the session: `reason` goes into `session.closed` and the log."""

    reason: str


Action: TypeAlias = (
    SendEvent
    | SendAudio
    | FlushAudio
    | ToUpstream
    | ImageUpstream
    | RunTool
    | AwaitClientTool
    | CancelTool
    | CloseSession
    | PlaybackReported
)
