"""What the emulator says, hears and breaks: plain data, so tests can assert on it.

Every duration here is in *service seconds*: the emulator divides it by
`Script.speed` before waiting, so a test can run a 10-minute session in seconds
and still see the same messages in the same order.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeAlias

from connections.emulator.faults import FaultRates
from connections.emulator.profiles import FAMILIES, check_overrides

__all__ = [
    "QUOTA_REASON",
    "Fault",
    "FaultRates",
    "ReplyContext",
    "Script",
    "ToolCall",
    "VideoFrame",
    "default_reply",
]

QUOTA_REASON = "RESOURCE_EXHAUSTED: Resource has been exhausted (e.g. check quota)."
"""The close reason of a 1011 quota close (too many sessions, tokens per minute)."""

FaultMoment: TypeAlias = Literal[
    "after_setup",
    "after_audio_chunks",
    "mid_generation",
    "after_tool_call",
    "after_tool_response",
    "after_turn",
    "on_resume",
]


@dataclasses.dataclass(frozen=True, slots=True)
class ToolCall:
    """A function call the model makes: `name` with `args`."""

    name: str
    args: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class Fault:
    """Break the connection on purpose, at a chosen moment.

    `when`:
    - `after_setup`: right after setupComplete;
    - `after_audio_chunks`: after the `n`-th realtime audio chunk was received;
    - `mid_generation`: after `n` reply chunks of a generation were sent;
    - `after_tool_call`: right after a toolCall was sent;
    - `after_tool_response`: right after a toolResponse was received;
    - `after_turn`: after the `n`-th model turn completed (turnComplete sent);
    - `on_resume`: when a setup resumes from a handle the service knows, before
      setupComplete (e.g. `Fault("on_resume", code=1008,
      reason="BidiGenerateContent session not found")`).

    `action` is `close` (WebSocket close with `code`; 1006 drops the TCP
    connection without a close frame) or `stall` (the session stops answering
    and ignores input, the socket stays open). `reason` defaults to what the
    real service says for that code. `times` limits how often the fault fires
    across the whole emulator (None: every time); `connection` restricts it to
    the n-th connection (0-based) the emulator accepted.
    """

    when: FaultMoment
    action: Literal["close", "stall"] = "close"
    code: int = 1011
    reason: str | None = None
    n: int = 1
    times: int | None = 1
    connection: int | None = None

    @classmethod
    def quota(cls, when: FaultMoment = "after_setup", **kwargs: Any) -> Fault:
        """A 1011 RESOURCE_EXHAUSTED close, as when the quota runs out."""
        return cls(when, code=1011, reason=QUOTA_REASON, **kwargs)

    @classmethod
    def stall(cls, when: FaultMoment = "after_setup", **kwargs: Any) -> Fault:
        """Stop answering (no close): what a client's watchdog must detect."""
        return cls(when, action="stall", **kwargs)


@dataclasses.dataclass(frozen=True, slots=True)
class VideoFrame:
    """One image the client sent as realtime video, as the emulator received it.

    `t` is the emulator's clock when it arrived; `width` and `height` are read
    from the image's header (None for a type the emulator does not read);
    `sha256` lets a test check the bytes arrived intact.
    """

    t: float
    mime_type: str
    size: int
    width: int | None
    height: int | None
    sha256: str

    def describe(self) -> str:
        kind = self.mime_type.split("/")[-1].upper()
        if self.width is None:
            return f"a {kind} frame of {self.size} bytes"
        return f"a {self.width}x{self.height} {kind} image of {self.size} bytes"


@dataclasses.dataclass(frozen=True, slots=True)
class ReplyContext:
    """What a reply function gets to decide what the model says next.

    `turn` is the 1-based user turn being answered, `user_text` what the user
    said or typed in that turn, `tool_results` the function responses that
    triggered this reply (empty for a plain turn), `history` the conversation
    so far as Content dicts (camelCase), `connection` the 0-based connection
    index, `video` the image frames this connection received so far (the
    newest last).
    """

    turn: int
    user_text: str
    tool_results: tuple[Mapping[str, Any], ...]
    history: tuple[Mapping[str, Any], ...]
    connection: int
    video: tuple[VideoFrame, ...] = ()


