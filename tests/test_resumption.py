"""Sessions that survive: go-away handovers, dropped connections and stalls.

The client's socket stays open through every recoverable fault; tool results are
delivered exactly once; history is never sent again; fatal faults end the
session with a clear error, without replaying the context.
"""

from __future__ import annotations

import anyio
import pytest

from clients.client import LiveClient
from connections import double
from connections.gemini import Gemini
from google.genai import types

from live import protocol as p
from live.agent import Agent
from serving import collect, running

pytestmark = pytest.mark.anyio

MIC = b"\x10\x00" * 320
HISTORY = [types.Content(role="user", parts=[types.Part(text="I am Ada.")]),
           types.Content(role="model", parts=[types.Part(text="Hi Ada.")])]


def reply(text: str) -> list:
    return [double.output_transcript(text), double.audio(b"\x01\x00" * 480), double.turn_complete()]


def answering(text: str = "on the new line") -> double.ScriptedSession:
    """A resumed connection that answers every turn."""
    session = double.ScriptedSession()
    session.on_client_content(*reply(text), times=None)
    return session


def handle(h: str) -> double.types.LiveServerMessage:
    return double.resumption_update(h, resumable=True)


def gemini(*sessions) -> tuple[Gemini, double.DoubleTransport]:
    transport = double.DoubleTransport(*sessions)
    return Gemini("gemini-2.5-flash", transport=transport), transport


def resume_handles(transport: double.DoubleTransport) -> list[str | None]:
    return [
        c.config.session_resumption.handle if c.config.session_resumption else "<none>"
        for c in transport.connects
    ]


async def say(client: LiveClient, text: str, *, timeout: float = 5.0) -> list:
    await client.send_text(text)
    return await collect(client, lambda e: isinstance(e, p.TurnComplete), timeout=timeout)


def said(events: list, text: str) -> bool:
    return any(isinstance(e, p.TranscriptOutput) and e.text == text for e in events)


async def test_go_away_with_a_tool_call_in_flight_hands_over_after_the_result():
    released = anyio.Event()

    async def check_stock(item: str) -> dict:
        """How many of an item are in stock."""
        await released.wait()
        return {"item": item, "count": 3}

    agent = Agent(name="shop", model="gemini-2.5-flash", tools=[check_stock])
    first = double.ScriptedSession(handle("h1"))
    first.on_client_content(
        double.tool_call("check_stock", {"item": "kettle"}, id="t1"), double.go_away(5)
    )
    first.on_tool_response(*reply("Three kettles."), handle("h2"))
    second = answering()
    llm, transport = gemini(first, second)
    async with running(agent, llm) as (_, url), LiveClient.connect(url, history=HISTORY) as client:
        await client.send_text("Any kettles?")
        events = await collect(client, lambda e: isinstance(e, p.SessionGoAway))
        await anyio.sleep(0.2)
        assert len(transport.connects) == 1  # not while the tool call is pending
        released.set()
        events = await collect(client, lambda e: isinstance(e, p.SessionResumed))
        assert said(events, "Three kettles.")
        assert [type(e) for e in events if isinstance(e, (p.SessionReconnecting, p.SessionResumed))] == [
            p.SessionReconnecting,
            p.SessionResumed,
        ]
        events = await say(client, "And toasters?")
        assert said(events, "on the new line")
    assert resume_handles(transport) == [None, "h2"]
    results = [r for s in (first, second) for m in s.tool_responses for r in m.function_responses]
    assert [(r.id, r.response["count"]) for r in results] == [("t1", 3)]  # exactly once
    assert len(first.client_contents) == 2  # history and the first question
    assert [c.turns[0].parts[0].text for c in second.client_contents] == ["And toasters?"]
    assert first.closed_by_client


async def test_go_away_hands_over_at_the_deadline_when_no_safe_point_comes():
    first = double.ScriptedSession(handle("h1"))
    # A reply that never ends: no safe point before the deadline.
    first.on_client_content(double.audio(b"\x01\x00" * 480), double.go_away(1.2))
    llm, transport = gemini(first, answering())
    async with running(Agent(name="a", model="gemini-2.5-flash"), llm) as (_, url), LiveClient.connect(url) as client:
        await client.send_text("Talk forever")
        with anyio.fail_after(3):
            await collect(client, lambda e: isinstance(e, p.SessionResumed))
        assert len(transport.connects) == 2
        assert said(await say(client, "hello?"), "on the new line")


