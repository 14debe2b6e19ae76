"""Session rules without sockets: turns, barge-in, tools, bad input."""

from __future__ import annotations

import json

import pytest
from google.genai import types

from live import LlmResponse
from live import protocol as p
from live.engine.session import (
    AwaitClientTool,
    CancelTool,
    CloseSession,
    FlushAudio,
    RunTool,
    SendAudio,
    SendEvent,
    SessionCore,
    ToUpstream,
    TurnState,
)


def audio(data: bytes = b"\x01\x00" * 480) -> LlmResponse:
    return LlmResponse(
        content=types.Content(
            role="model",
            parts=[types.Part(inline_data=types.Blob(data=data, mime_type="audio/pcm;rate=24000"))],
        )
    )


def call(name: str, call_id: str | None = "c1", **args) -> LlmResponse:
    return LlmResponse(
        content=types.Content(
            role="model",
            parts=[types.Part(function_call=types.FunctionCall(id=call_id, name=name, args=args))],
        )
    )


def events(actions):
    return [a.event for a in actions if isinstance(a, SendEvent)]


def core(**kw) -> SessionCore:
    return SessionCore(input_rate=16_000, server_tools=frozenset({"get_weather"}), **kw)


def test_audio_frames_become_blobs_at_the_session_rate():
    blob = SessionCore(input_rate=48_000).client_audio(b"\x00\x01" * 960)
    assert blob.mime_type == "audio/pcm;rate=48000"
    assert blob.data == b"\x00\x01" * 960


def test_odd_length_audio_is_refused_not_fatal():
    with pytest.raises(p.ProtocolError) as info:
        core().client_audio(b"\x00\x01\x02")
    assert info.value.code == "invalid_audio" and not info.value.fatal


def test_bad_text_frame_becomes_an_error_event_and_nothing_else():
    actions = core().client_text("{oops", now=0.0)
    [event] = events(actions)
    assert len(actions) == 1
    assert event.code == "invalid_json" and not event.fatal


def test_one_bundled_message_yields_audio_transcript_and_turn_end_in_order():
    s = core()
    response = audio()
    response.output_transcription = types.Transcription(text="Hi", finished=False)
    response.generation_complete = True
    response.turn_complete = True
    response.usage_metadata = types.UsageMetadata(prompt_token_count=7, response_token_count=3, total_token_count=10)
    actions = s.model_response(response, now=0.0)
    kinds = [type(a.event).__name__ if isinstance(a, SendEvent) else type(a).__name__ for a in actions]
    assert kinds == ["SendAudio", "TranscriptOutput", "GenerationComplete", "TurnComplete", "Usage"]
    assert events(actions)[-1].total_tokens == 10
    assert s.turn is TurnState.LISTENING


def test_for_a_door_that_wants_them_together_a_turns_usage_rides_on_its_end():
    s = core(usage_with_turn_end=True)
    response = LlmResponse(turn_complete=True, usage_metadata=types.UsageMetadata(total_token_count=10))
    [ended] = events(s.model_response(response, now=0.0))
    assert isinstance(ended, p.TurnComplete) and ended.usage.total_tokens == 10
    assert p.encode(ended) == '{"type":"turn.complete"}'  # never on the native wire
    # Usage on its own (no turn's end with it) is still told, at once.
    [alone] = events(s.model_response(LlmResponse(usage_metadata=types.UsageMetadata(total_token_count=4)), now=0.1))
    assert isinstance(alone, p.Usage) and s.tokens_used == 14


def test_interruption_flushes_and_drops_late_audio_until_the_turn_closes():
    s = core()
    assert isinstance(s.model_response(audio(), now=0.0)[0], SendAudio)
    interrupted = audio()  # audio bundled with the interruption is stale too
    interrupted.interrupted = True
    actions = s.model_response(interrupted, now=1.0)
    assert isinstance(actions[0], FlushAudio)
    assert [type(e) for e in events(actions)] == [p.TurnInterrupted]
    assert not any(isinstance(a, SendAudio) for a in actions)
    # Late audio of the interrupted generation never reaches the client...
    assert s.model_response(audio(), now=1.1) == []
    assert s.late_audio_dropped == 2
    # ...until the interrupted turn is closed; then the next reply plays.
    s.model_response(LlmResponse(turn_complete=True), now=1.2)
    assert isinstance(s.model_response(audio(), now=2.0)[0], SendAudio)


