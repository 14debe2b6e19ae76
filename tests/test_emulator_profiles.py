"""The emulator's model families and bad days: what a client of each meets.

Most tests step the protocol state machine with a fake clock (`Driver`); a few
run the unmodified google-genai SDK against the emulator over TLS.
"""

from __future__ import annotations

import base64
import dataclasses
import itertools
import math
import random

import anyio
import pytest
from audio_fixtures import silence, tone
from google import genai
from google.genai import errors, types
from test_emulator_core import Driver

from connections.emulator import Emulator, Fault, Script, ToolCall
from connections.emulator.core import CloseConnection, DropConnection, Shared
from connections.emulator.faults import FaultRates
from connections.emulator.profiles import (
    PROFILES,
    family_of,
    looks_unfinished,
    profile_for,
)
from connections.emulator.wire import HandleStore

FLASH = "models/gemini-live-2.5-flash-preview"
NATIVE = "models/gemini-2.5-flash-native-audio-preview-12-2025"
G31 = "models/gemini-3.1-flash-live-preview"
G38 = "models/gemini-3.8-live"
THINKING = "models/gemini-3.8-live-extended-thinking"
LOOKUP = [{"functionDeclarations": [{"name": "lookup"}]}]
NOT_FOUND = CloseConnection(1008, "BidiGenerateContent session not found")


def fast(**kwargs) -> Script:
    return Script(speed=math.inf, **kwargs)


# v1alpha: the version where affective dialog and proactivity are fields of setup.
ALPHA = "/ws/google.ai.generativelanguage.v1alpha.GenerativeService.BidiGenerateContent"


def started(model: str, script: Script | None = None, **setup) -> Driver:
    d = Driver(script or fast(), path=ALPHA, shared=setup.pop("shared", None), index=setup.pop("index", 0))
    d.send({"setup": {"model": model, **setup}})
    return d


def flow(d: Driver) -> list[str]:
    """What the client saw, one word per message part, in order."""
    out = []
    for m in d.messages():
        if "serverContent" in m:
            out += [k for k in m["serverContent"] if k not in ("usageMetadata",)]
        elif "sessionResumptionUpdate" in m:
            out.append("handle" if m["sessionResumptionUpdate"].get("resumable") else "busy")
        else:
            out += list(m)
    return out


def said(d: Driver) -> list[str]:
    return d.session.record.model_turns


def call_ids(d: Driver) -> list[str]:
    return [c["id"] for m in d.messages("toolCall") for c in m["toolCall"]["functionCalls"]]


def respond(d: Driver, call_id: str, scheduling: str | None = None, **response) -> None:
    answer = {"id": call_id, "name": "lookup", "response": response or {"ok": 1}}
    if scheduling:
        answer["scheduling"] = scheduling
    d.send({"toolResponse": {"functionResponses": [answer]}})


def text(d: Driver, words: str) -> None:
    d.send({"realtimeInput": {"text": words}})


# --- families ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "family"),
    [
        ("models/gemini-3.8-live-extended-thinking", "gemini-3.8-extended-thinking"),
        ("gemini-3.8-live-extended-thinking-preview", "gemini-3.8-extended-thinking"),
        ("gemini-3.8-live", "gemini-3.8"),
        ("models/gemini-3.1-flash-live-preview", "gemini-3.1"),
        ("gemini-3-flash-live", "gemini-3.1"),
        ("gemini-2.5-flash-native-audio-preview-12-2025", "gemini-2.5-native-audio"),
        ("models/gemini-live-2.5-flash-native-audio", "gemini-2.5-native-audio"),
        ("gemini-live-2.5-flash-preview", "gemini-2.5"),
        ("models/gemini-2.0-flash-live-001", "gemini-2.5"),
    ],
)
def test_model_names_map_to_families(model: str, family: str):
    assert family_of(model) == family
    assert profile_for(model).family == family
    assert profile_for(model, "gemini-3.1").family == "gemini-3.1"  # a name overrides
    d = started("models/" + model.removeprefix("models/"))
    assert d.session.record.profile == family


def test_a_script_names_a_profile_and_switches_single_behaviours():
    d = started(FLASH, fast(profile="gemini-2.5-native-audio", profile_overrides={"late_transcripts": False}))
    assert d.session.profile == dataclasses.replace(PROFILES["gemini-2.5-native-audio"], late_transcripts=False)
    with pytest.raises(ValueError, match="unknown profile"):
        Script(profile="gemini-9")
    with pytest.raises(ValueError, match="unknown behaviour"):
        Script(profile_overrides={"late_transcript": False})
    with pytest.raises(ValueError, match="true or false"):
        Script(profile_overrides={"late_transcripts": "no"})
    with pytest.raises(ValueError, match="seconds"):
        Script(profile_overrides={"handle_ttl": -1})


