"""local/voice's word matching: which tool a sentence names, its arguments, the reply."""

from __future__ import annotations

import pytest

from connections.local_voice import matching
from connections.local_voice.model import word_error_rate
from live.agent import Agent
from samples import orders, weather


def declarations(agent: Agent):
    return agent.declarations()


WEATHER = declarations(weather.agent)
CITIES = matching.known_values(WEATHER, weather.agent.instruction or "")


def test_tool_keywords_drop_generic_verbs():
    assert matching.keywords("get_weather") == ["weather"]
    assert matching.keywords("cancel_order") == ["cancel", "order"]
    assert matching.keywords("showOrderCard") == ["order", "card"]
    assert matching.keywords("get") == ["get"]  # nothing left: keep the name


def test_the_cities_the_weather_agent_names_are_known_values():
    assert {"Lisbon", "Paris", "Tokyo", "Sao Paulo", "Reykjavik", "Nairobi"} <= set(CITIES)


@pytest.mark.parametrize(
    ("said", "name", "args"),
    [
        ("what is the weather in paris", "get_weather", {"city": "Paris"}),
        ("what is the weather the paris", "get_weather", {"city": "Paris"}),  # a misheard "in"
        ("how is the weather in sao paulo today", "get_weather", {"city": "Sao Paulo"}),
        ("weather in berlin please", "get_weather", {"city": "Berlin"}),  # unknown, still asked
        ("tell me the forecast for tokyo for the next two days", "get_forecast", {"city": "Tokyo", "days": 2}),
        ("forecast for lisbon", "get_forecast", {"city": "Lisbon"}),
    ],
)
def test_a_sentence_naming_a_tool_becomes_a_call_with_its_arguments(said, name, args):
    match = matching.match_tool(said, WEATHER, CITIES)
    assert match is not None
    assert (match.name, match.args, match.missing) == (name, args, ())


def test_no_tool_named_means_no_call_and_a_missing_argument_is_reported():
    assert matching.match_tool("hello there how are you", WEATHER, CITIES) is None
    match = matching.match_tool("what is the weather", WEATHER, CITIES)
    assert match is not None and match.name == "get_weather" and match.missing == ("city",)


def test_more_keywords_win_when_several_tools_are_named():
    decls = declarations(orders.agent)
    names = [d.name for d in decls]
    said = "please cancel order one two three"
    match = matching.match_tool(said, decls)
    assert "cancel_order" in names and match is not None and match.name == "cancel_order"


def test_numbers_are_read_from_words_and_digits():
    decl = [d for d in WEATHER if d.name == "get_forecast"]
    assert matching.match_tool("forecast for paris for 3 days", decl, CITIES).args["days"] == 3
    assert matching.match_tool("forecast in paris twenty one", decl, CITIES).args["days"] == 21


def test_results_are_read_back_with_units_and_errors_said_as_errors():
    said = matching.describe_result("get_weather", weather.get_weather("Paris"))
    assert said == (
        "get weather: city Paris, sky overcast, temperature 12 degrees, humidity 78 percent, "
        "wind 9 kilometres per hour."
    )
    assert matching.describe_result("get_weather", {"error": "no data"}) == "get weather failed: no data."
    assert matching.describe_result("add", {"result": 3}) == "add: 3."
    assert matching.reply_to("hello there") == "You said: hello there."
    assert matching.reply_to("  ") == "Sorry, I did not catch that."


def test_the_corpus_holds_tool_phrases_with_the_known_values():
    corpus = matching.corpus_for(WEATHER, CITIES)
    assert "what is the weather in paris" in corpus
    assert "tell me the forecast for sao paulo" in corpus


def test_word_error_rate():
    assert word_error_rate("What is the weather in Paris?", "what is the weather in paris") == 0
    assert word_error_rate("one two three four", "one too three") == 0.5
