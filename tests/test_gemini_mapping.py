"""The sans-I/O mapping between Gemini Live messages and the live contract."""

from __future__ import annotations

import pytest
from google.genai import types

from connections import double
from connections.gemini_mapping import (
    GENERATED_ID_PREFIX,
    ServerMessageMapper,
    function_responses_of,
    history_turns,
    is_gemini3,
    parse_duration,
    prepare_connect_config,
    realtime_kwargs,
    text_of,
)
from live import AUDIO_STREAM_END, LlmResponse

PCM = b"\x01\x02" * 960  # 40 ms at 24 kHz


def feed_all(mapper: ServerMessageMapper, *messages: types.LiveServerMessage) -> list[LlmResponse]:
    return [r for m in messages for r in mapper.feed(m)]


def finals(responses: list[LlmResponse], direction: str) -> list[str]:
    attr = f"{direction}_transcription"
    return [
        getattr(r, attr).text
        for r in responses
        if getattr(r, attr) is not None and getattr(r, attr).finished
    ]


def fragments(responses: list[LlmResponse], direction: str) -> list[str]:
    attr = f"{direction}_transcription"
    out = []
    for r in responses:
        t = getattr(r, attr)
        if t is not None and not t.finished:
            assert r.partial, "a transcript fragment must be marked partial"
            out.append(t.text)
    return out


# -- server direction ---------------------------------------------------------


def test_audio_chunk_is_one_response_passing_the_content_through() -> None:
    message = double.audio(PCM)
    [response] = ServerMessageMapper().feed(message)
    assert response.content is message.server_content.model_turn  # no copy on the hot path
    assert response.partial
    assert response.audio_chunks == [PCM]
    assert not response.turn_complete and not response.interrupted


def test_a_3x_bundle_surfaces_every_field() -> None:
    mapper = ServerMessageMapper()
    feed_all(mapper, double.input_transcript("What's the"), double.output_transcript("It"))
    message = double.bundle(
        double.audio(PCM),
        double.audio(PCM[::-1]),
        double.input_transcript(" weather?"),
        double.output_transcript(" rains."),
        double.usage(prompt=11, response=7),
        double.turn_complete(
            reason=types.TurnCompleteReason.NEED_MORE_INPUT, waiting_for_input=True
        ),
    )
    responses = mapper.feed(message)
    assert len(responses) == 2
    body, tail = responses
    # Every part, not just parts[0].
    assert body.audio_chunks == [PCM, PCM[::-1]]
    assert body.partial
    assert body.input_transcription.text == " weather?"
    assert body.output_transcription.text == " rains."
    assert body.usage_metadata.total_token_count == 18
    assert not body.turn_complete
    assert tail.turn_complete and not tail.partial
    assert tail.turn_complete_reason == types.TurnCompleteReason.NEED_MORE_INPUT
    assert tail.waiting_for_input
    assert tail.input_transcription == types.Transcription(text="What's the weather?", finished=True)
    assert tail.output_transcription == types.Transcription(text="It rains.", finished=True)


def test_sub_word_fragments_make_one_final_per_turn_and_reset() -> None:
    mapper = ServerMessageMapper()
    turn1 = feed_all(
        mapper,
        double.output_transcript("Hel"),
        double.output_transcript("lo"),
        double.output_transcript(" wor"),
        double.output_transcript("ld"),
        double.generation_complete(),
        double.turn_complete(),
    )
    assert fragments(turn1, "output") == ["Hel", "lo", " wor", "ld"]
    assert finals(turn1, "output") == ["Hello world"]  # once, at generationComplete
    gen_done = [r for r in turn1 if r.generation_complete]
    assert gen_done[0].output_transcription.text == "Hello world"
    assert any(r.turn_complete for r in turn1)

    # The user speaks; the model answers: a new turn.
    turn2 = feed_all(mapper, double.input_transcript("Bye?"), double.output_transcript("By"),
                     double.output_transcript("e"), double.turn_complete())
    assert finals(turn2, "output") == ["Bye"]