def test_a_quick_answer_to_a_short_barge_in_keeps_its_start():
    s = core()
    s.model_response(LlmResponse(interrupted=True), now=0.0)
    # The model hears the user's new turn: the interrupted generation is over...
    s.model_response(LlmResponse(input_transcription=types.Transcription(text="stop")), now=0.2)
    # ...so the answer that follows 0.1 s later plays from its first chunk.
    assert isinstance(s.model_response(audio(), now=0.3)[0], SendAudio)
    assert s.late_audio_dropped == 0


def test_late_audio_is_dropped_by_generation_not_by_clock():
    s = core()
    s.model_response(LlmResponse(interrupted=True), now=0.0)
    # Nothing has shown a new turn: audio is still the interrupted generation's,
    # however late it comes.
    assert s.model_response(audio(), now=5.0) == []
    s.model_response(LlmResponse(voice_activity=types.VoiceActivity(
        voice_activity_type=types.VoiceActivityType.ACTIVITY_END)), now=5.1)
    assert isinstance(s.model_response(audio(), now=5.2)[0], SendAudio)


def test_a_client_turn_ends_the_drop_early():
    s = core()
    s.model_response(LlmResponse(interrupted=True), now=0.0)
    s.client_text('{"type": "text", "text": "what about Rome?"}', now=0.1)
    assert isinstance(s.model_response(audio(), now=0.2)[0], SendAudio)


def test_server_tool_call_starts_a_task_and_its_result_goes_upstream_once():
    s = core()
    actions = s.model_response(call("get_weather", city="Paris"), now=0.0)
    [event] = events(actions)
    assert event == p.ToolCallEvent("c1", "get_weather", {"city": "Paris"}, "server")
    assert any(isinstance(a, RunTool) and a.call.id == "c1" for a in actions)
    done = s.tool_finished("c1", {"temp_c": 18}, now=1.0)
    [up] = [a for a in done if isinstance(a, ToUpstream)]
    fr = up.item.parts[0].function_response
    assert (fr.id, fr.name, fr.response) == ("c1", "get_weather", {"temp_c": 18})
    assert s.tool_finished("c1", {"temp_c": 19}, now=1.0) == []  # exactly one response per call


def test_unknown_tool_goes_to_the_client_with_a_deadline_and_expires_with_an_error():
    s = core(client_tool_timeout=5.0)
    actions = s.model_response(call("open_door", call_id="d1"), now=0.0)
    assert events(actions)[0].runs_on == "client"
    [wait] = [a for a in actions if isinstance(a, AwaitClientTool)]
    assert wait.timeout == 5.0
    expired = s.client_tool_expired("d1", now=5.0)
    [up] = [a for a in expired if isinstance(a, ToUpstream)]
    assert "did not return a result" in up.item.parts[0].function_response.response["error"]
    assert events(expired)[0].code == "tool_timeout"
    late = s.client_text('{"type":"tool.result","id":"d1","name":"open_door","response":{}}', now=9)
    assert events(late)[0].code == "tool_call_closed"


def test_client_tool_result_is_checked_then_forwarded_with_the_exact_id():
    s = core()
    s.model_response(call("open_door", call_id="fn_7f2"), now=0.0)
    wrong = s.client_text('{"type":"tool.result","id":"nope","name":"open_door","response":{}}', now=1)
    assert events(wrong)[0].code == "unknown_tool_call"
    ok = s.client_text('{"type":"tool.result","id":"fn_7f2","name":"open_door","response":{"ok":true}}', now=1)
    assert any(isinstance(a, CancelTool) and a.call_id == "fn_7f2" for a in ok)
    [up] = [a for a in ok if isinstance(a, ToUpstream)]
    assert up.item.parts[0].function_response.id == "fn_7f2"


def test_missing_call_id_gets_one_of_ours():
    s = core()
    actions = s.model_response(call("get_weather", call_id=None), now=0.0)
    assert events(actions)[0].id.startswith("live-")