# --- a. resumption handles -----------------------------------------------------------


def test_no_handle_until_a_turn_completes_and_none_while_busy():
    d = started(FLASH, fast(tool_calls={2: [ToolCall("lookup")]}), sessionResumption={}, tools=LOOKUP)
    assert flow(d) == ["setupComplete"]
    text(d, "hi")
    d.run()
    busy = [m["sessionResumptionUpdate"] for m in d.messages("sessionResumptionUpdate")][:-1]
    assert busy == [{"resumable": False}]  # while generating: no newHandle
    assert flow(d)[-2:] == ["turnComplete", "handle"]
    text(d, "look it up")
    d.run()
    assert flow(d)[-2:] == ["busy", "toolCall"] and flow(d).count("handle") == 1  # the call is unanswered
    respond(d, call_ids(d)[0])
    d.run()
    assert flow(d)[-2:] == ["turnComplete", "handle"]
    assert len(d.session.record.handles) == 2


def test_after_an_interruption_the_handle_waits_for_the_turns_end():
    d = started(FLASH, Script(speed=1.0, replies=["a long answer with many words in it"]), sessionResumption={})
    text(d, "hi")
    d.run(0.5)
    d.audio(tone(0.1))
    tail = flow(d)[flow(d).index("interrupted") :]
    assert tail == ["interrupted", "turnComplete", "handle"]


def test_handle_after_setup_gives_the_old_behaviour():
    d = started(FLASH, fast(profile_overrides={"handle_after_setup": True}), sessionResumption={})
    assert flow(d) == ["setupComplete", "handle"]


# --- b. native audio: realtime input while a call is unanswered ------------------------


@pytest.mark.parametrize(
    "message",
    [
        {"audio": {"data": base64.b64encode(silence(0.02)).decode(), "mimeType": "audio/pcm;rate=16000"}},
        {"video": {"data": base64.b64encode(b"\xff\xd8\xff").decode(), "mimeType": "image/jpeg"}},
        {"text": "are you there?"},
        {"activityStart": {}},
        {"activityEnd": {}},
        {"audioStreamEnd": True},
    ],
    ids=lambda m: next(iter(m)),
)
def test_native_audio_closes_1008_on_realtime_input_during_a_call(message):
    d = started(NATIVE, fast(tool_calls={1: [ToolCall("lookup")]}), tools=LOOKUP)
    text(d, "look it up")
    d.run()
    assert call_ids(d)
    d.send({"realtimeInput": message})
    assert d.closes() == [CloseConnection(1008, "Operation is not implemented, or supported, or enabled.")]


def test_native_audio_takes_realtime_input_before_the_call_and_after_its_answer():
    d = started(NATIVE, Script(speed=1.0, tool_calls={1: [ToolCall("lookup")]}), tools=LOOKUP)
    text(d, "look it up")
    d.audio(silence(0.1))  # the toolCall is not out yet
    d.run(1)
    respond(d, call_ids(d)[0])
    d.audio(silence(0.1))
    d.run(10)
    assert d.closes() == [] and said(d) == ['lookup returned {"ok":1}.']
    # Other families, or the behaviour switched off: audio during the call is fine.
    for model, script in [
        (FLASH, fast(tool_calls={1: [ToolCall("lookup")]})),
        (NATIVE, fast(tool_calls={1: [ToolCall("lookup")]}, profile_overrides={"realtime_during_call_closes": False})),
    ]:
        d = started(model, script, tools=LOOKUP)
        text(d, "look it up")
        d.run()
        d.audio(silence(0.1))
        assert d.closes() == []


# --- c, d. resuming -------------------------------------------------------------------------


def idle_session(shared: Shared, script: Script | None = None, model: str = FLASH) -> tuple[Driver, str]:
    d = started(model, script, sessionResumption={}, shared=shared)
    text(d, "remember me")
    d.run()
    return d, d.session.record.handles[-1]


def resume(shared: Shared, handle: str, *, now: float = 0.0, script: Script | None = None) -> Driver:
    d = Driver(script or fast(), shared=shared, index=1)
    d.now = now
    d.send({"setup": {"model": FLASH, "sessionResumption": {"handle": handle}}})
    return d


