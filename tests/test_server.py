"""The server over real loopback sockets, with the transport double as Gemini."""

from __future__ import annotations

import time

import contextlib
import json
import re

import anyio
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import InvalidStatus

from clients.client import LiveClient, SessionRefused
from connections import double
from connections.gemini import Gemini
from google.genai import types

from live import protocol as p
from live.agent import Agent

from serving import audio_bytes, collect, kinds, running

# Every test on both WebSocket layers the server can listen with.
pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("both_socket_layers")]

MIC = b"\x10\x00" * 320  # 20 ms of 16 kHz PCM16


def get_weather(city: str) -> dict:
    """Current weather for a city."""
    return {"city": city, "sky": "sunny", "temp_c": 21}


AGENT = Agent(name="test", model="gemini-2.5-flash", tools=[get_weather])


def gemini(*sessions: double.ScriptedSession) -> tuple[Gemini, double.DoubleTransport]:
    transport = double.DoubleTransport(*sessions)
    return Gemini("gemini-2.5-flash", transport=transport), transport


async def test_a_spoken_turn_streams_transcripts_audio_and_turn_end_in_order():
    reply = [b"\x01\x02" * 960, b"\x03\x04" * 960]
    session = double.ScriptedSession()
    session.on(
        lambda m: session.audio_bytes >= 3 * len(MIC),
        double.input_transcript("What's the"),
        double.input_transcript(" weather?"),
        double.output_transcript("Sunny"),
        double.audio(reply[0]),
        double.output_transcript(" today."),
        double.audio(reply[1]),
        double.generation_complete(),
        double.turn_complete(),
        double.usage(prompt=12, response=30),
    )
    llm, _ = gemini(session)
    async with running(AGENT, llm) as (_, url), LiveClient.connect(url, late_tail_wait=None) as client:
        assert client.session.model == "gemini-2.5-flash"
        for _ in range(3):
            await client.send_audio(MIC)
        events = await collect(client, lambda e: isinstance(e, p.Usage))
    assert audio_bytes(events) == b"".join(reply)
    texts = [(e.type, e.text, e.final) for e in events if isinstance(e, (p.TranscriptInput, p.TranscriptOutput))]
    assert texts == [
        ("transcript.input", "What's the", False),
        ("transcript.input", " weather?", False),
        ("transcript.output", "Sunny", False),
        ("transcript.output", " today.", False),
        ("transcript.input", "What's the weather?", True),
        ("transcript.output", "Sunny today.", True),
    ]
    assert kinds(events)[-3:] == ["generation.complete", "turn.complete", "usage"]
    assert events[-1].total_tokens == 42
    # The audio reached the model as 16 kHz PCM, unchanged and in order.
    sent = [m.realtime_input.audio for m in session.sent if m.realtime_input and m.realtime_input.audio]
    assert b"".join(b.data for b in sent) == MIC * 3
    assert {b.mime_type for b in sent} == {"audio/pcm;rate=16000"}


async def test_frames_that_wait_for_a_slow_model_go_out_together_in_order():
    class SlowSession(double.ScriptedSession):
        async def send_realtime_input(self, **kwargs):
            await anyio.sleep(0.05)  # the model side takes 50 ms per message
            await super().send_realtime_input(**kwargs)

        def can_send_now(self):
            return False  # every send waits

    session = SlowSession()
    llm, _ = gemini(session)
    frames = [bytes([n, 0]) * 320 for n in range(20)]
    async with running(AGENT, llm) as (_, url), LiveClient.connect(url) as client:
        for frame in frames:
            await client.send_audio(frame)
        with anyio.fail_after(5):
            await session.wait_for(lambda m: session.audio_bytes >= 20 * 640)
    chunks = [m.realtime_input.audio.data for m in session.sent if m.realtime_input and m.realtime_input.audio]
    assert b"".join(chunks) == b"".join(frames)  # nothing lost, nothing reordered
    assert len(chunks) < len(frames)  # the waiting frames were sent as larger chunks
    assert max(len(c) for c in chunks) <= 5 * 640  # at most 100 ms in one chunk


