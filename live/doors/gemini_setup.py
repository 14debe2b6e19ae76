"""A Live API app's `setup` as the endpoint reads it: what of it a session
honours (`client_config`), whether the app marks its own turns, and the
service's refusal when a field has the wrong shape. No I/O; the door and the
`auth_tokens` route (a token's locked setup) read setups the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pydantic
from google.genai import types

from live.doors.gemini_policy import BUILTIN_TOOL_KINDS, GeminiPolicy, valid_function_name
from live.liveapi import INVALID, get_field
from live.protocol import ProtocolError

__all__ = ["SAMPLING", "check_setup", "client_config", "invalid", "manual_turns", "repeated", "snake"]


def invalid(reason: str) -> ProtocolError:
    return ProtocolError("invalid_argument", reason, fatal=True)


def manual_turns(setup: Mapping[str, Any]) -> bool:
    """The app marks turns itself (`activityStart` / `activityEnd`)."""
    config = get_field(setup, "realtimeInputConfig")
    detection = get_field(config, "automaticActivityDetection")
    if not isinstance(config or {}, Mapping) or not isinstance(detection or {}, Mapping):
        raise invalid(INVALID)
    return get_field(detection, "disabled") is True


def check_setup(setup: Mapping[str, Any], policy: GeminiPolicy) -> None:
    """Raise `ProtocolError` (invalid_argument) if a setup's fields have the wrong shape."""
    client_config(setup, policy)
    manual_turns(setup)


def client_config(setup: Mapping[str, Any], policy: GeminiPolicy) -> types.LiveConnectConfig | None:
    """What of an app's setup its session honours, within the operator's
    policy: its system instruction (after the policy's), its tools (less those
    the policy removes), its generation settings."""
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
        tools = []
        declarations = []
        for tool in repeated(get_field(setup, "tools")):
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
            # The kinds the service runs itself (a search, code execution) go
            # to the model as the app declared them, those the policy allows.
            builtin = {k: v for k, v in tool.items() if snake(k) in BUILTIN_TOOL_KINDS and policy.keeps_builtin(snake(k))}
            if builtin:
                tools.append(types.Tool.model_validate(builtin))
        if declarations:
            tools.insert(0, types.Tool(function_declarations=declarations))
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
        for name in ("proactivity", "enableAffectiveDialog"):
            value = get_field(setup, name)
            if value is not None:
                fields[snake(name)] = value
        modalities = get_field(generation, "responseModalities")
        if modalities:
            names = [m.upper() if isinstance(m, str) else m for m in repeated(modalities)]
            if not all(name in ("AUDIO", "TEXT") for name in names):
                raise invalid(INVALID)
            fields["response_modalities"] = [types.Modality(name) for name in names]
        speech = get_field(generation, "speechConfig")
        if speech is not None:
            fields["speech_config"] = types.SpeechConfig.model_validate(speech)
        config = types.LiveConnectConfig(**fields) if fields else None
    except (pydantic.ValidationError, ValueError, TypeError, AttributeError):
        raise invalid(INVALID) from None
    return config


# generationConfig's fields an app may set for its session, as they are.
SAMPLING = ("temperature", "topP", "topK", "maxOutputTokens", "seed", "mediaResolution")


def snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name)


def repeated(value: Any) -> list[Any]:
    """A repeated field: absent is empty; anything but a list is refused."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid(INVALID)
    return value