def test_model_cancellation_cancels_pending_calls_only():
    s = core()
    s.model_response(call("get_weather", call_id="a"), now=0)
    s.model_response(call("get_weather", call_id="b"), now=0)
    s.tool_finished("b", {"ok": True}, now=0)
    actions = s.model_response(LlmResponse(cancelled_tool_call_ids=("a", "b")), now=1)
    assert [a.call_id for a in actions if isinstance(a, CancelTool)] == ["a"]
    assert events(actions) == [p.ToolCancelled(("a",))]
    assert s.tool_finished("a", {"ok": True}, now=1) == []


def test_resumption_handle_kept_only_when_resumable():
    s = core()
    s.model_response(
        LlmResponse(session_resumption_update=types.LiveServerSessionResumptionUpdate(new_handle="h1", resumable=True)),
        now=0,
    )
    s.model_response(
        LlmResponse(session_resumption_update=types.LiveServerSessionResumptionUpdate(new_handle="h2", resumable=False)),
        now=0,
    )
    assert s.resumption_handle == "h1"


def test_session_close_and_second_start():
    s = core()
    assert s.client_text('{"type": "session.close"}', now=0) == [CloseSession("client closed the session")]
    assert events(s.client_text('{"type": "session.start"}', now=0))[0].code == "already_started"


def test_a_cut_reply_ends_for_the_client_and_an_unanswered_turn_is_sent_again():
    s = core()
    [up] = s.client_text('{"type": "text", "text": "Hello?"}', now=0.0)
    s.content_sent(up.item)
    lost = s.connection_lost()
    assert lost == []  # no reply had begun
    assert s.connection_resumed(now=1.0) == [ToUpstream(up.item)]
    assert s.connection_resumed(now=2.0) == []  # once


def test_a_handle_before_the_model_acted_on_a_turn_may_predate_it_so_the_turn_stays_owed():
    """The service takes a handle's state when it issues it: one that crossed the
    turn on the wire (a resumed connection's handle right after setup) does not
    hold it. Only once a reply or a call began is the turn known to be in it."""
    s = core()
    [up] = s.client_text('{"type": "text", "text": "Hi"}', now=0.0)
    s.content_sent(up.item)
    s.model_response(LlmResponse(session_resumption_update=types.LiveServerSessionResumptionUpdate(new_handle="h", resumable=True)), now=0.1)
    assert s.resumption_handle == "h"  # still the newest state to resume from
    s.connection_lost()
    assert s.connection_resumed(now=1.0) == [ToUpstream(up.item)]


def test_a_turn_already_answered_is_not_sent_again():
    s = core()
    [up] = s.client_text('{"type": "text", "text": "Again"}', now=2.0)
    s.content_sent(up.item)
    s.model_response(audio(), now=2.1)
    s.model_response(LlmResponse(turn_complete=True), now=2.2)  # answered in full
    s.connection_lost()
    assert s.connection_resumed(now=3.0) == []


def test_a_question_whose_reply_was_cut_by_a_drop_is_asked_again():
    s = core()
    [up] = s.client_text('{"type": "text", "text": "Again"}', now=2.0)
    s.content_sent(up.item)
    s.model_response(audio(), now=2.1)  # the reply began, then the connection dropped
    assert s.connection_lost() == [SendEvent(p.TurnComplete("connection_lost"))]
    # The resumed handle predates the question: without it the model never answers.
    assert s.connection_resumed(now=3.0) == [ToUpstream(up.item)]
    assert s.awaiting_reply_since == 3.0


def test_safe_point_waits_for_owed_replies_running_tools_and_replies_in_progress():
    s = core()
    assert s.at_safe_point
    s.client_text('{"type": "text", "text": "Weather?"}', now=0.0)
    assert not s.at_safe_point  # a reply is owed
    s.model_response(call("get_weather", city="Oslo"), now=0.1)
    assert not s.at_safe_point  # a call is pending
    s.tool_finished("c1", {"sky": "snow"}, now=0.2)
    assert not s.at_safe_point  # the model owes a reply to the result
    s.model_response(LlmResponse(output_transcription=types.Transcription(text="Snow")), now=0.3)
    assert not s.at_safe_point  # replying
    s.model_response(LlmResponse(turn_complete=True), now=0.4)
    assert s.at_safe_point
    assert not s.stalled(now=100.0, timeout=5.0)
    s.client_text('{"type": "text", "text": "And tomorrow?"}', now=100.0)
    assert s.stalled(now=106.0, timeout=5.0)