async def test_a_failure_while_taking_client_audio_ends_the_session_with_a_clear_error(caplog):
    """Audio is taken from the socket's own callback; a bug there must end the session
    as a failure anywhere else does (internal_error, then session.closed), and the
    server goes on."""

    class Broken(double.ScriptedSession):
        def send_audio_nowait(self, audio):
            raise RuntimeError("a bug in the model connection")

    llm, _ = gemini(Broken(), double.ScriptedSession())
    async with running(AGENT, llm) as (_, url):
        async with LiveClient.connect(url) as client:
            await client.send_audio(MIC)
            events = await collect(client, lambda e: e.type == "session.closed")
        errors = [e for e in events if e.type == "error"]
        assert [(e.code, e.fatal) for e in errors] == [("internal_error", True)]
        assert "a bug in the model connection" not in errors[0].message  # internals stay in the log
        assert "a bug in the model connection" in caplog.text
        async with LiveClient.connect(url) as client:  # the server still serves
            await client.send_audio(MIC)
            assert client.session.model == "gemini-2.5-flash"


async def test_frames_that_piled_up_while_the_server_was_busy_go_to_the_model_together(both_socket_layers):
    """A reader that fell behind (the process was busy) finds frames waiting: they
    go to the model joined, one message for the run, not one each."""
    if both_socket_layers == "websockets":
        pytest.skip("websockets' server does not say how many frames wait unread: each goes alone")
    session = double.ScriptedSession()
    llm, _ = gemini(session)
    frames = [bytes([n, 0]) * 320 for n in range(6)]
    async with running(AGENT, llm) as (_, url), LiveClient.connect(url) as client:
        await client.send_audio(frames[0])
        with anyio.fail_after(5):
            await session.wait_for(lambda m: session.audio_chunks == 1)
        for frame in frames[1:]:
            await client.send_audio(frame)  # written to the socket, not yet read by the server
        time.sleep(0.1)  # the event loop (the server's too) is busy meanwhile
        with anyio.fail_after(5):
            await session.wait_for(lambda m: session.audio_bytes == 6 * 640)
    chunks = [m.realtime_input.audio.data for m in session.sent if m.realtime_input and m.realtime_input.audio]
    assert b"".join(chunks) == b"".join(frames)  # in order, none lost
    assert chunks[0] == frames[0]  # sent at once: nothing was waiting
    assert len(chunks) <= 3, [len(c) for c in chunks]  # the five that piled up: joined


