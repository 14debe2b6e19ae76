"""A Live API app's `setup` as the endpoint reads it: what of it a session
honours (`client_config`), whether the app marks its own turns, and what the
service refuses in it, in the service's words (`setup_refusal`): a field it
does not know on the app's path and version, a field the Live API does not
support, a setting the model's family refuses. No I/O; the door and the
`auth_tokens` route (a token's locked setup) read setups the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pydantic
from google.genai import types

from live.doors.gemini_policy import (
    BUILTIN_TOOL_KINDS,
    GeminiPolicy,
    valid_function_name,
)
from live.families import ModelFamily
from live.liveapi import (
    AFFECTIVE_REFUSED,
    INVALID,
    PROACTIVE_OFF_REFUSED,
    THINKING_REFUSED,
    generation_refusal,
    get_field,
    modalities_refused,
    tools_refusal,
)
from live.protocol import ProtocolError

__all__ = [
    "SAMPLING",
    "check_setup",
    "client_config",
    "invalid",
    "manual_turns",
    "repeated",
    "setup_refusal",
    "snake",
    "tool_kinds_refusal",
    "vertex_refusal",
]


def invalid(reason: str) -> ProtocolError:
    return ProtocolError("invalid_argument", reason, fatal=True)


def manual_turns(setup: Mapping[str, Any]) -> bool:
    """The app marks turns itself (`activityStart` / `activityEnd`)."""
    config = get_field(setup, "realtimeInputConfig")
    detection = get_field(config, "automaticActivityDetection")
    if not isinstance(config or {}, Mapping) or not isinstance(detection or {}, Mapping):
        raise invalid(INVALID)
    return get_field(detection, "disabled") is True


def initial_history(setup: Mapping[str, Any]) -> bool:
    """The app seeds its history first (`historyConfig.initialHistoryInClientContent`):
    the service takes only client content until one completes a turn."""
    return get_field(get_field(setup, "historyConfig"), "initialHistoryInClientContent") is True


def check_setup(setup: Mapping[str, Any], policy: GeminiPolicy) -> None:
    """Raise `ProtocolError` (invalid_argument) if a setup's fields have the wrong shape."""
    client_config(setup, policy)
    manual_turns(setup)


def setup_refusal(setup: Mapping[str, Any], family: ModelFamily, model: str) -> str | None:
    """Why the service refuses this setup, its fields all known (a 1007 reason,
    in its words), or None: what the Live API refuses on every model (a
    generation field it does not support, more than one response modality),
    what the family of the model refuses (a setting, a tool the service runs
    itself that its models do not carry)."""
    generation = get_field(setup, "generationConfig")
    refused = generation_refusal(generation) or tools_refusal(get_field(setup, "tools"), family.service_tools)
    if refused is not None:
        return refused
    generation = generation or {}
    modalities = get_field(generation, "responseModalities")
    if isinstance(modalities, list) and modalities:
        asked = [str(m).upper() for m in modalities]
        if any(m not in family.modalities for m in asked):
            return modalities_refused(asked, model, family.modalities)
    if not family.thinking_config and get_field(generation, "thinkingConfig") is not None:
        return THINKING_REFUSED
    if not family.affective_dialog and get_field(generation, "enableAffectiveDialog") is not None:
        return AFFECTIVE_REFUSED
    if not family.proactive_audio_off and get_field(get_field(setup, "proactivity"), "proactiveAudio") is False:
        return PROACTIVE_OFF_REFUSED
    return None


# Vertex AI's own tool kinds: the service runs them on Vertex AI only.
VERTEX_TOOL_KINDS = ("retrieval", "enterpriseWebSearch", "parallelAiSearch", "exaAiSearch")


def _not_here(what: str) -> str:
    # Within a close frame's 123 bytes.
    return f"{what} is not supported by this server: its model is on the Gemini API, which lacks it."


def vertex_refusal(setup: Mapping[str, Any]) -> str | None:
    """Why this server refuses a Vertex AI app's own setting that the service
    would carry there (a 1007 reason, in words of its own), or None: the
    server's connection to the model is the Gemini API's, which has none of
    them (google-genai raises "... only supported in Gemini Enterprise Agent
    Platform mode" for each on the Gemini API). An app that asked for MP3
    replies (`responseFormat`), a transcription of its own
    (`audioTranscriptionConfig`) or blocking by severity would otherwise get
    what it did not ask for."""
    generation = get_field(setup, "generationConfig")
    for name in ("responseFormat", "audioTranscriptionConfig"):
        if get_field(generation, name) is not None:
            return _not_here(f"generationConfig.{name}")
    safety = get_field(setup, "safetySettings")
    for item in safety if isinstance(safety, list) else ():
        if str(get_field(item, "method") or "").upper() == "SEVERITY":
            return _not_here("safetySettings[].method SEVERITY")
    return tool_kinds_refusal(get_field(setup, "tools"))


def tool_kinds_refusal(tools: Any) -> str | None:
    """Why this server refuses a Vertex AI app's own tool kind (setup's tools,
    or a contextUpdate's), in words of its own, or None."""
    for tool in tools if isinstance(tools, list) else ():
        for kind in VERTEX_TOOL_KINDS:
            if get_field(tool, kind) is not None:
                return _not_here(f"The {kind} tool")
    return None