def test_an_unknown_or_expired_handle_is_not_found():
    shared = Shared()
    first, handle = idle_session(shared)
    first.session.connection_lost(1000)
    assert resume(shared, "made-up").closes() == [NOT_FOUND]
    assert resume(shared, handle, now=7199).closes() == []  # two hours by default
    assert resume(shared, handle, now=7201).closes() == [NOT_FOUND]
    old = fast(profile_overrides={"unknown_handle_not_found": False})
    assert resume(shared, "made-up", script=old).closes() == [CloseConnection(1007, "Invalid session resumption handle.")]
    forever = Shared()
    first, handle = idle_session(forever, fast(profile_overrides={"handle_ttl": None}))
    first.session.connection_lost(1000)
    assert resume(forever, handle, now=10 * 86400).closes() == []


def test_the_handle_store_forgets_expired_and_old_handles():
    store = HandleStore(limit=3)
    for n in range(5):
        store.put(f"h{n}", {"n": n}, now=float(n), ttl=10.0)
    assert len(store) == 3 and "h0" not in store and "h4" in store
    assert store.lookup("h4", now=13.9) is not None and store.lookup("h4", now=14.0) is None
    store.put("late", {}, now=100.0, ttl=10.0)  # the others expired by now
    assert len(store) == 1


def test_resuming_while_the_issuing_connection_is_open_closes_1011():
    shared = Shared()
    first, handle = idle_session(shared)
    assert resume(shared, handle).closes() == [CloseConnection(1011, "Internal error encountered.")]
    allowed = fast(profile_overrides={"resume_while_open_fails": False})
    assert resume(shared, handle, script=allowed).closes() == []
    first.session.connection_lost(1000)
    assert resume(shared, handle).closes() == []


def test_a_scripted_fault_on_resume():
    shared = Shared()
    first, handle = idle_session(shared)
    first.session.connection_lost(1000)
    stale = fast(faults=[Fault("on_resume", code=1008, reason="BidiGenerateContent session not found")])
    assert resume(shared, handle, script=stale).closes() == [NOT_FOUND]
    assert resume(shared, handle, script=stale).closes() == []  # it fired once


# --- e. the go-away deadline ------------------------------------------------------------------


@pytest.mark.parametrize("model", [FLASH, NATIVE, G31, G38, THINKING])
def test_the_go_away_deadline_closes_1011_on_every_family(model):
    d = started(model, Script(speed=10, go_away_after=20, go_away_time_left=3))
    d.run(3)
    assert d.messages("goAway") == [{"goAway": {"timeLeft": "3s"}}]
    assert d.closes() == [CloseConnection(1011, "Deadline expired before operation could complete.")]


# --- f. transcripts after turnComplete --------------------------------------------------------


@pytest.mark.parametrize("model", [FLASH, NATIVE, G31, G38])
def test_the_last_transcript_fragments_arrive_after_turn_complete(model):
    d = started(model, fast(user_says=["hello there"]), inputAudioTranscription={}, outputAudioTranscription={})
    d.audio(tone(0.4) + silence(1.1))
    d.run()
    messages = d.messages("serverContent")
    done = next(i for i, m in enumerate(messages) if m["serverContent"].get("turnComplete"))
    after = [m["serverContent"] for m in messages[done + 1 :]]
    if model in (G31, G38):  # 3.x bundles: the first straggler comes in turnComplete's own message
        assert messages[done]["serverContent"]["outputTranscription"] == {"text": "re."}
        assert after == [{"inputTranscription": {"text": " there"}}]
    else:
        assert after == [{"outputTranscription": {"text": "re."}}, {"inputTranscription": {"text": " there"}}]
    before = [m["serverContent"] for m in messages[:done]]
    assert "".join(c["outputTranscription"]["text"] for c in before if "outputTranscription" in c) == "You said: hello the"
    # Switched off: every fragment before its turn's end.
    d = started(model, fast(user_says=["hello there"], profile_overrides={"late_transcripts": False}),
                inputAudioTranscription={}, outputAudioTranscription={})
    d.audio(tone(0.4) + silence(1.1))
    d.run()
    assert "turnComplete" in d.messages("serverContent")[-1]["serverContent"]


@pytest.mark.parametrize("model", [FLASH, G31])
@pytest.mark.parametrize("late", [True, False])
def test_output_transcription_finished_marks_the_fragment_that_ends_the_reply(model, late):
    overrides = {"output_transcription_finished": True, "late_transcripts": late}
    d = started(model, fast(profile_overrides=overrides), outputAudioTranscription={})
    text(d, "hello there")
    d.run()
    pieces = d.content("outputTranscription")
    assert "".join(p["text"] for p in pieces) == "You said: hello there."
    assert pieces[-1]["finished"] is True and all("finished" not in p for p in pieces[:-1])
    done = next(i for i, m in enumerate(d.messages("serverContent")) if m["serverContent"].get("turnComplete"))
    marked = next(i for i, m in enumerate(d.messages("serverContent")) if m["serverContent"].get("outputTranscription", {}).get("finished"))
    assert (marked >= done) is late  # the last fragment, wherever it comes
    # Off by default, on every family.
    d = started(model, fast(), outputAudioTranscription={})
    text(d, "hello there")
    d.run()
    assert all("finished" not in p for p in d.content("outputTranscription"))


