"""What the session core decides: the actions its I/O layer carries out.

`live.engine.session.SessionCore` answers each thing that happens with a list of these;
`live.server.runner.SessionRunner` performs them in order. Plain values, no behaviour.

The conversation policies (`live.engine.policies`) answer with actions of their
own (`PolicyAction`), carried out by `live.server.policies`.
"""

from __future__ import annotations

import dataclasses
from typing import TypeAlias

from google.genai import types

from live.agent import Clip
from live.llm import RealtimeInput
from live.protocol import ServerEvent

__all__ = [
    "Action",
    "AwaitClientTool",
    "CancelTool",
    "CloseSession",
    "EndSession",
    "FlushAudio",
    "ImageUpstream",
    "PlayClip",
    "PlaybackReported",
    "PolicyAction",
    "Prompt",
    "RunTool",
    "SendAudio",
    "SendEvent",
    "ThinkingSound",
    "ToUpstream",
    "UserInput",
    "WatchPlayback",
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


# ---------------------------------------------------------------------------
# The conversation policies' actions (live.engine.policies)
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Prompt:
    """Ask the model to speak: `text` goes to it as a typed turn (each model
    family takes it its own way), marked as not said by the user."""

    text: str


@dataclasses.dataclass(frozen=True, slots=True)
class PlayClip:
    """Play a recording as the agent's voice, then end it as a turn (so a
    client, and a carrier's marks, know it is over)."""

    clip: Clip


@dataclasses.dataclass(frozen=True, slots=True)
class WatchPlayback:
    """Report (`played_out(number)`) once everything queued for the client so
    far has been played at its end: the carrier's mark after the last frame
    where the door reports it, else the server's estimate from its pacing."""

    number: int


@dataclasses.dataclass(frozen=True, slots=True)
class UserInput:
    """What becomes of the user's audio: `open` (to the model), `held` (kept
    from the model, and sent on when the hold ends: it interrupts nothing),
    `muted` (dropped; the client is told, if its door shows a mute).
    `reason` says why it is not open: `tool`, `must_hear`, `ending`."""

    mode: str
    reason: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class ThinkingSound:
    """Start (`on`) or stop the agent's hold sound."""

    on: bool


@dataclasses.dataclass(frozen=True, slots=True)
class EndSession:
    """End the session now (its goodbye was heard): `reason` goes into
    `session.closed` and the log; a phone call is hung up."""

    reason: str


PolicyAction: TypeAlias = Prompt | PlayClip | WatchPlayback | UserInput | ThinkingSound | EndSession
