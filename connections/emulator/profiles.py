"""How each Live model family behaves on the real service, bad days included.

The emulator picks a `Profile` by model name (`profile_for`), so a client meets
what it would meet in production without asking for it. Each field is one
behaviour users of the real service reported, with its source; each can be
switched off (`Script(profile_overrides={"late_transcripts": False})`, or
`live emulator --set late_transcripts=false`). Where the reports are thin or
disagree, the field takes the strictest plausible reading and says so.

Forum threads are at discuss.ai.google.dev (numbers given); issues are
`owner/repo#N` on GitHub.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import Any

from live.families import family_named
from live.liveapi import (
    AFFECTIVE_REFUSED,
    PROACTIVE_OFF_REFUSED,
    THINKING_REFUSED,
    generation_refusal,
    get_field,
    modalities_refused,
    tools_refusal,
)

__all__ = [
    "CHECKING",
    "FAMILIES",
    "PROFILES",
    "THINKING",
    "Profile",
    "blocks",
    "check_overrides",
    "declared_behaviours",
    "family_of",
    "looks_unfinished",
    "profile_for",
    "scheduling_of",
    "setup_error",
]

CHECKING = "Let me check."
"""What a model says while a non-blocking call it made runs."""

THINKING = "Let me think about that."
"""The filler turn of an extended-thinking model before its answer."""


@dataclasses.dataclass(frozen=True, slots=True)
class Profile:
    """One model family's behaviour. Booleans are True when the behaviour is on."""

    family: str

    handle_after_setup: bool = False
    """Send a resumable handle right after `setupComplete` (and after a completed
    initial history). Off on every family: the service sends no
    `sessionResumptionUpdate` until the session is idle after a turn (google-genai
    `types.py`, LiveServerSessionResumptionUpdate: "It might be not possible to
    resume session at some points"). While the model generates or a call is
    unanswered, updates say `{"resumable": false}` with no `newHandle`; a
    resumable handle comes only at a `turnComplete` with no call pending and
    nothing more to say. On for tests written against the old emulator."""

    handle_ttl: float | None = 7200.0
    """Seconds a resumable handle stays usable after it was issued (None:
    forever); an older one closes the resume with 1008 "BidiGenerateContent
    session not found". Counted on the emulator's clock, not scaled by
    `Script.speed`: it is the client's time to come back, not the model's pace.
    Two hours is a plausible default (the session-management docs have said
    handles stay valid about two hours after a session ends; not verified
    against the live service)."""

    unknown_handle_not_found: bool = True
    """Resuming with a handle the service does not know (unknown, expired, or
    forgotten by the bounded store) closes with 1008 "BidiGenerateContent session
    not found" (forum #186392; yeyu2/Youtube_demos#5). Off: 1007 "Invalid session
    resumption handle.", what the emulator said before."""

    resume_while_open_fails: bool = True
    """Resuming from a handle while the connection that issued it is still open
    closes the new connection with 1011 (sip-to-ai PR 14, a single report: the
    strictest reading). A client must close the old socket before resuming."""

    deadline_close_1011: bool = True
    """At a go-away's deadline the connection closes with 1011 "Deadline expired
    before operation could complete." (Live API session-management docs;
    kizuna-ai-lab/sokuji#179; kazunori279/adk-streaming-guide#11). Off: 1000."""

    late_transcripts: bool = True
    """Transcripts are not ordered with the model turn: the last output
    transcription fragment of a turn, and the last input transcription fragment
    of the user's turn before it, arrive in messages after that turn's
    `turnComplete` (google-genai `types.py`, LiveServerContent.input_transcription
    and output_transcription: "doesn't imply any ordering"; livekit/agents-js#2165;
    pipecat-ai/pipecat#1788). Always the last fragment, so tests can rely on it."""

    realtime_during_call_closes: bool = False
    """Any `realtimeInput` (audio, video, text, activityStart, activityEnd,
    audioStreamEnd) received while a toolCall the model sent is unanswered closes
    with 1008 "Operation is not implemented, or supported, or enabled."
    (gemini-2.5 native audio: forum #114644, #56; google/adk-python#4679;
    livekit/agents#4545; googleapis/js-genai#1236). Several independent reports,
    no official documentation; the emulator applies it to non-blocking calls too
    (the strictest reading)."""

    bundled_output: bool = False
    """Transcripts and completion flags ride in the same `serverContent` as the
    audio (gemini-3 models); `Script.bundle` overrides it."""

    client_content_after_history_closes: bool = False
    """`clientContent` other than the initial history closes with 1007 (3.1: text
    mid-session goes through `realtimeInput.text`; google-genai's `HistoryConfig`
    docstring and the Live API's session guide)."""

    input_transcription_finished_first: bool = False
    """The first input transcription message of a user turn carries
    `finished: true`, and more fragments follow it (gemini-3.1;
    google/adk-python#6045)."""

    output_transcription_finished: bool = False
    """The output transcription message that ends a reply's transcript carries
    `finished: true` (google-genai `types.py` Transcription.finished: "The bool
    indicates the end of the transcription."): its last fragment, wherever it
    arrives (after `turnComplete` with `late_transcripts`). Off on every
    family: no report says which models send it (the service rarely does;
    peers put a final together themselves at the turn's end)."""

    rejects_thinking_config: bool = False
    """`generationConfig.thinkingConfig` in setup closes with 1007 (gemini-3.8:
    ai.google.dev Gemini 3.8 Live page; Vertex AI 3.8 migration guide). The
    extended-thinking model takes it (its thinking levels: ai.google.dev
    live-api thinking page)."""

    rejects_proactive_audio_off: bool = False
    """`proactivity.proactiveAudio: false` closes with 1007: proactive audio is
    always on (gemini-3.8: ai.google.dev Gemini 3.8 Live page)."""

    rejects_affective_dialog: bool = False
    """`generationConfig.enableAffectiveDialog` (any value) closes with 1007:
    affective dialog was removed (gemini-3.8: Vertex AI 3.8 migration guide).
    Rejecting even `false` is the strictest reading."""

    non_blocking_calls: bool = False
    """Function calls do not block the model unless the declaration says
    `behavior: BLOCKING`: after the toolCall the model finishes its turn ("Let me
    check.") without waiting, and answers a `functionResponse` by its
    `scheduling`: SILENT (taken in, nothing said), WHEN_IDLE (the default:
    answered after the current generation, or at once when idle), INTERRUPT
    (the current generation is cut with `interrupted` and the answer comes now)
    (gemini-3.8: ai.google.dev Gemini 3.8 Live page; google-genai `types.py`
    Behavior and FunctionResponseScheduling). A declaration that says
    `NON_BLOCKING` is honoured on every family."""

    cancels_blocking_calls_on_input: bool = False
    """A BLOCKING call still unanswered when a new user turn arrives is cancelled
    with `toolCallCancellation`, even without barge-in (gemini-3.8: ai.google.dev
    Gemini 3.8 Live page)."""

    waits_for_more_input: bool = False
    """When the user's turn looks unfinished (its transcript ends with "..." or
    with "and", "but", "so", "or", "because", "um", "uh" and no closing
    punctuation), the model sends `serverContent.waitingForInput: true`, no
    reply and no `turnComplete`, and answers the whole utterance after the next
    user turn (google-genai `types.py` LiveServerContent.waiting_for_input;
    ai.google.dev Gemini 3.8 Live page). The trigger is the emulator's
    deterministic stand-in for the model's judgement."""

    interaction_status: bool = False
    """Every `turnComplete` carries `interactionStatus`: IN_PROGRESS while more
    output will follow (a filler turn "Let me think about that." first, the
    answer `thinking_delay` later; a pending non-blocking call), IDLE when all is
    done. google-genai's `receive()` ends only at IDLE (gemini-3.8 extended
    thinking: ai.google.dev live-api thinking page; google-genai `live.py`
    `_is_interaction_complete`)."""

    rejects_blocking_declarations: bool = False
    """A function declared `behavior: BLOCKING` in setup closes with 1007: only
    asynchronous calls exist (gemini-3.8 extended thinking: ai.google.dev live-api
    thinking page). Rejecting rather than ignoring it is the strictest reading."""

    thinking_delay: float = 2.0
    """Service seconds between an extended-thinking filler turn's end and its
    answer's first chunk (the emulator's choice)."""

    turn_end_silence: float | None = None
    """Seconds of silence after which the model's own detector closes the
    user's turn, whatever `silenceDurationMs` asks (None: it honours
    `silenceDurationMs`, 500 ms when unset). On gemini-3.1 a 1.0 s pause in
    mid-sentence closes the turn while the caller is still speaking, and
    `silence_duration_ms` is ignored (google-gemini/cookbook#1328,
    gemini-live-api-examples#37, googleapis/python-genai#2580); the 3.8
    families are taken to share that detector (the strictest reading). The
    audio time of a pause is what counts, so a test may send it faster."""

    barge_in_on_any_sound: bool = True
    """The model's detector takes any sound loud enough above the room's
    noise floor for speech: 20 ms of it (`prefixPaddingMs`) starts the user's
    turn and cuts the model's reply, a backchannel ("mm-hm"), a cough or a
    door as well as a real interruption (pipecat-ai/pipecat#4633). The floor follows steady noise within seconds (a hum or a line's
    hiss is not speech), not bursts. Off: speech must last 300 ms before it
    counts (a kinder service than the one users report)."""

    audio_only: bool = False
    """`responseModalities` other than AUDIO close with 1007 "The requested
    combination of response modalities (TEXT) is not supported by the model.
    models/M accepts the following combination of response modalities:\n* AUDIO"
    (gemini-2.5 native audio: field reports)."""

    rejects_media_chunks: bool = False
    """The deprecated `realtimeInput.mediaChunks` closes with 1007 (gemini-3.1:
    aicc2025/sip-to-ai#5, "newer Live API models reject with WebSocket close 1007")."""

    context_update: bool = False
    """`contextUpdate` (a new system instruction, new tools mid-session) is
    taken; elsewhere it closes with 1007 as an unknown name (gemini-3.8: the
    Vertex AI 3.8 page "Update system instructions and tools during a session";
    what older models answer is not documented: the strictest reading)."""

    history_config: bool = False
    """`historyConfig.initialHistoryInClientContent` is honoured: client
    content until one completes a turn is initial history, answered by no
    reply, and realtime input meanwhile is ignored (google-genai `HistoryConfig`;
    gemini-3: the 3.1 capabilities page). Off on 2.5, which answers a completed
    seed whatever the flag says: Pipecat's Gemini Live service sets the flag
    on every model and seeds 2.5 with `turn_complete=True` to be answered."""

    voice_activity_messages: bool = False
    """`voiceActivity` messages (ACTIVITY_START, ACTIVITY_END) when the
    detector hears the user start and stop (google-genai `types.py`
    LiveServerMessage.voice_activity). Off by default: no report says which
    models send them unasked."""

    voice_activity_audio_offset: bool = False
    """`voiceActivity` messages carry `audioOffset`, where the speech started
    or ended in the connection's audio as a duration (`"0.520s"`; google-genai
    VoiceActivity.audio_offset: "The time voice activity detected in audio
    time, relative to the start of the audio stream."). Off by default: no
    report says which models send it."""

    interim_input_transcription: bool = False
    """While the user speaks, `serverContent.interimInputTranscription` with
    the words heard so far, one more every 200 ms of speech (all of them
    when the speech ends), for a client that
    asked for input transcription (google-genai
    LiveServerContent.interim_input_transcription: "Low latency transcription
    updated while the user is speaking."); the turn's `inputTranscription`
    follows as usual. Off by default: no report says which models send it."""


