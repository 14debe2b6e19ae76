"""The Python client as the docs' simple loop reads it: whole replies, a polite
end the server hears, and a record of it that replays."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from clients.client import LiveClient
from clients.tails import LateTails
from connections import double
from connections.gemini import Gemini
from live import protocol as p
from live.agent import Agent
from live.observe.record import Recorder, load
from serving import collect, running

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
AGENT = Agent(name="a", model="gemini-2.5-flash")


def _tail_after_the_turn() -> Gemini:
    """Gemini's order: the reply's last words after its turnComplete (livekit agents-js#2165)."""
    session = double.ScriptedSession()
    session.on_client_content(
        double.audio(b"\0\1" * 960), double.output_transcript("It is sunny"), double.turn_complete(),
        double.usage(prompt=3, response=4), double.output_transcript(" in Paris."),
    )
    return Gemini("gemini-2.5-flash", transport=double.DoubleTransport(session))


async def _simple_loop(client: LiveClient) -> list[str]:
    """The loop docs/clients.md shows: print each final transcript, stop at turn.complete."""
    printed = []
    async for event in client.events():
        if isinstance(event, p.TranscriptOutput) and event.final:
            printed.append(event.text)
        elif isinstance(event, p.TurnComplete):
            break
    return printed


async def test_the_simple_loop_reads_the_whole_reply_when_its_tail_comes_after_the_turn():
    async with running(AGENT, _tail_after_the_turn()) as (_, url), LiveClient.connect(url) as client:
        await client.send_text("Weather in Paris?")
        with anyio.fail_after(5):
            assert await _simple_loop(client) == ["It is sunny in Paris."]
        # What followed the turn's end is still read, in order; the tail is not told twice.
        rest = await collect(client, lambda e: isinstance(e, p.Usage))
        assert [type(e) for e in rest] == [p.Usage]


async def test_without_folding_the_client_reads_the_server_as_it_sends():
    async with running(AGENT, _tail_after_the_turn()) as (_, url), LiveClient.connect(url, late_tail_wait=None) as client:
        await client.send_text("Weather in Paris?")
        events = await collect(client, lambda e: isinstance(e, p.TranscriptOutput) and e.late)
    finals = [e.text for e in events if isinstance(e, p.TranscriptOutput) and e.final]
    assert finals == ["It is sunny"] and events[-1].text == " in Paris."


async def test_the_documented_loop_prints_the_emulators_whole_reply(live_emulator):
    """The real SDK path against the Live emulator, which sends every reply's last
    transcript fragment after its turnComplete, as the service does."""
    from emulated import MODEL, gemini_for

    agent = Agent(name="a", model=MODEL)
    async with running(agent, gemini_for(live_emulator)) as (_, url), LiveClient.connect(url) as client:
        await client.send_text("What's the weather in Lisbon?")
        with anyio.fail_after(10):
            printed = await _simple_loop(client)
    assert printed == ["You said: What's the weather in Lisbon."]


def _reply(*items: object) -> list[object]:
    return [p.TranscriptOutput("It is", False), p.TranscriptOutput("It is", True), *items]


def test_late_tails_fold_before_and_after_the_turns_end_and_the_turn_ends_once_whole():
    tails: LateTails = LateTails(wait=0.3)
    out = []
    for item in _reply(p.GenerationComplete(), p.TranscriptOutput(" sunny", False, late=True), p.TurnComplete()):
        out += tails.feed(item, 0.0)
    # The final waits for a tail after the turn; the reply's audio end is told at once.
    assert out == [p.TranscriptOutput("It is", False), p.GenerationComplete()]
    assert tails.deadline == pytest.approx(0.3)
    out += tails.feed(p.TranscriptOutput(" today.", False, late=True), 0.1)
    assert out[2:] == [p.TranscriptOutput("It is sunny today.", True), p.TurnComplete()]
    # A tail later still passes as sent, for the client to append itself.
    assert tails.feed(p.TranscriptOutput(" Warm.", False, late=True), 0.2) == [p.TranscriptOutput(" Warm.", False, late=True)]


def test_a_turn_without_a_tail_ends_at_its_deadline_or_at_whatever_comes_next():
    tails: LateTails = LateTails(wait=0.3)
    for item in _reply(p.TurnComplete()):
        tails.feed(item, 1.0)
    assert tails.expire(1.2) == []
    assert tails.expire(1.3) == [p.TranscriptOutput("It is", True), p.TurnComplete()]
    for item in _reply(p.TurnComplete()):
        tails.feed(item, 2.0)
    heard = p.TranscriptInput("And tomorrow?", False)
    assert tails.feed(heard, 2.1) == [p.TranscriptOutput("It is", True), p.TurnComplete(), heard]
    # A barge-in: what was held goes before it; what the user heard is never held.
    tails.feed(p.TranscriptOutput("Once upon", True), 3.0)
    cut = [p.TurnInterrupted(), p.TranscriptOutput("Once", True, heard=True, played=0.4)]
    assert tails.feed(cut[0], 3.1) + tails.feed(cut[1], 3.1) == [p.TranscriptOutput("Once upon", True), *cut]


async def test_closing_waits_for_the_servers_session_closed_so_the_record_has_it(tmp_path):
    llm = Gemini("gemini-2.5-flash", transport=double.DoubleTransport(double.ScriptedSession()))
    async with running(AGENT, llm, recorder=Recorder(tmp_path)) as (_, url):
        async with LiveClient.connect(url) as client:
            pass
        assert client.closed_reason == "client closed the session"
        with anyio.fail_after(5):
            while not list(tmp_path.glob("*/events.jsonl")) or load(next(tmp_path.iterdir())).of("end") == []:
                await anyio.sleep(0.05)
    record = load(next(tmp_path.iterdir()))
    sent = [e["event"]["type"] for e in record.of("server")]
    assert sent[-1] == "session.closed"


def _documented_client(port: int) -> str:
    """docs/clients.md's Python client, as a file, pointed at `port`."""
    page = (ROOT / "docs/clients.md").read_text()
    [code] = [b for b in re.findall(r"```python\n(.*?)```", page, flags=re.S) if "LiveClient.connect" in b]
    return code.replace("127.0.0.1:8765", f"127.0.0.1:{port}")


def _env() -> dict[str, str]:
    import os

    out = {k: v for k, v in os.environ.items() if k not in ("GOOGLE_API_KEY", "GEMINI_API_KEY", "LIVE_TOKEN")}
    out["NO_PROXY"] = "127.0.0.1,localhost"
    return out


async def test_a_fresh_record_of_the_documented_client_replays(tmp_path):
    """`live serve --record`, the Python client of docs/clients.md (one typed
    turn, then leave), `live replay` on the record: it passes."""
    records = tmp_path / "records"
    server = subprocess.Popen(
        [sys.executable, "-m", "live.cli", "serve", "--port", "0", "--record", str(records)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=str(tmp_path),
    )
    try:
        line = await anyio.to_thread.run_sync(server.stdout.readline)
        port = int(re.search(r"ws://127\.0\.0\.1:(\d+)/live", line).group(1))
        (tmp_path / "talk.py").write_text(_documented_client(port))
        talked = subprocess.run(
            [sys.executable, "talk.py"], capture_output=True, text=True, env=_env(), cwd=str(tmp_path), timeout=60
        )
        assert talked.returncode == 0, talked.stderr
        assert "What's the weather in Lisbon?" in talked.stdout  # local/echo answers in kind
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=15)
    [folder] = records.iterdir()
    replayed = subprocess.run(
        [sys.executable, "-m", "live.cli", "replay", f"{folder}/"],
        capture_output=True, text=True, env=_env(), cwd=str(tmp_path), timeout=60,
    )
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert replayed.stdout.startswith("replay matches the record")
