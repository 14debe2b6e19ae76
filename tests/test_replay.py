"""Replay as a test: a recorded session, replayed against the server, must go the same way."""

from __future__ import annotations

import subprocess
import sys

import pytest

from live.engine import session as session_rules
from live.protocol import TurnInterrupted
from live.testing.replay import assert_replays, replay
from test_record import AGENT, record_conversation

pytestmark = pytest.mark.anyio


async def test_a_recorded_conversation_replays_the_same(tmp_path):
    _, folder = await record_conversation(tmp_path)
    result = await assert_replays(folder, agent=AGENT)
    kinds = [item.type for item in result.got]
    for expected in ("transcript.input", "tool.call", "tool.result", "session.reconnecting", "session.resumed", "turn.interrupted", "session.closed"):
        assert expected in kinds


async def test_the_replay_fails_when_the_server_behaves_differently(tmp_path, monkeypatch):
    _, folder = await record_conversation(tmp_path)
    # On purpose: the server stops telling clients that the user barged in.
    model_response = session_rules.SessionCore.model_response

    def without_interruptions(self, response, now):
        actions = model_response(self, response, now)
        return [a for a in actions if not (isinstance(a, session_rules.SendEvent) and isinstance(a.event, TurnInterrupted))]

    monkeypatch.setattr(session_rules.SessionCore, "model_response", without_interruptions)
    result = await replay(folder, agent=AGENT)
    assert not result.ok
    first = result.differences[0]
    assert first.expected.type == "turn.interrupted" and first.got.type != "turn.interrupted"
    with pytest.raises(AssertionError, match="expected turn.interrupted"):
        await assert_replays(folder, agent=AGENT)


async def test_live_replay_says_whether_a_record_still_replays(tmp_path):
    _, folder = await record_conversation(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "live.cli", "replay", str(folder), "--agent", "test_record:AGENT"],
        capture_output=True, text=True, timeout=60, cwd=str(__import__("pathlib").Path(__file__).parent),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("replay matches the record")


async def test_a_record_whose_client_left_without_hearing_session_closed_replays(tmp_path):
    """A client that sent session.close and closed its socket at once (the Python
    client did, before it waited for the answer) left a record without the
    server's session.closed: the replay, which waits for it, still matches."""
    import json

    _, folder = await record_conversation(tmp_path)
    events = folder / "events.jsonl"
    lines = events.read_text().splitlines()
    kept = [line for line in lines if json.loads(line).get("event", {}).get("type") != "session.closed"]
    assert len(kept) == len(lines) - 1
    assert any(json.loads(line).get("event", {}).get("type") == "session.close" for line in kept)
    events.write_text("\n".join(kept) + "\n")
    result = await assert_replays(folder, agent=AGENT)
    assert result.got[-1].type != "session.closed"