async def test_a_1011_in_the_middle_of_a_generation_resumes_without_replaying_history():
    first = double.ScriptedSession(handle("h1"))
    first.on(
        lambda m: m.client_content is not None and m.client_content.turn_complete,  # not the seed
        double.audio(b"\x01\x00" * 480),
        double.Close(1011, "Internal error"),
    )
    llm, transport = gemini(first, answering())
    async with running(Agent(name="a", model="gemini-2.5-flash"), llm) as (_, url), LiveClient.connect(url, history=HISTORY) as client:
        await client.send_text("Tell me something")
        events = await collect(client, lambda e: isinstance(e, p.SessionResumed))
        reconnecting = next(e for e in events if isinstance(e, p.SessionReconnecting))
        assert "1011" in reconnecting.reason
        assert said(await say(client, "Go on"), "on the new line")
    assert resume_handles(transport) == [None, "h1"]
    # The handle predates the question whose reply was cut: it is asked again,
    # then the conversation goes on; the history is never sent again.
    texts = [c.turns[0].parts[0].text for c in transport.sessions[1].client_contents]
    assert texts == ["Tell me something", "Go on"]


async def test_a_dropped_connection_without_a_close_frame_resumes_and_replays_held_audio():
    first = double.ScriptedSession(handle("h1"))
    # The second attempt is refused, so audio sent during the backoff waits.
    refused = double.ScriptedSession(refuse=double.Close(1011, "Internal error"))
    second = answering()
    llm, transport = gemini(first, refused, second)
    async with running(Agent(name="a", model="gemini-2.5-flash"), llm) as (_, url), LiveClient.connect(url) as client:
        first.drop(1006)
        await collect(client, lambda e: isinstance(e, p.SessionReconnecting))
        for _ in range(10):
            await client.send_audio(MIC)  # spoken while upstream is switching
        await collect(client, lambda e: isinstance(e, p.SessionResumed))
        with anyio.fail_after(2):
            await second.wait_for(lambda m: second.audio_bytes >= 10 * len(MIC))
    assert resume_handles(transport) == [None, "h1", "h1"]


async def test_a_stalled_model_is_reported_and_the_session_resumed():
    first = double.ScriptedSession(handle("h1"))  # never answers a turn
    llm, transport = gemini(first, answering())
    async with running(Agent(name="a", model="gemini-2.5-flash"), llm, stall_timeout=0.3) as (_, url), LiveClient.connect(url) as client:
        await client.send_text("Hello?")
        events = await collect(client, lambda e: isinstance(e, p.SessionResumed))
        stall = next(e for e in events if isinstance(e, p.ErrorEvent))
        assert stall.code == "model_stalled" and not stall.fatal
        assert said(await say(client, "Hello again?"), "on the new line")
    assert first.closed_by_client


@pytest.mark.parametrize(
    ("close", "code"),
    [
        (double.Close(1007, "Request contains an invalid argument."), "model_invalid_argument"),
        (double.Close(1008, "models/x is not found for API version v1beta, or is not supported for bidiGenerateContent"), "model_config_error"),
        (double.Close(1011, "RESOURCE_EXHAUSTED: quota exceeded"), "quota_exhausted"),
    ],
)
async def test_fatal_closes_end_the_session_at_once_without_reconnecting(close, code):
    first = double.ScriptedSession(handle("h1"))
    first.on_client_content(close)
    llm, transport = gemini(first, answering())
    async with running(Agent(name="a", model="gemini-2.5-flash"), llm) as (_, url), LiveClient.connect(url) as client:
        await client.send_text("hi")
        events = await collect(client, lambda e: isinstance(e, p.SessionClosed))
    error = next(e for e in events if isinstance(e, p.ErrorEvent))
    assert error.fatal and error.code == code
    assert not any(isinstance(e, p.SessionReconnecting) for e in events)
    assert len(transport.connects) == 1  # the same context is never replayed