def test_a_script_gives_the_turn_complete_reason_of_the_turns_it_names():
    d = started(FLASH, fast(replies=["One.", "Two.", "Three."], turn_complete_reasons={2: "NEED_MORE_INPUT"}))
    for words in ("a", "b", "c"):
        text(d, words)
        d.run()
    ends = [m["serverContent"] for m in d.messages("serverContent") if m["serverContent"].get("turnComplete")]
    assert [e.get("turnCompleteReason") for e in ends] == [None, "NEED_MORE_INPUT", None]
    with pytest.raises(ValueError, match="turnCompleteReason"):
        Script(turn_complete_reasons={1: "need more"})


def test_voice_activity_says_where_in_the_audio_the_speech_started_and_ended():
    overrides = {"voice_activity_messages": True, "voice_activity_audio_offset": True}
    d = started(FLASH, fast(profile_overrides=overrides, user_says=["what time is it"]))
    d.audio(silence(0.5) + tone(0.4) + silence(1.1))
    d.run()
    [start, end] = [m["voiceActivity"] for m in d.messages("voiceActivity")]
    assert (start["type"], end["type"]) == ("ACTIVITY_START", "ACTIVITY_END")
    # Audio time, in the service's duration form: the tone starts at 0.5 s and ends at 0.9 s.
    assert start["audioOffset"].endswith("s") and abs(float(start["audioOffset"][:-1]) - 0.5) <= 0.05
    assert abs(float(end["audioOffset"][:-1]) - 0.9) <= 0.05
    # Off, by default: the messages alone.
    d = started(FLASH, fast(profile_overrides={"voice_activity_messages": True}))
    d.audio(tone(0.4) + silence(1.1))
    d.run()
    assert all("audioOffset" not in m["voiceActivity"] for m in d.messages("voiceActivity"))


def test_interim_transcripts_grow_while_the_user_speaks_for_a_client_that_asked_for_transcripts():
    says = "I would like to know what time it is"
    script = fast(profile_overrides={"interim_input_transcription": True, "late_transcripts": False}, user_says=[says] * 2)
    d = started(FLASH, script, inputAudioTranscription={})
    d.audio(tone(1.0) + silence(1.1))
    d.run()
    interim = [c["text"] for c in d.content("interimInputTranscription")]
    assert len(interim) > 2 and interim[-1] == says
    assert all(says.startswith(t) and len(t) < len(u) for t, u in itertools.pairwise(interim))
    first_interim = next(i for i, m in enumerate(d.messages("serverContent")) if "interimInputTranscription" in m["serverContent"])
    first_final = next(i for i, m in enumerate(d.messages("serverContent")) if "inputTranscription" in m["serverContent"])
    assert first_interim < first_final
    assert "".join(p["text"] for p in d.content("inputTranscription")) == says
    # None for a client that did not ask for transcripts.
    d = started(FLASH, script)
    d.audio(tone(1.0) + silence(1.1))
    d.run()
    assert d.content("interimInputTranscription") == []


def test_a_script_adds_its_usage_fields_to_each_turns_usage():
    extra = {"thoughtsTokenCount": 12, "cachedContentTokenCount": 40, "serviceTier": "priority"}
    d = started(FLASH, fast(usage=extra))
    text(d, "hello")
    d.run()
    [usage] = [m["usageMetadata"] for m in d.messages("usageMetadata")]
    assert usage["thoughtsTokenCount"] == 12 and usage["serviceTier"] == "priority"
    assert usage["totalTokenCount"] == usage["promptTokenCount"] + usage["responseTokenCount"] + 12


# --- g. gemini-3.1 ---------------------------------------------------------------------------------


def test_gemini_3_1_marks_the_first_input_transcription_finished():
    d = started(G31, fast(user_says=["one two three"]), inputAudioTranscription={})
    d.audio(tone(0.4) + silence(1.1))
    d.run()
    pieces = d.content("inputTranscription")
    assert pieces[0] == {"text": "one", "finished": True}  # and more follows it
    assert "".join(p["text"] for p in pieces) == "one two three"
    assert all("finished" not in p for p in pieces[1:])
    d = started(FLASH, fast(user_says=["one two three"]), inputAudioTranscription={})
    d.audio(tone(0.4) + silence(0.6))
    d.run()
    assert all("finished" not in p for p in d.content("inputTranscription"))