FAMILIES = (
    "gemini-2.5",
    "gemini-2.5-native-audio",
    "gemini-3.1",
    "gemini-3.8",
    "gemini-3.8-extended-thinking",
)

_GEMINI_38: dict[str, Any] = {
    "history_config": True,
    "context_update": True,
    "bundled_output": True,
    "turn_end_silence": 1.0,
    "rejects_thinking_config": True,
    "rejects_proactive_audio_off": True,
    "rejects_affective_dialog": True,
    "non_blocking_calls": True,
    "cancels_blocking_calls_on_input": True,
    "waits_for_more_input": True,
}

PROFILES: Mapping[str, Profile] = {
    "gemini-2.5": Profile("gemini-2.5"),
    "gemini-2.5-native-audio": Profile("gemini-2.5-native-audio", realtime_during_call_closes=True, audio_only=True),
    "gemini-3.1": Profile(
        "gemini-3.1",
        bundled_output=True,
        client_content_after_history_closes=True,
        input_transcription_finished_first=True,
        turn_end_silence=1.0,
        rejects_media_chunks=True,
        history_config=True,
    ),
    "gemini-3.8": Profile("gemini-3.8", **_GEMINI_38),
    "gemini-3.8-extended-thinking": Profile(
        "gemini-3.8-extended-thinking",
        **{**_GEMINI_38, "rejects_thinking_config": False},
        interaction_status=True,
        rejects_blocking_declarations=True,
    ),
}
"""The profile of each family, as the real service behaves by default."""