def test_a_transcript_tail_after_its_turn_belongs_to_that_turn_not_the_next() -> None:
    """Gemini does not order transcripts with turns (livekit agents-js#2165,
    pipecat#1788): the last words of a reply may follow its turnComplete."""
    mapper = ServerMessageMapper()
    turn1 = feed_all(mapper, double.audio(PCM), double.output_transcript("It is sunny"), double.turn_complete())
    assert finals(turn1, "output") == ["It is sunny"]
    [late] = feed_all(mapper, double.output_transcript(" in Paris."))
    assert late.late_transcription and late.output_transcription.text == " in Paris."
    assert not late.partial and not late.output_transcription.finished
    turn2 = feed_all(mapper, double.input_transcript("And Lyon?"), double.audio(PCM),
                     double.output_transcript("Rain in Lyon."), double.turn_complete())
    assert finals(turn2, "output") == ["Rain in Lyon."]  # nothing of the last turn's tail
    assert not any(r.late_transcription for r in turn2)


def test_what_follows_generation_complete_before_turn_complete_is_that_turns_tail() -> None:
    mapper = ServerMessageMapper()
    out = feed_all(mapper, double.audio(PCM), double.output_transcript("Hello"), double.generation_complete(),
                   double.output_transcript(" there."), double.turn_complete())
    assert finals(out, "output") == ["Hello"]  # one final per turn, never a second one
    assert [r.output_transcription.text for r in out if r.late_transcription] == [" there."]


def test_server_final_is_used_and_not_duplicated() -> None:
    mapper = ServerMessageMapper()
    # The server's final repeats the whole text.
    out = feed_all(
        mapper,
        double.input_transcript("Good "),
        double.input_transcript("morning"),
        double.input_transcript("Good morning", finished=True),
        double.turn_complete(),
    )
    assert finals(out, "input") == ["Good morning"]
    # The server's final carries only the last fragment.
    out = feed_all(
        mapper,
        double.input_transcript("Good "),
        double.input_transcript("night", finished=True),
        double.turn_complete(),
    )
    assert finals(out, "input") == ["Good night"]


def test_a_revised_final_replaces_the_fragments_instead_of_doubling_them() -> None:
    mapper = ServerMessageMapper()
    out = feed_all(
        mapper,
        double.output_transcript(" what is the"),
        double.output_transcript(" whether in paris"),
        double.output_transcript("What is the weather in Paris?", finished=True),
        double.turn_complete(),
    )
    assert finals(out, "output") == ["What is the weather in Paris?"]


def test_interruption_mid_generation_is_its_own_flag_and_closes_the_turn() -> None:
    mapper = ServerMessageMapper()
    out = feed_all(
        mapper,
        double.audio(PCM),
        double.output_transcript("Let me tell you about"),
        double.interrupted(),
    )
    flagged = [r for r in out if r.interrupted]
    assert len(flagged) == 1
    assert not flagged[0].turn_complete
    assert flagged[0].output_transcription.text == "Let me tell you about"
    assert flagged[0].output_transcription.finished
    # The next turn starts from nothing.
    out = feed_all(mapper, double.output_transcript("Sure."), double.turn_complete())
    assert finals(out, "output") == ["Sure."]


def test_interrupted_without_pending_text_still_surfaces() -> None:
    [response] = ServerMessageMapper().feed(double.interrupted())
    assert response.interrupted and response.output_transcription is None


def test_tool_call_ids_are_kept_exactly_and_missing_ones_generated() -> None:
    message = double.tool_calls(
        types.FunctionCall(name="lookupInvoice", args={"invoiceId": "4411"}, id="call_7f2"),
        types.FunctionCall(name="getWeather", args={"city": "Oslo"}),
        types.FunctionCall(name="getTime", args={}),
    )
    mapper = ServerMessageMapper()
    [response] = mapper.feed(message)
    calls = response.function_calls
    assert [c.name for c in calls] == ["lookupInvoice", "getWeather", "getTime"]
    assert calls[0].id == "call_7f2"
    assert calls[0].args == {"invoiceId": "4411"}
    assert calls[1].id.startswith(GENERATED_ID_PREFIX) and calls[2].id.startswith(GENERATED_ID_PREFIX)
    assert calls[1].id != calls[2].id
    assert response.content.role == "model"
    assert not response.partial
    # The message itself is untouched: it may be replayed to another session.
    assert message.tool_call.function_calls[1].id is None