def test_client_content_mid_session_closes_on_3_1_and_is_allowed_on_3_8():
    turn = {"clientContent": {"turns": [{"role": "user", "parts": [{"text": "typed"}]}], "turnComplete": True}}
    d = started(G31)
    d.send(turn)
    assert d.closes() == [CloseConnection(1007, "Request contains an invalid argument.")]
    d = started(G38)
    d.send(turn)
    d.run()
    d.send(turn)
    d.run()
    assert d.closes() == [] and said(d) == ["You said: typed.", "You said: typed."]


# --- h. gemini-3.8 -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setup", "says"),
    [
        ({"generationConfig": {"thinkingConfig": {"thinkingBudget": 0}}}, "thinking_config"),
        ({"proactivity": {"proactive_audio": False}}, "proactive_audio"),
        ({"generationConfig": {"enableAffectiveDialog": True}}, "affective_dialog"),
    ],
)
def test_gemini_3_8_refuses_removed_settings_with_1007(setup, says):
    d = started(G38, **setup)
    (close,) = d.closes()
    assert close.code == 1007 and says in close.reason
    assert started(FLASH, **setup).closes() == []  # 2.5 takes them


def test_gemini_3_8_keeps_proactive_audio_on():
    assert started(G38, proactivity={"proactiveAudio": True}).closes() == []


def test_gemini_3_8_calls_do_not_block_the_model():
    d = started(G38, fast(tool_calls={1: [ToolCall("lookup")]}), tools=LOOKUP, sessionResumption={})
    text(d, "look it up")
    d.run()
    assert said(d) == ["Let me check."]  # the model carried on without the result
    assert flow(d).index("toolCall") < flow(d).index("turnComplete")
    assert "handle" not in flow(d)  # a call is unanswered: not resumable
    respond(d, call_ids(d)[0])  # WHEN_IDLE by default, and the model is idle: at once
    d.run()
    assert said(d) == ["Let me check.", 'lookup returned {"ok":1}.']
    assert flow(d)[-2:] == ["turnComplete", "handle"]


def test_gemini_3_8_silent_results_are_taken_in_without_a_word():
    d = started(G38, fast(tool_calls={1: [ToolCall("lookup")]}), tools=LOOKUP)
    text(d, "look it up")
    d.run()
    respond(d, call_ids(d)[0], "SILENT", city="Oslo")
    d.run()
    assert said(d) == ["Let me check."]
    text(d, "so?")
    d.run()
    history = [p for h in d.session._history for p in h["parts"]]
    assert {"functionResponse": {"id": call_ids(d)[0], "name": "lookup", "response": {"city": "Oslo"}}} in history


def test_a_streamed_result_keeps_its_call_open_until_one_without_will_continue():
    """google-genai FunctionResponse.will_continue: "more responses will be
    returned, turning the function call into a generator ... If set to false,
    future responses will not be considered." """
    d = started(G38, fast(tool_calls={1: [ToolCall("lookup")]}), tools=LOOKUP, sessionResumption={})
    text(d, "look it up")
    d.run()
    [call] = call_ids(d)
    for status, more in (("packed", True), ("shipped", True), ("delivered", None)):
        answer = {"id": call, "name": "lookup", "response": {"status": status}}
        if more:
            answer["willContinue"] = True
        before = len(flow(d))
        d.send({"toolResponse": {"functionResponses": [answer]}})
        d.run()
        if more:
            assert "handle" not in flow(d)[before:]  # the call is still open: not resumable
    late = {"id": call, "name": "lookup", "response": {"status": "returned"}}
    d.send({"toolResponse": {"functionResponses": [late]}})  # after the last: not considered
    d.run()
    assert d.closes() == []
    assert said(d)[1:] == [f'lookup returned {{"status":"{s}"}}.' for s in ("packed", "shipped", "delivered")]
    assert flow(d)[-1] == "handle"  # nothing open any more


