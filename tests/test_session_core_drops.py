"""What a session owes the model across a drop, decided without sockets.

A connection can go at any message of a turn; these pin down the edges where
the user's words (typed or spoken) or a tool's result could be lost, or an
answer given twice.
"""

from __future__ import annotations

import json

from google.genai import types

from live import LlmResponse
from live import protocol as p
from live.engine.session import SendEvent, SessionCore, ToUpstream
from live.llm import ClientTurns


def core() -> SessionCore:
    return SessionCore(input_rate=16_000, server_tools=frozenset({"get_weather"}))


def said(text: str, *, finished: bool = False) -> LlmResponse:
    return LlmResponse(output_transcription=types.Transcription(text=text, finished=finished))


def heard(text: str, *, finished: bool = False) -> LlmResponse:
    return LlmResponse(input_transcription=types.Transcription(text=text, finished=finished), partial=not finished)


def handle(h: str) -> LlmResponse:
    return LlmResponse(session_resumption_update=types.LiveServerSessionResumptionUpdate(new_handle=h, resumable=True))


def ask(s: SessionCore, text: str, now: float = 0.0) -> types.Content:
    [up] = s.client_text(json.dumps({"type": "text", "text": text}), now=now)
    s.content_sent(up.item)
    return up.item


def texts(actions) -> str:
    return "\n".join(part.text or "" for a in actions if isinstance(a, ToUpstream) for part in a.item.parts)


def test_a_late_tail_that_comes_with_the_turns_end_still_ends_the_turn():
    """3.x bundles a turn's last transcript words with turnComplete; the tail is
    the old reply's, and the turn's end, usage and handle are still read."""
    s = core()
    ask(s, "Weather?")
    s.model_response(said("It is sunny"), now=0.1)
    s.model_response(LlmResponse(generation_complete=True), now=0.2)
    tail = said(" in Paris.")
    tail.late_transcription = True
    tail.turn_complete = True
    tail.usage_metadata = types.UsageMetadata(total_token_count=9)
    tail.session_resumption_update = types.LiveServerSessionResumptionUpdate(new_handle="h2", resumable=True)
    kinds = [type(a.event) for a in s.model_response(tail, now=0.3) if isinstance(a, SendEvent)]
    assert kinds == [p.TurnComplete, p.Usage, p.TranscriptOutput]  # the tail told after its turn's end
    assert s.resumption_handle == "h2" and s.at_safe_point


def test_words_the_user_spoke_before_a_drop_are_owed_an_answer():
    """A 1011 while the user's question is still being transcribed: the model
    never answered it and a new connection never heard it."""
    s = core()
    s.model_response(handle("h1"), now=0.0)
    s.model_response(heard("What is the"), now=0.1)
    s.model_response(heard(" weather in Oslo?"), now=0.2)
    s.connection_lost()
    resumed = s.connection_resumed(now=1.0)
    assert "What is the weather in Oslo?" in texts(resumed)
    assert s.awaiting_reply_since == 1.0
    # A fresh connection is seeded with the words, last, so it answers them.
    s.connection_lost()
    seed = s.fresh_start(now=2.0)
    assert seed[-1].role == "user" and "weather in Oslo" in seed[-1].parts[0].text


def test_words_a_finished_turn_transcribed_are_not_asked_again():
    s = core()
    s.model_response(heard("Hello"), now=0.1)
    s.model_response(heard("Hello", finished=True), now=0.2)
    s.model_response(said("Hi!", finished=True), now=0.3)
    s.model_response(LlmResponse(turn_complete=True), now=0.4)
    s.connection_lost()
    assert s.connection_resumed(now=1.0) == []


def test_a_reply_generated_in_full_is_not_asked_for_again_when_the_drop_comes_before_its_turn_ends():
    """generationComplete, then the drop before turnComplete: the user heard the
    whole answer; asking again would have it said twice."""
    s = core()
    s.model_response(handle("h1"), now=0.0)
    ask(s, "Weather?", now=0.1)
    s.model_response(said("Sunny."), now=0.2)
    s.model_response(LlmResponse(generation_complete=True), now=0.3)
    s.connection_lost()
    assert "Weather?" not in texts(s.connection_resumed(now=1.0))


def test_a_filler_turn_on_extended_thinking_does_not_answer_the_question():
    """3.8 extended thinking completes a filler turn with interactionStatus
    IN_PROGRESS; the answer is still to come. A drop meanwhile asks again, and
    the new connection starts with no interaction going on."""
    s = core()
    s.model_response(handle("h1"), now=0.0)
    ask(s, "What is 17 times 23?", now=0.1)
    s.model_response(said("Let me think."), now=0.2)
    s.model_response(LlmResponse(generation_complete=True), now=0.3)
    s.model_response(
        LlmResponse(turn_complete=True, interaction_status=types.InteractionStatus.IN_PROGRESS), now=0.4
    )
    assert s.interaction_busy
    s.connection_lost()
    assert not s.interaction_busy
    assert "17 times 23" in texts(s.connection_resumed(now=1.0))


