"""Reattach: a client whose socket drops comes back to the same conversation."""

from __future__ import annotations

import json
import time

import anyio
import pytest
from websockets.asyncio.client import connect as ws_connect

from clients.client import AudioFrame, ConnectionLost, LiveClient, Reattaching
from connections import double
from connections.gemini import Gemini
from live import protocol as p
from live.agent import Agent
from live.access.auth import mint_token
from live.access.reattach import ReplayBuffer, token_digest, token_matches, with_seq
from serving import collect, running

# Every test on both WebSocket layers the server can listen with.
pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("both_socket_layers")]

AGENT = Agent(name="a", model="gemini-2.5-flash")


def gemini(*sessions) -> Gemini:
    return Gemini("gemini-2.5-flash", transport=double.DoubleTransport(*sessions))


def cut(client: LiveClient) -> None:
    """The client's network goes away: no close frame, nothing more arrives."""
    client._ws.transport.abort()


def story(n: int) -> list:
    """A reply told in `n` pieces, a little apart, so a cut lands in the middle."""
    out: list = []
    for i in range(n):
        out += [double.Pause(0.03), double.output_transcript(f"part{i} "), double.audio(bytes([i, 0]) * 240)]
    return [*out, double.turn_complete()]


async def test_a_cut_socket_reattaches_and_misses_no_event():
    session = double.ScriptedSession(double.resumption_update("h1"))
    session.on_client_content(*story(20))
    async with running(AGENT, gemini(session)) as (server, url), LiveClient.connect(url) as client:
        assert client.session.resume_token
        await client.send_text("Tell me a story")
        seen: list = []
        async for event in client.events():
            seen.append(event)
            if isinstance(event, p.TranscriptOutput) and event.text == "part5 ":
                cut(client)
            if isinstance(event, p.TurnComplete):
                break
        assert client.reattaches == 1
        assert server.live_sessions  # the same session goes on
        assert len(session.sent) == 1  # one model connection, no replay upstream
    news = [e for e in seen if isinstance(e, (Reattaching, p.SessionReattached))]
    assert isinstance(news[0], Reattaching) and isinstance(news[-1], p.SessionReattached)
    parts = [e.text for e in seen if isinstance(e, p.TranscriptOutput) and not e.final]
    assert parts == [f"part{i} " for i in range(20)]  # every piece, once, in order
    audio = [e.data[0] for e in seen if isinstance(e, AudioFrame)]
    assert audio == list(range(20))


async def test_a_wrong_token_is_unauthorized_and_an_unknown_session_expired():
    session = double.ScriptedSession(double.resumption_update("h1"))
    async with running(AGENT, gemini(session)) as (_, url), LiveClient.connect(url) as client:
        for message, code in [
            ({"session_id": client.session.session_id, "resume_token": "guess"}, "unauthorized"),
            ({"session_id": "nope", "resume_token": client.session.resume_token}, "session_expired"),
        ]:
            async with ws_connect(url) as ws:
                await ws.send(json.dumps({"type": "session.resume", **message}))
                event = p.parse_server_event(await ws.recv())
                assert isinstance(event, p.ErrorEvent) and event.code == code and event.fatal
                assert client.session.resume_token not in event.message
        # The real session is untouched by either attempt.
        await client.send_text("still here?")


async def test_a_client_that_stays_away_past_the_grace_loses_the_session():
    session = double.ScriptedSession(double.resumption_update("h1"))
    async with running(AGENT, gemini(session), reattach_grace=0.3) as (server, url):
        async with LiveClient.connect(url, reattach_for=0) as client:
            cut(client)
            with pytest.raises(ConnectionLost):
                async for _ in client.events():
                    pass
            with anyio.fail_after(2):
                await session.wait_closed()  # the model connection is released after the grace
            async with ws_connect(url) as ws:
                await ws.send(p.encode(p.SessionResume(client.session.session_id, client.session.resume_token)))
                event = p.parse_server_event(await ws.recv())
            assert event.code == "session_expired"