def test_cancellation_go_away_resumption_usage_and_activity() -> None:
    mapper = ServerMessageMapper()
    [cancel] = mapper.feed(double.tool_call_cancellation("a", "b"))
    assert cancel.cancelled_tool_call_ids == ("a", "b")
    [away] = mapper.feed(double.go_away("9.5s"))
    assert away.go_away_time_left == 9.5
    [resume] = mapper.feed(double.resumption_update("h-1", resumable=True))
    assert resume.session_resumption_update.new_handle == "h-1"
    assert resume.session_resumption_update.resumable
    [use] = mapper.feed(double.usage(prompt=3, response=4))
    assert use.usage_metadata.prompt_token_count == 3
    activity = types.VoiceActivity(voice_activity_type=types.VoiceActivityType.ACTIVITY_START)
    [voice] = mapper.feed(types.LiveServerMessage(voice_activity=activity))
    assert voice.voice_activity is activity
    legacy = types.LiveServerMessage(
        voice_activity_detection_signal=types.VoiceActivityDetectionSignal(
            vad_signal_type=types.VadSignalType.VAD_SIGNAL_TYPE_EOS
        )
    )
    [vad] = mapper.feed(legacy)
    assert vad.voice_activity.voice_activity_type == types.VoiceActivityType.ACTIVITY_END
    grounding = types.GroundingMetadata(web_search_queries=["weather oslo"])
    [grounded] = mapper.feed(
        types.LiveServerMessage(server_content=types.LiveServerContent(grounding_metadata=grounding))
    )
    assert grounded.grounding_metadata is grounding


def test_go_away_without_time_left_means_now() -> None:
    [away] = ServerMessageMapper().feed(types.LiveServerMessage(go_away=types.LiveServerGoAway()))
    assert away.go_away_time_left == 0.0


def test_setup_complete_alone_yields_nothing() -> None:
    message = types.LiveServerMessage(setup_complete=types.LiveServerSetupComplete(session_id="s"))
    assert ServerMessageMapper().feed(message) == []


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("9.5s", 9.5), ("1.000000001s", 1.000000001), ("300s", 300.0), ("0s", 0.0), ("12", 12.0),
     (".5s", 0.5), ("soon", None), (None, None)],
)
def test_parse_duration(text: str | None, seconds: float | None) -> None:
    assert parse_duration(text) == seconds


# -- client direction ---------------------------------------------------------


def _audio_part() -> types.Part:
    return types.Part(inline_data=types.Blob(data=b"\0\0", mime_type="audio/pcm;rate=16000"))


def test_history_strips_audio_and_empty_turns_without_touching_the_input() -> None:
    user = types.Content(role="user", parts=[types.Part(text="hi"), _audio_part()])
    voice_only = types.Content(role="user", parts=[_audio_part()])
    model = types.Content(role="model", parts=[types.Part(text="hello")])
    empty = types.Content(role="user", parts=[])
    turns, complete = history_turns([user, voice_only, empty, model])
    assert [t.role for t in turns] == ["user", "model"]
    assert turns[0].parts == [types.Part(text="hi")]
    assert len(user.parts) == 2  # caller's content unchanged
    assert complete is False  # last turn is the model's


def test_history_completes_a_turn_only_when_the_user_spoke_last() -> None:
    model = types.Content(role="model", parts=[types.Part(text="hello")])
    user = types.Content(role="user", parts=[types.Part(text="and you?")])
    assert history_turns([model, user])[1] is True
    assert history_turns([user, model])[1] is False
    assert history_turns([]) == ([], False)


