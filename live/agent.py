"""Agents: a model, an instruction, tools as plain Python functions, and live settings.

An `Agent` is data. It knows how to describe itself to a live model (an
`LlmRequest` with a `types.LiveConnectConfig`) and how to run one of its tools;
the session server does the rest. Tools are ordinary functions, sync or async,
declared to the model from their signature and docstring.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import importlib
import inspect
import logging
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import anyio
import anyio.to_thread
from google.genai import types

from live.backends import BackendPool
from live.llm import LlmRequest

__all__ = [
    "Agent",
    "Clip",
    "END_OF_TURN",
    "HoldSound",
    "KeyEntry",
    "MuteUser",
    "Say",
    "SessionControl",
    "Silence",
    "TURN_MODES",
    "TimeLimit",
    "TurnSettings",
    "agent_at",
    "end_session",
    "play_must_hear",
    "run_tool",
    "session_control",
    "tool",
]

ToolFunction = Callable[..., Any]

TURN_MODES = ("auto", "manual", "server")
"""Who ends the user's turns: the model's own voice detection (`auto`), the
client with activity signals (`manual`), or the server (`server`)."""

END_OF_TURN = ("silence", "smart")


@dataclasses.dataclass(frozen=True)
class TurnSettings:
    """How the server takes the user's turns with `turn_taking="server"`.

    Times are seconds of the user's audio (docs/turn-taking.md says when to
    change which):

    - `end_silence`: the silence that ends a turn. With `end_of_turn="smart"`,
      the wait when the end-of-turn model gave no answer in time.
    - `end_of_turn`: `"silence"` (silence timing alone) or `"smart"` (Smart
      Turn v3.2 listens to how the sentence ends at each pause; the
      `smart-turn` extra).
    - `smart_check_after`, `smart_min_speech`, `smart_threshold`,
      `smart_hold_below`: the model is asked once per pause, after this much
      silence, in a turn with at least this much speech; a probability at or
      above `smart_threshold` ends the turn at once, one below
      `smart_hold_below` (the sentence surely goes on) holds it up to
      `max_pause`, and one between leaves it to `end_silence`.
    - `max_pause`: the longest pause a turn survives, whatever the model says.
    - `max_turn`: the longest turn; it then ends even while the user speaks.
    - `min_speech`: speech that opens a turn while the agent is silent.
    - `barge_in`: speech, sustained (gaps shorter than `onset_gap` allowed),
      that interrupts the agent while it speaks; shorter speech over a reply
      (a backchannel, a cough) leaves it alone.
    - `onset_gap`: a gap that abandons speech not yet taken as a turn.
    - `preroll`: audio before the detected onset the model gets with the turn
      (in heavy noise speech is found up to about 0.4 s after it began).
    - `threshold`: the voice detector's speech probability for speech; it
      stays speech down to `threshold - 0.15`.
    - `energy_floor_dbfs`: quieter audio is silence without running the
      detector (it costs nothing).
    - `noise_filter`: a noise suppressor in front of the detector (the
      detector's copy only; the model hears the line as it is). For noisy
      phone lines; the `noise` extra.
    """

    end_silence: float = 1.0
    end_of_turn: str = "silence"
    smart_check_after: float = 0.3
    smart_min_speech: float = 1.0
    smart_threshold: float = 0.5
    smart_hold_below: float = 0.1
    max_pause: float = 2.5
    max_turn: float = 60.0
    min_speech: float = 0.1
    barge_in: float = 0.8
    onset_gap: float = 0.25
    preroll: float = 0.5
    threshold: float = 0.5
    energy_floor_dbfs: float = -55.0
    noise_filter: bool = False

    def __post_init__(self) -> None:
        if self.end_of_turn not in END_OF_TURN:
            raise ValueError(f"end_of_turn must be one of {', '.join(END_OF_TURN)}, not {self.end_of_turn!r}")
        seconds = {
            "end_silence": self.end_silence, "smart_check_after": self.smart_check_after,
            "smart_min_speech": self.smart_min_speech, "max_pause": self.max_pause, "max_turn": self.max_turn,
            "min_speech": self.min_speech, "barge_in": self.barge_in, "onset_gap": self.onset_gap,
            "preroll": self.preroll,
        }
        for name, value in seconds.items():
            if not (isinstance(value, (int, float)) and 0 <= value <= 600):
                raise ValueError(f"{name} must be seconds between 0 and 600, not {value!r}")
        if self.max_pause < self.end_silence:
            raise ValueError("max_pause must be at least end_silence")
        if not 0.2 <= self.threshold <= 0.95 or not 0 < self.smart_threshold < 1:
            raise ValueError("threshold must be within 0.2-0.95 and smart_threshold within 0-1")
        if not 0 <= self.smart_hold_below <= self.smart_threshold:
            raise ValueError("smart_hold_below must be within 0 and smart_threshold")
        if self.preroll > 1.0:
            raise ValueError("preroll is at most 1 s")

_SCHEDULING = {
    "silent": types.FunctionResponseScheduling.SILENT,
    "when_idle": types.FunctionResponseScheduling.WHEN_IDLE,
    "interrupt": types.FunctionResponseScheduling.INTERRUPT,
}


@dataclasses.dataclass(frozen=True)
class ToolOptions:
    """How the model treats a tool (see `tool`)."""

    non_blocking: bool = False
    scheduling: types.FunctionResponseScheduling | None = None


def tool(
    fn: ToolFunction | None = None,
    *,
    non_blocking: bool = False,
    scheduling: str | types.FunctionResponseScheduling | None = None,
) -> Any:
    """Mark a tool function with how the model treats it; plain functions need no mark.

    `non_blocking=True` declares it NON_BLOCKING: the model goes on talking while
    it runs (Gemini 3.8 calls every function that way by default). `scheduling`
    says what the model does with its result: `"silent"` (takes it in, says
    nothing), `"when_idle"` (tells the user once it is done talking, the
    service's default), `"interrupt"` (stops and tells at once)::

        @tool(non_blocking=True, scheduling="when_idle")
        async def book_table(time: str) -> dict: ...
    """
    if isinstance(scheduling, str):
        if scheduling.lower() not in _SCHEDULING:
            raise ValueError(f"scheduling must be one of {', '.join(_SCHEDULING)}, not {scheduling!r}")
        scheduling = _SCHEDULING[scheduling.lower()]

    def mark(function: ToolFunction) -> ToolFunction:
        function.__live_tool__ = ToolOptions(non_blocking, scheduling)  # type: ignore[attr-defined]
        return function

    return mark(fn) if fn is not None else mark


def _options(function: ToolFunction) -> ToolOptions:
    return getattr(function, "__live_tool__", None) or ToolOptions()


# ---------------------------------------------------------------------------
# Conversation policies: what the agent does that the Live API leaves to the
# application. Data only; `live.engine.policies` decides when, and the session
# runner carries it out.
# ---------------------------------------------------------------------------

CLIP_RATE = 24_000  # a clip plays as reply audio: PCM16 mono at 24 kHz


@dataclasses.dataclass(frozen=True)
class Clip:
    """A recording the server plays itself, as the agent's voice: PCM16 mono at
    24 kHz (`pcm`). `text` is what it says: the transcript a client shows and
    the session's record keeps. Build one from a file with `Clip.from_wav`, or
    from PCM at another rate with `Clip.from_pcm`."""

    pcm: bytes
    text: str | None = None

    def __post_init__(self) -> None:
        if not self.pcm or len(self.pcm) % 2:
            raise ValueError("a clip is PCM16: a non-empty, even number of bytes")

    @property
    def seconds(self) -> float:
        return len(self.pcm) / (2 * CLIP_RATE)

    @classmethod
    def from_pcm(cls, pcm: bytes, rate: int = CLIP_RATE, *, channels: int = 1, text: str | None = None) -> Clip:
        """PCM16 little-endian at `rate`, mixed to mono and resampled to 24 kHz."""
        import numpy as np

        samples = np.frombuffer(pcm[: len(pcm) // (2 * channels) * 2 * channels], "<i2")
        if channels > 1:
            samples = samples.reshape(-1, channels).mean(axis=1).astype("<i2")
        if rate != CLIP_RATE:
            import soxr

            samples = soxr.resample(samples, rate, CLIP_RATE, quality="HQ")
        return cls(np.ascontiguousarray(samples, "<i2").tobytes(), text)

    @classmethod
    def from_wav(cls, path: str | Path, *, text: str | None = None) -> Clip:
        """A WAV file of 16-bit PCM (any rate, mono or stereo); `ValueError` names what else it is."""
        import wave

        try:
            with wave.open(str(path), "rb") as wav:
                if wav.getsampwidth() != 2:
                    raise ValueError(f"{path}: {8 * wav.getsampwidth()}-bit samples; a clip takes 16-bit PCM")
                rate, channels = wav.getframerate(), wav.getnchannels()
                pcm = wav.readframes(wav.getnframes())
        except (wave.Error, EOFError) as exc:
            raise ValueError(f"{path}: not a PCM WAV file ({exc})") from None
        return cls.from_pcm(pcm, rate, channels=channels, text=text)


@dataclasses.dataclass(frozen=True)
class Say:
    """What the agent says when a policy speaks, one of:

    - `text`: these words, word for word (the model is asked to say exactly them);
    - `instruction`: what to say, in the model's own words (its voice, its language);
    - `clip`: a recording the server plays itself (the model is not asked).

    Where a `Say` is expected, a plain string means `Say(text=...)`.
    """

    text: str | None = None
    instruction: str | None = None
    clip: Clip | None = None

    def __post_init__(self) -> None:
        given = [name for name in ("text", "instruction", "clip") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"Say takes one of text, instruction or clip, not {given or 'none'}")
        for name in ("text", "instruction"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"Say({name}=...) takes a non-empty string")


def as_say(value: Say | str) -> Say:
    """`value` as a `Say` (a string is the words to say)."""
    if isinstance(value, Say):
        return value
    if isinstance(value, str):
        return Say(text=value)
    raise TypeError(f"expected a live.Say or a string, not {type(value).__name__}")


@dataclasses.dataclass(frozen=True)
class MuteUser:
    """Listening windows: the user's audio does not reach the model (it is
    dropped, and a client whose door shows a mute is told: `user.muted`)
    while a tool call is running (`during_tools`) and while a must-hear
    segment plays (`during_must_hear`)."""

    during_tools: bool = True
    during_must_hear: bool = True


@dataclasses.dataclass(frozen=True)
class Silence:
    """When the user says nothing: after `prompt_after` seconds without speech
    (the server's voice detection on their audio, not frames), the agent says
    `prompt`; after `end_after` seconds more, `goodbye`, and the session ends
    once that was heard (a phone call is hung up). Silence counts from the end
    of the user's speech or of the agent's reply, whichever was later, and
    never while a tool runs. Off for clients that take turns themselves
    (`turn_taking: "manual"`: push-to-talk)."""

    prompt_after: float = 15.0
    prompt: Say | str = Say(text="Are you still there?")
    end_after: float = 15.0
    goodbye: Say | str = Say(text="I haven't heard from you, so I'll say goodbye for now. Goodbye!")

    def __post_init__(self) -> None:
        if not (self.prompt_after > 0 and self.end_after > 0):
            raise ValueError("Silence: prompt_after and end_after are positive seconds")
        object.__setattr__(self, "prompt", as_say(self.prompt))
        object.__setattr__(self, "goodbye", as_say(self.goodbye))


@dataclasses.dataclass(frozen=True)
class TimeLimit:
    """A session's time limit, ended with grace: `wrap_up_before` seconds before
    the end the agent is told `wrap_up` (start wrapping up), `goodbye_before`
    seconds before it says `goodbye`, and the session ends once that was heard,
    or at the end at the latest.

    The end is `max_duration` seconds after the session started (None: no
    limit of the agent's own) or the end its token sets (`max_duration`,
    `ends_at`), whichever comes first. A limit shorter than `wrap_up_before`
    gets no wrap-up, one shorter than `goodbye_before` no goodbye.
    """

    max_duration: float | None = None
    wrap_up_before: float = 60.0
    wrap_up: Say | str = Say(
        instruction="Less than a minute of this conversation remains: start wrapping up, and do not begin anything new."
    )
    goodbye_before: float = 15.0
    goodbye: Say | str = Say(text="We're out of time for today. Thank you, and goodbye!")

    def __post_init__(self) -> None:
        if self.max_duration is not None and not self.max_duration > 0:
            raise ValueError("TimeLimit: max_duration is positive seconds (or None)")
        if not (self.wrap_up_before >= 0 and self.goodbye_before >= 0):
            raise ValueError("TimeLimit: wrap_up_before and goodbye_before are seconds, 0 or more")
        object.__setattr__(self, "wrap_up", as_say(self.wrap_up))
        object.__setattr__(self, "goodbye", as_say(self.goodbye))


@dataclasses.dataclass(frozen=True)
class HoldSound:
    """A sound the server plays while a tool runs longer than `after` seconds
    and the agent is silent, so the line does not seem dead; it stops the
    moment the agent speaks. `clip`: the sound (looped); None: a soft built-in one."""

    after: float = 1.0
    clip: Clip | None = None

    def __post_init__(self) -> None:
        if not self.after >= 0:
            raise ValueError("HoldSound: after is seconds, 0 or more")


class SessionControl(Protocol):
    """What a tool may ask of the conversation it runs in (see `end_session`)."""

    def end(self, reason: str) -> None:
        """End the session once what the agent said has been heard."""

    def must_hear(self, say: Say) -> None:
        """Play a must-hear segment at the next moment the agent is silent."""


session_control: contextvars.ContextVar[SessionControl | None] = contextvars.ContextVar(
    "live_session_control", default=None
)
"""The conversation the current task belongs to: set by the server for each
session, so its tools (and their tasks) see it."""


def _control() -> SessionControl:
    control = session_control.get()
    if control is None:
        raise RuntimeError("not in a conversation: end_session and play_must_hear work in a session's tools")
    return control


async def end_session() -> dict:
    """End the conversation. Say goodbye first: the session ends once everything you said has been heard."""
    _control().end("the agent ended the conversation")
    return {"result": "the conversation ends once your last words have been heard"}
# A phone's `end_call` (live.phone.control) is this same tool under another name.


async def play_must_hear(segment: Say | str) -> None:
    """From a tool: play `segment` in full at the next moment the agent is
    silent, the user's speech not interrupting it. A clip plays even while
    the tool still runs; words the model says wait until no call is open."""
    _control().must_hear(as_say(segment))


@dataclasses.dataclass(frozen=True)
class KeyEntry:
    """How a phone caller's keys reach the model.

    Keys are gathered until one of `terminators` is pressed (it ends the entry
    and is part of it), `pause` seconds pass without a key, or `max_keys` were
    pressed; the entry is then one turn for the model ("The caller entered
    1234# on their keypad."). A PIN is one turn, not four. `pause=0` tells
    the model of each key as it comes, as a turn of its own.
    """

    terminators: str = "#"
    pause: float = 2.0
    max_keys: int = 32

    def __post_init__(self) -> None:
        if not self.pause >= 0 or self.max_keys < 1:
            raise ValueError("key_entry: pause must be 0 or more seconds, and max_keys at least 1")


@dataclasses.dataclass(frozen=True)
class Agent:
    """A conversational agent served by `live serve --agent module:attr`.

    - `tools`: functions the server runs when the model calls them. Their names,
      parameters (type hints) and docstrings become `types.FunctionDeclaration`s.
    - `client_tools`: declarations of tools the *client* runs; calls to them are
      sent to the client as `tool.call` and wait for its `tool.result`.
    - `voice`: a prebuilt voice name (e.g. "Puck"); None keeps the model's default.
    - `transcription`: transcripts of both sides (on by default).
    - `context_compression`: a sliding context window, so a conversation is not
      capped at 15 minutes of audio (on by default).
    - `config`: a `types.LiveConnectConfig` whose set fields override the rest.
    - `on_key_press`: on phone calls, `(call id, digit)` for each key the
      caller presses, a plain or an `async` function (the model is told too:
      see `key_entry`).
    - `key_entry`: on phone calls, how keys reach the model (`KeyEntry`):
      gathered into one turn until a terminator or a pause, by default.
    - `backends`: where sessions may run, in order (`live.backends`): AI
      Studio keys, Vertex projects and regions, with the models each serves;
      a session moves down the pool when its backend fails. None: the one
      backend `model` names (`live serve --backends FILE` overrides it).
    - `turn_taking`: who ends the user's turns when a session does not say:
      `"auto"` (the model's voice detection), `"manual"` (the client's
      activity signals) or `"server"` (the server's own voice detection,
      with `turns`). docs/turn-taking.md says when to pick which.

    Conversation policies (docs/agents.md), carried out by the server for every
    front door with a listener (not the Live API's own endpoint, whose apps run
    their own conversation):

    - `speak_first`: the agent opens the conversation (`Say`: words or an
      instruction), once, when a session starts without history.
    - `must_hear`: segments played in full before the conversation, the
      user's speech not interrupting them (a disclosure: "this call is recorded").
    - `mute_user`: listening windows (`MuteUser`).
    - `silence`: what happens when the user says nothing (`Silence`).
    - `time_limit`: a maximum duration ended with a wrap-up and a goodbye
      (`TimeLimit`); a token's `max_duration` gets the same grace.
    - `hold_sound`: a sound while a slow tool runs (`HoldSound`).

    Session resumption is always requested: it is what lets a conversation
    survive the model closing its connection.
    """

    name: str
    model: str
    instruction: str | None = None
    tools: Sequence[ToolFunction] = ()
    client_tools: Sequence[types.FunctionDeclaration] = ()
    voice: str | None = None
    response_modalities: Sequence[types.Modality] = (types.Modality.AUDIO,)
    transcription: bool = True
    context_compression: bool = True
    tool_timeout: float = 10.0
    client_tool_timeout: float = 30.0
    config: types.LiveConnectConfig | None = None
    # Phone calls: called with (the call's id, the digit) when a caller presses
    # a key. A plain function is called in the session's own task (it must
    # not block); an `async` one runs as a task of the session.
    on_key_press: Callable[[str, str], object] | None = None
    backends: BackendPool | None = None
    speak_first: Say | str | None = None
    must_hear: Sequence[Say | str] = ()
    mute_user: MuteUser | None = None
    silence: Silence | None = None
    time_limit: TimeLimit | None = None
    hold_sound: HoldSound | None = None
    turn_taking: str = "auto"
    turns: TurnSettings = TurnSettings()
    key_entry: KeyEntry = dataclasses.field(default_factory=lambda: KeyEntry())

    def __post_init__(self) -> None:
        if self.speak_first is not None:
            object.__setattr__(self, "speak_first", as_say(self.speak_first))
        if isinstance(self.must_hear, (str, Say)):
            raise TypeError(f"agent {self.name!r}: must_hear takes a sequence of segments, e.g. [Say(...)]")
        object.__setattr__(self, "must_hear", tuple(as_say(s) for s in self.must_hear))
        if self.turn_taking not in TURN_MODES:
            raise ValueError(f"agent {self.name!r}: turn_taking must be one of {', '.join(TURN_MODES)}, not {self.turn_taking!r}")
        names = [t.__name__ for t in self.tools] + [d.name or "" for d in self.client_tools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"agent {self.name!r}: tool names must be unique: {duplicates}")
        for tool in self.tools:
            if not callable(tool):
                raise TypeError(f"agent {self.name!r}: tool {tool!r} is not callable")
        if not (self.tool_timeout > 0 and self.client_tool_timeout > 0):
            raise ValueError(f"agent {self.name!r}: tool timeouts must be positive")

    @functools.cached_property
    def tools_by_name(self) -> Mapping[str, ToolFunction]:
        return {tool.__name__: tool for tool in self.tools}

    @functools.cached_property
    def tool_scheduling(self) -> Mapping[str, types.FunctionResponseScheduling]:
        """The scheduling each marked tool's result carries (see `tool`)."""
        return {
            function.__name__: scheduling
            for function in self.tools
            if (scheduling := _options(function).scheduling) is not None
        }

    @functools.cached_property
    def _declarations(self) -> tuple[types.FunctionDeclaration, ...]:
        # google-genai logs a recommendation for JSON-schema declarations on the
        # first call; the Live API takes the `parameters` form built here, so the
        # line would only confuse whoever reads the server's log.
        sdk_log = logging.getLogger("google_genai.types")
        quiet = _DropMessage("use_json_schema is not True")
        sdk_log.addFilter(quiet)
        try:
            declared = []
            for function in self.tools:
                declaration = types.FunctionDeclaration.from_callable_with_api_option(
                    callable=function, api_option="GEMINI_API"
                )
                if _options(function).non_blocking:
                    declaration.behavior = types.Behavior.NON_BLOCKING
                declared.append(declaration)
        finally:
            sdk_log.removeFilter(quiet)
        return tuple(declared + list(self.client_tools))

    def declarations(self) -> list[types.FunctionDeclaration]:
        """What the model is told about every tool, server and client side."""
        return [d.model_copy(deep=True) for d in self._declarations]

    def live_connect_config(self) -> types.LiveConnectConfig:
        config = types.LiveConnectConfig(
            response_modalities=list(self.response_modalities),
            session_resumption=types.SessionResumptionConfig(),
        )
        if self.context_compression:
            config.context_window_compression = types.ContextWindowCompressionConfig(
                sliding_window=types.SlidingWindow()
            )
        if self.instruction:
            config.system_instruction = types.Content(
                role="system", parts=[types.Part(text=self.instruction)]
            )
        declarations = self.declarations()
        if declarations:
            config.tools = [types.Tool(function_declarations=declarations)]
        if self.voice:
            config.speech_config = types.SpeechConfig(
                voice_config=types.VoiceConfig(
                    prebuilt_voice_config=types.PrebuiltVoiceConfig(voice_name=self.voice)
                )
            )
        if self.transcription:
            config.input_audio_transcription = types.AudioTranscriptionConfig()
            config.output_audio_transcription = types.AudioTranscriptionConfig()
        if self.config is not None:
            overrides = {
                name: getattr(self.config, name)
                for name in self.config.model_fields_set
                if getattr(self.config, name) is not None
            }
            config = config.model_copy(update=overrides)
        return config

    def request(
        self,
        history: Sequence[types.Content] = (),
        *,
        resume_handle: str | None = None,
        manual_activity: bool = False,
    ) -> LlmRequest:
        """The request for one model connection; `resume_handle` resumes a session.

        `manual_activity` turns the model's own voice detection off, so that the
        client's activity signals mark the user's turns (the model rejects those
        signals while its detection is on).
        """
        config = self.live_connect_config()
        if resume_handle is not None:
            config.session_resumption = types.SessionResumptionConfig(handle=resume_handle)
        if manual_activity:
            ric = config.realtime_input_config or types.RealtimeInputConfig()
            aad = ric.automatic_activity_detection or types.AutomaticActivityDetection()
            config.realtime_input_config = ric.model_copy(
                update={
                    "automatic_activity_detection": aad.model_copy(update={"disabled": True})
                }
            )
        return LlmRequest(
            model=self.model,
            contents=list(history),
            live_connect_config=config,
            tools=dict(self.tools_by_name),
        )

    def with_model(self, model: str) -> Agent:
        return dataclasses.replace(self, model=model)


class _DropMessage(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value))
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return _jsonable(dump(mode="json"))
    return str(value)


def _is_async(tool: Any) -> bool:
    """An async function, a partial of one, or an object whose `__call__` is async."""
    if inspect.iscoroutinefunction(tool):
        return True
    call = getattr(type(tool), "__call__", None)
    return call is not None and inspect.iscoroutinefunction(call)


async def run_tool(tool: ToolFunction, args: Mapping[str, Any], timeout: float) -> dict[str, Any]:
    """Run one tool call and always produce a response for the model.

    Sync functions run in a worker thread so they never block the session. A
    result that is not a dict is wrapped as `{"result": ...}`. A tool that raises
    or takes longer than `timeout` seconds yields `{"error": "..."}`: the model
    must get an answer for every call, or it waits forever.
    """
    name = getattr(tool, "__name__", "tool")
    try:
        inspect.signature(tool).bind(**args)
    except TypeError as exc:
        return {"error": f"{name} was called with arguments it does not take: {exc}"}
    try:
        with anyio.fail_after(timeout):
            if _is_async(tool):
                result = await tool(**args)
            else:
                result = await anyio.to_thread.run_sync(
                    lambda: tool(**args), abandon_on_cancel=True
                )
                if inspect.isawaitable(result):  # a sync wrapper around a coroutine
                    result = await result
    except TimeoutError:
        return {"error": f"{name} did not finish within {timeout:g} s"}
    except Exception as exc:  # a tool's failure is the model's information, not ours
        return {"error": f"{name} failed: {type(exc).__name__}: {exc}"}
    result = _jsonable(result)
    return result if isinstance(result, dict) else {"result": result}


def agent_at(spec: str) -> Agent:
    """The agent `MODULE:ATTR` names (an `Agent`, or a function that returns one),
    imported as `python -m` would, with the working directory on the path.
    Raises `ValueError` saying what is wrong with `spec`."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"takes MODULE:ATTR, e.g. samples.weather:agent, not {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: agents next to you import
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ValueError(f"{spec}: cannot import {module_name!r} ({exc})") from None
    try:
        agent = getattr(module, attr)
    except AttributeError:
        raise ValueError(f"{spec}: module {module_name!r} has no {attr!r}") from None
    if callable(agent) and not isinstance(agent, Agent):
        agent = agent()
    if not isinstance(agent, Agent):
        raise ValueError(f"{spec}: {attr!r} is a {type(agent).__name__}, not a live.Agent")
    return agent