def test_gemini_3_8_when_idle_waits_for_the_current_generation_and_interrupt_cuts_it():
    story = "once upon a time there was a long story with many words in it"
    for scheduling, expected in [("WHEN_IDLE", []), ("INTERRUPT", [True])]:
        d = started(G38, Script(speed=1.0, tool_calls={1: [ToolCall("lookup")]}, replies=[story]), tools=LOOKUP)
        text(d, "look it up")
        d.run(5)  # the call and "Let me check."
        text(d, "meanwhile tell me a story")
        d.run(0.5)  # the story is being told
        respond(d, call_ids(d)[0], scheduling)
        d.run(20)
        assert d.content("interrupted") == expected
        if scheduling == "WHEN_IDLE":
            assert said(d)[1:] == [story, 'lookup returned {"ok":1}.']  # after the whole story
        else:
            assert said(d)[-1] == 'lookup returned {"ok":1}.' and story.startswith(said(d)[1]) and said(d)[1] != story


def test_gemini_3_8_cancels_a_blocking_call_when_the_user_goes_on():
    tools = [{"functionDeclarations": [{"name": "lookup", "behavior": "BLOCKING"}]}]
    for model, cancelled in [(G38, True), (FLASH, False)]:
        d = started(model, fast(tool_calls={1: [ToolCall("lookup")]}), tools=tools,
                    realtimeInputConfig={"activityHandling": "NO_INTERRUPTION"})
        text(d, "look it up")
        d.run()
        assert said(d) == []  # BLOCKING: the model waits
        text(d, "never mind, what time is it")
        d.run()
        if cancelled:
            assert d.messages("toolCallCancellation") == [{"toolCallCancellation": {"ids": call_ids(d)}}]
            assert said(d) == ["You said: never mind, what time is it."]
        else:
            assert d.messages("toolCallCancellation") == [] and said(d) == []  # the turn waits for the call


@pytest.mark.parametrize("words", ["I would like to book a table and", "so I was thinking..."])
def test_gemini_3_8_waits_for_more_input_when_the_user_trails_off(words):
    assert looks_unfinished(words)
    d = started(G38)
    text(d, words)
    d.run()
    assert d.content("waitingForInput") == [True] and said(d) == [] and d.content("turnComplete") == []
    text(d, "for two people")
    d.run()
    assert said(d) == [f"You said: {words} for two people."]
    d = started(FLASH)
    text(d, words)
    d.run()
    assert d.content("waitingForInput") == [] and len(said(d)) == 1


def test_what_does_not_look_unfinished():
    assert not looks_unfinished("bread and butter.")
    assert not looks_unfinished("user turn 3")
    assert not looks_unfinished("Sandy")


# --- i. gemini-3.8 extended thinking ----------------------------------------------------------------


def status(d: Driver) -> list[str]:
    return [m["serverContent"]["interactionStatus"] for m in d.messages("serverContent") if "interactionStatus" in m["serverContent"]]


def test_extended_thinking_fills_then_answers_later():
    d = started(THINKING, Script(speed=1.0, replies=["the answer"]))
    text(d, "why is the sky blue")
    d.run(3)
    assert said(d) == ["Let me think about that."] and status(d) == ["IN_PROGRESS"]
    d.run(1.5)  # thinking_delay (2 s) after the filler ended: nothing yet
    assert said(d) == ["Let me think about that."]
    d.run(5)
    assert said(d) == ["Let me think about that.", "the answer"] and status(d) == ["IN_PROGRESS", "IDLE"]
    assert len(d.content("turnComplete")) == 2


def test_extended_thinking_calls_are_asynchronous_only():
    blocking = [{"functionDeclarations": [{"name": "lookup", "behavior": "BLOCKING"}]}]
    (close,) = started(THINKING, tools=blocking).closes()
    assert close.code == 1007 and "BLOCKING" in close.reason
    d = started(THINKING, fast(tool_calls={1: [ToolCall("lookup")]}), tools=LOOKUP)
    text(d, "look it up")
    d.run()
    assert said(d) == ["Let me check."] and status(d) == ["IN_PROGRESS"]
    respond(d, call_ids(d)[0], "SILENT")
    d.run()
    assert status(d) == ["IN_PROGRESS", "IDLE"] and said(d) == ["Let me check."]
    assert d.messages("serverContent")[-1] == {"serverContent": {"turnComplete": True, "interactionStatus": "IDLE"}}


# --- faults at rates ----------------------------------------------------------------------------


def test_realistic_rates_are_low_and_a_rate_is_a_probability():
    rates = FaultRates.realistic()
    values = [getattr(rates, f.name) for f in dataclasses.fields(rates)]
    assert all(0 < v <= 0.05 for v in values)
    with pytest.raises(ValueError):
        FaultRates(internal_error_mid_turn=1.5)


def test_no_rates_no_draws():
    shared = Shared()
    d = started(FLASH, fast(), shared=shared)
    text(d, "hi")
    d.run()
    assert shared.random(0).getstate() == random.Random(0).getstate()