def family_of(model: str) -> str:
    """The family of a Live model name, with or without `models/`."""
    name = model.removeprefix("models/")
    if name.startswith("gemini-3.8"):
        return "gemini-3.8-extended-thinking" if "extended-thinking" in name else "gemini-3.8"
    if name.startswith("gemini-3"):
        return "gemini-3.1"
    if "native-audio" in name:
        return "gemini-2.5-native-audio"
    return "gemini-2.5"


def profile_for(model: str, name: str | None = None) -> Profile:
    """The profile named `name`, or for `model`'s family when `name` is None or "auto"."""
    if name is None or name == "auto":
        return PROFILES[family_of(model)]
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}: one of auto, {', '.join(FAMILIES)}") from None


_TUNABLE = {f.name: f for f in dataclasses.fields(Profile) if f.name != "family"}
_SECONDS = ("handle_ttl", "thinking_delay", "turn_end_silence")
_OPTIONAL = ("handle_ttl", "turn_end_silence")


def check_overrides(overrides: Mapping[str, Any]) -> None:
    """Raise ValueError for an override that names no behaviour or has the wrong type."""
    for name, value in overrides.items():
        if name not in _TUNABLE:
            raise ValueError(f"unknown behaviour {name!r}: one of {', '.join(sorted(_TUNABLE))}")
        if name in _SECONDS:
            seconds = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
            if not (seconds or (value is None and name in _OPTIONAL)):
                raise ValueError(f"{name} must be a number of seconds (>= 0), not {value!r}")
        elif not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false, not {value!r}")