async def test_a_model_socket_that_stops_taking_sends_does_not_stop_the_client_being_read():
    """Audio goes straight to the model while its socket takes it; when the socket
    is full, frames wait in the queue (the oldest dropped at its bound, the
    client told) and the client's socket is still read. Once the model's socket
    drains, what waited follows, in order."""
    session = double.ScriptedSession()
    llm, _ = gemini(session)
    frames = [bytes([n % 256, n // 256]) * 320 for n in range(130)]
    async with running(AGENT, llm) as (_, url), LiveClient.connect(url) as client:
        await client.send_audio(frames[0])
        with anyio.fail_after(5):
            await session.wait_for(lambda m: session.audio_chunks == 1)
        session.hold_sends()  # the model stops reading; its socket fills up
        for frame in frames[1:]:
            await client.send_audio(frame)
        error = await expect_error(client, "audio_overflow")
        assert "dropped" in error.message
        session.release_sends()
        with anyio.fail_after(5):
            await session.wait_for(lambda m: m.realtime_input is not None and m.realtime_input.audio is not None
                                   and m.realtime_input.audio.data.endswith(frames[-1]))
        await client.send_audio(frames[0])  # the session goes on
        with anyio.fail_after(5):
            await session.wait_for(lambda m: session.audio_chunks > 2 and m.realtime_input is not None
                                   and m.realtime_input.audio is not None and m.realtime_input.audio.data == frames[0])
    chunks = [m.realtime_input.audio.data for m in session.sent if m.realtime_input and m.realtime_input.audio]
    joined = b"".join(chunks)
    sent = [joined[i] + 256 * joined[i + 1] for i in range(0, len(joined), 640)]
    assert joined == b"".join(frames[n] for n in sent)  # whole frames, unchanged
    # frames[0]; the run being sent when the socket filled (frames 1 to j); the
    # newest that waited (frames k to the last); frames[0] again. Between j and
    # k, the dropped ones, oldest first.
    j = 0
    while sent[j + 1] == j + 1:
        j += 1
    k = sent[j + 1]
    assert sent == [*range(j + 1), *range(k, len(frames)), 0]
    assert 1 <= j < k - 1 and len(frames) - k <= 100


async def test_server_tool_runs_and_its_result_goes_back_with_the_exact_id():
    session = double.ScriptedSession()
    session.on_client_content(double.tool_call("get_weather", {"city": "Lisbon"}, id="fn_7f2"))
    session.on_tool_response(double.audio(b"\x05\x00" * 480), double.turn_complete())
    llm, _ = gemini(session)
    async with running(AGENT, llm) as (_, url), LiveClient.connect(url) as client:
        await client.send_text("Weather in Lisbon?")
        events = await collect(client, lambda e: isinstance(e, p.TurnComplete))
    call = next(e for e in events if isinstance(e, p.ToolCallEvent))
    assert (call.id, call.name, call.args, call.runs_on) == ("fn_7f2", "get_weather", {"city": "Lisbon"}, "server")
    result = next(e for e in events if isinstance(e, p.ToolResultEvent))
    assert result.response == {"city": "Lisbon", "sky": "sunny", "temp_c": 21}
    [response] = session.tool_responses[0].function_responses
    assert (response.id, response.name, response.response["temp_c"]) == ("fn_7f2", "get_weather", 21)
    assert kinds(events) == ["tool.call", "tool.result", "audio", "turn.complete"]


async def test_client_tool_call_waits_for_the_clients_result():
    session = double.ScriptedSession()
    session.on_client_content(double.tool_call("open_door", {"door": "front"}, id="d-1"))
    session.on_tool_response(double.output_transcript("Done."), double.turn_complete())
    llm, _ = gemini(session)
    async with running(AGENT, llm) as (_, url), LiveClient.connect(url) as client:
        await client.send_text("Open the front door")
        [call] = [e for e in await collect(client, lambda e: isinstance(e, p.ToolCallEvent))]
        assert (call.runs_on, call.args) == ("client", {"door": "front"})
        await client.send_tool_result(call.id, call.name, {"opened": True})
        await collect(client, lambda e: isinstance(e, p.TurnComplete))
    [response] = session.tool_responses[0].function_responses
    assert (response.id, response.response) == ("d-1", {"opened": True})


async def test_a_client_tool_that_never_answers_gets_an_error_response_at_its_deadline():
    agent = Agent(name="t", model="gemini-2.5-flash", client_tool_timeout=0.2)
    session = double.ScriptedSession()
    session.on_client_content(double.tool_call("open_door", id="d-2"))
    session.on_tool_response(double.turn_complete())
    llm, _ = gemini(session)
    async with running(agent, llm) as (_, url), LiveClient.connect(url) as client:
        await client.send_text("Open it")
        events = await collect(client, lambda e: isinstance(e, p.TurnComplete))
    assert any(isinstance(e, p.ErrorEvent) and e.code == "tool_timeout" for e in events)
    [response] = session.tool_responses[0].function_responses
    assert response.id == "d-2" and "did not return a result" in response.response["error"]


async def test_late_audio_of_an_interrupted_reply_never_reaches_the_client():
    before, late, after = b"\x01\x00" * 480, b"\x0f\x0f" * 480, b"\x02\x00" * 480
    session = double.ScriptedSession()
    session.on_client_content(
        double.audio(before),
        double.Pause(0.1),  # the first chunk has reached the client by then
        double.interrupted(),
        double.audio(late),
        double.audio(late),
        double.turn_complete(),
        double.audio(after),
        double.turn_complete(),
    )
    llm, _ = gemini(session)
    async with running(AGENT, llm) as (_, url), LiveClient.connect(url) as client:
        await client.send_text("Tell me a long story")
        events = await collect(client, lambda e: isinstance(e, p.TurnComplete))
        events += await collect(client, lambda e: isinstance(e, p.TurnComplete))
    assert late not in audio_bytes(events)
    assert audio_bytes(events) == before + after
    assert kinds(events) == ["audio", "turn.interrupted", "turn.complete", "audio", "turn.complete"]


async def test_queued_reply_audio_is_flushed_when_the_user_barges_in():
    # Paced: the client may be at most 0.1 s ahead, so most of a 2 s reply waits
    # on the server, and the interruption discards it there.
    chunk = b"\x07\x00" * 960  # 40 ms at 24 kHz
    session = double.ScriptedSession()
    session.on_client_content(*[double.audio(chunk) for _ in range(50)], double.Pause(0.3), double.interrupted(), double.turn_complete())
    llm, _ = gemini(session)
    async with running(AGENT, llm, audio_lead=0.1) as (server, url), LiveClient.connect(url) as client:
        await client.send_text("Talk for a while")
        events = await collect(client, lambda e: isinstance(e, p.TurnComplete))
    received = len(audio_bytes(events)) / 48_000
    assert 0.2 <= received <= 0.8, received  # about lead + the 0.3 s before the barge-in
    assert kinds(events)[-2:] == ["turn.interrupted", "turn.complete"]


async def test_history_is_seeded_once_and_the_agent_config_reaches_the_model():
    session = double.ScriptedSession()
    llm, transport = gemini(session)
    history = [
        types.Content(role="user", parts=[types.Part(text="My name is Ada.")]),
        types.Content(role="model", parts=[types.Part(text="Hello Ada!")]),
    ]
    async with running(AGENT, llm) as (_, url), LiveClient.connect(url, history=history):
        await session.wait_for(lambda m: m.client_content is not None)
    [seed] = session.client_contents
    assert [c.parts[0].text for c in seed.turns] == ["My name is Ada.", "Hello Ada!"]
    assert seed.turn_complete is False  # the last turn is the model's: no reply is due
    config = transport.connects[0].config
    assert config.tools[0].function_declarations[0].name == "get_weather"
    assert config.input_audio_transcription is not None and config.output_audio_transcription is not None


async def test_model_cancellation_cancels_a_running_server_tool():
    started, cancelled = anyio.Event(), anyio.Event()

    async def slow_lookup(order_id: str) -> dict:
        """Look an order up (slowly)."""
        started.set()
        try:
            await anyio.sleep(30)
        finally:
            cancelled.set()
        return {}

    agent = Agent(name="t", model="gemini-2.5-flash", tools=[slow_lookup])
    session = double.ScriptedSession()
    session.on_client_content(double.tool_call("slow_lookup", {"order_id": "A1"}, id="s-1"))
    llm, _ = gemini(session)
    async with running(agent, llm) as (_, url), LiveClient.connect(url) as client:
        await client.send_text("Where is my order?")
        await collect(client, lambda e: isinstance(e, p.ToolCallEvent))
        with anyio.fail_after(2):
            await started.wait()
        session.push(double.tool_call_cancellation("s-1"))
        events = await collect(client, lambda e: isinstance(e, p.ToolCancelled))
        with anyio.fail_after(2):
            await cancelled.wait()
    assert events[-1].ids == ("s-1",)
    assert session.tool_responses == []  # a cancelled call is not answered


# ------------------------------------------------------------------ bad input


async def expect_error(client: LiveClient, code: str) -> p.ErrorEvent:
    [*_, error] = await collect(client, lambda e: isinstance(e, p.ErrorEvent))
    assert error.code == code, error
    return error


def echo_text_session() -> double.ScriptedSession:
    session = double.ScriptedSession()
    session.on_client_content(double.output_transcript("still here"), double.turn_complete(), times=None)
    return session


async def assert_session_goes_on(client: LiveClient) -> None:
    await client.send_text("are you there?")
    events = await collect(client, lambda e: isinstance(e, p.TurnComplete))
    assert any(isinstance(e, p.TranscriptOutput) and e.text == "still here" for e in events)


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ("{this is not json", "invalid_json"),
        ('{"type": "sing"}', "unknown_type"),
        ('{"type": "text"}', "missing_field"),
        ('{"type": "tool.result", "id": "x", "name": "y"}', "missing_field"),
        ('{"type": "tool.result", "id": "x", "name": "y", "response": {}}', "unknown_tool_call"),
        (b"\x00\x01\x02", "invalid_audio"),
        ("[" * 60_000, "invalid_json"),  # nested past any recursion limit, under the frame limit
    ],
)
async def test_bad_frames_get_an_error_and_the_session_goes_on(frame, code):
    llm, _ = gemini(echo_text_session())
    async with running(AGENT, llm) as (_, url), LiveClient.connect(url) as client:
        await client.send_raw(frame)
        error = await expect_error(client, code)
        assert not error.fatal and error.message
        await assert_session_goes_on(client)


async def test_input_before_session_start_is_refused_until_it_comes():
    llm, _ = gemini(echo_text_session())
    async with running(AGENT, llm) as (_, url), ws_connect(url) as ws:
        await ws.send(MIC)
        assert json.loads(await ws.recv())["code"] == "not_started"
        await ws.send('{"type": "text", "text": "hi"}')
        assert json.loads(await ws.recv())["code"] == "not_started"
        await ws.send('{"type": "session.start"}')
        assert json.loads(await ws.recv())["type"] == "session.started"


async def test_an_oversized_frame_gets_an_error_then_close_1009_and_the_server_goes_on():
    llm, _ = gemini(echo_text_session(), echo_text_session())
    async with running(AGENT, llm, max_frame_bytes=4096) as (_, url):
        async with LiveClient.connect(url) as client:
            await client.send_audio(b"\x00" * 8192)
            error = await expect_error(client, "frame_too_large")
            assert error.fatal and "4096" in error.message
            closed = await collect(client, lambda e: isinstance(e, p.SessionClosed))
            assert closed[-1].type == "session.closed"
            assert await client.wait_closed() == 1009
        async with LiveClient.connect(url) as client:
            await assert_session_goes_on(client)


async def test_a_wrong_token_is_refused_and_the_right_one_accepted():
    llm, _ = gemini(echo_text_session())
    async with running(AGENT, llm, token="s3cret") as (_, url):
        with pytest.raises(SessionRefused) as info:
            async with LiveClient.connect(url, token="guess"):
                pass
        assert info.value.code == "unauthorized"
        async with LiveClient.connect(url, token="s3cret") as client:
            await assert_session_goes_on(client)


async def test_sessions_beyond_capacity_get_a_clear_error():
    llm, _ = gemini(double.ScriptedSession(), echo_text_session())
    async with running(AGENT, llm, max_sessions=1) as (_, url):
        async with LiveClient.connect(url):
            with pytest.raises(SessionRefused) as info:
                async with LiveClient.connect(url):
                    pass
            assert info.value.code == "capacity" and "limit of 1" in info.value.message
        with anyio.fail_after(2):
            while True:  # the first session's slot frees up once it has ended
                try:
                    async with LiveClient.connect(url) as client:
                        await assert_session_goes_on(client)
                        break
                except Exception:
                    await anyio.sleep(0.05)


async def test_foreign_browser_origins_are_refused_local_and_listed_ones_allowed():
    llm, _ = gemini(double.ScriptedSession(), double.ScriptedSession())
    async with running(AGENT, llm, allowed_origins=("https://app.example",)) as (_, url):
        with pytest.raises(InvalidStatus) as info:
            async with ws_connect(url, origin="https://evil.example"):
                pass
        assert info.value.response.status_code == 403
        async with LiveClient.connect(url, origin="http://localhost:3000"):
            pass
        async with LiveClient.connect(url, origin="https://app.example"):
            pass


async def test_idle_sessions_end_with_a_reason():
    llm, _ = gemini(double.ScriptedSession())
    async with running(AGENT, llm, idle_timeout=0.3) as (_, url), LiveClient.connect(url) as client:
        events = await collect(client, lambda e: isinstance(e, p.SessionClosed))
    assert any(isinstance(e, p.ErrorEvent) and e.code == "idle_timeout" for e in events)
    assert events[-1].reason == "idle timeout"


async def test_model_errors_reach_the_client_as_a_fatal_error_with_a_hint():
    session = double.ScriptedSession()
    session.on_client_content(double.Close(1008, "models/gemini-x is not found for API version v1beta, or is not supported for bidiGenerateContent"))
    llm, _ = gemini(session)
    async with running(AGENT, llm) as (_, url), LiveClient.connect(url) as client:
        await client.send_text("hello")
        events = await collect(client, lambda e: isinstance(e, p.SessionClosed))
    error = next(e for e in events if isinstance(e, p.ErrorEvent))
    assert error.fatal and error.code == "model_config_error"
    assert "bidiGenerateContent" in error.message


# ------------------------------------------------------------------ lifetimes


@pytest.mark.parametrize("grace", [0.0, 0.5])
async def test_a_vanished_client_releases_its_upstream_connection_after_the_reattach_grace(grace):
    session = double.ScriptedSession()
    llm, _ = gemini(session)
    async with running(AGENT, llm, reattach_grace=grace) as (server, url):
        ws = await ws_connect(url)
        await ws.send('{"type": "session.start"}')
        await ws.recv()
        ws.transport.abort()  # no close frame: the client just vanishes
        if grace:
            await anyio.sleep(grace / 2)
            assert not session.closed  # the model connection waits for the client
        with anyio.fail_after(grace + 1.0):
            await session.wait_closed()
            while server.sessions:
                await anyio.sleep(0.01)


async def test_stopping_the_server_tells_every_session_and_closes_upstream():
    sessions = [double.ScriptedSession(), double.ScriptedSession()]
    llm, _ = gemini(*sessions)
    async with running(AGENT, llm) as (server, url):
        async with LiveClient.connect(url) as a, LiveClient.connect(url) as b:
            server.stop()
            for client in (a, b):
                events = await collect(client, lambda e: isinstance(e, p.SessionClosed))
                assert any(isinstance(e, p.ErrorEvent) and e.code == "server_shutdown" for e in events)
                assert events[-1].reason == "server shutting down"
    assert all(s.closed for s in sessions)


async def test_no_task_outlives_its_session():
    import asyncio

    session = double.ScriptedSession()
    session.on_client_content(double.tool_call("open_door", id="x"))  # a client tool left waiting
    llm, _ = gemini(session)
    async with running(AGENT, llm) as (server, url):
        baseline = len(asyncio.all_tasks())
        async with LiveClient.connect(url) as client:
            await client.send_text("open")
            await collect(client, lambda e: isinstance(e, p.ToolCallEvent))
            assert len(asyncio.all_tasks()) > baseline
        with anyio.fail_after(2):
            while server.sessions or len(asyncio.all_tasks()) > baseline:
                await anyio.sleep(0.01)
    assert session.closed


async def test_health_and_pages_are_served_on_the_same_port():
    from websockets.asyncio.client import connect  # noqa: F401  (same port as /live)
    import urllib.request

    llm, _ = gemini()
    async with running(AGENT, llm) as (_, url):
        base = url.replace("ws://", "http://").removesuffix("/live")

        def fetch(path):
            with urllib.request.urlopen(base + path, timeout=5) as r:
                return r.status, r.headers["Content-Type"], r.read()

        status, kind, body = await anyio.to_thread.run_sync(fetch, "/healthz")
        assert status == 200 and json.loads(body)["model"] == "gemini-2.5-flash"
        status, kind, body = await anyio.to_thread.run_sync(fetch, "/")
        assert status == 200 and kind.startswith("text/html") and b"Start talking" in body  # the page itself
        # Every module the page imports, and each of theirs, is served.
        wanted = re.findall(r'from "(/client/[^"]+)"', body.decode())
        served = set()
        while wanted:
            path = wanted.pop()
            if path in served:
                continue
            status, kind, module = await anyio.to_thread.run_sync(fetch, path)
            assert status == 200 and kind == "text/javascript", path
            served.add(path)
            wanted += ["/client/" + name for name in re.findall(r'from "\./([^"]+)"', module.decode())]
        assert {"/client/live-client.js", "/client/late-tails.js"} <= served


async def test_health_tells_a_load_balancer_to_route_elsewhere_before_the_server_refuses():
    import urllib.error
    import urllib.request

    llm, _ = gemini(*(double.ScriptedSession() for _ in range(4)))
    async with running(AGENT, llm, max_sessions=4, near_capacity=0.5) as (server, url):
        base = url.replace("ws://", "http://").removesuffix("/live")

        def fetch(path: str) -> tuple[int, dict]:
            try:
                with urllib.request.urlopen(base + path, timeout=5) as r:
                    return r.status, json.loads(r.read())
            except urllib.error.HTTPError as error:
                return error.code, json.loads(error.read())

        async def health() -> tuple[int, str]:
            status, body = await anyio.to_thread.run_sync(fetch, "/healthz")
            assert (await anyio.to_thread.run_sync(fetch, "/livez"))[0] == 200  # alive throughout
            return status, body["status"]

        assert await health() == (200, "ok")
        async with contextlib.AsyncExitStack() as stack:
            for _ in range(2):
                await stack.enter_async_context(LiveClient.connect(url))
            assert await health() == (503, "near_capacity")
            status, body = await anyio.to_thread.run_sync(fetch, "/healthz")
            assert body["sessions"] == 2 and body["near_capacity_at"] == 2 and body["max_sessions"] == 4
            for _ in range(2):
                await stack.enter_async_context(LiveClient.connect(url))
            assert await health() == (503, "full")
        with anyio.fail_after(5):
            while (await health()) != (200, "ok"):  # the slots free up as the sessions end
                await anyio.sleep(0.05)
        await server.drain()  # as on SIGTERM: no new sessions here
        assert await health() == (503, "draining")


def test_a_near_capacity_share_outside_zero_to_one_is_refused_at_configuration():
    from live.server.port import ServerConfig

    for share in (0.0, -1.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="near_capacity"):
            ServerConfig(near_capacity=share)
    assert ServerConfig(near_capacity=1.0).near_capacity == 1.0
