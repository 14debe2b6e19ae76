"""The real service's bad days through every layer: the session server, our
Gemini connection, the unmodified google-genai SDK over TLS, and the Live
emulator behaving as the real service does for each model family
(connections/emulator/profiles.py). Each test is one reported behaviour
(docs/emulator.md names its source) that used to end the session or lose what the user said."""

from __future__ import annotations

import anyio
import pytest

from clients.client import LiveClient
from connections.emulator import Fault, Script, running_emulator
from live.liveapi import ENTITY_NOT_FOUND, SESSION_NOT_FOUND
from emulated import gemini_for
from bench.emulated_backends import reply as emulated_reply
from live import protocol as p
from live.agent import Agent
from serving import collect, late_tail, replies, running

pytestmark = pytest.mark.anyio

NATIVE_AUDIO = "gemini-2.5-flash-native-audio-preview-12-2025"
FRAME = b"\x10\x00" * 320  # 20 ms of quiet 16 kHz PCM16


async def reply(client: LiveClient, *, timeout: float = 10.0) -> list:
    """Events up to the turn's end that is not a cut (and the tail after it)."""
    events = await collect(client, lambda e: isinstance(e, p.TurnComplete) and e.reason is None, timeout=timeout)
    return events + await late_tail(client)


async def test_talking_while_a_tool_runs_on_native_audio_neither_closes_nor_loses_anything():
    """2.5 native audio closes with 1008 on any realtime input while a call is
    unanswered (forum #114644); users keep talking while a tool runs."""
    started = anyio.Event()

    async def check_stock(item: str) -> dict:
        """How many of an item are in stock."""
        started.set()
        await anyio.sleep(0.5)
        return {"item": item, "count": 3}

    agent = Agent(name="shop", model=NATIVE_AUDIO, tools=[check_stock])
    script = Script(speed=10, tool_args={"check_stock": {"item": "kettle"}})
    async with running_emulator(script) as emu, running(agent, gemini_for(emu, NATIVE_AUDIO)) as (_, url):
        async with LiveClient.connect(url) as client:
            await client.send_text("please check_stock for kettles")
            with anyio.fail_after(10):
                await started.wait()
            for _ in range(15):  # still talking while it looks
                await client.send_audio(FRAME)
                await anyio.sleep(0.02)
            events = await reply(client)
    assert replies(events) == ['check_stock returned {"count":3,"item":"kettle"}.']
    assert not any(isinstance(e, (p.SessionReconnecting, p.ErrorEvent)) for e in events)
    [session] = emu.sessions
    assert session.close is None  # never the 1008
    assert len(session.tool_responses) == 1
    assert len(session.audio) == 15 * len(FRAME)  # what was said meanwhile reached the model, after the result


async def test_a_1008_right_after_a_tool_response_is_survived_and_the_result_is_not_lost():
    """Forum #109319: "Requested entity was not found." (1008) right after a
    toolResponse, mid-session. Not a configuration error: the conversation goes
    on, told what the tool returned, and the tool does not run again."""
    runs = 0

    async def check_stock(item: str) -> dict:
        """How many of an item are in stock."""
        nonlocal runs
        runs += 1
        return {"item": item, "count": 3}

    agent = Agent(name="shop", model="gemini-live-2.5-flash-preview", tools=[check_stock])
    script = Script(
        speed=10, tool_args={"check_stock": {"item": "kettle"}},
        faults=[Fault("after_tool_response", code=1008, reason=ENTITY_NOT_FOUND)],
    )
    async with running_emulator(script) as emu, running(agent, gemini_for(emu)) as (_, url):
        async with LiveClient.connect(url) as client:
            await client.send_text("please check_stock for kettles")
            events = await collect(client, lambda e: isinstance(e, p.SessionResumed), timeout=10)
            events += await reply(client)
    assert not any(isinstance(e, p.SessionClosed) for e in events)
    assert runs == 1
    first, second = emu.sessions[:2]
    assert first.close == (1008, ENTITY_NOT_FOUND)
    told = str(second.frames)
    assert '"count": 3' in told or '"count":3' in told  # the new connection knows the result
    assert replies(events)  # and answers


