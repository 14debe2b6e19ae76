"""The live contract: a model opens a connection; a connection carries one conversation.

`BaseLlm.connect(request)` is the Python shape of ADK's `BaseLlm.connect`: an async
context manager yielding a `BaseLlmConnection`. Leaving the context closes the
connection, whatever happened inside it.

Concurrency guarantees every implementation gives (and the server relies on):

- **One receiver.** `receive()` is iterated by exactly one task for the whole life
  of the connection. It yields responses in the order the model produced them and
  does not stop at a turn boundary: it ends only when the connection ends. A normal
  end (the model closed with 1000, or `close()` was called) ends the iteration
  quietly; every other end raises a `live.errors.LiveError` subclass.
- **Many senders.** `send_*` may be called from several tasks at once. Each call
  sends one whole message; messages from one task keep their order. A send after
  the connection ended raises `live.errors.ConnectionClosedError`.
- **A send that need not wait can be made at once.** `send_realtime_nowait(input)`
  sends without waiting when the transport takes the bytes at once, and says
  whether it did; the server then sends client audio straight from where it
  read it (no task switch, no await) rather than handing it to a sender task.
  False, the default, means "queue it": nothing was sent.
- **No per-session state on the model.** One `BaseLlm` instance serves every
  concurrent session in the process; all per-session state lives in the connection.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Final, TypeAlias

from google.genai import types

__all__ = [
    "AUDIO_STREAM_END",
    "AudioStreamEnd",
    "BaseLlm",
    "BaseLlmConnection",
    "ClientTurns",
    "ContextChange",
    "LlmRequest",
    "LlmResponse",
    "RealtimeInput",
    "RealtimeText",
]


@dataclasses.dataclass(frozen=True, slots=True)
class AudioStreamEnd:
    """The microphone was muted or closed: flush any audio held for voice detection.

    google-genai models this as a bare boolean on the wire; a value of its own keeps
    `send_realtime` to one argument with an unambiguous type.
    """


AUDIO_STREAM_END: Final = AudioStreamEnd()

RealtimeInput: TypeAlias = (
    types.Blob | types.ActivityStart | types.ActivityEnd | AudioStreamEnd
)
"""What `send_realtime` accepts: an audio chunk or image (`Blob`, routed by its
mime type), a manual activity start or end, or the end of the audio stream."""


@dataclasses.dataclass(frozen=True, slots=True)
class RealtimeText:
    """Text in the realtime input stream (the Live API's `realtimeInput.text`):
    answered as the model's activity detection decides, like speech, not as a
    turn of the conversation's history (`send_realtime_text`)."""

    text: str


@dataclasses.dataclass(frozen=True, slots=True)
class ClientTurns:
    """Client content as the Live API carries it (`clientContent`): turns of
    either role with any parts, appended to the conversation, and whether they
    complete the user's turn (the model answers then) (`send_turns`).
    `initial` marks the app's initial history (`historyConfig`): never answered."""

    turns: tuple[types.Content, ...]
    turn_complete: bool
    initial: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class ContextChange:
    """The client's own system instruction or tools change mid-session (the
    Live API's `contextUpdate`): `config` holds what changes. The session's
    model connection is told the whole instruction and tools that follow
    (`send_context_update`), and every later connection opens with them."""

    config: types.LiveConnectConfig


@dataclasses.dataclass(slots=True)
class LlmRequest:
    """Everything a live session is opened with.

    `model` overrides the model's own name when set. `contents` is the history the
    caller will seed with `send_history`; it is carried here for implementations
    that need to know about it at connect time (none of the built-in ones do).
    `tools` maps a function name to the Python callable that runs it; their
    declarations travel in `live_connect_config.tools`.
    """

    model: str | None = None
    contents: list[types.Content] = dataclasses.field(default_factory=list)
    live_connect_config: types.LiveConnectConfig = dataclasses.field(
        default_factory=types.LiveConnectConfig
    )
    tools: Mapping[str, Callable[..., Any]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(slots=True)
class LlmResponse:
    """One thing the model said or signalled.

    A single server message may carry several of these fields at once (Gemini 3.x
    bundles audio, a transcript fragment and turn-complete in one message); a
    consumer must look at every field, never stop at the first one it recognises.

    - `content`: model output (audio as `inline_data`, text, function calls).
    - `partial`: `content` or a transcription is a fragment of something longer.
    - `turn_complete`: the model finished its turn and waits for the user.
      Arrives after Gemini believes playback ended; it never means interrupted.
    - `interrupted`: the user barged in; audio of the current generation still
      queued anywhere should be discarded.
    - `generation_complete`: the model's output for this turn is complete.
    - `input_transcription` / `output_transcription`: `types.Transcription` with
      `text` and `finished`. Fragments come with `finished=False` and
      `partial=True`; one final transcript per turn comes with `finished=True`.
    - `input_transcription_sent` / `output_transcription_sent`: with a final
      transcript made from a fragment the model marked `finished` itself,
      that fragment as it came (the final may be the whole turn's text).
    - `late_transcription`: the `output_transcription` fragment here belongs to
      the model turn that already completed (Gemini does not order transcripts
      with turns: the tail of a turn's transcript may follow its
      `turn_complete`); it is not part of the next turn.
    - `usage_metadata`: token counts, for cost accounting.
    - `turn_complete_reason`, `waiting_for_input`: why the turn ended;
      `waiting_for_input` says the model waits for more of the user's words
      (it owes no reply until they come).
    - `interaction_status`: sent with `turn_complete` by models whose turn can
      complete while the interaction goes on (Gemini 3.8 extended thinking):
      IN_PROGRESS (or REQUIRES_ACTION) until the interaction is IDLE.
    - `go_away_time_left`: seconds until the server closes this connection.
    - `session_resumption_update`: a new resumption handle (`resumable` says
      whether it may be used).
    - `cancelled_tool_call_ids`: tool calls the model no longer wants answered.
    - `url_context_metadata`: what the URL-context tool retrieved;
      `interim_input_transcription`: a low-latency transcript of what the user
      is saying, updated as they speak (the session passes both on as they came).
    - `error_code` / `error_message`: an in-band error that did not end the
      connection.
    """

    content: types.Content | None = None
    partial: bool = False
    turn_complete: bool = False
    interrupted: bool = False
    generation_complete: bool = False
    input_transcription: types.Transcription | None = None
    output_transcription: types.Transcription | None = None
    usage_metadata: types.UsageMetadata | None = None
    turn_complete_reason: types.TurnCompleteReason | None = None
    waiting_for_input: bool = False
    interaction_status: types.InteractionStatus | None = None
    late_transcription: bool = False
    input_transcription_sent: types.Transcription | None = None
    output_transcription_sent: types.Transcription | None = None
    grounding_metadata: types.GroundingMetadata | None = None
    go_away_time_left: float | None = None
    session_resumption_update: types.LiveServerSessionResumptionUpdate | None = None
    cancelled_tool_call_ids: tuple[str, ...] = ()
    voice_activity: types.VoiceActivity | None = None
    url_context_metadata: types.UrlContextMetadata | None = None
    interim_input_transcription: types.Transcription | None = None
    error_code: str | None = None
    error_message: str | None = None

    @property
    def function_calls(self) -> list[types.FunctionCall]:
        """The function calls in `content`, in order (empty when there are none)."""
        if self.content is None or not self.content.parts:
            return []
        return [p.function_call for p in self.content.parts if p.function_call]

    @property
    def audio_chunks(self) -> list[bytes]:
        """The audio bytes in `content`, in order (empty when there are none)."""
        if self.content is None or not self.content.parts:
            return []
        return [
            p.inline_data.data
            for p in self.content.parts
            if p.inline_data is not None
            and p.inline_data.data
            and (p.inline_data.mime_type or "").startswith("audio/")
        ]

    @property
    def text(self) -> str | None:
        """The concatenated non-thought text in `content`, or None."""
        if self.content is None or not self.content.parts:
            return None
        texts = [p.text for p in self.content.parts if p.text and not p.thought]
        return "".join(texts) if texts else None


class BaseLlmConnection(abc.ABC):
    """A live, bidirectional connection to a model, for one conversation.

    See the module docstring for the ordering and concurrency guarantees.
    """

    @abc.abstractmethod
    async def send_history(self, history: Sequence[types.Content]) -> None:
        """Seed the conversation once, right after connecting.

        The model answers only if the last turn is the user's. Audio parts are
        dropped (the model cannot take recorded audio as history).
        """

    @abc.abstractmethod
    async def send_content(self, content: types.Content) -> None:
        """Send a user turn, or a content made only of function responses.

        A content whose parts are all `function_response` answers tool calls;
        mixing function responses with other parts is a `ValueError`.
        """

    @abc.abstractmethod
    async def send_realtime(self, input: RealtimeInput) -> None:
        """Stream realtime input; the model decides when to answer (voice activity)."""

    async def send_turns(self, turns: Sequence[types.Content], *, turn_complete: bool) -> None:
        """Append `turns` (either role, any parts) to the conversation; with
        `turn_complete` the model answers what it now has.

        By default, for models that keep no history of their own: the user's
        text of a completed content goes as one typed turn (`send_content`),
        and content that completes nothing is context they cannot hold.
        """
        if not turn_complete:
            return
        text = "\n".join(
            "".join(part.text or "" for part in turn.parts or () if not part.thought)
            for turn in turns
            if (turn.role or "user") == "user"
        ).strip()
        if text:
            await self.send_content(types.Content(role="user", parts=[types.Part(text=text)]))

    async def send_context_update(
        self, *, system_instruction: types.Content | None = None, tools: Sequence[types.Tool] | None = None
    ) -> None:
        """The conversation's system instruction, or its tools (all of them: they
        replace the earlier ones), change from now on. By default, for models
        that take neither mid-connection: from the next connection on, which
        opens with them (nothing is sent)."""

    async def send_realtime_text(self, text: str) -> None:
        """Text in the realtime input stream (see `RealtimeText`). By default, for
        models without one: a typed turn (`send_content`)."""
        await self.send_content(types.Content(role="user", parts=[types.Part(text=text)]))

    def send_realtime_nowait(self, input: RealtimeInput) -> bool:
        """Send `input` now if that needs no waiting; whether it was sent.

        True only when the connection is open and its transport took the bytes
        at once. False (nothing was sent) when the send would wait (a socket
        whose buffer is full), when the connection ended, or when the
        implementation cannot send synchronously (the default): the caller
        queues the input for a task that awaits `send_realtime`. Never raises
        for a closed connection; the queued send reports that.
        """
        return False

    @property
    def voice_consent_signature(self) -> str | None:
        """The signature the model returned when it opened this connection, for
        a cloned voice whose consent audio it verified (None: none returned, or
        a model without cloned voices). A later setup may send it in place of
        the consent audio."""
        return None

    @abc.abstractmethod
    def receive(self) -> AsyncIterator[LlmResponse]:
        """Every response of the connection's life, in order (one receiver only)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the connection. Idempotent; ends `receive()` quietly."""


class BaseLlm(abc.ABC):
    """A model that can open live connections.

    Holds no per-session state: one instance serves every concurrent session.
    """

    def __init__(self, model: str) -> None:
        self._model = model

    @property
    def model(self) -> str:
        """The model name this instance was created for, e.g. `gemini-2.5-flash`."""
        return self._model

    @abc.abstractmethod
    def connect(
        self, request: LlmRequest
    ) -> AbstractAsyncContextManager[BaseLlmConnection]:
        """Open a live session; the connection is closed when the context exits.

        Raises a `live.errors.LiveError` subclass when the session cannot be
        opened, and gives up within a bounded time (an implementation's own
        connect timeout). Closing on exit completes even when the caller's scope
        was cancelled (implementations shield it), so no upstream connection
        outlives its context.
        """

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self._model!r})"
