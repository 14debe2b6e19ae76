"""`/metrics`: a whole conversation moves each figure by exactly what happened.

The conversation has speech (the model's voice detection ends the turn), a
typed turn that calls a server tool, a barge-in with late audio, a bad frame,
and a dropped model connection that is resumed. `/metrics` is then read over
HTTP, as Prometheus would, and parsed with prometheus-client's own parser.
With `live serve --workers 2` the figures of both processes add up.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import anyio
import pytest
from google.genai import types
from prometheus_client.parser import text_string_to_metric_families

from clients.client import AudioFrame, LiveClient
from connections import double
from connections.gemini import Gemini
from live import protocol as p
from live.agent import Agent
from live.llm import LlmRequest
from live.observe.metrics import Metrics
from live.observe.watch import Measured
from serving import collect, running

pytestmark = pytest.mark.anyio

MIC = b"\x10\x00" * 320  # 20 ms of 16 kHz PCM16
CHUNK = b"\x01\x00" * 960  # 40 ms of 24 kHz PCM16


def get_weather(city: str) -> dict:
    """Current weather for a city."""
    return {"city": city, "sky": "sunny", "temp_c": 21}


AGENT = Agent(name="weather", model="gemini-2.5-flash", tools=[get_weather])


def speech_ended() -> types.LiveServerMessage:
    return types.LiveServerMessage(
        voice_activity=types.VoiceActivity(voice_activity_type=types.VoiceActivityType.ACTIVITY_END)
    )


def scrape(port: int, path: str = "/metrics") -> dict[tuple[str, frozenset], float]:
    """Every sample of the text format, keyed by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


async def ascrape(port: int, path: str = "/metrics") -> dict[tuple[str, frozenset], float]:
    """`scrape` from a thread: the server runs on this event loop."""
    return await anyio.to_thread.run_sync(scrape, port, path)


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def whole_conversation() -> tuple[dict, list, int]:
    """The conversation of the module's docstring; `/metrics` after it, its
    events, and how many frames the client received."""
    first = double.ScriptedSession()
    # Speech: after five frames the model hears the end of it and answers.
    first.on(
        lambda m: first.audio_bytes >= 5 * len(MIC),
        speech_ended(),
        double.output_transcript("Hello."),
        double.audio(CHUNK),
        double.turn_complete(),
        double.usage(prompt=12, response=30),
    )
    # A typed turn that calls a server tool.
    first.on_client_content(double.tool_call("get_weather", {"city": "Lisbon"}, id="w-1"))
    first.on_tool_response(
        double.audio(CHUNK),
        double.turn_complete(),
        double.resumption_update("h-1"),
    )
    second = double.ScriptedSession()  # the resumed connection: a barge-in with late audio
    second.on_client_content(
        double.audio(CHUNK),
        double.Pause(0.1),
        double.interrupted(),
        double.audio(CHUNK),  # late: dropped, never sent
        double.turn_complete(),
    )
    llm = Gemini("gemini-2.5-flash", transport=double.DoubleTransport(first, second))
    received = 1  # session.started, read by connect()
    async with running(AGENT, llm) as (server, url):
        before = await ascrape(server.port)
        assert value(before, "live_sessions_active") == 0
        async with LiveClient.connect(url) as client:
            assert value(await ascrape(server.port), "live_sessions_active") == 1
            for _ in range(5):
                await client.send_audio(MIC)
            events = await collect(client, lambda e: isinstance(e, p.Usage))
            await client.send_text("Weather in Lisbon?")
            events += await collect(client, lambda e: isinstance(e, p.TurnComplete))
            await client.send_raw("{this is not json")
            events += await collect(client, lambda e: isinstance(e, p.ErrorEvent))
            first.drop(1011, "internal error")
            events += await collect(client, lambda e: isinstance(e, p.SessionResumed))
            await client.send_text("Tell me a story")
            events += await collect(client, lambda e: isinstance(e, p.TurnComplete))
            await client.send_raw('{"type": "session.close"}')
            events += await collect(client, lambda e: isinstance(e, p.SessionClosed))
        received += len(events)
        with anyio.fail_after(5):
            while server.sessions:
                await anyio.sleep(0.01)
        m = await ascrape(server.port)
    return m, events, received