def test_a_mid_turn_internal_error():
    d = started(FLASH, fast(fault_rates=FaultRates(internal_error_mid_turn=1.0)))
    text(d, "hi")
    d.run()
    assert d.closes() == [CloseConnection(1011, "Internal error encountered.")]
    assert d.content("modelTurn") and d.content("turnComplete") == []


def test_a_not_found_after_a_tool_response():
    d = started(FLASH, fast(tool_calls={1: [ToolCall("lookup")]}, fault_rates=FaultRates(not_found_after_tool_response=1.0)), tools=LOOKUP)
    text(d, "look it up")
    d.run()
    respond(d, call_ids(d)[0])
    assert d.closes() == [CloseConnection(1008, "Requested entity was not found.")]


def test_a_drop_before_the_first_handle():
    for seed in range(8):
        d = started(FLASH, fast(seed=seed, fault_rates=FaultRates(drop_before_first_handle=1.0)), sessionResumption={})
        text(d, "hi")
        d.run()
        (close,) = d.closes()
        assert isinstance(close, DropConnection) or close == CloseConnection(1011, "The service is currently unavailable.")
        assert d.session.record.handles == []


def test_a_stale_handle_on_resume():
    shared = Shared()
    first, handle = idle_session(shared)
    first.session.connection_lost(1000)
    assert resume(shared, handle, script=fast(fault_rates=FaultRates(stale_handle_on_resume=1.0))).closes() == [NOT_FOUND]


def test_the_same_seed_replays_the_same_faults():
    def run(seed: int) -> list:
        shared, outcome = Shared(), []
        script = fast(seed=seed, fault_rates=FaultRates(internal_error_mid_turn=0.3, drop_before_first_handle=0.3))
        for n in range(20):
            d = started(FLASH, script, shared=shared, index=n)
            for _ in range(3):
                text(d, "hi")
                d.run()
            outcome.append((d.session.record.close, len(d.content("modelTurn"))))
        return outcome

    assert run(7) == run(7)
    assert run(7) != run(8)
    assert any(close for close, _ in run(7))


# --- through the real SDK --------------------------------------------------------------------------


async def turns_until_idle(session) -> list[types.LiveServerMessage]:
    got = []
    with anyio.fail_after(10):
        async for message in session.receive():
            got.append(message)
    return got


async def until_tool_call(session) -> types.LiveServerToolCall:
    with anyio.fail_after(10):
        async for message in session.receive():
            if message.tool_call:
                return message.tool_call
    raise AssertionError("the turn ended without a tool call")


@pytest.mark.anyio
async def test_sdk_receive_runs_until_the_interaction_is_idle(live_emulator: Emulator, live_emulator_client: genai.Client):
    live_emulator.script = Script(speed=20, replies=["the answer"])
    async with live_emulator_client.aio.live.connect(model="gemini-3.8-live-extended-thinking") as session:
        await session.send_realtime_input(text="why?")
        got = await turns_until_idle(session)  # one receive(): through the filler's turnComplete
    done = [m.server_content for m in got if m.server_content and m.server_content.turn_complete]
    assert [c.interaction_status for c in done] == [types.InteractionStatus.IN_PROGRESS, types.InteractionStatus.IDLE]
    assert live_emulator.sessions[0].model_turns == ["Let me think about that.", "the answer"]


@pytest.mark.anyio
async def test_sdk_sees_waiting_for_input_and_scheduling_is_honoured(live_emulator: Emulator, live_emulator_client: genai.Client):
    live_emulator.script = Script(speed=20, tool_calls={2: [ToolCall("lookup")]})
    config = types.LiveConnectConfig(tools=[types.Tool(function_declarations=[types.FunctionDeclaration(name="lookup")])])
    async with live_emulator_client.aio.live.connect(model="gemini-3.8-live", config=config) as session:
        await session.send_realtime_input(text="I want to know...")
        with anyio.fail_after(10):
            async for message in session.receive():
                if message.server_content and message.server_content.waiting_for_input:
                    break
        await session.send_realtime_input(text="the weather")
        got = await turns_until_idle(session)
        (call,) = next(m.tool_call for m in got if m.tool_call).function_calls
        await session.send_tool_response(function_responses=[
            types.FunctionResponse(id=call.id, name=call.name, response={"sky": "clear"}, scheduling=types.FunctionResponseScheduling.SILENT)
        ])
        await session.send_realtime_input(text="thanks")
        await turns_until_idle(session)
    record = live_emulator.sessions[0]
    assert record.tool_responses[0]["scheduling"] == "SILENT"
    assert record.model_turns == ["Let me check.", "You said: thanks."]  # nothing said for the silent result