# Setup objects an app's session takes as they are, by the LiveConnectConfig
# field each becomes: how the model hears the app (its voice detection, the
# transcriptions' options), its context window, proactivity, the history it
# seeds, and what the service does with the session (avatar, safety, labels).
_AS_GIVEN: dict[str, tuple[str, Any]] = {
    "realtimeInputConfig": ("realtime_input_config", types.RealtimeInputConfig),
    "contextWindowCompression": ("context_window_compression", types.ContextWindowCompressionConfig),
    "inputAudioTranscription": ("input_audio_transcription", types.AudioTranscriptionConfig),
    "outputAudioTranscription": ("output_audio_transcription", types.AudioTranscriptionConfig),
    "proactivity": ("proactivity", types.ProactivityConfig),
    "historyConfig": ("history_config", types.HistoryConfig),
    "avatarConfig": ("avatar_config", types.AvatarConfig),
    "labels": ("labels", None),
}


def client_config(setup: Mapping[str, Any], policy: GeminiPolicy) -> types.LiveConnectConfig | None:
    """What of an app's setup its session honours, within the operator's
    policy: its system instruction (after the policy's), its tools (less those
    the policy removes), its generation settings, and the rest of its setup
    but its resumption (the server resumes Google's connection itself)."""
    fields: dict[str, Any] = {}
    try:
        instruction = get_field(setup, "systemInstruction")
        if instruction is not None:
            if isinstance(instruction, str):
                instruction = {"parts": [{"text": instruction}]}
            fields["system_instruction"] = types.Content.model_validate(instruction)
        if policy.instruction:
            own = fields.get("system_instruction")
            text = "".join(part.text or "" for part in (own.parts or [])) if own is not None else ""
            joined = "\n\n".join(t for t in (policy.instruction, text) if t)
            fields["system_instruction"] = types.Content(parts=[types.Part(text=joined)])
        tools = app_tools(get_field(setup, "tools"), policy)
        if tools:
            fields["tools"] = tools
        generation = get_field(setup, "generationConfig") or {}
        if not isinstance(generation, Mapping):
            raise invalid(INVALID)
        for name in SAMPLING:
            value = get_field(generation, name)
            if value is not None:
                fields[snake(name)] = value
        thinking = get_field(generation, "thinkingConfig")
        if thinking is not None:
            fields["thinking_config"] = types.ThinkingConfig.model_validate(thinking)
        affective = get_field(generation, "enableAffectiveDialog")
        if affective is not None:
            fields["enable_affective_dialog"] = affective
        translation = get_field(generation, "translationConfig")
        if translation is not None:
            fields["translation_config"] = types.TranslationConfig.model_validate(translation)
        generation_only = {snake(name): get_field(generation, name) for name in GENERATION_ONLY}
        if any(value is not None for value in generation_only.values()):
            fields["generation_config"] = types.GenerationConfig(
                **{name: value for name, value in generation_only.items() if value is not None}
            )
        modalities = get_field(generation, "responseModalities")
        if modalities:
            names = [m.upper() if isinstance(m, str) else m for m in repeated(modalities)]
            if not all(name in ("AUDIO", "TEXT") for name in names):
                raise invalid(INVALID)
            fields["response_modalities"] = [types.Modality(name) for name in names]
        speech = get_field(generation, "speechConfig")
        if speech is not None:
            fields["speech_config"] = types.SpeechConfig.model_validate(speech)
        for key, (name, kind) in _AS_GIVEN.items():
            value = get_field(setup, key)
            if value is not None:
                fields[name] = value if kind is None else kind.model_validate(value)
        safety = get_field(setup, "safetySettings")
        if safety is not None:
            # Vertex AI's `method` (its path only): by probability, unset or
            # said, is how the Gemini API's threshold blocks ("Block at and
            # beyond a specified harm probability"), so it is not sent on;
            # by severity is refused (`vertex_refusal`).
            fields["safety_settings"] = [
                types.SafetySetting.model_validate(item).model_copy(update={"method": None}) for item in repeated(safety)
            ]
        config = types.LiveConnectConfig(**fields) if fields else None
    except (pydantic.ValidationError, ValueError, TypeError, AttributeError):
        raise invalid(INVALID) from None
    return config


def app_tools(value: Any, policy: GeminiPolicy) -> list[types.Tool]:
    """An app's `tools` as its session declares them: its functions (less those
    the policy removes) first, then the kinds the service runs itself that the
    policy allows, as the app declared them."""
    tools = []
    declarations = []
    for tool in repeated(value):
        if not isinstance(tool, Mapping):
            raise invalid(INVALID)
        for declaration in repeated(get_field(tool, "functionDeclarations")):
            declared = types.FunctionDeclaration.model_validate(declaration)
            if not valid_function_name(declared.name):
                raise invalid(
                    f"Invalid function name {str(declared.name)[:80]!r}: it must start with a letter or an "
                    "underscore and hold only a-z, A-Z, 0-9, underscores, dots, colons and dashes, "
                    "at most 128 characters."
                )
            if policy.keeps_function(declared.name):
                declarations.append(declared)
        builtin = {k: v for k, v in tool.items() if snake(k) in BUILTIN_TOOL_KINDS and policy.keeps_builtin(snake(k))}
        if builtin:
            tools.append(types.Tool.model_validate(builtin))
    if declarations:
        tools.insert(0, types.Tool(function_declarations=declarations))
    return tools


# generationConfig's fields an app may set for its session, as they are.
SAMPLING = ("temperature", "topP", "topK", "maxOutputTokens", "seed", "mediaResolution")
# Those the session's config carries inside its generationConfig only.
GENERATION_ONLY = ("candidateCount", "presencePenalty", "frequencyPenalty", "enableEnhancedCivicAnswers")


def snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name)


def repeated(value: Any) -> list[Any]:
    """A repeated field: absent is empty; anything but a list is refused."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid(INVALID)
    return value