async def test_a_1008_right_after_a_tool_response_with_a_handle_to_resume_from_does_not_run_the_tool_again():
    """As above, later in a conversation: the connection resumes from the handle
    of an earlier answer, which predates the question. The resumed model is
    told the question as what was said and the tool's result as context, and
    answers from it: it does not call the tool again, and the user hears the
    answer once."""
    runs = 0

    async def check_stock(item: str) -> dict:
        """How many of an item are in stock."""
        nonlocal runs
        runs += 1
        return {"item": item, "count": 3}

    agent = Agent(name="shop", model="gemini-live-2.5-flash-preview", tools=[check_stock])
    script = Script(
        speed=10, tool_args={"check_stock": {"item": "kettle"}}, replies=emulated_reply,
        faults=[Fault("after_tool_response", code=1008, reason=ENTITY_NOT_FOUND)],
    )
    async with running_emulator(script) as emu, running(agent, gemini_for(emu)) as (_, url):
        async with LiveClient.connect(url) as client:
            await client.send_text("q1x1")
            events = await reply(client)
            await client.send_text("please check_stock for q1x2")
            events += await collect(client, lambda e: isinstance(e, p.SessionResumed), timeout=10)
            events += await reply(client)
            await client.send_text("q1x3")
            events += await reply(client)
    first, second = emu.sessions[:2]
    assert first.close == (1008, ENTITY_NOT_FOUND) and second.resumed_from == first.handles[-1]
    assert runs == 1 and not second.sent_of("toolCall")
    assert replies(events) == ["q1x1, you said: q1x1.", 'check_stock returned {"count": 3, "item": "kettle"}.', "q1x3, you said: q1x3."]
    assert "please check_stock for q1x2" in str(second.frames)  # the model knows what was asked


async def test_a_handle_the_service_no_longer_knows_starts_fresh_from_the_conversation():
    """Forum #186392: a resume refused with 1008 "BidiGenerateContent session not
    found". The conversation goes on, on a fresh connection that knows it."""
    script = Script(
        speed=20,
        faults=[Fault("after_turn", code=1011, n=1), Fault("on_resume", code=1008, reason=SESSION_NOT_FOUND)],
    )
    agent = Agent(name="a", model="gemini-live-2.5-flash-preview")
    async with running_emulator(script) as emu, running(agent, gemini_for(emu)) as (_, url):
        async with LiveClient.connect(url) as client:
            await client.send_text("My name is Ada.")
            first = await reply(client)
            await collect(client, lambda e: isinstance(e, p.SessionResumed), timeout=10)
            await client.send_text("What is my name?")
            second = await reply(client)
    assert replies(first) == ["You said: My name is Ada."]
    assert replies(second) == ["You said: What is my name."]
    sessions = emu.sessions
    assert sessions[0].handles  # a handle existed ...
    assert sessions[1].close == (1008, SESSION_NOT_FOUND)  # ... the service forgot it ...
    fresh = sessions[2]
    assert fresh.resumed_from is None and "My name is Ada." in str(fresh.frames)  # ... the conversation did not


async def test_on_3_8_an_unfinished_sentence_is_waited_for_not_taken_for_a_stall():
    agent = Agent(name="a", model="gemini-3.8-live")
    script = Script(speed=20)
    async with running_emulator(script) as emu, running(agent, gemini_for(emu, "gemini-3.8-live"), stall_timeout=0.6) as (_, url):
        async with LiveClient.connect(url) as client:
            await client.send_text("I would like to book a table and")
            with anyio.move_on_after(1.5):
                quiet = await collect(client, lambda e: isinstance(e, (p.ErrorEvent, p.TurnComplete)), timeout=3)
                pytest.fail(f"nothing expected while the model waits for more words: {quiet}")
            await client.send_text("for two people.")
            events = await reply(client)
    assert any(isinstance(e, p.TranscriptOutput) for e in events)
    assert not any(isinstance(e, p.ErrorEvent) and e.code == "model_stalled" for e in events)
    assert len(emu.sessions) == 1


async def test_on_3_8_extended_thinking_the_answer_after_the_filler_is_not_taken_for_a_stall():
    model = "gemini-3.8-live-extended-thinking"
    agent = Agent(name="a", model=model)
    script = Script(speed=1)
    async with running_emulator(script) as emu, running(agent, gemini_for(emu, model), stall_timeout=1.0) as (_, url):
        async with LiveClient.connect(url) as client:
            await client.send_text("What is seventeen times twenty-three?")
            events = await reply(client, timeout=15)  # the filler turn
            events += await reply(client, timeout=15)  # the answer, after thinking
    said = replies(events)
    assert said[0] == "Let me think about that." and "seventeen times twenty-three" in said[-1]
    assert not any(isinstance(e, (p.ErrorEvent, p.SessionReconnecting)) for e in events)
    assert len(emu.sessions) == 1