async def test_a_drop_before_any_handle_goes_on_fresh_seeded_with_the_conversation():
    """The service sends no handle after setup and withholds them while it
    works: a drop then has nothing to resume from. The conversation goes on
    on a fresh connection seeded with what was said, and the question the
    model owed is asked there exactly once."""
    first = double.ScriptedSession()
    first.on_client_content(double.output_transcript("Sunny."), double.turn_complete())
    second = double.ScriptedSession()
    second.on_client_content(double.output_transcript("Rainy."), double.turn_complete())
    llm, transport = gemini(first, second)
    async with running(Agent(name="a", model="gemini-2.5-flash"), llm) as (_, url), LiveClient.connect(url) as client:
        assert said(await say(client, "Weather in Paris?"), "Sunny.")
        await client.send_text("And tomorrow?")
        with anyio.fail_after(5):
            await first.wait_for(lambda m: len(first.client_contents) == 2)
        first.drop(1011, "Internal error")
        events = await collect(client, lambda e: isinstance(e, p.TurnComplete) and e.reason is None)
    assert any(isinstance(e, p.SessionReconnecting) for e in events)
    assert any(isinstance(e, p.SessionResumed) for e in events)
    assert said(events, "Rainy.")
    assert transport.connects[1].config.session_resumption.handle is None  # fresh, not resumed
    [seed] = second.client_contents
    assert [(t.role, t.parts[0].text) for t in seed.turns] == [
        ("user", "Weather in Paris?"),
        ("model", "Sunny."),
        ("user", "And tomorrow?"),
    ]
    assert seed.turn_complete  # the owed question is answered
    assert notes(second).count("And tomorrow?") == 1  # asked once, in the seed


async def test_the_reconnect_budget_is_bounded():
    first = double.ScriptedSession(handle("h1"))
    refusals = [double.ScriptedSession(refuse=double.Close(1011, "Internal error")) for _ in range(3)]
    llm, transport = gemini(first, *refusals)
    async with running(Agent(name="a", model="gemini-2.5-flash"), llm, reconnect_attempts=2) as (_, url), LiveClient.connect(url) as client:
        first.drop(1006)
        events = await collect(client, lambda e: isinstance(e, p.SessionClosed), timeout=10)
    error = next(e for e in events if isinstance(e, p.ErrorEvent))
    assert error.fatal and "gave up after 2 attempts" in error.message
    assert len(transport.connects) == 3  # the first, then two attempts


async def test_a_long_conversation_survives_several_handovers_in_a_row():
    def leg(n: int) -> double.ScriptedSession:
        session = double.ScriptedSession(handle(f"h{n}"), double.go_away(0.5))
        session.on_client_content(*reply(f"leg {n}"), times=None)
        return session

    legs = [leg(n) for n in range(1, 6)]
    llm, transport = gemini(*legs, answering("last leg"))
    async with running(Agent(name="a", model="gemini-2.5-flash"), llm) as (_, url), LiveClient.connect(url, history=HISTORY) as client:
        for _ in range(5):
            await collect(client, lambda e: isinstance(e, p.SessionResumed), timeout=5)
        assert said(await say(client, "still there?"), "last leg")
    assert resume_handles(transport) == [None, "h1", "h2", "h3", "h4", "h5"]
    assert len(legs[0].client_contents) == 1  # the history, once, on the first connection only
    assert all(not s.client_contents for s in legs[1:])


async def test_a_model_that_keeps_closing_normally_cannot_make_the_session_spin():
    closing = [double.ScriptedSession(handle(f"h{n}"), double.Close(1000)) for n in range(4)]
    llm, transport = gemini(*closing)
    async with running(Agent(name="a", model="gemini-2.5-flash"), llm, reconnect_attempts=2) as (_, url), LiveClient.connect(url) as client:
        events = await collect(client, lambda e: isinstance(e, p.SessionClosed), timeout=10)
    error = next(e for e in events if isinstance(e, p.ErrorEvent))
    assert error.fatal and "gave up after 2 attempts" in error.message
    assert len(transport.connects) == 3


# -- what a close reading against the protocol found -------------------------------------


