"""The real service's bad days (docs/emulator.md, with their sources), survived by the server.

Each test puts the server in front of a model that misbehaves the way users of
the real Live API report it, through the transport double or the Live
emulator, and checks what the user would notice: the session goes on, nothing
said or returned by a tool is lost or answered twice.
"""

from __future__ import annotations

import anyio
import pytest
from google.genai import types

from clients.client import LiveClient
from connections import double
from connections.gemini import Gemini
from live import protocol as p
from live.agent import Agent
from serving import collect, running

pytestmark = pytest.mark.anyio

NATIVE_AUDIO = "gemini-2.5-flash-native-audio-preview-12-2025"
FRAME = b"\x10\x00" * 320  # 20 ms of 16 kHz PCM16


def _sent_kinds(session: double.ScriptedSession) -> list[str]:
    kinds = []
    for message in session.sent:
        if message.tool_response is not None:
            kinds.append("tool_response")
        elif message.client_content is not None:
            kinds.append("client_content")
        elif message.realtime_input is not None and message.realtime_input.audio is not None:
            kinds.append("audio")
        elif message.realtime_input is not None:
            kinds.append("realtime")
    return kinds


async def test_on_native_audio_what_the_user_says_while_a_tool_runs_waits_for_its_result():
    """2.5 native-audio models close with 1008 on any realtime input while a call
    is unanswered (forum #114644): the audio is held, then follows the result."""
    started = anyio.Event()

    async def lookup(city: str) -> dict:
        """Weather for a city."""
        started.set()
        await anyio.sleep(0.4)
        return {"city": city, "sky": "sunny"}

    agent = Agent(name="weather", model=NATIVE_AUDIO, tools=[lookup])
    session = double.ScriptedSession()
    session.on_client_content(double.tool_call("lookup", {"city": "Paris"}, id="c-1"))
    session.on_tool_response(double.output_transcript("Sunny in Paris."), double.turn_complete())
    llm = Gemini(NATIVE_AUDIO, transport=double.DoubleTransport(session))
    async with running(agent, llm) as (_, url), LiveClient.connect(url) as client:
        await client.send_text("Weather in Paris?")
        with anyio.fail_after(5):
            await started.wait()
        for _ in range(10):  # the user keeps talking while the tool runs
            await client.send_audio(FRAME)
            await anyio.sleep(0.02)
        events = await collect(client, lambda e: isinstance(e, p.TurnComplete))
        with anyio.fail_after(5):
            await session.wait_for(lambda m: session.audio_chunks >= 1 and session.audio_bytes >= 10 * len(FRAME))
    assert session.server_close is None  # no 1008: the connection lived
    assert not any(isinstance(e, p.SessionReconnecting) for e in events)
    kinds = _sent_kinds(session)
    assert kinds.index("tool_response") < kinds.index("audio")  # held audio follows the result
    assert session.audio_bytes == 10 * len(FRAME)  # and none of it was lost
    assert any(isinstance(e, p.TranscriptOutput) and "Sunny" in e.text for e in events)


async def test_a_hold_ends_with_the_connection_whose_call_it_waited_for():
    """A call of a connection that dropped is owed to no one: the user's words
    reach the new connection at once, not after the old call's tool is done."""
    done = anyio.Event()

    async def lookup(city: str) -> dict:
        """Weather for a city."""
        await done.wait()
        return {"city": city}

    agent = Agent(name="weather", model=NATIVE_AUDIO, tools=[lookup])
    first = double.ScriptedSession(double.resumption_update("h1"))
    first.after_audio_chunks(1, double.tool_call("lookup", {"city": "Oslo"}, id="c-1"))
    second = double.ScriptedSession()
    llm = Gemini(NATIVE_AUDIO, transport=double.DoubleTransport(first, second))
    async with running(agent, llm) as (_, url), LiveClient.connect(url) as client:
        for _ in range(2):  # the question, spoken: nothing typed is owed after the drop
            await client.send_audio(FRAME)
        await collect(client, lambda e: isinstance(e, p.ToolCallEvent))
        first.drop(1011, "Internal error")
        await collect(client, lambda e: isinstance(e, p.SessionResumed))
        for _ in range(3):
            await client.send_audio(FRAME)
        with anyio.fail_after(3):
            await second.wait_for(lambda m: second.audio_bytes >= 3 * len(FRAME))
        done.set()
    assert second.server_close is None


