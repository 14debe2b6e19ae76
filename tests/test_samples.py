"""The sample agents: their tools, their declarations, and a conversation through the server."""

from __future__ import annotations

import argparse

import pytest

from clients.client import LiveClient
from connections import double
from connections.gemini import Gemini
from live import protocol as p
from live.registry import LlmRegistry
from live.cli.serve import UsageError, build_parser, load_agent, resolve
from samples import orders, weather
from serving import collect, running


def test_weather_tools_answer_from_the_table_and_explain_unknown_cities():
    assert weather.get_weather("  lisbon ")["temperature_c"] == 21
    assert weather.get_weather("São Paulo")["sky"] == "humid"
    unknown = weather.get_weather("Atlantis")
    assert "no weather data" in unknown["error"] and "Lisbon" in unknown["known_cities"]
    assert [d["day"] for d in weather.get_forecast("Tokyo", 2)["days"]] == [1, 2]
    assert "1 to 3" in weather.get_forecast("Tokyo", 9)["error"]


def test_orders_can_be_looked_up_and_only_unshipped_ones_cancelled():
    book = orders.OrderBook([orders.Order("B1", "lamp", "processing"), orders.Order("B2", "boots", "shipped")])
    original = orders.BOOK
    orders.BOOK = book
    try:
        assert orders.lookup_order("b1")["status"] == "processing"
        assert orders.cancel_order("B2") == {"cancelled": False, "reason": "order B2 is already shipped"}
        assert orders.cancel_order("B1")["cancelled"] is True
        assert orders.lookup_order("B1")["status"] == "cancelled"
        assert "no order" in orders.lookup_order("Z9")["error"]
    finally:
        orders.BOOK = original


def test_sample_agents_declare_every_tool_with_its_parameters():
    config = weather.agent.live_connect_config()
    declared = {d.name: d for d in config.tools[0].function_declarations}
    assert set(declared) == {"get_weather", "get_forecast"}
    assert declared["get_forecast"].parameters.required == ["city"]
    assert "Celsius" in declared["get_weather"].description
    assert [d.name for d in orders.agent.declarations()] == ["lookup_order", "cancel_order", "show_order_card"]
    assert config.input_audio_transcription is not None


def args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_live_serve_loads_agents_and_reports_bad_specs_in_one_line():
    assert load_agent("samples.weather:agent") is weather.agent
    for spec, words in [
        ("samples.weather", "MODULE:ATTR"),
        ("samples.nope:agent", "cannot import"),
        ("samples.weather:nothing", "has no 'nothing'"),
        ("samples.weather:MODEL", "not a live.Agent"),
    ]:
        with pytest.raises(UsageError, match=words):
            load_agent(spec)


def test_live_serve_fails_at_boot_on_an_unknown_model_or_a_missing_key(monkeypatch):
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    from live.registry import default_registry

    with pytest.raises(UsageError, match="no model registered for 'gpt-live'.*gemini-"):
        resolve(args("--model", "gpt-live"), default_registry())
    with pytest.raises(UsageError, match="GOOGLE_API_KEY"):
        resolve(args("--agent", "samples.weather:agent"), default_registry())
    server = resolve(args("--agent", "samples.weather:agent", "--model", "local/echo"), default_registry())
    assert server.agent.name == "weather" and server.agent.model == "local/echo"


@pytest.mark.anyio
async def test_the_order_desk_answers_with_a_server_tool_and_shows_a_card_on_the_client():
    session = double.ScriptedSession()
    # Gemini 3 models take mid-session text as realtime text, not client content.
    session.on_text(double.tool_call("lookup_order", {"order_id": "A1001"}, id="t1"))
    session.on_tool_response(double.tool_call("show_order_card", {"order_id": "A1001", "status": "shipped"}, id="t2"))
    session.on_tool_response(double.output_transcript("It ships Thursday."), double.turn_complete())
    registry = LlmRegistry()
    registry.register(r"gemini-.*", lambda name: Gemini(name, transport=double.DoubleTransport(session)))
    server = resolve(args("--agent", "samples.orders:agent"), registry)
    async with running(server.agent, server.llm) as (_, url), LiveClient.connect(url) as client:
        await client.send_text("Where is order A1001?")
        events = await collect(client, lambda e: isinstance(e, p.ToolCallEvent) and e.runs_on == "client")
        result = next(e for e in events if isinstance(e, p.ToolResultEvent))
        assert result.response["carrier"] == "DHL" and result.response["status"] == "shipped"
        await client.send_tool_result("t2", "show_order_card", {"shown": True})
        events = await collect(client, lambda e: isinstance(e, p.TurnComplete))
    first, second = session.tool_responses
    assert first.function_responses[0].response["eta"] == "Thursday"
    assert second.function_responses[0].response == {"shown": True}


@pytest.mark.anyio
async def test_an_async_callable_object_runs_as_async():
    import anyio

    from live.agent import run_tool

    class Lookup:
        """A tool as an object with an async __call__ (a common way to carry a client)."""

        async def __call__(self, key: str) -> dict:
            await anyio.sleep(0)
            return {"key": key, "found": True}

    assert await run_tool(Lookup(), {"key": "a"}, timeout=1.0) == {"key": "a", "found": True}
