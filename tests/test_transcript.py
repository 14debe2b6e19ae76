"""The session's own transcript: what a fresh connection is seeded with."""

from __future__ import annotations

from google.genai import types

from live.engine.transcript import Transcript


def _roles_and_texts(transcript: Transcript) -> list[tuple[str, str]]:
    return [(c.role, c.parts[0].text) for c in transcript.contents()]


def test_turns_alternate_and_a_turn_owed_an_answer_is_last():
    t = Transcript()
    t.seed([types.Content(role="user", parts=[types.Part(text="I am Ann.")]),
            types.Content(role="model", parts=[types.Part(text="Hello Ann.")])])
    t.user("Weather in Paris?")
    t.call("get_weather", {"city": "Paris"})
    t.result("get_weather", {"city": "Paris"}, {"sky": "sunny"})
    t.model("Sunny in Paris.")
    t.user("And tomorrow?")
    t.user("In Lyon too?")
    assert _roles_and_texts(t) == [
        ("user", "I am Ann."),
        ("model", "Hello Ann."),
        ("user", "Weather in Paris?"),
        ("model", '[called get_weather({"city":"Paris"})]'),
        ("user", '[get_weather({"city":"Paris"}) returned {"sky":"sunny"}]'),
        ("model", "Sunny in Paris."),
        ("user", "And tomorrow?\nIn Lyon too?"),
    ]
    assert t.last_role == "user"


def test_it_is_bounded_and_loses_its_beginning_never_its_end():
    t = Transcript(max_chars=100)
    for n in range(50):
        t.user(f"question {n}")
        t.model(f"answer {n}")
    text = "\n".join(part.text for c in t.contents() for part in c.parts)
    assert "answer 49" in text and "question 0" not in text
    assert len(text) <= 100 + len(t.contents())  # the joins add a newline each


def test_a_snapshot_restores_the_same_conversation():
    t = Transcript()
    t.user("hi")
    t.model("hello")
    copy = Transcript()
    copy.restore(t.snapshot())
    assert copy.contents() == t.contents()