async def test_a_newer_socket_takes_over_from_one_whose_drop_was_not_noticed():
    session = double.ScriptedSession(double.resumption_update("h1"))
    session.on_client_content(double.output_transcript("Hello there."), double.turn_complete(), times=None)
    async with running(AGENT, gemini(session)) as (server, url), LiveClient.connect(url) as client:
        async with ws_connect(url) as ws:
            await ws.send(p.encode(p.SessionResume(client.session.session_id, client.session.resume_token, 0)))
            reattached = p.parse_server_event(await ws.recv())
            assert isinstance(reattached, p.SessionReattached)
            await ws.send(p.encode(p.Text("hi")))
            texts = []
            while not texts or texts[-1] != "turn.complete":
                frame = await ws.recv()
                if isinstance(frame, str):
                    texts.append(json.loads(frame)["type"])
            assert "transcript.output" in texts
        # The old socket was let go by the server.
        with anyio.fail_after(2):
            await client._ws.wait_closed()


def test_the_replay_buffer_drops_reply_audio_before_events():
    buffer = ReplayBuffer(max_audio_bytes=1000, max_events=3)
    for i in range(4):
        buffer.add(with_seq('{"type":"x"}', i + 1))
        buffer.add(b"\0" * 400)
    frames, missed = buffer.after(0)
    assert [f for f in frames if isinstance(f, str)] == [with_seq('{"type":"x"}', n) for n in (2, 3, 4)]
    assert sum(1 for f in frames if isinstance(f, bytes)) == 2  # 800 of 1000 bytes kept
    assert missed == 3 and len(frames) == 5
    assert buffer.after(buffer.last_seq) == ([], 0)


def test_resume_tokens_are_kept_as_digests_only():
    assert token_matches("abc", token_digest("abc")) and not token_matches("abd", token_digest("abc"))
    assert "abc" not in token_digest("abc")


async def test_a_resume_token_works_once_and_the_next_comes_with_session_reattached():
    session = double.ScriptedSession(double.resumption_update("h1"))
    session.on_client_content(double.output_transcript("Hello there."), double.turn_complete(), times=None)
    async with running(AGENT, gemini(session)) as (server, url), LiveClient.connect(url) as client:
        first = client.session.resume_token
        cut(client)
        await collect(client, lambda e: isinstance(e, p.SessionReattached))
        second = client.session.resume_token
        assert second and second != first
        # The token a leak would give away no longer opens the conversation.
        async with ws_connect(url) as ws:
            await ws.send(p.encode(p.SessionResume(client.session.session_id, first)))
            event = p.parse_server_event(await ws.recv())
            assert isinstance(event, p.ErrorEvent) and event.code == "unauthorized"
        await client.send_text("still mine?")
        await collect(client, lambda e: isinstance(e, p.TurnComplete))
        assert client.reattaches == 1 and len(server.sessions) == 1  # one conversation, counted once


async def test_a_resume_needs_a_token_for_the_subject_that_started_the_session():
    secret = "a-test-secret-that-is-long-enough-for-hs256"
    session = double.ScriptedSession(double.resumption_update("h1"))
    async with running(AGENT, gemini(session), token_secret=secret) as (server, url):
        tokens = iter(mint_token(secret, subject="ann", ttl=60) for _ in range(10))
        async with LiveClient.connect(url, token=lambda: next(tokens)) as client:
            sid = client.session.session_id
            for token, why in ((None, "needs a token"), (mint_token(secret, subject="eve"), "does not match")):
                async with ws_connect(url) as ws:
                    await ws.send(p.encode(p.SessionResume(sid, client.session.resume_token, 0, token)))
                    event = p.parse_server_event(await ws.recv())
                    assert event.code == "unauthorized" and why in event.message, event
            # Ann's client comes back with a fresh token of hers by itself.
            cut(client)
            seen = await collect(client, lambda e: isinstance(e, p.SessionReattached))
            assert client.reattaches == 1 and seen
            assert len(server.sessions) == 1  # one conversation, counted once