def test_function_responses_only_or_value_error() -> None:
    fr = types.FunctionResponse(id="1", name="f", response={"ok": True})
    assert function_responses_of(types.Content(role="user", parts=[types.Part(function_response=fr)])) == [fr]
    assert function_responses_of(types.Content(role="user", parts=[types.Part(text="x")])) is None
    mixed = types.Content(role="user", parts=[types.Part(function_response=fr), types.Part(text="x")])
    with pytest.raises(ValueError, match="only function responses"):
        function_responses_of(mixed)


def test_text_of_only_plain_text() -> None:
    assert text_of(types.Content(parts=[types.Part(text="a"), types.Part(text="b")])) == "ab"
    assert text_of(types.Content(parts=[types.Part(text="a"), _audio_part()])) is None
    assert text_of(types.Content(parts=[types.Part(text="plan", thought=True)])) is None


def test_realtime_routing() -> None:
    pcm = types.Blob(data=b"\0\0", mime_type="audio/pcm;rate=16000")
    jpeg = types.Blob(data=b"\xff\xd8", mime_type="image/jpeg")
    frame = types.Blob(data=b"\0", mime_type="video/webm")
    assert realtime_kwargs(pcm) == {"audio": pcm}
    assert realtime_kwargs(jpeg) == {"video": jpeg}
    assert realtime_kwargs(frame) == {"video": frame}
    start, end = types.ActivityStart(), types.ActivityEnd()
    assert realtime_kwargs(start) == {"activity_start": start}
    assert realtime_kwargs(end) == {"activity_end": end}
    assert realtime_kwargs(AUDIO_STREAM_END) == {"audio_stream_end": True}
    with pytest.raises(TypeError, match="text/plain"):
        realtime_kwargs(types.Blob(data=b"x", mime_type="text/plain"))
    with pytest.raises(TypeError, match="str"):
        realtime_kwargs("hello")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("model", "expected"),
    [("gemini-3.1-flash-live-preview", True), ("models/gemini-3-pro", True),
     ("gemini-4-live", True), ("gemini-2.5-flash-native-audio-preview-09-2025", False),
     ("gemini-live-2.5-flash-preview", False), ("local/echo", False)],
)
def test_is_gemini3(model: str, expected: bool) -> None:
    assert is_gemini3(model) is expected


def test_history_flag_rule() -> None:
    config = types.LiveConnectConfig(response_modalities=[types.Modality.AUDIO])
    # Without history, or on 2.x: the caller's config, untouched.
    for model, has_history in [("gemini-2.5-flash", False), ("gemini-2.5-flash", True),
                               ("gemini-3.1-flash-live", False)]:
        assert prepare_connect_config(config, model=model, has_history=has_history) is config
    # A fresh Gemini 3 connection that seeds history: the flag, on a copy.
    prepared = prepare_connect_config(config, model="gemini-3.1-flash-live", has_history=True)
    assert prepared.history_config.initial_history_in_client_content is True
    assert prepared.response_modalities == [types.Modality.AUDIO]
    assert config.history_config is None
    # An explicit choice on a fresh connection is the caller's.
    explicit = types.LiveConnectConfig(
        history_config=types.HistoryConfig(initial_history_in_client_content=False)
    )
    assert prepare_connect_config(explicit, model="gemini-3-x", has_history=True) is explicit
    # Never on a resumed connection, whoever set it.
    resumed = types.LiveConnectConfig(
        history_config=types.HistoryConfig(initial_history_in_client_content=True),
        session_resumption=types.SessionResumptionConfig(handle="h"),
    )
    cleared = prepare_connect_config(resumed, model="gemini-3-x", has_history=True)
    assert not cleared.history_config.initial_history_in_client_content


def test_initial_history_mode_always_completes_the_seed() -> None:
    user = types.Content(role="user", parts=[types.Part(text="hi")])
    model = types.Content(role="model", parts=[types.Part(text="hello")])
    assert history_turns([user, model], initial_history_mode=True)[1] is True
    assert history_turns([user, model])[1] is False