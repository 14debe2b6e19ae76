"""Session records: what a conversation leaves on disk, and how it reads back."""

from __future__ import annotations

import json
import subprocess
import sys
import wave

import pytest
from google.genai import types

from clients.client import AudioFrame, LiveClient
from connections import double
from connections.gemini import Gemini
from live import protocol as p
from live.agent import Agent
from live.llm import LlmRequest
from live.observe.watch import Recorded
from live.observe.record import Recorder, SessionRecord, load, timeline
from serving import audio_bytes, collect, running

pytestmark = pytest.mark.anyio

MIC = b"\x10\x00" * 320
CHUNK = b"\x01\x00" * 960
TOKEN = "tok-0123456789"
UPSTREAM_HANDLE = "gemini-session-handle-0123"


def get_weather(city: str) -> dict:
    """Current weather for a city."""
    return {"city": city, "sky": "sunny", "temp_c": 21}


AGENT = Agent(name="weather", model="gemini-2.5-flash", tools=[get_weather])


def conversation() -> tuple[double.ScriptedSession, double.ScriptedSession]:
    """Speech, a tool call, a dropped connection, then a barge-in on the new one."""
    first = double.ScriptedSession()
    first.on(
        lambda m: first.audio_bytes >= 5 * len(MIC),
        double.input_transcript("Hello?"),
        double.output_transcript("Hi."),
        double.audio(CHUNK),
        double.turn_complete(),
        double.usage(prompt=5, response=7),
    )
    first.on_client_content(double.tool_call("get_weather", {"city": "Lisbon"}, id="w-1"))
    first.on_tool_response(double.audio(CHUNK), double.turn_complete(), double.resumption_update(UPSTREAM_HANDLE))
    second = double.ScriptedSession()
    second.on_client_content(
        double.output_transcript("Once upon"),
        double.audio(CHUNK),
        double.Pause(0.1),
        double.interrupted(),
        double.audio(CHUNK),
        double.turn_complete(),
    )
    return first, second


async def record_conversation(folder) -> tuple[list, object]:
    first, second = conversation()
    llm = Gemini("gemini-2.5-flash", transport=double.DoubleTransport(first, second))
    async with running(AGENT, llm, token=TOKEN, recorder=Recorder(folder)) as (_, url):
        async with LiveClient.connect(url, token=TOKEN) as client:
            for _ in range(5):
                await client.send_audio(MIC)
            events = await collect(client, lambda e: isinstance(e, p.Usage))
            await client.send_text("Weather in Lisbon?")
            events += await collect(client, lambda e: isinstance(e, p.TurnComplete))
            first.drop(1011, "internal error")
            events += await collect(client, lambda e: isinstance(e, p.SessionResumed))
            await client.send_text("Tell me a story")
            events += await collect(client, lambda e: isinstance(e, p.TurnComplete))
            await client.send_raw('{"type": "session.close"}')
            events += await collect(client, lambda e: isinstance(e, p.SessionClosed))
    [session_folder] = list(folder.iterdir())
    return events, session_folder


async def test_a_session_leaves_its_events_and_both_directions_of_audio(tmp_path):
    events, folder = await record_conversation(tmp_path)
    record = load(folder)
    assert record.header["model"] == "gemini-2.5-flash" and record.header["agent"] == "weather"
    times = [e["t"] for e in record.entries]
    assert times == sorted(times)  # one monotonic clock
    # Audio both ways, as WAV files a standard tool reads.
    with wave.open(str(folder / "in.wav")) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (16000, 1, 2)
        assert wav.readframes(wav.getnframes()) == MIC * 5
    assert record.audio("out") == audio_bytes(events)  # exactly what the user was sent
    assert record.audio("model") == CHUNK * 4  # what the model sent, the late chunk included
    # Every event the client got is in the record, in order.
    sent = [e["event"]["type"] for e in record.of("server")]
    got = [e.type for e in events if not isinstance(e, AudioFrame)]
    assert sent == ["session.started", *got]
    client = [e["event"]["type"] for e in record.of("client")]
    assert client == ["session.start", "text", "text", "session.close"]
    # The model side: two connections, the first ended by the 1011.
    ends = record.of("model.end")
    assert [(e["conn"], e.get("close_code")) for e in ends] == [(1, 1011), (2, None)]
    assert record.of("model.connect")[1]["resumed"] is True
    assert any(e.get("activity_end") is None and "content" in e for e in record.of("model.send"))
    # No secret anywhere: neither the client's token nor the model session's handle.
    updates = [e["response"].get("session_resumption_update") for e in record.of("model")]
    assert [u for u in updates if u] == [
        {"new_handle": "<redacted>", "resumable": True}
    ]
    for path in folder.iterdir():
        assert TOKEN.encode() not in path.read_bytes()
        assert UPSTREAM_HANDLE.encode() not in path.read_bytes(), path.name
    assert record.of("client")[0]["event"]["token"] == "<redacted>"