# --- what the profile decides -------------------------------------------------

_TRAILING = frozenset({"and", "but", "so", "or", "because", "um", "uh"})
_WORD = re.compile(r"[a-z']+")


def looks_unfinished(text: str) -> bool:
    """The user's turn looks cut off: it ends with "..." (or "…"), or its last
    word is a conjunction or filler with no closing punctuation after it."""
    stripped = text.strip()
    if stripped.endswith(("...", "…")):
        return True
    if stripped.endswith((".", "?", "!")):
        return False
    words = _WORD.findall(stripped.lower())
    return bool(words) and words[-1] in _TRAILING


def declared_behaviours(tools: Iterable[Any] | None) -> dict[str, str]:
    """Function name -> its declared `behavior` (BLOCKING, NON_BLOCKING or "")."""
    out: dict[str, str] = {}
    for tool in tools or []:
        for decl in get_field(tool, "functionDeclarations") or []:
            name = get_field(decl, "name")
            if isinstance(name, str):
                out[name] = str(get_field(decl, "behavior") or "").upper()
    return out


def setup_error(profile: Profile, setup: Mapping[str, Any]) -> str | None:
    """Why the service refuses the setup on this family (a 1007 reason), or
    None: what the Live API refuses on every model (`generation_refusal`),
    then what the family refuses (a setting; a tool the service runs itself
    that the family does not carry, as `live.families` says)."""
    gen = get_field(setup, "generationConfig")
    refused = generation_refusal(gen) or tools_refusal(
        get_field(setup, "tools"), family_named(profile.family).service_tools
    )
    if refused is not None:
        return refused
    gen = gen or {}
    modalities = [str(m).upper() for m in get_field(gen, "responseModalities") or []]
    if profile.audio_only and any(m != "AUDIO" for m in modalities):
        return modalities_refused(modalities, str(get_field(setup, "model")), ("AUDIO",))
    if profile.rejects_thinking_config and get_field(gen, "thinkingConfig") is not None:
        return THINKING_REFUSED
    if profile.rejects_affective_dialog and get_field(gen, "enableAffectiveDialog") is not None:
        return AFFECTIVE_REFUSED
    proactivity = get_field(setup, "proactivity")
    if profile.rejects_proactive_audio_off and get_field(proactivity, "proactiveAudio") is False:
        return PROACTIVE_OFF_REFUSED
    if profile.rejects_blocking_declarations:
        blocking = [n for n, b in declared_behaviours(get_field(setup, "tools")).items() if b == "BLOCKING"]
        if blocking:
            return f"Function {blocking[0]!r}: BLOCKING behavior is not supported by this model."
    return None


def blocks(profile: Profile, behaviour: str) -> bool:
    """Whether a call to a function declared with `behaviour` makes the model wait."""
    if behaviour == "BLOCKING":
        return True
    if behaviour == "NON_BLOCKING":
        return False
    return not profile.non_blocking_calls


_SCHEDULING_RANK = {"SILENT": 0, "WHEN_IDLE": 1, "INTERRUPT": 2}


def scheduling_of(responses: Iterable[Mapping[str, Any]]) -> str:
    """How a toolResponse is answered: the most urgent `scheduling` among its
    function responses (SILENT < WHEN_IDLE < INTERRUPT; unset is WHEN_IDLE)."""
    best = "SILENT"
    for response in responses:
        value = str(get_field(response, "scheduling") or "WHEN_IDLE").upper()
        value = value if value in _SCHEDULING_RANK else "WHEN_IDLE"
        if _SCHEDULING_RANK[value] > _SCHEDULING_RANK[best]:
            best = value
    return best
