"""What each family of Live models allows and does, in one place.

The Live API is one protocol, but its model families differ in what they take
and when: Gemini 2.5's native-audio models close the connection (1008) on any
realtime input while a function call is unanswered; 3.1 refuses client content
after the first turn; 3.8 calls functions without blocking and reports an
interaction that goes on past a completed turn. The session reads these rules
here, by model name, instead of testing names where it acts. Sources for each
rule are in `../shared/FIELD-NOTES.md` §9 and docs/emulator.md.
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
    - `client_content_mid_session`: typed turns may go as `client_content`
      after the first turn (Gemini 3 takes them only as realtime text; 3.1
      closes with 1007 on anything else).
    - `history_flag`: seeded history needs `initialHistoryInClientContent`,
      and is never answered by itself.

    What else differs (non-blocking calls, `interactionStatus`) the session
    reads from the messages themselves, on any model.
    """

    name: str
    realtime_input_while_call_owed: bool = True
    client_content_mid_session: bool = True
    history_flag: bool = False


DEFAULT: Final = ModelFamily("default")
"""Models that are not Gemini (local/echo, local/voice): no restriction."""

_GEMINI_3_ON = ModelFamily("gemini-3", client_content_mid_session=False, history_flag=True)

# First match wins: the more specific names first.
FAMILIES: Final[tuple[tuple[re.Pattern[str], ModelFamily], ...]] = (
    (re.compile(r"^(?:models/)?gemini-3\.8-live-extended-thinking"),
     dataclasses.replace(_GEMINI_3_ON, name="gemini-3.8-extended-thinking")),
    (re.compile(r"^(?:models/)?gemini-3\.8"), dataclasses.replace(_GEMINI_3_ON, name="gemini-3.8")),
    (re.compile(r"^(?:models/)?gemini-3\.1"), dataclasses.replace(_GEMINI_3_ON, name="gemini-3.1")),
    # Gemini 3 and later: the rules of the newest family we know.
    (re.compile(r"^(?:models/)?gemini-(?:[3-9]|[1-9]\d+)(?!\d)"), _GEMINI_3_ON),
    (re.compile(r"native-audio"), ModelFamily("gemini-2.5-native-audio", realtime_input_while_call_owed=False)),
    (re.compile(r"gemini"), ModelFamily("gemini-2.5")),
)


def family_of(model: str) -> ModelFamily:
    """The family `model` (with or without `models/`) belongs to."""
    for pattern, family in FAMILIES:
        if pattern.search(model):
            return family
    return DEFAULT
