"""What each family of Live models allows and does, in one place.

The Live API is one protocol, but its model families differ in what they take
and when: Gemini 2.5's native-audio models close the connection (1008) on any
realtime input while a function call is unanswered, and speak only; 3.1 refuses
client content after its initial history, and `mediaChunks`; 3.8 calls
functions without blocking, takes client content all session, and refuses
thinking settings and affective dialog; each carries its own set of the
service's tools (Search everywhere, code execution and URL context on the
half-cascade 2.5 models only). The session, and the Live API's
endpoint answering for the model it runs, read these rules here, by model
name, instead of testing names where they act. Sources for each rule are in
docs/emulator.md and docs/gemini-endpoint.md.

A session that moves to a model of another family (`live.backends`, when the
operator allows it) has its connection config fitted to the new family here
(`fit_config`): what that family refuses is left out, and a voice it does not
have is replaced.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Final

from google.genai import types

__all__ = ["DEFAULT", "FAMILIES", "ModelFamily", "family_named", "family_of", "fit_config"]

# The eight voices of the half-cascade Live models (Gemini 2.5 Live without
# native audio); native audio and Gemini 3 speak with every prebuilt voice.
HALF_CASCADE_VOICES: Final = frozenset({"Puck", "Charon", "Kore", "Fenrir", "Aoede", "Leda", "Orus", "Zephyr"})

# The tools the service runs itself (google-genai `Tool` fields, snake_case)
# that a family's Live models carry; function declarations go to every model.
# The Live tools guide (ai.google.dev/gemini-api/docs/live-tools) lists, for
# Gemini 3.1 Flash Live and 2.5 Flash Live (native audio): "Search: Supported;
# Function calling: Supported; Google Maps: Not supported; Code execution: Not
# supported; URL context: Not supported". Its older versions marked code
# execution and URL context "Yes" for the half-cascade 2.5 models. Kinds the
# guide does not list for Live (Search as retrieval, File Search, computer
# use, MCP servers, Vertex AI's retrieval and web searches) are taken as not
# carried by any family: the strictest reading.
SEARCH_ONLY: Final = frozenset({"google_search"})
HALF_CASCADE_TOOLS: Final = frozenset({"google_search", "code_execution", "url_context"})


@dataclasses.dataclass(frozen=True, slots=True)
class ModelFamily:
    """The rules of one family of models.

    - `realtime_input_while_call_owed`: the model takes realtime input (audio,
      video, activity signals, audio stream end) while a function call it made
      is unanswered. Where it does not, the session holds that input until the
      result was sent (forum #114644, adk-python#4679, js-genai#1236).
    - `client_content_mid_session`: client content (turns of either role) may
      come after the initial history; 3.1 closes with 1007 on it, and takes
      mid-session text only as realtime text (google-genai `HistoryConfig`; sonichi/sutando#181).
    - `history_flag`: seeded history needs `initialHistoryInClientContent`,
      and is never answered by itself.
    - `modalities`: the response modalities it speaks in (native audio: AUDIO
      only; a transcription model: TEXT only); another is refused at setup.
    - `media_chunks`: it takes the deprecated `realtimeInput.mediaChunks`
      (3.1 closes with 1007: aicc2025/sip-to-ai#5).
    - `context_update`: it takes `contextUpdate` mid-session (a new system
      instruction, new tools: 3.8, the Vertex AI 3.8 page "Update system
      instructions and tools during a session"); older models do not.
    - `thinking_config`, `affective_dialog`, `proactive_audio_off`: it takes
      `generationConfig.thinkingConfig`, `enableAffectiveDialog`, and
      `proactivity.proactiveAudio: false` (3.8 refuses each with 1007).
    - `blocking_calls`: functions may be declared BLOCKING (3.8 extended
      thinking calls functions only asynchronously).
    - `voices`: the prebuilt voices it speaks with (None: any).
    - `service_tools`: the tools the service runs itself that it carries
      (None: any); a setup that declares another is refused (1007).

    What else differs (non-blocking calls, `interactionStatus`) the session
    reads from the messages themselves, on any model.
    """

    name: str
    realtime_input_while_call_owed: bool = True
    client_content_mid_session: bool = True
    history_flag: bool = False
    modalities: tuple[str, ...] = ("AUDIO", "TEXT")
    media_chunks: bool = True
    thinking_config: bool = True
    affective_dialog: bool = True
    proactive_audio_off: bool = True
    context_update: bool = False
    blocking_calls: bool = True
    voices: frozenset[str] | None = None
    service_tools: frozenset[str] | None = SEARCH_ONLY


DEFAULT: Final = ModelFamily("default", context_update=True, service_tools=None)
"""Models that are not Gemini (local/echo, local/voice): no restriction."""

_GEMINI_3_ON = ModelFamily("gemini-3", client_content_mid_session=False, history_flag=True, media_chunks=False)
_GEMINI_38 = dataclasses.replace(
    _GEMINI_3_ON,
    name="gemini-3.8",
    client_content_mid_session=True,
    media_chunks=True,
    thinking_config=False,
    affective_dialog=False,
    proactive_audio_off=False,
    context_update=True,
)

# First match wins: the more specific names first.
FAMILIES: Final[tuple[tuple[re.Pattern[str], ModelFamily], ...]] = (
    (re.compile(r"^(?:models/)?gemini-3\.8-live-extended-thinking"),
     dataclasses.replace(_GEMINI_38, name="gemini-3.8-extended-thinking", thinking_config=True,
                         blocking_calls=False)),
    (re.compile(r"^(?:models/)?gemini-3\.8"), _GEMINI_38),
    (re.compile(r"^(?:models/)?gemini-3\.5-transcribe"),
     dataclasses.replace(_GEMINI_3_ON, name="gemini-3.5-transcribe", modalities=("TEXT",))),
    (re.compile(r"^(?:models/)?gemini-3\.1"), dataclasses.replace(_GEMINI_3_ON, name="gemini-3.1")),
    # Gemini 3 and later: the rules of the newest family we know.
    (re.compile(r"^(?:models/)?gemini-(?:[3-9]|[1-9]\d+)(?!\d)"), _GEMINI_3_ON),
    (re.compile(r"native-audio"),
     ModelFamily("gemini-2.5-native-audio", realtime_input_while_call_owed=False, modalities=("AUDIO",))),
    (re.compile(r"gemini"), ModelFamily("gemini-2.5", voices=HALF_CASCADE_VOICES, service_tools=HALF_CASCADE_TOOLS)),
)


def family_of(model: str) -> ModelFamily:
    """The family `model` (with or without `models/`) belongs to."""
    for pattern, family in FAMILIES:
        if pattern.search(model):
            return family
    return DEFAULT


def family_named(name: str) -> ModelFamily:
    """The family called `name` (as `ModelFamily.name`), or DEFAULT."""
    for _, family in FAMILIES:
        if family.name == name:
            return family
    return DEFAULT


def fit_config(
    config: types.LiveConnectConfig, family: ModelFamily, *, voice: str | None = None
) -> tuple[types.LiveConnectConfig, list[str]]:
    """`config` as `family` takes it, and what was changed (for the log).

    Settings the family refuses are left out (the model's own default
    applies), and so are the service's tools it does not carry; BLOCKING declarations become unset where calls cannot block; a
    voice the family does not have becomes `voice` (a backend's), or the
    model's default. `config` itself is not changed.
    """
    update: dict[str, object] = {}
    changed: list[str] = []
    generation = config.generation_config
    if not family.thinking_config and (
        config.thinking_config is not None or (generation is not None and generation.thinking_config is not None)
    ):
        update["thinking_config"] = None
        if generation is not None and generation.thinking_config is not None:
            generation = generation.model_copy(update={"thinking_config": None})
        changed.append("thinking_config")
    if not family.affective_dialog and (
        config.enable_affective_dialog is not None
        or (generation is not None and generation.enable_affective_dialog is not None)
    ):
        update["enable_affective_dialog"] = None
        if generation is not None and generation.enable_affective_dialog is not None:
            generation = generation.model_copy(update={"enable_affective_dialog": None})
        changed.append("enable_affective_dialog")
    if generation is not config.generation_config:
        update["generation_config"] = generation
    if not family.proactive_audio_off and config.proactivity is not None and config.proactivity.proactive_audio is False:
        update["proactivity"] = config.proactivity.model_copy(update={"proactive_audio": None})
        changed.append("proactive_audio")
    if not family.blocking_calls and config.tools:
        tools = []
        for tool in config.tools:
            declarations = []
            for declaration in tool.function_declarations or ():
                if declaration.behavior == types.Behavior.BLOCKING:
                    declaration = declaration.model_copy(update={"behavior": None})
                    changed.append(f"{declaration.name}: BLOCKING")
                declarations.append(declaration)
            tools.append(tool.model_copy(update={"function_declarations": declarations}) if declarations else tool)
        update["tools"] = tools
    if family.service_tools is not None and config.tools:
        kept, dropped = [], []
        for tool in update.get("tools", config.tools):
            refused = [
                name for name in type(tool).model_fields
                if name != "function_declarations" and getattr(tool, name) is not None
                and name not in family.service_tools
            ]
            if refused:
                dropped.extend(refused)
                tool = tool.model_copy(update=dict.fromkeys(refused))
                if all(getattr(tool, name) is None for name in type(tool).model_fields):
                    continue
            kept.append(tool)
        if dropped:
            update["tools"] = kept
            changed.extend(f"tool {name}" for name in dropped)
    speech = config.speech_config
    prebuilt = speech.voice_config.prebuilt_voice_config if speech and speech.voice_config else None
    current = prebuilt.voice_name if prebuilt is not None else None
    wanted = current
    if voice is not None and (current is None or (family.voices is not None and current not in family.voices)):
        wanted = voice
    elif current is not None and family.voices is not None and current not in family.voices:
        wanted = None
    if wanted != current:
        update["speech_config"] = (
            types.SpeechConfig(
                voice_config=types.VoiceConfig(prebuilt_voice_config=types.PrebuiltVoiceConfig(voice_name=wanted))
            )
            if wanted is not None
            else None
        )
        changed.append(f"voice {current or 'default'} -> {wanted or 'default'}")
    return (config.model_copy(update=update) if update else config), changed