def test_a_filler_then_its_answer_leaves_nothing_owed():
    s = core()
    ask(s, "What is 17 times 23?", now=0.1)
    s.model_response(said("Let me think."), now=0.2)
    s.model_response(LlmResponse(turn_complete=True, interaction_status=types.InteractionStatus.IN_PROGRESS), now=0.3)
    s.model_response(said("391."), now=2.0)
    s.model_response(LlmResponse(turn_complete=True, interaction_status=types.InteractionStatus.IDLE), now=2.1)
    s.connection_lost()
    assert s.connection_resumed(now=3.0) == []


def test_a_takeover_without_a_handle_keeps_the_results_and_the_question_of_the_server_that_died():
    """Another server carried the conversation and died before any handle: the
    fresh connection is seeded with the transcript, which must now hold what
    that server's tools returned, and end with what is owed an answer."""
    first = core()
    weather = types.FunctionCall(id="w1", name="get_weather", args={"city": "Rome"})
    first.model_response(LlmResponse(content=types.Content(role="model", parts=[types.Part(function_call=weather)])), now=0.0)
    first.tool_finished("w1", {"temp_c": 21}, now=0.5)  # its result never reached the model
    ask(first, "And Oslo?", now=0.6)
    snap = json.loads(json.dumps(first.snapshot()))
    other = core()
    other.restore(snap)
    other.connection_lost()
    seed = other.fresh_start(now=1.0)
    history = "\n".join(part.text or "" for content in seed for part in content.parts)
    assert "temp_c" in history and "And Oslo?" in history
    assert seed[-1].role == "user" and other.awaiting_reply_since == 1.0
    assert other.connection_resumed(now=1.1) == []  # seeded: nothing told twice


def test_a_result_whose_handle_crossed_it_on_the_wire_is_told_again():
    """A resumed connection's handle comes right after setup, while the context
    note about a call's result is on its way: that handle does not hold the
    result, so a drop then tells it again."""
    s = core()
    weather = types.FunctionCall(id="w1", name="get_weather", args={"city": "Oslo"})
    s.model_response(LlmResponse(content=types.Content(role="model", parts=[types.Part(function_call=weather)])), now=0.0)
    [up, _] = s.tool_finished("w1", {"sky": "snow"}, now=1.0)
    s.content_sent(up.item)
    s.model_response(handle("h9"), now=1.1)  # before the model acted on the result
    s.connection_lost()
    assert '"sky": "snow"' in texts(s.connection_resumed(now=2.0))


def sent_as(actions) -> list[tuple[str, bool]]:
    """What a new connection is told first: each item's text, and whether it asks for a reply."""
    told = []
    for action in actions:
        item = action.item
        if isinstance(item, ClientTurns):
            text = "\n".join(part.text or "" for turn in item.turns for part in turn.parts)
            told.append((text, item.turn_complete))
        else:
            told.append(("".join(part.text or "" for part in item.parts), True))
    return told


def test_a_question_the_model_called_a_tool_for_is_not_asked_again_after_a_drop():
    """The model called a tool for a typed question; the tool ran and its result
    reached the model; the connection went before the answer, with no handle
    since the question. The resumed connection is told the question as what
    was said, and asked for the answer only with the result: asked the
    question again, the model calls the tool again (a second run, a second
    side effect)."""
    s = core()
    ask(s, "What is the weather in Oslo?")
    weather = types.FunctionCall(id="w1", name="get_weather", args={"city": "Oslo"})
    s.model_response(LlmResponse(content=types.Content(role="model", parts=[types.Part(function_call=weather)])), now=0.5)
    [up, _] = s.tool_finished("w1", {"sky": "snow"}, now=1.0)
    s.content_sent(up.item)
    s.connection_lost()  # e.g. 1008 right after the tool response (forum #109319)
    told = sent_as(s.connection_resumed(now=2.0))
    asked = [text for text, reply in told if reply]
    assert ("What is the weather in Oslo?", False) in told  # known to the model, not asked
    assert len(asked) == 1 and '"sky": "snow"' in asked[0] and "Oslo?" not in asked[0]


def answer(s: SessionCore, text: str, now: float) -> None:
    """The model's whole reply: its words, generation and turn complete (no handle)."""
    s.model_response(said(text), now=now)
    s.model_response(said(text, finished=True), now=now)
    s.model_response(LlmResponse(generation_complete=True), now=now)
    s.model_response(LlmResponse(turn_complete=True), now=now)


