"""What each family of Live models allows and does, in one place.

The Live API is one protocol, but its model families differ in what they take
and when: Gemini 2.5's native-audio models close the connection (1008) on any
realtime input while a function call is unanswered, and speak only; 3.1 refuses
client content after its initial history, and `mediaChunks`; 3.8 calls
functions without blocking, takes client content all session, and refuses
thinking settings and affective dialog. The session, and the Live API's
endpoint answering for the model it runs, read these rules here, by model
name, instead of testing names where they act. Sources for each rule are in
`../shared/FIELD-NOTES.md` §9, docs/emulator.md and docs/gemini-endpoint.md.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Final

__all__ = ["DEFAULT", "FAMILIES", "ModelFamily", "family_of"]


@dataclasses.dataclass(frozen=True, slots=True)
class ModelFamily:
    """The rules of one family of models.

    - `realtime_input_while_call_owed`: the model takes realtime input (audio,
      video, activity signals, audio stream end) while a function call it made
      is unanswered. Where it does not, the session holds that input until the
      result was sent (forum #114644, adk-python#4679, js-genai#1236).
    - `client_content_mid_session`: client content (turns of either role) may
      come after the initial history; 3.1 closes with 1007 on it, and takes
      mid-session text only as realtime text (FIELD-NOTES §1; sonichi/sutando#181).
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


DEFAULT: Final = ModelFamily("default", context_update=True)
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
     dataclasses.replace(_GEMINI_38, name="gemini-3.8-extended-thinking", thinking_config=True)),
    (re.compile(r"^(?:models/)?gemini-3\.8"), _GEMINI_38),
    (re.compile(r"^(?:models/)?gemini-3\.5-transcribe"),
     dataclasses.replace(_GEMINI_3_ON, name="gemini-3.5-transcribe", modalities=("TEXT",))),
    (re.compile(r"^(?:models/)?gemini-3\.1"), dataclasses.replace(_GEMINI_3_ON, name="gemini-3.1")),
    # Gemini 3 and later: the rules of the newest family we know.
    (re.compile(r"^(?:models/)?gemini-(?:[3-9]|[1-9]\d+)(?!\d)"), _GEMINI_3_ON),
    (re.compile(r"native-audio"),
     ModelFamily("gemini-2.5-native-audio", realtime_input_while_call_owed=False, modalities=("AUDIO",))),
    (re.compile(r"gemini"), ModelFamily("gemini-2.5")),
)


def family_of(model: str) -> ModelFamily:
    """The family `model` (with or without `models/`) belongs to."""
    for pattern, family in FAMILIES:
        if pattern.search(model):
            return family
    return DEFAULT
