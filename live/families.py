"""What each family of Live models allows and does, in one place.

The Live API is one protocol, but its model families differ in what they take
and when: Gemini 2.5's native-audio models close the connection (1008) on any
realtime input while a function call is unanswered; 3.1 refuses client content
after the first turn; 3.8 calls functions without blocking and reports an
interaction that goes on past a completed turn. The session reads these rules
here, by model name, instead of testing names where it acts. Sources for each
rule are in docs/emulator.md.

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

__all__ = ["DEFAULT", "FAMILIES", "ModelFamily", "family_of", "fit_config"]

# The eight voices of the half-cascade Live models (Gemini 2.5 Live without
# native audio); native audio and Gemini 3 speak with every prebuilt voice.
HALF_CASCADE_VOICES: Final = frozenset({"Puck", "Charon", "Kore", "Fenrir", "Aoede", "Leda", "Orus", "Zephyr"})


@dataclasses.dataclass(frozen=True, slots=True)
class ModelFamily:
    """The rules of one family of models.

    - `realtime_input_while_call_owed`: the model takes realtime input (audio,
      video, activity signals, audio stream end) while a function call it made
      is unanswered. Where it does not, the session holds that input until the
      result was sent (forum #114644, adk-python#4679, js-genai#1236).
    - `client_content_mid_session`: typed turns may go as `client_content`
      after the first turn (Gemini 3 takes them only as realtime text; 3.1
      closes with 1007 on anything else).
    - `history_flag`: seeded history needs `initialHistoryInClientContent`,
      and is never answered by itself.
    - `thinking_config`, `affective_dialog`, `proactive_audio_off`: the setup
      may carry them (3.8 closes with 1007 on each).
    - `blocking_calls`: functions may be declared BLOCKING (3.8 extended
      thinking calls functions only asynchronously).
    - `voices`: the prebuilt voices it speaks with (None: any).

    What else differs (non-blocking calls, `interactionStatus`) the session
    reads from the messages themselves, on any model.
    """

    name: str
    realtime_input_while_call_owed: bool = True
    client_content_mid_session: bool = True
    history_flag: bool = False
    thinking_config: bool = True
    affective_dialog: bool = True
    proactive_audio_off: bool = True
    blocking_calls: bool = True
    voices: frozenset[str] | None = None


DEFAULT: Final = ModelFamily("default")
"""Models that are not Gemini (local/echo, local/voice): no restriction."""

_GEMINI_3_ON = ModelFamily("gemini-3", client_content_mid_session=False, history_flag=True)
_GEMINI_3_8 = dataclasses.replace(
    _GEMINI_3_ON, name="gemini-3.8", thinking_config=False, affective_dialog=False, proactive_audio_off=False
)

# First match wins: the more specific names first.
FAMILIES: Final[tuple[tuple[re.Pattern[str], ModelFamily], ...]] = (
    (re.compile(r"^(?:models/)?gemini-3\.8-live-extended-thinking"),
     dataclasses.replace(_GEMINI_3_8, name="gemini-3.8-extended-thinking", blocking_calls=False)),
    (re.compile(r"^(?:models/)?gemini-3\.8"), _GEMINI_3_8),
    (re.compile(r"^(?:models/)?gemini-3\.1"), dataclasses.replace(_GEMINI_3_ON, name="gemini-3.1")),
    # Gemini 3 and later: the rules of the newest family we know.
    (re.compile(r"^(?:models/)?gemini-(?:[3-9]|[1-9]\d+)(?!\d)"), _GEMINI_3_ON),
    (re.compile(r"native-audio"), ModelFamily("gemini-2.5-native-audio", realtime_input_while_call_owed=False)),
    (re.compile(r"gemini"), ModelFamily("gemini-2.5", voices=HALF_CASCADE_VOICES)),
)


def family_of(model: str) -> ModelFamily:
    """The family `model` (with or without `models/`) belongs to."""
    for pattern, family in FAMILIES:
        if pattern.search(model):
            return family
    return DEFAULT


def fit_config(
    config: types.LiveConnectConfig, family: ModelFamily, *, voice: str | None = None
) -> tuple[types.LiveConnectConfig, list[str]]:
    """`config` as `family` takes it, and what was changed (for the log).

    Settings the family refuses are left out (the model's own default
    applies); BLOCKING declarations become unset where calls cannot block; a
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
