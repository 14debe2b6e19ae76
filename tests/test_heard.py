"""What the user heard: after a barge-in, the reply's transcript cut where playback was."""

from __future__ import annotations

import json
import time

import anyio
import pytest

from clients.client import AudioFrame, LiveClient
from connections import double
from connections.gemini import Gemini
from live import protocol as p
from live.agent import Agent
from live.engine.heard import BYTES_PER_SECOND, HeardTracker, cut_transcript
from serving import collect, running

CHUNK = b"\x07\x00" * 960  # 40 ms at 24 kHz


def test_the_cut_keeps_whole_fragments_then_the_spoken_share_of_the_next():
    fragments = [(0, "Once upon"), (9600, " a time"), (19200, " there was")]
    assert cut_transcript(fragments, 28800, 0) == ""
    assert cut_transcript(fragments, 28800, 9600) == "Once upon"
    assert cut_transcript(fragments, 28800, 14400) == "Once upon a"
    assert cut_transcript(fragments, 28800, 28800) == "Once upon a time there was"
    assert cut_transcript(fragments, 28800, 4800) == "Once"


def test_without_a_report_playback_is_what_was_sent_less_what_was_ahead():
    heard = HeardTracker()
    for word in ("one", " two", " three", " four"):
        heard.fragment(word)
        heard.audio_queued(BYTES_PER_SECOND // 2)
    heard.audio_sent(BYTES_PER_SECOND * 3 // 2)  # 1.5 s sent, 0.5 s of it not played yet
    reply = heard.interrupted(unplayed_seconds=0.5)
    assert reply.heard() == ("one two", 1.0)
    assert reply.heard(played_seconds=0.5) == ("one", 0.5)  # the client's own figure wins
    assert reply.heard(played_seconds=9.0) == ("one two three", 1.5)  # never past what was sent
    assert heard.interrupted(0.0) is None  # the next reply has not begun
    heard.fragment("next")
    heard.audio_queued(BYTES_PER_SECOND)
    heard.audio_sent(BYTES_PER_SECOND)
    assert heard.interrupted(0.0).heard() == ("next", 1.0)  # positions start again at the new reply


@pytest.mark.anyio
async def test_after_a_barge_in_the_client_gets_what_the_user_heard():
    words = [f" w{i}" for i in range(50)]
    script = []
    for word in words:  # a 2 s reply: each 40 ms chunk after the word it speaks
        script += [double.output_transcript(word), double.audio(CHUNK)]
    session = double.ScriptedSession()
    session.on_client_content(*script, double.Pause(0.7), double.interrupted(), double.turn_complete())
    llm = Gemini("gemini-2.5-flash", transport=double.DoubleTransport(session))
    agent = Agent(name="t", model="gemini-2.5-flash")
    async with running(agent, llm, audio_lead=0.2) as (_, url), LiveClient.connect(url) as client:
        await client.send_text("Tell me a long story")
        events = []
        first_audio = None
        with anyio.fail_after(5):
            async for event in client.events():
                events.append(event)
                if isinstance(event, AudioFrame) and first_audio is None:
                    first_audio = time.monotonic()
                if isinstance(event, p.TurnInterrupted):
                    interrupted_at = time.monotonic()
                if isinstance(event, p.TurnComplete):
                    break
    received = sum(len(e.data) for e in events if isinstance(e, AudioFrame)) / BYTES_PER_SECOND
    # A player that started with the first byte had played this much at the barge-in:
    played = min(received, interrupted_at - first_audio)
    [heard] = [e for e in events if isinstance(e, p.TranscriptOutput) and e.heard]
    kinds = [type(e) for e in events]
    # After the barge-in (and the transcript already on its way), before the turn ends.
    assert kinds.index(p.TurnInterrupted) < events.index(heard) < kinds.index(p.TurnComplete)
    assert heard.final and abs(heard.played - played) <= 0.2, (heard.played, played)
    full = "".join(words)
    assert full.startswith(heard.text) and heard.text  # a prefix of the whole reply
    # The words heard are the words of the audio played, within 200 ms (5 words of 40 ms).
    assert abs(len(heard.text.split()) * 0.04 - played) <= 0.2, (heard.text, played)
    assert 0.5 <= heard.played <= 1.1  # about the 0.7 s before the barge-in, plus what was ahead


async def _interrupted_session(report: float | None) -> list[dict]:
    """A raw client that says it reports playback; returns the events after the barge-in."""
    import json

    from websockets.asyncio.client import connect as ws_connect

    session = double.ScriptedSession()
    script = []
    for word in (" one", " two", " three", " four"):
        script += [double.output_transcript(word), *[double.audio(CHUNK)] * 5]  # 0.2 s a word
    session.on_client_content(*script, double.Pause(0.2), double.interrupted(), double.turn_complete())
    llm = Gemini("gemini-2.5-flash", transport=double.DoubleTransport(session))
    agent = Agent(name="t", model="gemini-2.5-flash")
    after: list[dict] = []
    async with running(agent, llm) as (_, url), ws_connect(url) as ws:
        await ws.send(json.dumps({"type": "session.start", "reports_playback": True}))
        assert json.loads(await ws.recv())["type"] == "session.started"
        await ws.send(json.dumps({"type": "text", "text": "count"}))
        with anyio.fail_after(5):
            async for frame in ws:
                if isinstance(frame, bytes):
                    continue
                event = json.loads(frame)
                if event["type"] == "turn.interrupted":
                    started = time.monotonic()
                    if report is not None:
                        await ws.send(json.dumps({"type": "playback", "played": report}))
                if after or event["type"] == "turn.interrupted":
                    after.append({**event, "_waited": time.monotonic() - started})
                if event.get("heard"):
                    break
    return after


@pytest.mark.anyio
async def test_a_client_that_reports_its_playback_is_believed():
    after = await _interrupted_session(report=0.65)
    heard = after[-1]
    assert (heard["text"], heard["played"]) == (" one two three", 0.65)  # 0.2 s a word
    assert heard["_waited"] < 0.4  # sent when the report came, not at the deadline


@pytest.mark.anyio
async def test_without_the_report_the_server_estimate_comes_at_the_deadline():
    after = await _interrupted_session(report=None)
    heard = after[-1]
    assert heard["heard"] and heard["final"] and 0.4 <= heard["_waited"] < 2
    # Sent at once (no pacing in this server), so the estimate is the time since: about 0.2 s.
    assert 0.0 <= heard["played"] <= 0.6


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ('{"type": "playback"}', "missing_field"),
        ('{"type": "playback", "played": "1.0"}', "invalid_field"),
        ('{"type": "playback", "played": -1}', "invalid_field"),
        ('{"type": "playback", "played": true}', "invalid_field"),
        ('{"type": "session.start", "reports_playback": "yes"}', "invalid_field"),
    ],
)
def test_bad_playback_reports_are_refused_with_a_reason(frame, code):
    with pytest.raises(p.ProtocolError) as refused:
        p.parse_client_message(frame)
    assert refused.value.code == code


def test_a_playback_report_parses():
    assert p.parse_client_message('{"type": "playback", "played": 1.25}') == p.Playback(1.25)
    start = p.parse_client_message('{"type": "session.start", "reports_playback": true}')
    assert start.reports_playback and json.loads(p.encode(start))["reports_playback"] is True
