"""Every layer at once: the session server, our Gemini connection, the real SDK, a
real TLS socket, and the Live emulator — including the faults sessions must survive."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import anyio
import pytest

from audio_fixtures import silence, speak
from clients.client import AudioFrame, LiveClient, SessionRefused
from connections.emulator import Fault, Script, emulator_client, running_emulator
from connections.gemini import Gemini
from google.genai import types

from live import protocol as p
from live.agent import Agent
from serving import audio_bytes, collect, running

pytestmark = pytest.mark.anyio

MODEL = "gemini-2.5-flash-native-audio-preview-09-2025"
FRAME = 640
IN_ORDER = {"late_transcripts": False}
"""For tests that assert final transcripts: every fragment before its turnComplete
(the service may send the last one after it, and the session sends it as a
late transcript; see
tests/test_emulator_gemini.py::test_a_transcript_fragment_after_turn_complete_stays_with_its_turn)."""


def said(events: list, text: str) -> bool:
    return any(isinstance(e, p.TranscriptOutput) and e.final and e.text == text for e in events)


async def say(client: LiveClient, text: str, *, timeout: float = 10.0) -> list:
    await client.send_text(text)
    return await collect(client, lambda e: isinstance(e, p.TurnComplete), timeout=timeout)


async def test_live_serve_through_the_standard_variables_a_whole_spoken_turn():
    speech = speak("What is the weather in Lisbon?", rate=16_000)
    script = Script(
        speed=4, user_says=["What is the weather in Lisbon?"], replies=["It is sunny in Lisbon."], profile_overrides=IN_ORDER
    )
    async with running_emulator(script) as emu:
        env = {k: v for k, v in os.environ.items() if k not in ("GEMINI_API_KEY", "LIVE_TOKEN")}
        env.update(
            GOOGLE_API_KEY=emu.api_key,
            GOOGLE_GEMINI_BASE_URL=emu.base_url,
            SSL_CERT_FILE=emu.ca_file,
            NO_PROXY="127.0.0.1,localhost",
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "live.cli", "serve", "--port", "0", "--model", MODEL],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        try:
            line = await anyio.to_thread.run_sync(proc.stdout.readline)
            port = int(re.search(r":(\d+)/live", line).group(1))
            async with LiveClient.connect(f"ws://127.0.0.1:{port}/live") as client:
                assert client.session.model == MODEL
                pcm = silence(0.2) + speech + silence(1.2)
                for start in range(0, len(pcm), FRAME):
                    await client.send_audio(pcm[start : start + FRAME])
                    await anyio.sleep(0.005)
                events = await collect(client, lambda e: isinstance(e, p.Usage), timeout=20)
            heard = next(e for e in events if isinstance(e, p.TranscriptInput) and e.final)
            assert heard.text == "What is the weather in Lisbon?"
            assert said(events, "It is sunny in Lisbon.")
            assert len(audio_bytes(events)) > 48_000 * 0.5  # half a second of reply, at least
            order = [type(e).__name__ for e in events if not isinstance(e, AudioFrame)]
            assert order.index("GenerationComplete") < order.index("TurnComplete") < order.index("Usage")
            [record] = emu.sessions
            assert len(record.audio) > len(speech) * 0.9  # the speech reached the service
        finally:
            proc.terminate()
            stderr = await anyio.to_thread.run_sync(lambda: proc.communicate(timeout=10)[1])
        assert emu.api_key not in stderr  # the key never reaches the log
        assert re.search(r"session \w+ started model=" + re.escape(MODEL), stderr)


def gemini_for(emu, model: str = MODEL) -> Gemini:
    return Gemini(model, client=emulator_client(emu))


async def test_go_away_with_a_tool_call_in_flight_hands_over_and_the_result_arrives_once():
    released = anyio.Event()

    async def check_stock(item: str) -> dict:
        """How many of an item are in stock."""
        await released.wait()
        return {"item": item, "count": 3}

    agent = Agent(name="shop", model=MODEL, tools=[check_stock])
    # The go-away comes after the call (0.3 s), and its close long after the tool returns.
    script = Script(
        speed=10, tool_args={"check_stock": {"item": "kettle"}}, go_away_after=3.0, go_away_time_left=30, profile_overrides=IN_ORDER
    )
    async with running_emulator(script) as emu, running(agent, gemini_for(emu)) as (_, url):
        async with LiveClient.connect(url) as client:
            await client.send_text("please check_stock for kettles")
            await collect(client, lambda e: isinstance(e, p.ToolCallEvent))
            await collect(client, lambda e: isinstance(e, p.SessionGoAway))
            await anyio.sleep(0.3)
            assert len(emu.sessions) == 1  # no handover while the call is pending
            released.set()
            events = await collect(client, lambda e: isinstance(e, p.SessionResumed), timeout=10)
            assert said(events, 'check_stock returned {"count":3,"item":"kettle"}.')
            events = await say(client, "thanks")
            assert said(events, "You said: thanks.")
        first, second = emu.sessions[:2]
        responses = [r for s in emu.sessions for r in s.tool_responses]
        assert len(responses) == 1  # delivered exactly once
        assert second.resumed_from is not None and second.resumed_from in first.handles
        assert second.user_turns == ["thanks"]  # nothing replayed


@pytest.mark.parametrize(
    "fault",
    [
        Fault("mid_generation", code=1011, n=2),
        Fault("after_turn", code=1006, n=1),
        Fault.stall("after_turn", n=1),
    ],
    ids=["1011-mid-generation", "1006-no-close-frame", "stall"],
)
async def test_recoverable_faults_leave_the_client_socket_open_and_the_conversation_going(fault):
    agent = Agent(name="a", model=MODEL)
    # A handle after setup, as the old emulator gave: the cut first turn is resumed
    # (without one, see test_a_drop_before_the_first_handle_starts_afresh_with_the_history).
    overrides = {**IN_ORDER, "handle_after_setup": fault.when == "mid_generation"}
    script = Script(speed=20, faults=[fault], profile_overrides=overrides)
    history = [types.Content(role="user", parts=[types.Part(text="My name is Ada.")]),
               types.Content(role="model", parts=[types.Part(text="Hello Ada.")])]
    async with running_emulator(script) as emu, running(agent, gemini_for(emu), stall_timeout=1.0) as (_, url):
        async with LiveClient.connect(url, history=history) as client:
            first = await say(client, "one")
            if fault.when == "mid_generation":
                # The cut reply ends for the client; the conversation goes on.
                assert first[-1] == p.TurnComplete("connection_lost")
                await collect(client, lambda e: isinstance(e, p.SessionResumed), timeout=10)
                # The handle predates "one": it is asked again on the new connection.
                again = await collect(client, lambda e: isinstance(e, p.TurnComplete), timeout=10)
                assert said(again, "You said: one.")
            second = await say(client, "two", timeout=15)
            assert said(second, "You said: two.")  # after a stall: sent again, answered once
            if fault.action == "stall":
                assert any(isinstance(e, p.ErrorEvent) and e.code == "model_stalled" for e in second)
            assert not any(isinstance(e, p.SessionClosed) for e in first + second)
        assert len(emu.sessions) == 2
        assert emu.sessions[1].resumed_from is not None
        turns = [f for f in emu.sessions[1].frames if "clientContent" in f or "client_content" in f]
        assert all("My name is Ada." not in str(t) for t in turns)  # history not re-sent


async def test_a_drop_before_the_first_handle_starts_afresh_with_the_history():
    # The service issues no handle before a turn completed; a drop then leaves
    # nothing to resume: the new connection must be seeded again.
    script = Script(speed=20, faults=[Fault("mid_generation", code=1011, n=2)], profile_overrides=IN_ORDER)
    history = [types.Content(role="user", parts=[types.Part(text="My name is Ada.")]),
               types.Content(role="model", parts=[types.Part(text="Hello Ada.")])]
    async with running_emulator(script) as emu, running(Agent(name="a", model=MODEL), gemini_for(emu)) as (_, url):
        async with LiveClient.connect(url, history=history) as client:
            await say(client, "one")
            again = await collect(client, lambda e: isinstance(e, p.TurnComplete), timeout=10)
            assert said(again, "You said: one.")
        assert len(emu.sessions) == 2 and emu.sessions[0].handles == []
        assert emu.sessions[1].resumed_from is None
        seeded = [f for f in emu.sessions[1].frames if "clientContent" in f or "client_content" in f]
        assert any("My name is Ada." in str(f) for f in seeded)


@pytest.mark.parametrize(
    ("fault", "code"),
    [
        (Fault("after_turn", code=1007, n=1), "model_invalid_argument"),
        (Fault.quota("after_turn", n=1), "quota_exhausted"),
    ],
)
async def test_fatal_faults_end_the_session_with_a_clear_error_and_no_replay(fault, code):
    async with running_emulator(Script(speed=20, faults=[fault])) as emu, running(Agent(name="a", model=MODEL), gemini_for(emu)) as (_, url):
        async with LiveClient.connect(url) as client:
            events = await say(client, "one")
            events += await collect(client, lambda e: isinstance(e, p.SessionClosed), timeout=10)
        error = next(e for e in events if isinstance(e, p.ErrorEvent))
        assert error.fatal and error.code == code
        assert len(emu.sessions) == 1


async def test_a_model_without_live_support_is_refused_with_a_hint():
    agent = Agent(name="a", model="gemini-2.5-flash")
    async with running_emulator(Script(speed=20)) as emu, running(agent, gemini_for(emu, "gemini-2.5-flash")) as (_, url):
        with pytest.raises(SessionRefused) as info:
            async with LiveClient.connect(url):
                pass
    assert info.value.code == "model_config_error"
    assert "bidiGenerateContent" in info.value.message


async def test_a_long_session_survives_several_go_aways_in_a_row():
    # Each connection is told to go away 0.5 service-seconds after setup (at 20x
    # speed): several handovers within a few seconds of wall time.
    script = Script(speed=20, go_away_after=10.0, go_away_time_left=60.0, profile_overrides=IN_ORDER)
    async with running_emulator(script) as emu, running(Agent(name="a", model=MODEL), gemini_for(emu)) as (_, url):
        async with LiveClient.connect(url) as client:
            for n in range(4):
                assert said(await say(client, f"turn {n}"), f"You said: turn {n}.")
                await collect(client, lambda e: isinstance(e, p.SessionResumed), timeout=10)
            assert said(await say(client, "last"), "You said: last.")
        assert len(emu.sessions) >= 5
        assert all(s.resumed_from for s in emu.sessions[1:])
        assert [t for s in emu.sessions for t in s.user_turns] == ["turn 0", "turn 1", "turn 2", "turn 3", "last"]