async def test_after_a_replay_that_lost_frames_the_client_counts_them():
    """`missed` frames are numbered all the same: the next resume starts after them."""
    session = double.ScriptedSession(double.resumption_update("h1"))
    chunk = b"\x01\x00" * 240  # 10 ms
    reply = [double.audio(chunk), double.Pause(0.2)]
    for _ in range(30):
        reply += [double.audio(chunk), double.Pause(0.01)]  # each its own frame
    session.on_client_content(*reply, double.Pause(1.0), double.turn_complete())
    async with (
        running(AGENT, gemini(session), reattach_audio_seconds=0.1) as (server, url),
        LiveClient.connect(url) as client,
    ):
        await client.send_text("talk")
        await collect(client, lambda e: isinstance(e, AudioFrame))
        cut(client)
        replay = server.live_sessions[client.session.session_id].client.replay
        with anyio.fail_after(5):  # the rest of the reply overflows what is kept for a replay
            while replay.last_seq < client.last_seq + 30:
                await anyio.sleep(0.02)
        seen: list = []
        with anyio.fail_after(5):
            async for event in client.events():
                seen.append(event)
                news = next((e for e in seen if isinstance(e, p.SessionReattached)), None)
                if news is not None and len(seen) - seen.index(news) - 1 == news.replayed:
                    break
        assert news.missed > 0 and news.replayed > 0
        # Every frame of the replay was audio: only the client's count says where it is.
        assert client.last_seq == replay.last_seq


async def test_a_normal_close_ends_the_session_at_once_a_cut_keeps_it():
    session = double.ScriptedSession(double.resumption_update("h1"))
    async with running(AGENT, gemini(session), reattach_grace=30) as (server, url):
        async with ws_connect(url) as ws:
            await ws.send(p.encode(p.SessionStart()))
            assert p.parse_server_event(await ws.recv()).type == "session.started"
        # Closed with 1000 and no session.close: the slot and the model connection go now.
        with anyio.fail_after(2):
            await session.wait_closed()
            while server.sessions or server.live_sessions:
                await anyio.sleep(0.02)
    # session.close, the socket left open: the same, at once.
    closing = double.ScriptedSession(double.resumption_update("h3"))
    async with running(AGENT, gemini(closing), reattach_grace=30) as (server, url), ws_connect(url) as ws:
        await ws.send(p.encode(p.SessionStart()))
        await ws.recv()
        await ws.send(p.encode(p.SessionClose()))
        with anyio.fail_after(2):
            await closing.wait_closed()
            while server.sessions or server.live_sessions:
                await anyio.sleep(0.02)
    # Going away (1001) or any other close: the session waits for the client.
    for code in (1001, 4000):
        other = double.ScriptedSession(double.resumption_update("h2"))
        async with running(AGENT, gemini(other), reattach_grace=30) as (server, url):
            ws = await ws_connect(url)
            await ws.send(p.encode(p.SessionStart()))
            await ws.recv()
            await ws.close(code)
            await anyio.sleep(0.3)
            assert len(server.live_sessions) == 1, code  # waiting for the client to come back


async def test_a_resume_relayed_to_the_server_holding_the_session_is_authorized_there():
    """Behind a balancer the resume may land on another server of the fleet, which
    relays it to the holder: the token the client sent on its handshake goes along."""
    from live.fleet.member import Fleet
    from live.registry import default_registry
    from live.server.port import LiveServer, ServerConfig
    from live.fleet.store import MemoryStore

    secret = "a-test-secret-that-is-long-enough-for-hs256"
    store = MemoryStore()
    agent = Agent(name="a", model="local/echo")
    servers = [
        LiveServer(
            agent,
            default_registry().resolve("local/echo"),
            ServerConfig(port=0, token_secret=secret, audio_lead=None),
            fleet=Fleet(store, address=""),
        )
        for _ in range(2)
    ]
    async with anyio.create_task_group() as tg:
        ports = [await tg.start(server.serve) for server in servers]
        holder_url, other_url = (f"ws://127.0.0.1:{port}/live" for port in ports)
        token = mint_token(secret, subject="ann", ttl=60)
        async with LiveClient.connect(holder_url, token=token, reattach_for=0) as client:
            sid = client.session.session_id
            with anyio.fail_after(5):
                while (await servers[1].fleet.locate(sid))[0] is None:
                    await anyio.sleep(0.05)
            for headers, expected in (({}, "error"), ({"Authorization": f"Bearer {token}"}, "session.reattached")):
                async with ws_connect(other_url, additional_headers=headers) as ws:
                    await ws.send(p.encode(p.SessionResume(sid, client.session.resume_token, client.last_seq)))
                    with anyio.fail_after(5):
                        event = json.loads(await ws.recv())
                    assert event["type"] == expected, event
                    if expected == "error":
                        assert event["code"] == "unauthorized"
        for server in servers:
            server.stop()