def notes(session: double.ScriptedSession) -> list[str]:
    """Texts a connection was given as client content (2.x) or realtime text (3.x)."""
    texts = [part.text for c in session.client_contents for t in c.turns or [] for part in t.parts or [] if part.text]
    return texts + [r.text for r in session.realtime_inputs if r.text]


async def test_a_call_pending_at_a_drop_reaches_the_resumed_model_as_context_not_a_response():
    released = anyio.Event()

    async def book_table(time: str) -> dict:
        """Book a table (a side effect: it must never be lost or repeated)."""
        await released.wait()
        return {"booked": time}

    agent = Agent(name="r", model="gemini-2.5-flash", tools=[book_table])
    first = double.ScriptedSession(handle("h1"))
    first.on_client_content(double.tool_call("book_table", {"time": "8pm"}, id="b1"), double.Close(1011, "Internal error"))
    second = double.ScriptedSession()
    second.on_client_content(*reply("Your table is booked for 8pm."), times=None)
    llm, transport = gemini(first, second)
    async with running(agent, llm) as (_, url), LiveClient.connect(url) as client:
        await client.send_text("A table at 8pm, please.")
        await collect(client, lambda e: isinstance(e, p.SessionResumed))
        released.set()  # the tool finishes after the model connection was replaced
        events = await collect(client, lambda e: isinstance(e, p.TurnComplete) and e.reason is None)
    assert said(events, "Your table is booked for 8pm.")
    assert not any(isinstance(e, p.ErrorEvent) for e in events)
    # The resumed connection never issued b1: no function response goes to it
    # (the service would close with 1007), but it learns what ran.
    assert second.tool_responses == []
    assert any("book_table" in t and '"booked": "8pm"' in t for t in notes(second))
    assert second.server_close is None


async def test_a_call_pending_at_a_go_away_deadline_reaches_the_new_connection_as_context():
    released = anyio.Event()

    async def check_stock(item: str) -> dict:
        """How many of an item are in stock."""
        await released.wait()
        return {"item": item, "count": 3}

    agent = Agent(name="shop", model="gemini-2.5-flash", tools=[check_stock])
    first = double.ScriptedSession(handle("h1"))
    first.on_client_content(double.tool_call("check_stock", {"item": "kettle"}, id="t1"), double.go_away(0.4))
    second = answering("Three kettles.")
    llm, transport = gemini(first, second)
    async with running(agent, llm, handover_margin=0.2) as (_, url), LiveClient.connect(url) as client:
        await client.send_text("Any kettles?")
        await collect(client, lambda e: isinstance(e, p.SessionResumed))  # at the deadline, call pending
        released.set()
        events = await collect(client, lambda e: isinstance(e, p.TurnComplete) and e.reason is None)
    assert said(events, "Three kettles.")
    assert first.tool_responses == [] and second.tool_responses == []
    assert any('"count": 3' in t for t in notes(second))


async def test_a_close_the_sender_sees_first_is_still_recoverable():
    first = double.ScriptedSession(handle("h1"))
    llm, transport = gemini(first, answering())
    async with running(Agent(name="a", model="gemini-2.5-flash"), llm) as (_, url), LiveClient.connect(url) as client:
        first.drop(1011, "Internal error", seen_by="sender")
        await client.send_audio(MIC)  # the sender meets the dead socket first
        events = await collect(client, lambda e: isinstance(e, p.SessionResumed))
        assert said(await say(client, "Still there?"), "on the new line")
    assert not any(isinstance(e, p.ErrorEvent) and e.fatal for e in events)
    assert resume_handles(transport) == [None, "h1"]


async def test_a_go_away_waits_for_the_end_of_the_users_sentence():
    first = double.ScriptedSession(handle("h1"))
    llm, transport = gemini(first, answering())
    async with running(Agent(name="a", model="gemini-2.5-flash"), llm) as (_, url), LiveClient.connect(url) as client:
        first.push(double.input_transcript("I would like"), double.go_away(5))
        await collect(client, lambda e: isinstance(e, p.SessionGoAway))
        with anyio.move_on_after(0.5) as waited:
            await collect(client, lambda e: isinstance(e, p.SessionReconnecting), timeout=1)
        assert waited.cancelled_caught  # the user is still speaking: no hand-over yet
        first.push(double.input_transcript(" a tea", finished=True))
        await collect(client, lambda e: isinstance(e, p.SessionResumed))
    assert resume_handles(transport) == [None, "h1"]