def test_reconnect_policy_backs_off_gives_up_and_forgives_after_a_stable_period():
    from live.engine.supervisor import ReconnectPolicy

    policy = ReconnectPolicy(max_failures=3, base_delay=0.5, max_delay=1.5, stable_after=60)
    assert [policy.failed(0), policy.failed(1), policy.failed(2)] == [0.5, 1.0, 1.5]
    assert policy.failed(3) is None
    policy = ReconnectPolicy(max_failures=2)
    policy.failed(0)
    policy.connected(1)
    policy.failed(100)  # the connection had stayed up 99 s: the count starts again
    assert policy.failures == 1


def handle(h: str) -> LlmResponse:
    return LlmResponse(
        session_resumption_update=types.LiveServerSessionResumptionUpdate(new_handle=h, resumable=True)
    )


def test_a_result_for_a_call_of_an_earlier_connection_goes_as_context_never_as_a_response():
    s = core()
    s.model_response(call("get_weather", call_id="w1", city="Paris"), now=0.0)
    s.connection_lost()  # the call was pending: the resumed handle predates it
    s.connection_resumed(now=1.0)
    [up, _] = s.tool_finished("w1", {"temp_c": 21}, now=2.0)
    sent = s.for_connection(up.item)
    assert all(part.function_response is None for part in sent.parts)
    note = sent.parts[0].text
    assert "get_weather" in note and '"Paris"' in note and '"temp_c": 21' in note
    s.content_sent(sent)
    assert not s.at_safe_point  # the model owes a reply to the note


def test_a_result_of_the_current_connection_goes_as_a_function_response():
    s = core()
    s.model_response(call("get_weather", call_id="w1", city="Paris"), now=0.0)
    [up, _] = s.tool_finished("w1", {"temp_c": 21}, now=1.0)
    assert s.for_connection(up.item) is up.item


def test_a_result_the_old_connection_took_but_no_handle_holds_is_told_again():
    s = core()
    s.model_response(call("get_weather", call_id="w1", city="Oslo"), now=0.0)
    [up, _] = s.tool_finished("w1", {"sky": "snow"}, now=1.0)
    s.content_sent(s.for_connection(up.item))
    s.connection_lost()  # before any handle after the response
    [resend] = s.connection_resumed(now=2.0)
    assert '"sky": "snow"' in resend.item.parts[0].text


def test_a_result_a_handle_holds_is_not_told_again():
    s = core()
    s.model_response(call("get_weather", call_id="w1", city="Oslo"), now=0.0)
    [up, _] = s.tool_finished("w1", {"sky": "snow"}, now=1.0)
    s.content_sent(up.item)
    s.model_response(audio(), now=1.2)  # the model answers from the result ...
    s.model_response(LlmResponse(turn_complete=True), now=1.4)
    s.model_response(handle("h9"), now=1.5)  # ... so this handle holds it
    s.connection_lost()
    assert s.connection_resumed(now=2.0) == []


def test_activity_signals_need_manual_turn_taking():
    s = core()
    [event] = events(s.client_text('{"type": "activity.start"}', now=0.0))
    assert event.code == "activity_not_enabled" and not event.fatal
    manual = core(manual_activity=True)
    [up] = manual.client_text('{"type": "activity.start"}', now=0.0)
    assert isinstance(up.item, types.ActivityStart)
    assert not manual.at_safe_point  # the user is speaking


def test_no_handover_point_while_the_user_is_speaking():
    s = core()
    s.model_response(LlmResponse(input_transcription=types.Transcription(text="I would like")), now=0.0)
    assert not s.at_safe_point
    s.model_response(LlmResponse(input_transcription=types.Transcription(text="I would like tea", finished=True)), now=1.0)
    assert s.at_safe_point
    s.model_response(LlmResponse(voice_activity=types.VoiceActivity(
        voice_activity_type=types.VoiceActivityType.ACTIVITY_START)), now=2.0)
    assert not s.at_safe_point