async def test_a_conversation_moves_every_figure_by_what_happened():
    m, events, received = await whole_conversation()
    assert sum(isinstance(e, AudioFrame) for e in events) == 3
    assert value(m, "live_sessions_active") == 0
    assert value(m, "live_sessions_total", model="gemini-2.5-flash", agent="weather", end_reason="client_closed") == 1
    # Three replies with audio, each timed from the end of the user's turn
    # (voice detection, a typed turn, a typed turn); the first also from the start.
    assert value(m, "live_turn_latency_seconds_count") == 3
    assert 0 < value(m, "live_turn_latency_seconds_sum") < 3
    assert value(m, "live_first_audio_seconds_count") == 1
    assert value(m, "live_tool_calls_total", tool="get_weather", runs_on="server", outcome="ok") == 1
    assert value(m, "live_tool_duration_seconds_count", tool="get_weather") == 1
    assert value(m, "live_interruptions_total") == 1
    assert value(m, "live_audio_dropped_frames_total", reason="late") == 1
    assert value(m, "live_audio_dropped_frames_total", reason="overflow") == 0
    assert value(m, "live_model_reconnects_total", cause="connection_lost") == 1
    assert value(m, "live_errors_total", code="invalid_json") == 1
    assert value(m, "live_errors_total", code="model_connection_lost") == 0
    assert value(m, "live_tokens_total", model="gemini-2.5-flash", kind="prompt", modality="unspecified") == 12
    assert value(m, "live_tokens_total", model="gemini-2.5-flash", kind="response", modality="unspecified") == 30
    assert value(m, "live_model_connects_total", model="gemini-2.5-flash", outcome="ok") == 2
    # Frames: session.start, five audio, two texts, the bad frame, session.close.
    assert value(m, "live_client_frames_total", direction="in") == 10
    assert value(m, "live_client_frames_total", direction="out") == received