def test_a_tool_result_already_answered_is_not_asked_about_again_after_a_drop():
    """The model answered from a tool's result, and the connection went before a
    handle held that result: the next connection is told the result as context,
    and asked nothing (asked, it answers again: the user hears it twice)."""
    s = core()
    ask(s, "What is the weather in Oslo?")
    weather = types.FunctionCall(id="w1", name="get_weather", args={"city": "Oslo"})
    s.model_response(LlmResponse(content=types.Content(role="model", parts=[types.Part(function_call=weather)])), now=0.5)
    [up, _] = s.tool_finished("w1", {"sky": "snow"}, now=1.0)
    s.content_sent(up.item)
    answer(s, "It snows in Oslo.", now=1.5)
    s.connection_lost()  # e.g. a connection dropped at its first handle
    told = sent_as(s.connection_resumed(now=2.0))
    assert [reply for _, reply in told] == [False]  # nothing asks for a reply
    assert s.awaiting_reply_since is None  # and none is waited for (no stall reported)
    assert '"sky": "snow"' in told[0][0]  # the result is known to the model


def test_a_result_answered_on_the_connection_it_was_told_to_is_not_asked_about_a_third_time():
    """The result of a call made before a drop was told to the next connection,
    which answered from it and dropped before its first handle: the one after
    asks for nothing."""
    s = told_the_result_then_answered_and_dropped()
    told = sent_as(s.connection_resumed(now=3.0))
    assert [reply for _, reply in told] == [False]  # the question, then the result: not asked
    assert told[0][0].startswith("What is the weather in Oslo?\n") and '"sky": "snow"' in told[0][0]


def told_the_result_then_answered_and_dropped() -> SessionCore:
    """A typed question, a call for it whose result went to the model, a drop;
    the next connection is told the question and asked for the answer with the
    result, answers, and drops before any handle: the state of the third
    connection to come, which resumes from a handle older than all of it."""
    s = core()
    ask(s, "What is the weather in Oslo?")
    weather = types.FunctionCall(id="w1", name="get_weather", args={"city": "Oslo"})
    s.model_response(LlmResponse(content=types.Content(role="model", parts=[types.Part(function_call=weather)])), now=0.5)
    [up, _] = s.tool_finished("w1", {"sky": "snow"}, now=1.0)
    s.content_sent(up.item)
    s.connection_lost()
    for action in s.connection_resumed(now=2.0):
        s.content_sent(action.item)
    answer(s, "It snows in Oslo.", now=2.5)
    assert s.awaiting_reply_since is None  # answered: nothing owed
    s.connection_lost()  # e.g. 1008 on a working connection: no handle since the first
    return s


def test_context_a_handle_holds_is_not_told_again_on_the_connection_resumed_from_it():
    """The third connection is told the question and the result as context (it
    asks nothing, so the model never acts on it), and sends a resumable handle
    while it has nothing else going: taken after the context went, that handle
    holds it. A go-away then: the fourth connection, resumed from that handle,
    is told nothing again (told again, the question and the result would be
    twice in the model's context)."""
    s = told_the_result_then_answered_and_dropped()
    told = s.connection_resumed(now=3.0)
    assert [reply for _, reply in sent_as(told)] == [False]
    for action in told:
        s.content_sent(action.item)
    s.model_response(handle("h3"), now=3.3)
    assert s.resumption_handle == "h3"
    s.connection_lost()  # the go-away's hand-over, resumed from h3
    assert s.connection_resumed(now=4.0) == []


def test_a_fresh_start_after_such_context_has_the_question_and_the_result_once():
    """The same, but the resume from that handle is refused (or the session
    moves to another backend): the fresh connection is seeded with the
    conversation, where the question and the result are once each."""
    s = told_the_result_then_answered_and_dropped()
    for action in s.connection_resumed(now=3.0):
        s.content_sent(action.item)
    s.model_response(handle("h3"), now=3.3)
    s.connection_lost()
    seed = "\n".join(part.text or "" for content in s.fresh_start(now=4.0) for part in content.parts)
    assert seed.count("What is the weather in Oslo?") == 1 and seed.count('"sky":"snow"') == 1
    assert s.connection_resumed(now=4.1) == []  # seeded: nothing told on top


def test_context_sent_as_a_turn_ends_is_told_again_when_the_handle_may_have_crossed_it():
    """The service sends a turn's resumable handle as the turn ends. Context
    (client content that completes no turn) sent after the server read the
    turn's end but before that handle came may have crossed the handle on the
    wire, and the model acts on nothing it asks: that handle is not taken to
    hold it, and a drop tells it again."""
    s = core()
    ask(s, "Hello?")
    answer(s, "Hi.", now=0.5)  # its turn ends; the handle comes after
    note = ClientTurns((types.Content(role="user", parts=[types.Part(text="The user opened the map.")]),), False)
    s.content_sent(note)
    s.model_response(handle("h1"), now=0.6)  # issued at the turn's end, before the note arrived
    s.connection_lost()
    assert "The user opened the map." in "\n".join(text for text, _ in sent_as(s.connection_resumed(now=1.0)))