async def test_a_hold_longer_than_its_bound_drops_the_oldest_and_says_how_many():
    async def lookup(city: str) -> dict:
        """Weather for a city."""
        await anyio.sleep(1.0)
        return {"city": city}

    agent = Agent(name="weather", model=NATIVE_AUDIO, tools=[lookup])
    session = double.ScriptedSession()
    session.on_client_content(double.tool_call("lookup", {"city": "Oslo"}, id="c-1"))
    session.on_tool_response(double.turn_complete())
    llm = Gemini(NATIVE_AUDIO, transport=double.DoubleTransport(session))
    async with running(agent, llm, audio_queue_frames=10) as (_, url), LiveClient.connect(url) as client:
        await client.send_text("Weather in Oslo?")
        await collect(client, lambda e: isinstance(e, p.ToolCallEvent))
        for _ in range(25):
            await client.send_audio(FRAME)
        events = await collect(client, lambda e: isinstance(e, p.ErrorEvent) and e.code == "input_held")
        await collect(client, lambda e: isinstance(e, p.TurnComplete))
    held = [e for e in events if isinstance(e, p.ErrorEvent) and e.code == "input_held"]
    assert "15 frame(s)" in held[0].message and not held[0].fatal
    assert not any(isinstance(e, p.ErrorEvent) and e.code == "audio_overflow" for e in events)
    assert session.server_close is None
    assert session.audio_bytes == 10 * len(FRAME)  # the newest two seconds' worth, here ten frames


async def test_other_models_take_what_the_user_says_at_once_while_a_tool_runs():
    started = anyio.Event()
    finish = anyio.Event()

    async def lookup(city: str) -> dict:
        """Weather for a city."""
        started.set()
        await finish.wait()
        return {"city": city}

    agent = Agent(name="weather", model="gemini-3.1-flash-live-preview", tools=[lookup])
    session = double.ScriptedSession()
    session.on_text(double.tool_call("lookup", {"city": "Rome"}, id="c-1"))
    session.on_tool_response(double.turn_complete())
    llm = Gemini("gemini-3.1-flash-live-preview", transport=double.DoubleTransport(session))
    async with running(agent, llm) as (_, url), LiveClient.connect(url) as client:
        await client.send_text("Weather in Rome?")
        with anyio.fail_after(5):
            await started.wait()
        await client.send_audio(FRAME)
        with anyio.fail_after(5):
            await session.wait_for(lambda m: session.audio_chunks == 1)
        finish.set()
        await collect(client, lambda e: isinstance(e, p.TurnComplete))


async def test_a_transcript_tail_after_the_turn_stays_with_its_reply_and_its_question_is_not_lost():
    """Transcripts are not ordered with the model turn (livekit agents-js#2165,
    pipecat#1788). The tail belongs to the reply that ended: the client is
    told so, and the conversation a fresh connection is seeded with says it
    there, not in the answer to the next question."""
    first = double.ScriptedSession()
    first.on_client_content(
        double.audio(b"\0\1" * 960), double.output_transcript("It is sunny"), double.turn_complete(),
        double.output_transcript(" in Paris."),
    )
    second = double.ScriptedSession()
    second.on_client_content(double.output_transcript("Rain in Lyon."), double.turn_complete())
    llm = Gemini("gemini-2.5-flash", transport=double.DoubleTransport(first, second))
    # The events as the server sends them (the client would fold the tail in).
    async with running(Agent(name="a", model="gemini-2.5-flash"), llm) as (_, url), LiveClient.connect(url, late_tail_wait=None) as client:
        await client.send_text("Weather in Paris?")
        events = await collect(client, lambda e: isinstance(e, p.TranscriptOutput) and e.late)
        await client.send_text("And Lyon?")
        with anyio.fail_after(5):
            await first.wait_for(lambda m: len(first.client_contents) == 2)
        first.drop(1011, "Internal error")  # no handle was ever given: a fresh connection
        events += await collect(client, lambda e: isinstance(e, p.TurnComplete) and e.reason is None)
    outputs = [e for e in events if isinstance(e, p.TranscriptOutput)]
    finals = [e.text for e in outputs if e.final]
    assert finals[0] == "It is sunny" and [e.text for e in outputs if e.late] == [" in Paris."]
    complete = next(i for i, e in enumerate(events) if isinstance(e, p.TurnComplete))
    late = next(i for i, e in enumerate(events) if isinstance(e, p.TranscriptOutput) and e.late)
    assert complete < late  # told after its turn ended, marked as its tail
    [seed] = second.client_contents
    assert [(t.role, t.parts[0].text) for t in seed.turns] == [
        ("user", "Weather in Paris?"),
        ("model", "It is sunny in Paris."),
        ("user", "And Lyon?"),
    ]
    assert "Rain in Lyon." in finals