async def test_every_series_the_grafana_dashboard_plots_is_served_with_the_labels_it_groups_by():
    dashboard = json.loads((Path(__file__).parent.parent / "docs/grafana/live-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(exprs) >= 15
    m, _, _ = await whole_conversation()
    served: dict[str, set[str]] = {}
    for name, labels in m:
        served.setdefault(name, set()).update(label for label, _ in labels)
    for expr in exprs:
        names = re.findall(r"\blive_[a-z_]+", expr)
        assert names, expr
        for name in names:
            assert name in served, f"{name} (in {expr!r}) is not a series /metrics serves"
            for group in re.findall(r"by \(([^)]*)\)", expr):
                for label in (g.strip() for g in group.split(",")):
                    assert label in served[name], f"{name} has no label {label!r} (in {expr!r})"


async def test_a_long_session_shows_its_frames_and_model_messages_while_it_goes_on():
    """Counts kept per session reach /metrics within a second (frames) and every
    50 messages (the model side), not only when the session ends."""
    session = double.ScriptedSession()
    llm = Gemini("gemini-2.5-flash", transport=double.DoubleTransport(session))
    async with running(AGENT, llm) as (server, url), LiveClient.connect(url) as client:
        for sent in range(1, 61):  # one at a time: each its own message to the model
            await client.send_audio(MIC)
            with anyio.fail_after(5):
                await session.wait_for(lambda m: session.audio_chunks == sent)
        await anyio.sleep(1.2)  # one catch-up of the session's counts
        m = await ascrape(server.port)
        assert server.sessions  # still going
        assert value(m, "live_client_frames_total", direction="in") == 61  # session.start and 60 frames
        assert value(m, "live_model_messages_total", model="gemini-2.5-flash", direction="out") == 50


async def test_tool_outcomes_errors_and_refusals_are_labelled():
    async def slow(city: str) -> dict:
        """Too slow."""
        await anyio.sleep(5)
        return {}

    agent = Agent(name="tools", model="gemini-2.5-flash", tools=[slow], tool_timeout=0.2, client_tool_timeout=0.2)
    session = double.ScriptedSession()
    session.on_client_content(
        double.tool_calls(
            types.FunctionCall(name="slow", args={"city": "x"}, id="s-1"),
            types.FunctionCall(name="slow", args={"nope": 1}, id="s-2"),  # bad arguments
            types.FunctionCall(name="show_card", args={}, id="c-1"),  # runs on the client
            types.FunctionCall(name="made_up", args={}, id="c-2"),
        )
    )
    llm = Gemini("gemini-2.5-flash", transport=double.DoubleTransport(session))
    async with running(agent, llm, max_sessions=1) as (server, url):
        async with LiveClient.connect(url) as client:
            await client.send_text("go")
            await collect(client, lambda e: isinstance(e, p.ToolCallEvent) and e.id == "c-2")
            await client.send_tool_result("c-1", "show_card", {"shown": True})
            with anyio.fail_after(5):
                while len(session.tool_responses) < 4:
                    await anyio.sleep(0.02)
            with pytest.raises(Exception):
                async with LiveClient.connect(url):
                    pass
        m = await ascrape(server.port)
    assert value(m, "live_tool_calls_total", tool="slow", runs_on="server", outcome="timeout") == 1
    assert value(m, "live_tool_calls_total", tool="slow", runs_on="server", outcome="error") == 1
    # show_card is not declared by the agent: its name is not a label value.
    assert value(m, "live_tool_calls_total", tool="other", runs_on="client", outcome="ok") == 1
    assert value(m, "live_tool_calls_total", tool="other", runs_on="client", outcome="timeout") == 1
    assert value(m, "live_errors_total", code="tool_timeout") == 1
    assert value(m, "live_errors_total", code="capacity") == 1
    assert value(m, "live_sessions_total", model="gemini-2.5-flash", agent="tools", end_reason="capacity") == 1


async def test_measured_counts_tokens_by_modality_without_a_server():
    usage = types.UsageMetadata(
        prompt_token_count=100,
        response_token_count=40,
        thoughts_token_count=7,
        prompt_tokens_details=[
            types.ModalityTokenCount(modality=types.MediaModality.AUDIO, token_count=80),
            types.ModalityTokenCount(modality=types.MediaModality.TEXT, token_count=20),
        ],
        response_tokens_details=[types.ModalityTokenCount(modality=types.MediaModality.AUDIO, token_count=40)],
    )
    session = double.ScriptedSession(
        types.LiveServerMessage(usage_metadata=usage), double.turn_complete()
    )
    metrics = Metrics()
    llm = Measured(Gemini("gemini-2.5-flash", transport=double.DoubleTransport(session)), metrics)
    async with llm.connect(LlmRequest()) as conn:
        await conn.send_realtime(types.Blob(data=MIC, mime_type="audio/pcm;rate=16000"))
        async for response in conn.receive():
            if response.turn_complete:
                break
    tokens = lambda kind, modality: metrics.value(  # noqa: E731
        "live_tokens_total", {"model": "gemini-2.5-flash", "kind": kind, "modality": modality}
    )
    assert (tokens("prompt", "audio"), tokens("prompt", "text"), tokens("response", "audio")) == (80, 20, 40)
    assert tokens("thoughts", "unspecified") == 7
    assert tokens("prompt", "unspecified") == 0  # fully broken down
    assert metrics.value("live_model_messages_total", {"model": "gemini-2.5-flash", "direction": "out"}) == 1


async def test_metrics_can_live_on_a_port_of_their_own():
    llm = Gemini("gemini-2.5-flash", transport=double.DoubleTransport())
    async with running(AGENT, llm, metrics_port=0) as (server, _):
        assert server.metrics_port not in (None, 0, server.port)
        assert "live_sessions_active" in {name for name, _ in await ascrape(server.metrics_port)}
        with pytest.raises(urllib.error.HTTPError) as refused:
            await ascrape(server.port)  # not on the public port
        assert refused.value.code == 404
        with pytest.raises(urllib.error.HTTPError):
            await ascrape(server.metrics_port, "/healthz")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env.pop("GOOGLE_API_KEY", None)
    env.pop("GEMINI_API_KEY", None)
    return env


async def test_with_two_workers_the_figures_add_up():
    proc = subprocess.Popen(
        # Every session comes from this machine at once: more than the default 8 may be starting together.
        [sys.executable, "-m", "live.cli", "serve", "--port", "0", "--workers", "2", "--metrics-port", "0",
         "--max-pending-per-ip", "32"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
    )
    sessions = 12
    try:
        line = await anyio.to_thread.run_sync(proc.stdout.readline)
        port = int(re.search(r":(\d+)/live", line).group(1))
        metrics_line = await anyio.to_thread.run_sync(proc.stdout.readline)
        metrics_port = int(re.search(r":(\d+)/metrics", metrics_line).group(1))
        url = f"ws://127.0.0.1:{port}/live"

        async def converse() -> None:
            async with LiveClient.connect(url) as client:
                for _ in range(3):
                    await client.send_audio(MIC)
                await client.send_raw('{"type": "sing"}')
                await collect(client, lambda e: isinstance(e, p.ErrorEvent), timeout=10)
                await client.send_raw('{"type": "session.close"}')
                await collect(client, lambda e: isinstance(e, p.SessionClosed), timeout=10)

        async with anyio.create_task_group() as tg:
            for _ in range(sessions):
                tg.start_soon(converse)
        # Any process answers, and each answer holds every process's figures. A
        # session is counted once its socket is closed, a moment after the client
        # read session.closed: wait for every end to be counted (or fail on time).
        for _ in range(4):
            with anyio.fail_after(10):
                while True:
                    m = await ascrape(metrics_port)
                    ended = sum(v for (name, _), v in m.items() if name == "live_sessions_total")
                    if ended >= sessions and value(m, "live_sessions_active") == 0:
                        break
                    await anyio.sleep(0.05)
            reasons = {dict(labels)["end_reason"]: v for (name, labels), v in m.items() if name == "live_sessions_total"}
            assert reasons == {"client_closed": sessions}
            assert value(m, "live_sessions_total", model="local/echo", agent="assistant", end_reason="client_closed") == sessions
            assert value(m, "live_client_frames_total", direction="in") == sessions * 6
            assert value(m, "live_errors_total", code="unknown_type") == sessions
            assert value(m, "live_model_connects_total", model="local/echo", outcome="ok") == sessions
        proc.terminate()
        assert await anyio.to_thread.run_sync(lambda: proc.wait(timeout=15)) == 0
        log = proc.stderr.read()
        started = re.findall(r"\[worker (\d)\]: session \w+ started", log)
        assert len(started) == sessions and set(started) == {"0", "1"}  # both processes served
    finally:
        if proc.poll() is None:
            proc.terminate()  # the first process stops the worker it started
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