async def test_activity_signals_are_refused_unless_the_session_takes_turns_manually():
    first = double.ScriptedSession(handle("h1"))
    manual = double.ScriptedSession(handle("h2"))
    manual.on_activity_end(*reply("Heard you."))
    llm, transport = gemini(first, manual)
    agent = Agent(name="a", model="gemini-2.5-flash")
    async with running(agent, llm) as (_, url):
        async with LiveClient.connect(url) as client:
            await client.activity_start()
            [error] = [e for e in await collect(client, lambda e: isinstance(e, p.ErrorEvent))
                       if isinstance(e, p.ErrorEvent)]
            assert error.code == "activity_not_enabled" and not error.fatal
        async with LiveClient.connect(url, turn_taking="manual") as client:
            await client.activity_start()
            await client.send_audio(MIC)
            await client.activity_end()
            events = await collect(client, lambda e: isinstance(e, p.TurnComplete))
    assert said(events, "Heard you.")
    assert first.server_close is None and first.realtime_inputs == []  # nothing went upstream
    config = transport.connects[1].config
    assert config.realtime_input_config.automatic_activity_detection.disabled is True


async def test_nothing_of_a_cut_reply_follows_its_turn_complete():
    endless = [double.Pause(0.02), double.audio(b"\x07\x00" * 480), double.output_transcript("blah ")] * 40
    first = double.ScriptedSession(handle("h1"))
    first.on_client_content(double.go_away(0.3), *endless)
    second = answering("Fresh start.")
    llm, _ = gemini(first, second)
    async with running(Agent(name="a", model="gemini-2.5-flash"), llm, handover_margin=0.1) as (_, url), LiveClient.connect(url) as client:
        await client.send_text("Talk to me")
        events = await collect(client, lambda e: isinstance(e, p.TurnComplete) and e.reason is None, timeout=8)
    cut = next(i for i, e in enumerate(events) if isinstance(e, p.TurnComplete) and e.reason == "connection_lost")
    after = events[cut + 1:]
    assert b"\x07\x00" * 4 not in b"".join(e.data for e in after if hasattr(e, "data") and isinstance(e.data, bytes))
    assert not any(isinstance(e, p.TranscriptOutput) and "blah" in e.text for e in after)
    assert said(after, "Fresh start.")  # the question, asked again, is answered


class _SlowToolResponses(double.ScriptedSession):
    """A connection whose tool-response send hangs until `gate` opens."""

    def __init__(self, *script, gate: anyio.Event) -> None:
        super().__init__(*script)
        self.gate = gate

    async def send_tool_response(self, **kwargs) -> None:
        await self.gate.wait()
        await super().send_tool_response(**kwargs)


async def test_a_resume_waits_for_the_old_sender_so_a_result_goes_out_once():
    def lookup(q: str) -> dict:
        """Look something up."""
        return {"q": q, "a": 42}

    gate = anyio.Event()
    first = _SlowToolResponses(handle("h1"), gate=gate)
    first.on_client_content(double.tool_call("lookup", {"q": "answer"}, id="l1"))
    second = double.ScriptedSession()
    second.on_client_content(*reply("It is 42."), times=None)
    llm, transport = gemini(first, second)
    agent = Agent(name="a", model="gemini-2.5-flash", tools=[lookup])
    async with running(agent, llm) as (_, url), LiveClient.connect(url) as client:
        await client.send_text("What is the answer?")
        await collect(client, lambda e: isinstance(e, p.ToolResultEvent))
        await anyio.sleep(0.1)  # the result's send is now stuck on the old connection
        first.drop(1006)
        await anyio.sleep(0.2)
        assert len(transport.connects) == 1  # the resume waits for the old sender
        gate.set()  # its send fails on the dropped socket; the result is kept
        events = await collect(client, lambda e: isinstance(e, p.TurnComplete) and e.reason is None)
    assert said(events, "It is 42.")
    assert first.tool_responses == [] and second.tool_responses == []
    assert sum('"a": 42' in t for t in notes(second)) == 1  # told once, as context
