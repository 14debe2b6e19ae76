"""Agents: a model, an instruction, tools as plain Python functions, and live settings.

An `Agent` is data. It knows how to describe itself to a live model (an
`LlmRequest` with a `types.LiveConnectConfig`) and how to run one of its tools;
the session server does the rest. Tools are ordinary functions, sync or async,
declared to the model from their signature and docstring.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import logging
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio
import anyio.to_thread
from google.genai import types

from live.llm import LlmRequest

__all__ = ["Agent", "KeyEntry", "agent_at", "run_tool", "tool"]

ToolFunction = Callable[..., Any]

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
    key_entry: KeyEntry = dataclasses.field(default_factory=lambda: KeyEntry())

    def __post_init__(self) -> None:
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