_ASKS_TO_SEE = re.compile(r"\b(see|seeing|look|looking|screen|camera)\b", re.IGNORECASE)
# "Say exactly ...: "<words>"": a model told what to say says it.
_SAY_EXACTLY = re.compile(r'\bsay exactly\b[^"]*"(.+)"', re.IGNORECASE | re.DOTALL)


def default_reply(ctx: ReplyContext) -> str:
    """`You said: <text>.`, or `<name> returned <json>.` after a tool response.

    Asked what it sees (a turn with "see", "look", "screen" or "camera") after
    image frames arrived, it describes the newest: `I see a 768x432 JPEG image
    of 35120 bytes, frame 12.` Told to say exactly some words (`... say exactly
    these words: "Hello."`), it says them, as a model does.
    """
    if ctx.tool_results:
        parts = []
        for result in ctx.tool_results:
            name = result.get("name") or "the function"
            payload = json.dumps(result.get("response"), sort_keys=True, separators=(",", ":"))
            parts.append(f"{name} returned {payload}.")
        return " ".join(parts)
    exact = _SAY_EXACTLY.search(ctx.user_text)
    if exact is not None:
        return exact.group(1)
    if ctx.video and _ASKS_TO_SEE.search(ctx.user_text):
        return f"I see {ctx.video[-1].describe()}, frame {len(ctx.video)}."
    text = ctx.user_text.strip().rstrip(".!?")
    return f"You said: {text}." if text else "I am listening."