async def test_a_tokens_max_duration_still_counts_from_the_start_after_a_reattach():
    secret = "a-test-secret-that-is-long-enough-for-hs256"
    session = double.ScriptedSession(double.resumption_update("h1"))
    async with running(AGENT, gemini(session), token_secret=secret) as (_, url):
        token = mint_token(secret, subject="ann", max_duration=1.0)
        async with LiveClient.connect(url, token=token) as client:
            started = time.monotonic()
            await anyio.sleep(0.3)
            cut(client)
            seen = await collect(client, lambda e: isinstance(e, p.SessionClosed), timeout=5)
            lasted = time.monotonic() - started
    assert any(isinstance(e, p.SessionReattached) for e in seen)
    error = next(e for e in seen if isinstance(e, p.ErrorEvent))
    assert error.code == "session_expired" and "max_duration" in error.message
    assert 0.9 < lasted < 1.8  # not a new second from the reattach


async def test_a_session_taken_over_by_another_server_keeps_its_users_and_its_max_duration():
    from live.fleet.member import Fleet
    from live.registry import default_registry
    from live.server.port import LiveServer, ServerConfig
    from live.fleet.store import MemoryStore

    secret = "a-test-secret-that-is-long-enough-for-hs256"
    store = MemoryStore()
    agent = Agent(name="a", model="local/echo")
    servers = [
        LiveServer(
            agent,
            default_registry().resolve("local/echo"),
            ServerConfig(port=0, token_secret=secret, audio_lead=None, drain_timeout=1),
            fleet=Fleet(store, address=""),
        )
        for _ in range(2)
    ]
    async with anyio.create_task_group() as tg:
        first_url, second_url = [f"ws://127.0.0.1:{await tg.start(s.serve)}/live" for s in servers]
        token = mint_token(secret, subject="ann", ttl=60, max_duration=2.0)
        async with LiveClient.connect(first_url, token=token, reattach_for=0) as client:
            started = time.monotonic()
            sid, resume_token = client.session.session_id, client.session.resume_token
            await anyio.sleep(0.5)
            servers[0].stop()  # drains: the session goes to the fleet
            with anyio.fail_after(5):
                while servers[0].live_sessions:
                    await anyio.sleep(0.05)
            async with ws_connect(second_url) as ws:  # someone else, with the resume token alone
                eve = mint_token(secret, subject="eve", ttl=60)
                await ws.send(p.encode(p.SessionResume(sid, resume_token, client.last_seq, eve)))
                assert json.loads(await ws.recv())["code"] == "unauthorized"
            async with ws_connect(second_url) as ws:
                # A fresh token of hers, with a longer limit of its own: the session's stays.
                fresh = mint_token(secret, subject="ann", ttl=60, max_duration=30)
                await ws.send(p.encode(p.SessionResume(sid, resume_token, client.last_seq, fresh)))
                with anyio.fail_after(5):
                    reattached = json.loads(await ws.recv())
                assert reattached["type"] == "session.reattached", reattached
                assert reattached["resume_token"] != resume_token
                with anyio.fail_after(5):
                    while True:
                        event = json.loads(await ws.recv())
                        if event.get("code") == "session_expired":
                            break
                lasted = time.monotonic() - started
                assert "max_duration" in event["message"]
        assert 1.8 < lasted < 3.0  # from the start on the first server, not from the takeover
        servers[1].stop()