async def test_record_show_prints_a_readable_timeline(tmp_path):
    _, folder = await record_conversation(tmp_path)
    shown = subprocess.run(
        [sys.executable, "-m", "live.cli", "record", "show", str(folder / "events.jsonl")],
        capture_output=True, text=True, timeout=30,
    )
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    for words in (
        "model gemini-2.5-flash  agent weather",
        "user    audio 0.10 s",
        "user    said: 'Hello?'",
        "agent   said: 'Hi.'",
        "latency first reply audio",
        "user    typed: 'Weather in Lisbon?'",
        'tool    call get_weather({"city": "Lisbon"}) on the server',
        "tool    result get_weather",
        "model   connection 1 ended: RecoverableConnectionError",
        "model   connection 2 opened (resumed)",
        "user    barged in: reply interrupted",
        "end     client closed the session",
    ):
        assert words in out, (words, out)
    lines = out.splitlines()
    assert lines.index(next(l for l in lines if "barged in" in l)) > lines.index(next(l for l in lines if "typed: 'Tell me" in l))


def test_record_show_refuses_what_is_not_a_record(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"kind": "something"}\n')
    for target in (tmp_path / "missing", tmp_path / "x.jsonl"):
        shown = subprocess.run(
            [sys.executable, "-m", "live.cli", "record", "show", str(target)], capture_output=True, text=True, timeout=30
        )
        assert shown.returncode == 2 and "Traceback" not in shown.stderr
        assert len(shown.stderr.strip().splitlines()) == 1


async def test_the_caps_bound_a_session_and_the_folder(tmp_path):
    llm = Gemini("gemini-2.5-flash", transport=double.DoubleTransport(factory=double.ScriptedSession))
    recorder = Recorder(tmp_path, session_cap=6000, total_cap=14000, rescan_seconds=0)
    async with running(AGENT, llm, recorder=recorder) as (server, url):
        for _ in range(3):
            async with LiveClient.connect(url) as client:
                for _ in range(20):  # 12.8 kB of audio, over the session's cap
                    await client.send_audio(MIC)
                await client.send_raw('{"type": "session.close"}')
                await collect(client, lambda e: isinstance(e, p.SessionClosed))
    folders = sorted(tmp_path.iterdir())
    assert len(folders) == 2  # the third found the folder full (less than 4 KiB of room)
    for folder in folders:
        assert sum(f.stat().st_size for f in folder.iterdir()) <= 6000 + 100  # the cap, and the line saying so
        assert load(folder).entries[-1]["kind"] == "truncated"


async def test_recorded_wraps_any_model_without_the_server(tmp_path):
    session = double.ScriptedSession()
    session.on_client_content(double.output_transcript("Hi."), double.audio(CHUNK), double.turn_complete())
    record = SessionRecord(tmp_path / "r", {"model": "gemini-2.5-flash"}, cap=1 << 20)
    llm = Recorded(Gemini("gemini-2.5-flash", transport=double.DoubleTransport(session)), record)
    async with llm.connect(LlmRequest()) as conn:
        await conn.send_content(types.Content(role="user", parts=[types.Part(text="Hello")]))
        async for response in conn.receive():
            if response.turn_complete:
                break
    record.close("done")
    back = load(tmp_path / "r")
    [sent] = back.of("model.send")
    assert sent["content"]["parts"] == [{"text": "Hello"}]
    kinds = [json.dumps(e["response"], sort_keys=True) for e in back.of("model")]
    assert any('"audio": 1920' in k for k in kinds) and any('"text": "Hi."' in k for k in kinds)
    assert back.audio("model") == CHUNK
    assert [e["kind"] for e in back.entries][-2:] == ["model.end", "end"]


async def test_records_are_private_to_the_servers_user(tmp_path):
    """Voices, transcripts and model session handles: no other account may read them."""
    import os
    import stat

    previous = os.umask(0o022)  # the usual umask, under which new files are world-readable
    try:
        _, folder = await record_conversation(tmp_path / "records")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "records").stat().st_mode) == 0o700
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    files = list(folder.iterdir())
    assert {f.name for f in files} >= {"events.jsonl", "in.wav", "out.wav", "model.wav"}
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path.name
    assert load(folder).audio("out")  # and it still reads back