async def test_on_gemini_3_8_a_turn_that_completes_while_the_interaction_goes_on_is_no_safe_point():
    """3.8 extended thinking: a filler turn completes with interactionStatus
    IN_PROGRESS; the real answer follows. A go-away meanwhile waits for IDLE
    (deadline permitting) rather than cutting the interaction off."""
    model = "gemini-3.8-live-extended-thinking"
    first = double.ScriptedSession(double.resumption_update("h1"))
    filler = double.turn_complete()
    filler.server_content.interaction_status = types.InteractionStatus.IN_PROGRESS
    first.on_text(double.output_transcript("Let me think."), filler, double.go_away(30))
    llm = Gemini(model, transport=double.DoubleTransport(first, double.ScriptedSession()))
    async with running(Agent(name="a", model=model), llm) as (server, url), LiveClient.connect(url) as client:
        await client.send_text("What is 17 times 23?")
        await collect(client, lambda e: isinstance(e, p.SessionGoAway))
        await anyio.sleep(0.3)
        [session] = server.live_sessions.values()
        assert session.core.interaction_busy and not session.core.at_safe_point
        answer = double.turn_complete()
        answer.server_content.interaction_status = types.InteractionStatus.IDLE
        first.push(double.output_transcript("391."), answer, double.resumption_update("h2"))
        events = await collect(client, lambda e: isinstance(e, p.SessionResumed))
    reconnecting = next(i for i, e in enumerate(events) if isinstance(e, p.SessionReconnecting))
    said = [i for i, e in enumerate(events) if isinstance(e, p.TranscriptOutput) and "391" in e.text]
    assert said and said[0] < reconnecting  # the answer came first, then the hand-over


async def test_waiting_for_more_input_is_not_a_stall():
    """3.8: `waitingForInput` means the model waits for the rest of the user's
    words. Nothing is owed meanwhile: no stall, nothing sent again."""
    model = "gemini-3.8-live"
    session = double.ScriptedSession()
    session.on_text(types.LiveServerMessage(server_content=types.LiveServerContent(waiting_for_input=True)))
    llm = Gemini(model, transport=double.DoubleTransport(session))
    async with running(Agent(name="a", model=model), llm, stall_timeout=0.5) as (_, url), LiveClient.connect(url) as client:
        await client.send_text("I would like to book a table for")
        with anyio.move_on_after(1.2):
            events = await collect(client, lambda e: isinstance(e, p.ErrorEvent), timeout=2)
            pytest.fail(f"no event expected, got {events}")
    assert len(session.realtime_inputs) == 1  # the text went once


async def test_a_non_blocking_tool_is_declared_so_and_its_silent_result_is_owed_no_reply():
    """3.8 calls functions without blocking; a tool's result can say what the
    model does with it. A SILENT result is taken in without a word: the server
    must not take the silence for a stall."""
    from live.agent import tool

    @tool(non_blocking=True, scheduling="silent")
    async def note_preference(item: str) -> dict:
        """Remember what the user likes."""
        return {"noted": item}

    model = "gemini-3.8-live"
    session = double.ScriptedSession()
    session.on_text(double.tool_call("note_preference", {"item": "window seat"}, id="n-1"),
                    double.output_transcript("Noted."), double.turn_complete())
    llm = Gemini(model, transport=double.DoubleTransport(session))
    agent = Agent(name="a", model=model, tools=[note_preference])
    async with running(agent, llm, stall_timeout=0.5) as (_, url), LiveClient.connect(url) as client:
        await client.send_text("I like window seats.")
        events = await collect(client, lambda e: isinstance(e, p.ToolResultEvent))
        with anyio.move_on_after(1.2):
            late = await collect(client, lambda e: isinstance(e, p.ErrorEvent), timeout=2)
            pytest.fail(f"no error expected, got {late}")
    [declaration] = session.config.tools[0].function_declarations
    assert declaration.behavior == types.Behavior.NON_BLOCKING
    [response] = session.tool_responses[0].function_responses
    assert response.scheduling == types.FunctionResponseScheduling.SILENT
    assert any(isinstance(e, p.ToolCallEvent) for e in events)


async def test_a_connection_that_drops_as_its_history_is_sent_is_one_more_reconnect():
    """The service may drop a connection right after setup (forum #167186),
    before the seed of a fresh connection went out: a recoverable end like any
    other, never the end of the session."""
    first = double.ScriptedSession()
    first.on_client_content(double.output_transcript("Sunny."), double.turn_complete())
    dropping = double.ScriptedSession().drop(1011, "The service is currently unavailable.", seen_by="sender")
    third = double.ScriptedSession()
    third.on_client_content(double.output_transcript("Still here."), double.turn_complete())
    llm = Gemini("gemini-2.5-flash", transport=double.DoubleTransport(first, dropping, third))
    async with running(Agent(name="a", model="gemini-2.5-flash"), llm) as (_, url), LiveClient.connect(url) as client:
        await client.send_text("Weather?")
        await collect(client, lambda e: isinstance(e, p.TurnComplete))
        first.drop(1011, "Internal error")  # no handle: a fresh connection, seeded
        await collect(client, lambda e: isinstance(e, p.SessionResumed), timeout=10)
        await client.send_text("Are you there?")
        events = await collect(client, lambda e: isinstance(e, p.TurnComplete) and e.reason is None, timeout=10)
    assert any(isinstance(e, p.TranscriptOutput) and e.text == "Still here." for e in events)
    assert third.client_contents[0].turns[0].parts[0].text == "Weather?"  # the seed reached the third