@pytest.mark.anyio
async def test_sdk_native_audio_during_a_call_is_closed_1008(live_emulator: Emulator, live_emulator_client: genai.Client):
    live_emulator.script = Script(speed=20, tool_calls={1: [ToolCall("lookup")]})
    with pytest.raises(errors.APIError) as info:
        async with live_emulator_client.aio.live.connect(model="gemini-2.5-flash-native-audio-preview-12-2025") as session:
            await session.send_realtime_input(text="look it up")
            await until_tool_call(session)  # unanswered
            await session.send_realtime_input(audio=types.Blob(data=silence(0.02), mime_type="audio/pcm;rate=16000"))
            await turns_until_idle(session)
    assert info.value.code == 1008 and "not implemented" in str(info.value)


@pytest.mark.anyio
async def test_sdk_no_handle_after_setup_and_a_stale_one_is_not_found(live_emulator: Emulator, live_emulator_client: genai.Client):
    config = types.LiveConnectConfig(session_resumption=types.SessionResumptionConfig())
    async with live_emulator_client.aio.live.connect(model="gemini-3.1-flash-live-preview", config=config) as session:
        await anyio.sleep(0.3)
        assert live_emulator.sessions[0].sent == [{"setupComplete": {}}]  # nothing to resume yet
        await session.send_realtime_input(text="hello")
        got = await turns_until_idle(session)
        with anyio.fail_after(5):
            async for message in session.receive():
                got.append(message)
                if message.session_resumption_update and message.session_resumption_update.resumable:
                    break
    updates = [m.session_resumption_update for m in got if m.session_resumption_update]
    assert [u.resumable for u in updates] == [False, True] and not updates[0].new_handle
    live_emulator.script = Script(speed=20, fault_rates=FaultRates(stale_handle_on_resume=1.0))
    resumed = types.LiveConnectConfig(session_resumption=types.SessionResumptionConfig(handle=updates[-1].new_handle))
    with pytest.raises(errors.APIError) as info:
        async with live_emulator_client.aio.live.connect(model="gemini-3.1-flash-live-preview", config=resumed):
            pass
    assert info.value.code == 1008 and "session not found" in str(info.value)


# --- h. the model's own turn detection, as users report it -----------------------------------------


def test_gemini_3_closes_a_turn_at_a_one_second_pause_whatever_silence_duration_says():
    """cookbook#1328 / gemini-live-api-examples#37: on 3.1 a 1.0 s mid-sentence
    pause closes the turn; python-genai#2580: silenceDurationMs is ignored."""
    for model in (G31, G38):
        d = started(model, fast(), realtimeInputConfig={"automaticActivityDetection": {"silenceDurationMs": 3000}})
        d.audio(tone(0.6) + silence(0.9))
        assert d.session.record.user_turns == []  # a pause under a second: still the user's turn
        d.audio(tone(0.6) + silence(1.0))
        assert len(d.session.record.user_turns) == 1  # one turn, both halves; closed at 1 s whatever was asked
    # 2.5 honours silenceDurationMs.
    d = started(FLASH, fast(), realtimeInputConfig={"automaticActivityDetection": {"silenceDurationMs": 3000}})
    d.audio(tone(0.6) + silence(1.5))
    assert d.session.record.user_turns == []


def test_any_loud_sound_cuts_the_reply_but_a_steady_hum_does_not():
    """A 60 ms click over the model's reply interrupts it (any sound above the
    floor barges in: pipecat#4633); steady noise raises the floor instead."""
    long = "a long answer with many words in it, long enough to interrupt"
    d = started(FLASH, Script(speed=1.0, replies=[long]))
    d.send({"realtimeInput": {"text": "hi"}})
    d.run(0.5)
    d.audio(tone(0.06) + silence(0.2))
    assert any(m["serverContent"].get("interrupted") for m in d.messages("serverContent"))
    kind = started(FLASH, Script(speed=1.0, replies=[long], profile_overrides={"barge_in_on_any_sound": False}))
    kind.send({"realtimeInput": {"text": "hi"}})
    kind.run(0.5)
    kind.audio(tone(0.06) + silence(0.2))
    assert not any(m["serverContent"].get("interrupted") for m in kind.messages("serverContent"))
    hum = started(FLASH, fast())
    hum.audio(tone(10.0, amp=0.1))
    # The hum opened a turn at first; as the floor rose to it, it stopped being
    # speech, and the turn ended while the hum went on.
    assert len(hum.session.record.user_turns) == 1