@dataclasses.dataclass(slots=True)
class Script:
    """Deterministic behaviour of every session of one emulator.

    - `user_says`: what the user "said" in each spoken turn, in order (the
      emulator has no recogniser). When the list runs out, or for a turn index
      missing from a mapping, the transcript is `user turn N` (N = 1-based
      user turn number in the session).
    - `replies`: what the model says: a list (one entry per model turn, falling
      back to `default_reply` when exhausted) or a function of `ReplyContext`.
    - `tool_calls`: user turn number -> calls the model makes instead of
      answering. `call_named_functions`: when the user's text names a declared
      function (case-insensitive, `_` or space), call it with `tool_args[name]`;
      a name written as a call, `name(...)`, reports one that ran (a context
      note) and calls nothing.
    - `faults`: see `Fault`.
    - `go_away_after`: send goAway this long after setupComplete, then close
      after `go_away_time_left` (1011 "Deadline expired before operation could
      complete.", as the service does; 1000 with the profile's
      `deadline_close_1011` off).
    - `speed`: pacing factor (1 = real time; `math.inf` = no waiting at all).
    - `first_response_delay`: time from end of user turn to first reply chunk.
    - `chunk_ms`, `burst_chunks`: reply audio is 24 kHz PCM16 cut into
      `chunk_ms` chunks sent `burst_chunks` at a time, one burst per burst
      duration (bursts of ~200 ms, like the real service).
    - `chars_per_second`: how long the synthetic speech of a reply lasts.
    - `max_sessions`: concurrent sessions allowed; more close with 1011
      RESOURCE_EXHAUSTED after setup (None: unlimited).
    - `bundle`: put transcripts and completion flags in the same serverContent
      as the audio (as 3.x models do); None decides by model name.
    - `audio_keys`, `audio_base64`: how reply audio parts are written. The
      service writes `inlineData`/`mimeType` with standard base64; protobuf
      JSON readers also take `inline_data`/`mime_type` and URL-safe base64, so
      a client must too (`"snake"`, `"urlsafe"`).
    - `profile`: whose behaviour the sessions follow, a family of
      `connections.emulator.profiles` (None or "auto": by each setup's model
      name); `profile_overrides` switches single behaviours of it, by field
      name (`{"late_transcripts": False, "handle_after_setup": True}`).
    - `extras`: messages the model sends before each reply's first chunk, as
      the service writes them (grounding metadata, code it wrote and ran, a
      file it made, URL context, an interim transcript...).
    - `turn_complete_reasons`: model turn number (1-based, fillers not
      counted) -> the `turnCompleteReason` its `turnComplete` carries, a
      google-genai `TurnCompleteReason` name (`"NEED_MORE_INPUT"`,
      `"GENERATED_CONTENT_SAFETY"`...); the other turns carry none.
    - `usage`: fields added to each turn's `usageMetadata`, as the service
      writes them (`cachedContentTokenCount`, `thoughtsTokenCount`,
      `toolUsePromptTokenCount`, their `...TokensDetails`, `serviceTier`...);
      `thoughtsTokenCount` and `toolUsePromptTokenCount` count in
      `totalTokenCount`, as google-genai's UsageMetadata says.
    - `transcription_fields`: fields added to every transcription fragment
      the model sends, by kind (`inputTranscription`, `outputTranscription`),
      as the service writes them (`languageCode`, `speakerLabel`, `words`,
      `startOffset`, `endOffset`).
    - `fault_rates`: random faults at rates (`FaultRates.realistic()`), drawn
      from a generator seeded with `seed` and shared by all connections, so a
      run with the same traffic replays.
    """

    user_says: Sequence[str] | Mapping[int, str] = ()
    replies: Sequence[str] | Callable[[ReplyContext], str] = ()
    tool_calls: Mapping[int, Sequence[ToolCall]] = dataclasses.field(default_factory=dict)
    call_named_functions: bool = True
    tool_args: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    faults: Sequence[Fault] = ()
    go_away_after: float | None = None
    go_away_time_left: float = 5.0
    speed: float = 1.0
    first_response_delay: float = 0.3
    chunk_ms: int = 40
    burst_chunks: int = 5
    chars_per_second: float = 15.0
    max_sessions: int | None = None
    bundle: bool | None = None
    audio_keys: Literal["camel", "snake"] = "camel"
    audio_base64: Literal["standard", "urlsafe"] = "standard"
    profile: str | None = None
    profile_overrides: Mapping[str, bool | float | None] = dataclasses.field(default_factory=dict)
    fault_rates: FaultRates = dataclasses.field(default_factory=FaultRates)
    seed: int = 0
    extras: Sequence[Mapping[str, Any]] = ()
    turn_complete_reasons: Mapping[int, str] = dataclasses.field(default_factory=dict)
    usage: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    transcription_fields: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.profile not in (None, "auto", *FAMILIES):
            raise ValueError(f"unknown profile {self.profile!r}: one of auto, {', '.join(FAMILIES)}")
        check_overrides(self.profile_overrides)
        if self.audio_keys not in ("camel", "snake"):
            raise ValueError(f"audio_keys must be 'camel' or 'snake', not {self.audio_keys!r}")
        if self.audio_base64 not in ("standard", "urlsafe"):
            raise ValueError(f"audio_base64 must be 'standard' or 'urlsafe', not {self.audio_base64!r}")
        for turn, reason in self.turn_complete_reasons.items():
            if not isinstance(reason, str) or not reason.isupper():
                raise ValueError(f"turn {turn}: a turnCompleteReason is a name such as 'NEED_MORE_INPUT', not {reason!r}")

    def scaled(self, seconds: float) -> float:
        """Real seconds to wait for `seconds` of service time."""
        if self.speed <= 0:
            raise ValueError("speed must be positive")
        return 0.0 if math.isinf(self.speed) else seconds / self.speed

    def transcript_for(self, turn: int, spoken_index: int) -> str:
        """What the user said in a spoken turn (see `user_says`)."""
        says = self.user_says
        if isinstance(says, Mapping):
            text = says.get(turn)
        else:
            text = says[spoken_index] if spoken_index < len(says) else None
        return text if text is not None else f"user turn {turn}"

    def reply_for(self, ctx: ReplyContext, model_turn_index: int) -> str:
        """What the model says in its `model_turn_index`-th (0-based) turn."""
        if callable(self.replies):
            return self.replies(ctx)
        if model_turn_index < len(self.replies):
            return self.replies[model_turn_index]
        return default_reply(ctx)
