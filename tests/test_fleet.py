"""Many servers, one conversation space: `live serve --redis` processes against the
Live emulator, a real `redis-server`, and a load balancer without stickiness in
front (a round-robin TCP proxy that skips servers refusing connections)."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator

import anyio
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import InvalidHandshake

from bench.balancer import round_robin as balancer
from clients.client import LiveClient, Reattaching
from connections.emulator import Script
from connections.emulator.server import running_emulator
from live import protocol as p
from serving import collect, late_tail, replies
from test_store import FLEET_KEY, RedisServer

pytestmark = pytest.mark.anyio

MODEL = "gemini-live-2.5-flash-preview"
LEASE = 1.5


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.kill()


class Serving:
    """One `live serve` process of the fleet."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "live.cli", "serve", "--port", "0", "--model", MODEL, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={"LIVE_FLEET_KEY": FLEET_KEY, **env},
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        match = re.search(r"https?://127\.0\.0\.1:(\d+)/", line)
        assert match, f"live serve did not start: {line!r} {self.proc.stderr.read() if self.proc.poll() is not None else ''}"
        self.port = int(match.group(1))

    def sessions(self) -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2) as response:
            import json

            return int(json.load(response)["sessions"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@contextlib.asynccontextmanager
async def fleet(redis: RedisServer, count: int, *extra: str) -> AsyncIterator[tuple[object, list[Serving], str]]:
    async with running_emulator(Script(speed=20)) as emu:
        env = emu.environment()
        servers = [
            Serving(env, "--redis", redis.url, "--fleet-lease", str(LEASE), *extra) for _ in range(count)
        ]
        try:
            async with balancer([s.port for s in servers]) as port:
                yield emu, servers, f"ws://127.0.0.1:{port}/live"
        finally:
            for server in servers:
                server.stop()


async def say(client: LiveClient, text: str) -> list:
    await client.send_text(text)
    events = await collect(client, lambda e: isinstance(e, p.TurnComplete) and e.reason is None, timeout=30)
    return events + await late_tail(client)


def said(events: list, text: str) -> bool:
    return text in replies(events)


def holder(servers: list[Serving]) -> Serving:
    [server] = [s for s in servers if s.proc.poll() is None and s.sessions() > 0]
    return server


async def test_a_server_killed_mid_conversation_is_taken_over_by_another(redis):
    async with fleet(redis, 2) as (emu, servers, url), LiveClient.connect(url) as client:
        assert said(await say(client, "one"), "You said: one.")
        await anyio.sleep(LEASE / 2)  # the facts with the newest handle are in Redis
        first = holder(servers)
        killed = time.monotonic()
        first.proc.send_signal(signal.SIGKILL)
        # What a client sends into a socket that is dying is lost with it; the
        # client learns of the drop, reattaches through the balancer, and goes on.
        events = await collect(client, lambda e: isinstance(e, p.SessionReattached), timeout=30)
        back = time.monotonic() - killed
        assert any(isinstance(e, Reattaching) for e in events)
        events = await say(client, "two")
        took = time.monotonic() - killed
        print(f"\nfrom a server's death: reattached after {back:.2f} s, next answer after {took:.2f} s (lease {LEASE} s)")
        assert said(events, "You said: two.")
        second = holder(servers)
        assert second is not first
    resumed = [s for s in emu.sessions if s.resumed_from]
    assert resumed and resumed[-1].resumed_from in emu.sessions[0].handles  # the same Gemini session
    assert resumed[-1].user_turns == ["two"]


async def test_a_holder_killed_right_after_a_reattach_is_taken_over_with_the_clients_new_token(redis):
    """The client's network blips, it reattaches to the server holding its
    session and gets a new resume token; that server dies the moment after.
    The server taking over accepts the token the client holds, and the spent
    one from nobody (here: someone who copied it)."""
    async with fleet(redis, 2) as (emu, servers, url), LiveClient.connect(url) as client:
        assert said(await say(client, "one"), "You said: one.")
        first = holder(servers)
        spent = client.session.resume_token
        client._ws.transport.abort()  # the network goes away: no close frame
        async for event in client.events():
            if isinstance(event, p.SessionReattached):
                first.proc.send_signal(signal.SIGKILL)  # before its next heartbeat
                break
        assert client.session.resume_token != spent

        answers: list[str] = []

        async def copied_token() -> None:
            resume = {"type": "session.resume", "session_id": client.session.session_id, "resume_token": spent}
            while True:  # as a client would: the balancer may first pick the dead server
                try:
                    async with ws_connect(url) as ws:
                        await ws.send(json.dumps(resume))
                        event = p.parse_server_event(await ws.recv())
                except (OSError, InvalidHandshake):
                    await anyio.sleep(0.2)
                    continue
                answers.append(event.code if isinstance(event, p.ErrorEvent) else type(event).__name__)
                return

        async with anyio.create_task_group() as tg:
            tg.start_soon(copied_token)
            await collect(client, lambda e: isinstance(e, p.SessionReattached), timeout=30)
        assert answers == ["unauthorized"]
        assert said(await say(client, "two"), "You said: two.")
        assert holder(servers) is not first
    resumed = [s for s in emu.sessions if s.resumed_from]
    assert resumed and resumed[-1].user_turns == ["two"]


async def test_a_takeover_whose_stored_handle_is_refused_starts_fresh_from_the_stored_transcript(redis):
    """The dead server's handle resumes nothing (expired, or the service lost
    the session): the server taking over seeds a fresh connection with the
    conversation instead of ending it."""
    async with fleet(redis, 2) as (emu, servers, url), LiveClient.connect(url) as client:
        assert said(await say(client, "one"), "You said: one.")
        await anyio.sleep(LEASE / 2)
        first = holder(servers)
        first.proc.send_signal(signal.SIGKILL)
        emu.forget_handles()
        await collect(client, lambda e: isinstance(e, p.SessionReattached), timeout=30)
        assert said(await say(client, "two"), "You said: two.")
    [fresh] = [s for s in emu.sessions[1:] if s.resumed_from is None and s.user_turns]
    assert fresh.user_turns[-1] == "two"
    seeded = json.dumps(fresh.frames)
    assert "one" in seeded and "You said: one." in seeded  # the conversation so far went first


async def test_sigterm_drains_and_no_conversation_is_lost(redis):
    async with fleet(redis, 2) as (emu, servers, url), LiveClient.connect(url) as client:
        assert said(await say(client, "one"), "You said: one.")
        first = holder(servers)
        first.proc.send_signal(signal.SIGTERM)
        events = await collect(client, lambda e: isinstance(e, p.SessionReattached), timeout=20)
        assert any(isinstance(e, p.SessionGoAway) for e in events)
        assert first.proc.wait(timeout=20) == 0
        assert said(await say(client, "two"), "You said: two.")
        assert holder(servers) is not first
    assert any(s.resumed_from in emu.sessions[0].handles for s in emu.sessions[1:])


async def test_the_global_limit_holds_across_servers_and_recovers_after_a_death(redis):
    """A dead server's session keeps its slot while it may still be taken over
    (the lease, then the reattach grace), then the slot comes back."""
    async with fleet(redis, 2, "--max-sessions-global", "1", "--reattach-grace", "1") as (_, servers, url):
        async with LiveClient.connect(url, reattach_for=0) as first_client:
            first = holder(servers)
            with pytest.raises(Exception) as refused:
                async with LiveClient.connect(url):
                    pass
            assert "capacity" in str(refused.value)
            first.proc.send_signal(signal.SIGKILL)
            with anyio.fail_after(LEASE * 4 + 1 + 5):
                while True:
                    try:
                        async with LiveClient.connect(url, reattach_for=0) as again:
                            assert again.session.session_id != first_client.session.session_id
                            break
                    except Exception:
                        await anyio.sleep(0.3)


def test_redis_unreachable_at_start_is_a_one_line_error():
    port = RedisServer().port  # nothing listens there
    proc = subprocess.run(
        [sys.executable, "-m", "live.cli", "serve", "--port", "0", "--redis", f"redis://:hunter2@127.0.0.1:{port}/0",
         "--fleet-key", FLEET_KEY],
        capture_output=True, text=True, timeout=30,
    )
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Redis" in lines[0] and str(port) in lines[0]
    assert "hunter2" not in proc.stderr


async def test_redis_holds_no_conversation_text_nor_model_handle_in_clear(redis):
    """Whoever reads Redis (or a copy of it) learns neither what was said nor
    the handle that resumes the model's session; the fleet still carries the
    conversation on from what it holds."""
    import redis as redis_py

    async with fleet(redis, 2) as (emu, servers, url), LiveClient.connect(url) as client:
        assert said(await say(client, "my locker code is 4711"), "You said: my locker code is 4711.")
        await anyio.sleep(LEASE / 2)  # the facts with the newest handle are in Redis
        raw = redis_py.Redis(port=redis.port, decode_responses=True)
        try:
            held = []
            for key in raw.scan_iter():
                kind = raw.type(key)
                held += [key, raw.get(key) if kind == "string" else json.dumps(raw.zrange(key, 0, -1))]
        finally:
            raw.close()
        text = "\n".join(held)
        assert f"state:{client.session.session_id}" in text  # its facts are there
        assert "4711" not in text and "locker" not in text
        handles = emu.sessions[0].handles
        assert handles and not any(handle in text for handle in handles)
        holder(servers).proc.send_signal(signal.SIGKILL)
        await collect(client, lambda e: isinstance(e, p.SessionReattached), timeout=30)
        assert said(await say(client, "two"), "You said: two.")
    assert any(s.resumed_from in handles for s in emu.sessions[1:])


def test_a_fleet_server_without_a_key_does_not_start():
    """Without --fleet-key, Redis would hold every conversation in clear: a
    server of a fleet says what it needs, in one line, and does not start."""
    import os

    port = RedisServer().port
    environment = {k: v for k, v in os.environ.items() if k != "LIVE_FLEET_KEY"}
    for extra, words in (([], "--redis needs --fleet-key"), (["--fleet-key", "too-short"], "at least 32 bytes")):
        proc = subprocess.run(
            [sys.executable, "-m", "live.cli", "serve", "--port", "0", "--redis", f"redis://127.0.0.1:{port}/0", *extra],
            capture_output=True, text=True, timeout=30, env=environment,
        )
        assert proc.returncode == 2
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0], lines
        assert "too-short" not in proc.stderr


async def test_redis_lost_mid_run_degrades_to_one_server_with_a_warning(redis):
    async with fleet(redis, 1) as (_, servers, url), LiveClient.connect(url) as client:
        assert said(await say(client, "one"), "You said: one.")
        redis.kill()
        await anyio.sleep(LEASE)
        assert said(await say(client, "two"), "You said: two.")
        assert servers[0].proc.poll() is None
        servers[0].proc.send_signal(signal.SIGTERM)
        assert servers[0].proc.wait(timeout=20) == 0
        log = servers[0].proc.stderr.read()
    assert "shared store unavailable" in log and "single server" in log
    assert "Traceback" not in log
