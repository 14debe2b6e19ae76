"""The client protocol as data: what parses, what is refused, and with which message."""

from __future__ import annotations

import json

import pytest
from google.genai import types

from live import protocol as p


def test_session_start_with_history_and_rate_round_trips():
    start = p.SessionStart(
        token="t0k",
        history=(
            types.Content(role="user", parts=[types.Part(text="Hi")]),
            types.Content(role="model", parts=[types.Part(text="Hello!")]),
        ),
        input_rate=48_000,
    )
    parsed = p.parse_client_message(p.encode(start))
    assert parsed == start


def test_defaults_apply_when_session_start_is_bare():
    parsed = p.parse_client_message('{"type": "session.start"}')
    assert parsed == p.SessionStart(token=None, history=(), input_rate=16_000)


@pytest.mark.parametrize(
    ("frame", "code", "words"),
    [
        ("{not json", "invalid_json", "not JSON"),
        ("[1, 2]", "invalid_json", "JSON objects"),
        ('{"text": "hi"}', "missing_field", "'type'"),
        ('{"type": "dance"}', "unknown_type", "known types: session.start"),
        ('{"type": "text"}', "missing_field", "'text'"),
        ('{"type": "text", "text": 5}', "invalid_field", "must be a string"),
        ('{"type": "tool.result", "id": "a", "name": "f"}', "missing_field", "'response'"),
        ('{"type": "tool.result", "id": "a", "name": "f", "response": [1]}', "invalid_field", "JSON object"),
        ('{"type": "session.start", "input_audio": {"rate": 4}}', "invalid_field", "between 8000"),
        ('{"type": "session.start", "history": [{"role": "robot", "parts": []}]}', "invalid_field", "role"),
        ('{"type": "session.start", "history": [{"parts": 3}]}', "invalid_field", "history[0]"),
        ('{"type": "session.start", "token": 7}', "invalid_field", "token"),
        ('{"type": "session.start", "token": "\\ud800"}', "invalid_field", "'token' is not valid text"),
        ('{"type": "session.resume", "session_id": "\\uDC00", "resume_token": "t"}', "invalid_field", "session_id"),
        ('{"type": "text", "text": "a \\udbff b"}', "invalid_json", "lone surrogate"),
        ('{"type": "tool.result", "id": "a", "name": "f", "response": {"\\ud800": 1}}', "invalid_json", "lone surrogate"),
    ],
)
def test_bad_frames_are_refused_with_a_code_and_a_readable_message(frame, code, words):
    with pytest.raises(p.ProtocolError) as info:
        p.parse_client_message(frame)
    assert info.value.code == code
    assert words in info.value.message


def test_every_server_event_survives_encode_and_parse():
    events = [
        p.SessionStarted("abc", "local/echo", 16_000),
        p.TranscriptInput("hello", False),
        p.TranscriptOutput("hi there", True),
        p.TextEvent("typed reply"),
        p.ToolCallEvent("c1", "get_weather", {"city": "Paris"}, "server"),
        p.ToolResultEvent("c1", "get_weather", {"temp_c": 18}),
        p.ToolCancelled(("c1", "c2")),
        p.TurnInterrupted(),
        p.GenerationComplete(),
        p.TurnComplete(),
        p.Usage(prompt_tokens=10, response_tokens=5, total_tokens=15),
        p.SessionGoAway(9.5),
        p.ErrorEvent("invalid_json", "nope", False),
        p.SessionClosed("client closed the session"),
    ]
    for event in events:
        assert p.parse_server_event(p.encode(event)) == event


def test_session_started_says_both_audio_formats():
    frame = json.loads(p.encode(p.SessionStarted("abc", "m", 16_000)))
    assert frame["input_audio"] == {"rate": 16_000, "encoding": "pcm16le"}
    assert frame["output_audio"] == {"rate": 24_000, "encoding": "pcm16le"}


def test_an_event_type_this_client_does_not_know_is_kept_not_fatal():
    event = p.parse_server_event('{"type": "avatar.frame", "seq": 3}')
    assert isinstance(event, p.UnknownEvent)
    assert event.type == "avatar.frame" and event.data["seq"] == 3
    # A known type missing a field it needs is kept the same way.
    assert isinstance(p.parse_server_event('{"type": "turn.interrupted_by"}'), p.UnknownEvent)
    assert isinstance(p.parse_server_event('{"type": "tool.call", "id": "x"}'), p.UnknownEvent)
    # Extra fields a newer server adds to a known event are ignored.
    assert p.parse_server_event('{"type": "turn.complete", "seq": 9}') == p.TurnComplete()


def test_turn_taking_is_declared_at_session_start():
    start = p.parse_client_message('{"type": "session.start", "turn_taking": "manual"}')
    assert start.turn_taking == "manual"
    assert json.loads(p.encode(start))["turn_taking"] == "manual"
    with pytest.raises(p.ProtocolError) as info:
        p.parse_client_message('{"type": "session.start", "turn_taking": "sometimes"}')
    assert info.value.code == "invalid_field"


def test_the_server_may_take_the_turns_and_says_what_it_heard():
    start = p.parse_client_message('{"type": "session.start", "turn_taking": "server"}')
    assert start.turn_taking == "server"
    # Unsaid, the agent decides: nothing is written for it.
    unsaid = p.parse_client_message('{"type": "session.start"}')
    assert unsaid.turn_taking is None and "turn_taking" not in json.loads(p.encode(unsaid))
    for event, wire in (
        (p.UserSpeaking(over_reply=True), {"type": "user.speaking", "over_reply": True}),
        (p.UserStopped("backchannel"), {"type": "user.stopped", "reason": "backchannel"}),
    ):
        assert json.loads(p.encode(event)) == wire
        assert p.parse_server_event(p.encode(event)) == event
