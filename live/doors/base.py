"""The front-door seam: one client's wire protocol, between its socket and the session.

A conversation is the same whichever way a client reaches it: audio and text in,
audio, transcripts and tool calls out, interruptions, resumption across model
connections. What differs is the wire: our JSON + binary PCM protocol for the
browser and `live mic`, a carrier's media stream for a phone call, the Live API
itself for an app written against Gemini. A `FrontDoor` is that difference and
nothing more:

- `opening(frame)`: what a frame before the session means (the start, with its
  credential; a resume; a close; an error to answer; nothing);
- `inputs(frame)`: what a frame during the session means, as session inputs:
  audio (`bytes`, PCM16 at the session's input rate) and typed messages
  (`live.protocol` client messages: text, tool results, images, activity,
  playback reports, close);
- `event(event)`: how a session event is written for this client (a frame, or
  None when this client has no use for it);
- `audio(pcm)`: how reply audio (PCM16 mono at 24 kHz, already paced to real
  time by the session) is written: format, rate, frame size;
- `capabilities`: what the client can do (reattach after a drop, run tools,
  send images), which the session honours; `resumable()`, whether this client
  may come back (a Live API app that asked for session resumption may);
- `going_away(time_left)`: how the client is told its server is stopping;
- `admitted(start, grant)`: the start as the client's token lets it be;
- `closing(code, reason, error)`: the close code and reason this client is
  told its session ended with (by default the server's own);
- `in_step_events`: the events whose frames depend on the reply audio before
  them (a carrier's last frame of a reply and its mark): the session asks for
  their frames when their turn comes in the paced stream, not when queued;
- `end(reason)`: the session ended on the server's side; end what the client
  is on (a phone call: hang up through the carrier). The one thing a door may
  do with I/O, awaited (within a bound) before its socket is closed.

A door holds per-connection state (a carrier's stream id, a resampler), so the
server makes one per socket, from the door's route. It does no I/O but `end`:
a test drives it with frames and reads what it returns.

Besides the client's own messages, a door may give the session two signals
among its inputs:

- `PlayedOut`: everything the session sent before it has been played at the
  client's end (a carrier echoes a mark sent after a reply's last frame once
  that frame has played; `Capabilities.reports_played_out`). A policy that
  hangs up after a goodbye waits for it, then ends the session, and `end`
  hangs up.
- `SessionTask`: an awaitable the door asks the session to run as one of its
  own tasks (an agent's `async` key handler): it ends with the session, and
  what it raises is logged, never the session's end.

Capabilities a phone call has (`Capabilities.call`): it cannot come back on
another socket; a stopping server lets it finish (up to its drain timeout)
and then has the agent say goodbye, since ending it hangs up on a person.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, ClassVar, TypeAlias

from websockets.http11 import Request

from live.access.auth import Grant
from live.protocol import (
    ClientMessage,
    ErrorEvent,
    ProtocolError,
    ServerEvent,
    SessionClose,
    SessionGoAway,
    SessionResume,
    SessionStart,
)

__all__ = ["Capabilities", "FrontDoor", "Input", "Opening", "PlayedOut", "SessionTask"]


@dataclasses.dataclass(frozen=True, slots=True)
class PlayedOut:
    """The client played everything the session sent before this signal
    (see the module's docstring)."""


@dataclasses.dataclass(frozen=True, slots=True)
class SessionTask:
    """Something the door asks the session to run as a task of its own: `run()`
    is awaited in the session's task group; `name` says what it is in the log."""

    run: Callable[[], Awaitable[object]]
    name: str


# What opens a session (or ends the socket before one).
Opening: TypeAlias = SessionStart | SessionResume | SessionClose
# One session input: client audio (PCM16 at the session's input rate), a
# message, or a door's signal to the session.
Input: TypeAlias = bytes | ClientMessage | PlayedOut | SessionTask


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a client behind a door can do.

    - `reattach`: after a dropped socket the client may come back with
      `session.resume`; the session keeps its stream (numbered) for a replay.
    - `client_tools`: the agent's client-side tools are offered to it.
    - `images`: it may send camera or screen frames.
    - `usage_with_turn_end`: a turn's usage comes on its `TurnComplete`
      (`usage`) when the model sends both together, not as an event after it.
    - `raw_audio`: binary frames in are PCM16 at the session's rate as they are,
      and reply audio goes out as binary PCM16 frames as it is: the session then
      takes the fast lane (no call into the door per audio frame).
    - `policies`: the agent's conversation policies apply (speak first, must-hear
      segments, silence, time limits, the hold sound: `live.engine.policies`).
      False for a client whose app runs its own conversation (the Live API's
      endpoint keeps what the app asked); a tool's own `end_session` or
      `play_must_hear` is still carried out.
    - `shows_mute`: the client can show the user that they are not heard
      (`user.muted`, during the agent's listening windows).
    - `reports_played_out`: the door gives the session `PlayedOut` once the
      audio queued before a turn's end has been played at the client's end;
      without it the session estimates playback from its own pacing.
    - `client_tool_deadline`: a call the client runs is answered for it with an
      error after the agent's `client_tool_timeout`; False: the model waits for
      the client as long as it takes (as the Live API's service waits for an app).
    - `results_by_id`: a tool result is paired with its call by id alone,
      whatever name it gives (as the Live API pairs them).
    - `cut_replies_repeated`: a question whose reply a lost model connection
      cut short is asked again on the next one (the client gets the reply
      again, whole); False: the cut reply ends as interrupted, and the new
      connection is told what was asked and what was said (no word twice).
    - `call`: a phone call. It cannot come back on another socket; a stopping
      server lets it finish, up to a drain timeout, and then has the agent say
      goodbye; ending its session ends the call (`FrontDoor.end`).
    """

    reattach: bool = False
    client_tools: bool = False
    images: bool = False
    raw_audio: bool = False
    usage_with_turn_end: bool = False
    policies: bool = True
    shows_mute: bool = False
    reports_played_out: bool = False
    client_tool_deadline: bool = True
    results_by_id: bool = False
    cut_replies_repeated: bool = True
    call: bool = False


class FrontDoor(abc.ABC):
    """One client's wire protocol (see the module's docstring)."""

    # The label this door's sessions carry in metrics and logs.
    name: ClassVar[str]
    capabilities: ClassVar[Capabilities] = Capabilities()
    # The largest message its clients may send (None: the server's
    # `max_frame_bytes`); a larger one ends the session (1009).
    max_message_bytes: ClassVar[int | None] = None
    # How long a session whose client may return (`resumable()`) is kept after
    # the client left and the reattach grace passed, without a model
    # connection (`live.server.parking`); None: it ends then.
    kept_after_leaving: ClassVar[float | None] = None
    # Its clients hear `going_away` before the server, stopping on its own
    # (no fleet to carry their sessions on), ends their sessions.
    tells_going_away: ClassVar[bool] = False
    # True: the door checks its clients' credentials itself (`authorize`), in
    # place of the server's token check (a carrier cannot present the
    # server's token; its call does, signed by the server's own webhook).
    # A socket it authorizes is a carrier's stream for a real call: it does not
    # count against the limit of sockets per client address.
    checks_own_credentials: ClassVar[bool] = False
    # The events whose frames depend on the reply audio before them: written
    # when their turn comes in the paced stream (see the module's docstring).
    in_step_events: ClassVar[tuple[type[ServerEvent], ...]] = ()

    def __init__(self, request: Request | None = None) -> None:
        # The socket's handshake: its headers and query may carry what the
        # door needs (a credential, a stream's parameters).
        self.request = request

    @abc.abstractmethod
    def opening(self, frame: str | bytes) -> Opening | ErrorEvent | None:
        """A frame before the session started: the `SessionStart` (its `token`
        the client's credential, checked by the server), a `SessionResume`, a
        `SessionClose`, an error to answer (the socket stays open), or None
        (nothing to do yet). Raising `live.protocol.ProtocolError` answers its
        code and message."""

    def admitted(self, start: SessionStart, grant: Grant | None) -> SessionStart:
        """The start as the client's credential lets it be (`grant`: the
        token's, None for an open server or its static token). A door whose
        tokens constrain a session (the Live API's ephemeral tokens) applies
        them here; raising `live.protocol.ProtocolError` refuses the session.
        By default a token that locks a Live API setup is refused: this door
        could not keep its locks."""
        if grant is not None and grant.live is not None:
            raise ProtocolError(
                "unauthorized",
                "this token locks a Live API session's setup: it opens sessions on the Live API endpoint only",
                fatal=True,
            )
        return start

    def authorize(self, token: str | None) -> str | None:
        """With `checks_own_credentials`: None if the start's `token` opens a
        session, else why not (never the token itself)."""
        return None

    async def redeem(self) -> str | None:
        """With `checks_own_credentials`, once `authorize` let the start in: spend
        its credential where its uses are counted (a fleet's store, shared by
        every server); None, or why it opens nothing more."""
        return None

    @abc.abstractmethod
    def inputs(self, frame: str | bytes) -> Iterable[Input]:
        """What a frame of the started session means for it, in order. Raise
        `live.protocol.ProtocolError` for a frame the client got wrong: it is
        answered with an error event and the session goes on (or ends, if the
        error is fatal)."""

    @abc.abstractmethod
    def event(self, event: ServerEvent) -> str | bytes | tuple[str | bytes, ...] | None:
        """The frame that tells this client of `event`, or None to leave it out.
        For the events sent outside the stream (`SessionStarted`,
        `SessionReattached`), a tuple of frames may say it."""

    def resumable(self) -> bool:
        """Whether this client may come back to its session on a new socket
        (asked once the opening was read). By default: `capabilities.reattach`."""
        return self.capabilities.reattach

    def record_header(self) -> dict[str, Any]:
        """What a session's record keeps of this client's opening, to replay it
        (`live.testing.replay`); JSON, with no secret in it."""
        return {}

    def may_return_after_close(self) -> bool:
        """Whether a socket this client closed normally may still come back
        (the session then waits for it, as after a drop). By default a normal
        close is goodbye."""
        return False

    def going_away(self, time_left: float) -> str | bytes | None:
        """The frame that tells this client its server is stopping and its
        session goes on elsewhere in `time_left` seconds (it should come back
        on a new socket)."""
        frame = self.event(SessionGoAway(time_left))
        return frame if not isinstance(frame, tuple) else None

    @abc.abstractmethod
    def audio(self, pcm: bytes) -> Sequence[str | bytes]:
        """The frames that carry reply audio (PCM16 mono, 24 kHz) to this client."""

    def line_rate(self) -> int | None:
        """The rate the client's audio really has, when lower than the
        session's (a phone line's 8 kHz, resampled for the model): the
        server's voice detection listens at it. None: the session's rate."""
        return None

    def credential(self) -> str | None:
        """The client's token as its handshake carries it, if the door reads one
        there (None: in its opening, or `Authorization: Bearer`)."""
        return None

    async def end(self, reason: str) -> None:
        """The session ended on the server's side (`reason`): end what the
        client is on, e.g. hang up its phone call. By default nothing: closing
        the socket says it. Awaited before the socket closes, within the
        server's shutdown grace; it must not raise."""

    def closing(self, code: int, reason: str, error: ErrorEvent | None) -> tuple[int, str]:
        """The close code and reason that tell this client how its session
        ended: `code` and `reason` are the server's, `error` the fatal error
        that ended it (None for a plain end). A door whose clients expect
        another service's codes and words says them here."""
        return code, reason