def test_usage_keeps_tokens_per_modality():
    s = core()
    usage = types.UsageMetadata(
        prompt_token_count=30,
        prompt_tokens_details=[
            types.ModalityTokenCount(modality=types.MediaModality.AUDIO, token_count=25),
            types.ModalityTokenCount(modality=types.MediaModality.TEXT, token_count=5),
        ],
        response_tokens_details=[types.ModalityTokenCount(modality=types.MediaModality.AUDIO, token_count=9)],
    )
    [event] = events(s.model_response(LlmResponse(usage_metadata=usage), now=0.0))
    assert event.by_modality == {"prompt": {"AUDIO": 25, "TEXT": 5}, "response": {"AUDIO": 9}}


def test_grounding_code_and_images_reach_the_client():
    s = core()
    content = types.Content(role="model", parts=[
        types.Part(executable_code=types.ExecutableCode(code="print(2+2)", language=types.Language.PYTHON)),
        types.Part(code_execution_result=types.CodeExecutionResult(outcome=types.Outcome.OUTCOME_OK, output="4")),
        types.Part(inline_data=types.Blob(data=b"\x89PNG", mime_type="image/png")),
    ])
    grounding = types.GroundingMetadata(web_search_queries=["weather paris"])
    got = events(s.model_response(LlmResponse(content=content, grounding_metadata=grounding), now=0.0))
    assert got == [
        p.CodeEvent("print(2+2)", "PYTHON"),
        p.CodeResultEvent("4", "OUTCOME_OK"),
        p.DataEvent("image/png", "iVBORw=="),
        p.Grounding({"web_search_queries": ["weather paris"]}),
    ]


def test_deeply_nested_json_is_an_error_not_a_crash():
    [event] = events(core().client_text("[" * 100_000, now=0.0))
    assert event.code == "invalid_json" and not event.fatal


def test_a_snapshot_carries_the_conversation_to_another_server():
    s = core()
    s.model_response(handle("h7"), now=0.0)
    s.model_response(call("get_weather", call_id="w1", city="Rome"), now=0.1)  # still running
    [up] = s.client_text('{"type": "text", "text": "And Oslo?"}', now=0.2)
    s.content_sent(up.item)
    snap = json.loads(json.dumps(s.snapshot()))  # it goes through a store as JSON
    other = core()
    other.restore(snap)
    other.connection_lost()
    assert other.resumption_handle == "h7"
    [note] = other.connection_resumed(now=1.0)
    text = "\n".join(part.text for part in note.item.parts)
    assert "get_weather" in text and "outcome is unknown" in text  # the run died with its server
    assert "And Oslo?" in text  # the question it owed is asked again


def test_a_note_that_was_never_sent_cannot_be_mistaken_for_a_later_turn(monkeypatch):
    """A context note whose send failed is garbage, and CPython gives its address to
    later objects: a typed turn there must still be owed a reply and asked again
    after a drop, not taken for the note. (Address reuse is made certain here by an
    `id()` that gives every object the same number.)"""
    import gc

    import live.engine.session

    s = core()
    s.model_response(call("get_weather", call_id="w1", city="Paris"), now=0.0)
    s.connection_lost()
    s.connection_resumed(now=1.0)
    monkeypatch.setattr(live.engine.session, "id", lambda obj: 4096, raising=False)
    [up, _] = s.tool_finished("w1", {"temp_c": 21}, now=2.0)
    note = s.for_connection(up.item)  # a note for the new connection ...
    assert note is not up.item
    del note  # ... whose send failed: nobody holds it any more
    gc.collect()
    [turn] = s.client_text(json.dumps({"type": "text", "text": "question"}), now=3.0)
    s.content_sent(turn.item)  # a typed question goes to the model
    assert not s.at_safe_point  # it is owed a reply
    s.connection_lost()
    assert ToUpstream(turn.item) in s.connection_resumed(now=4.0)  # and asked again after a drop
