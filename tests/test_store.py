"""The shared session store: one contract, held by the in-process store and by a real
Redis (a `redis-server` this suite starts on a free port)."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import anyio
import pytest

from live.fleet.store import (
    FactsKey,
    MemoryStore,
    RedisStore,
    SessionStore,
    StoreError,
    StoreUnavailable,
    open_store,
    redact_url,
)

pytestmark = pytest.mark.anyio


# The secret a test fleet's servers share (`live serve --fleet-key`).
FLEET_KEY = "a-fleet-key-every-test-server-shares"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _pings(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """A throwaway `redis-server`: no persistence, loopback only."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or _free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed: run ./test, which installs Debian's redis-server"
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not _pings(self.port):
            assert self.process.poll() is None, f"redis-server exited with {self.process.returncode}"
            assert time.monotonic() < deadline, "redis-server did not answer PING within 10 s"
            time.sleep(0.02)
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # in case a test froze it
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def redis_of_its_own() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.kill()


Servers = Callable[[], Awaitable[SessionStore]]


@pytest.fixture(params=["memory", "redis"])
async def servers(request: pytest.FixtureRequest) -> AsyncIterator[Servers]:
    """Makes the store as one more server sees it: for Redis, a client of its own
    on the same Redis; in one process, the same store."""
    opened: list[SessionStore] = []
    if request.param == "memory":
        memory = MemoryStore()

        async def new() -> SessionStore:
            return memory
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        prefix = f"test-{uuid.uuid4().hex[:8]}:"  # each test its own key space

        async def new() -> SessionStore:
            store = await RedisStore.connect(server.url, prefix=prefix)
            opened.append(store)
            return store

    try:
        yield new
    finally:
        for store in opened:
            await store.aclose()


async def test_a_claimed_session_has_one_holder_until_it_is_released(servers: Servers) -> None:
    a, b = await servers(), await servers()
    assert await a.claim("s1", "A", 5)
    assert await a.claim("s1", "A", 5), "claiming again what one holds is fine"
    assert not await b.claim("s1", "B", 5)
    assert not await b.take_over("s1", "B", 5), "the holder is alive"
    assert await b.holder("s1") == "A"
    assert await a.holder("unknown") is None

    assert 4 < await b.lease_left("s1") <= 5, "a waiting server wakes when the lease runs out"
    assert await b.lease_left("unknown") == 0
    assert not await b.release("s1", "B"), "only the holder can release"
    assert await a.holder("s1") == "A"
    assert await a.release("s1", "A")
    assert await b.holder("s1") is None
    assert not await a.release("s1", "A")
    assert await b.claim("s1", "B", 5)
    assert await a.holder("s1") == "B"


async def test_heartbeat_keeps_held_leases_and_names_the_lost_ones(servers: Servers) -> None:
    a, b = await servers(), await servers()
    assert await a.claim("kept", "A", 1.0)
    assert await b.claim("theirs", "B", 5)
    assert await a.heartbeat("A", [], 1.0) == set()
    await anyio.sleep(0.6)
    assert await a.heartbeat("A", ["kept", "theirs", "never"], 1.0) == {"theirs", "never"}
    await anyio.sleep(0.6)  # past the first lease, within the renewed one
    assert await b.holder("kept") == "A"
    assert await b.holder("theirs") == "B", "a heartbeat does not touch others' leases"


async def test_an_expired_lease_frees_the_session_for_another_server(servers: Servers) -> None:
    a, b = await servers(), await servers()
    assert await a.claim("s1", "A", 0.2)
    assert not await b.take_over("s1", "B", 5)
    await anyio.sleep(0.4)  # A died: it stopped renewing
    assert await b.holder("s1") is None
    assert await b.take_over("s1", "B", 5)
    assert await a.holder("s1") == "B"
    assert not await a.claim("s1", "A", 5), "a server back from the dead does not win it back"
    assert await a.heartbeat("A", ["s1"], 5) == {"s1"}
    assert await b.holder("s1") == "B"


async def test_state_round_trips_as_json_and_expires(servers: Servers) -> None:
    a, b = await servers(), await servers()
    state = {
        "agent": "weather",
        "model": "gemini-live",
        "handle": "h-123",
        "pending_tools": [{"id": "c1", "name": "get_weather", "outcome": {"temp": 21.5}}],
        "owed_turn": None,
        "input_rate": 16000,
        "token_sha256": "ab" * 32,
    }
    await a.save_state("s1", state, 0.5)
    state["handle"] = "changed afterwards"
    loaded = await b.load_state("s1")
    assert loaded is not None and loaded["handle"] == "h-123"
    assert loaded["pending_tools"] == [{"id": "c1", "name": "get_weather", "outcome": {"temp": 21.5}}]
    assert loaded["owed_turn"] is None
    await anyio.sleep(0.7)
    assert await b.load_state("s1") is None, "state outlives its TTL"

    await a.save_state("s2", {"n": 1}, 5)
    await a.save_state("s2", {"n": 2}, 5)
    assert await b.load_state("s2") == {"n": 2}
    await b.delete_state("s2")
    assert await a.load_state("s2") is None
    assert await a.load_state("never") is None

    with pytest.raises(TypeError):
        await a.save_state("s3", {"not json": {1, 2}}, 5)
    with pytest.raises(ValueError):
        await a.save_state("s3", {"nan": float("nan")}, 5)
    with pytest.raises(ValueError):
        await a.save_state("s3", {}, 0)
    assert await b.load_state("s3") is None


async def test_a_server_is_findable_while_it_announces_itself(servers: Servers) -> None:
    a, b = await servers(), await servers()
    await a.announce("A", "ws://10.0.0.1:8765/live", 0.3)
    assert await b.server_address("A") == "ws://10.0.0.1:8765/live"
    assert await b.server_address("Z") is None
    await anyio.sleep(0.5)
    assert await b.server_address("A") is None, "it stopped announcing: dead"
    await a.announce("A", "ws://10.0.0.1:8765/live", 5)
    await a.retire("A")
    assert await b.server_address("A") is None


async def test_the_global_limit_holds_under_concurrent_servers(servers: Servers) -> None:
    fleet = {name: await servers() for name in ("A", "B", "C")}
    wanted = [(name, f"{name}-{i}") for i in range(10) for name in fleet]
    granted = await asyncio.gather(*(fleet[name].acquire_slot(session, 7, 10) for name, session in wanted))
    assert sum(granted) == 7
    assert await fleet["A"].slots_in_use() == 7
    server, winner = next(want for want, ok in zip(wanted, granted) if ok)
    assert await fleet[server].acquire_slot(winner, 7, 10), "a session's own slot again"
    assert not await fleet["A"].acquire_slot("late", 7, 10)

    await fleet[server].release_slot(winner)
    assert await fleet["B"].slots_in_use() == 6
    assert await fleet["A"].acquire_slot("late", 7, 10)
    assert not await fleet["C"].acquire_slot("later", 7, 10)


async def test_a_dead_servers_slots_stay_while_its_sessions_may_be_taken_over(servers: Servers) -> None:
    """A server that dies stops pushing its slots' expiry on: they stay counted
    for as long as another server may take its sessions over, then come back."""
    a, b = await servers(), await servers()
    for i in range(3):
        assert await a.acquire_slot(f"a{i}", 4, 0.4)
    assert await b.acquire_slot("b0", 4, 10)
    assert not await b.acquire_slot("b1", 4, 10), "A's sessions still count"
    await b.hold_slots(["a0"], 10)  # B took one of A's sessions over: always room for it
    await anyio.sleep(0.5)  # nobody took the others over in time
    assert await b.slots_in_use() == 2
    assert await b.acquire_slot("b1", 4, 10)
    assert await b.slots_in_use() == 3


async def test_a_session_counts_once_and_held_slots_come_back_after_a_store_emptied(servers: Servers) -> None:
    a, b = await servers(), await servers()
    assert await a.acquire_slot("s1", 2, 10)
    assert await b.acquire_slot("s1", 2, 10), "the same conversation, counted once"
    assert await a.slots_in_use() == 1
    assert await a.acquire_slot("s2", 2, 10)
    assert not await a.acquire_slot("s3", 2, 10)
    await a.release_slot("s1")
    await a.release_slot("s2")
    await a.hold_slots(["s1", "s2"], 10)  # a heartbeat after Redis restarted empty
    assert await a.slots_in_use() == 2
    assert not await b.acquire_slot("s3", 2, 10)


async def test_a_tokens_uses_are_counted_once_across_servers_until_it_expires(servers: Servers) -> None:
    a, b = await servers(), await servers()
    assert await a.token_uses("jti-1") == 0
    assert await a.spend_use("jti-1", 1, 0.3)
    assert await b.token_uses("jti-1") == 1
    assert not await b.spend_use("jti-1", 1, 0.3), "spent, whichever server asks"
    assert not await a.spend_use("jti-1", 1, 0.3)
    assert await a.spend_use("jti-2", 2, 10) and await b.spend_use("jti-2", 2, 10)
    assert not await a.spend_use("jti-2", 2, 10)
    await anyio.sleep(0.4)  # the token expired: what it counted goes with it
    assert await b.spend_use("jti-1", 1, 10)


async def test_release_deletes_the_state_only_for_the_holder(servers: Servers) -> None:
    """A server whose session another server took over must not delete the
    facts the new holder carries it on with."""
    a, b = await servers(), await servers()
    assert await a.claim("s1", "A", 0.2)
    await a.save_state("s1", {"handle": "h1"}, 60)
    await anyio.sleep(0.3)  # A's lease ran out ...
    assert await b.take_over("s1", "B", 5)  # ... and B carries the session on
    assert not await a.release("s1", "A", delete_state=True)
    assert await b.load_state("s1") == {"handle": "h1"}
    assert await b.release("s1", "B", delete_state=True)
    assert await a.load_state("s1") is None


async def test_a_heartbeat_keeps_the_facts_of_held_sessions_alive(servers: Servers) -> None:
    a = await servers()
    assert await a.claim("s1", "A", 5)
    await a.save_state("s1", {"n": 1}, 0.3)
    await a.save_state("s2", {"n": 2}, 0.3)  # not held: its facts run out
    for _ in range(3):
        await anyio.sleep(0.15)
        assert await a.heartbeat("A", ["s1"], 5, state_ttl=0.3) == set()
    assert await a.load_state("s1") == {"n": 1}
    assert await a.load_state("s2") is None


async def test_bad_arguments_are_refused_before_reaching_the_store(servers: Servers) -> None:
    a = await servers()
    await a.announce("A", "ws://a/live", 10)
    with pytest.raises(ValueError):
        await a.claim("s1", "A", 0)
    with pytest.raises(ValueError):
        await a.claim("s1", "A", float("inf"))
    with pytest.raises(ValueError):
        await a.acquire_slot("s1", -1, 10)
    assert await a.holder("s1") is None
    assert not await a.acquire_slot("s1", 0, 10), "a limit of 0 admits nobody"


async def test_open_store_without_a_url_is_the_in_process_store() -> None:
    async with await open_store(None, facts_key=None) as store:
        assert isinstance(store, MemoryStore)


async def test_unreachable_redis_at_start_is_one_line_without_the_password() -> None:
    port = _free_port()
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as caught:
        await open_store(f"redis://:hunter2@127.0.0.1:{port}/0", facts_key=None)
    message = str(caught.value)
    assert message == f"cannot reach Redis at redis://:***@127.0.0.1:{port}/0: Connection refused"
    assert "hunter2" not in repr(caught.value)
    assert time.monotonic() - started < 5

    with pytest.raises(StoreError) as caught:
        await open_store("http://user:hunter2@example/", facts_key=None)
    assert "not a Redis URL" in str(caught.value) and "hunter2" not in str(caught.value)
    assert "\n" not in str(caught.value)


def test_redacted_urls_keep_everything_but_the_password() -> None:
    assert redact_url("redis://u:p4ss@host:6379/2") == "redis://u:***@host:6379/2"
    assert redact_url("rediss://:p4ss@[::1]:6380") == "rediss://:***@[::1]:6380"
    assert redact_url("redis://host:6379/0") == "redis://host:6379/0"


async def test_redis_lost_mid_run_raises_unavailable_promptly_and_recovers(redis_of_its_own: RedisServer) -> None:
    store = await RedisStore.connect(redis_of_its_own.url)
    try:
        await store.announce("A", "ws://a/live", 10)
        assert await store.claim("s1", "A", 10)
        redis_of_its_own.kill()
        calls = [
            store.claim("s1", "A", 10),
            store.heartbeat("A", ["s1"], 10),
            store.holder("s1"),
            store.save_state("s1", {"x": 1}, 10),
            store.load_state("s1"),
            store.acquire_slot("s1", 5, 10),
            store.announce("A", "ws://a/live", 10),
        ]
        for call in calls:
            with anyio.fail_after(5):  # a hang, not a speed figure
                with pytest.raises(StoreUnavailable, match=r"cannot reach Redis at redis://127\.0\.0\.1:\d+/0: "):
                    await call

        # Redis comes back (empty: no persistence): the same store works again.
        redis_of_its_own.start()
        with anyio.fail_after(5):
            assert await store.holder("s1") is None
            assert await store.claim("s1", "A", 10)
    finally:
        await store.aclose()


async def test_a_frozen_redis_raises_unavailable_instead_of_hanging(redis_of_its_own: RedisServer) -> None:
    store = await RedisStore.connect(redis_of_its_own.url, timeout=0.5)
    try:
        assert await store.claim("s1", "A", 10)
        assert redis_of_its_own.process is not None
        redis_of_its_own.process.send_signal(signal.SIGSTOP)
        with anyio.fail_after(5):
            with pytest.raises(StoreUnavailable, match="timed out"):
                await store.holder("s1")
        redis_of_its_own.process.send_signal(signal.SIGCONT)
        with anyio.fail_after(5):
            assert await store.holder("s1") == "A"
    finally:
        await store.aclose()


async def test_facts_reach_redis_sealed_and_open_only_with_the_fleets_key(redis_server: RedisServer) -> None:
    """What Redis holds of a conversation is unreadable without the key, bound
    to its session, and refused when altered; a second key opens the facts
    the first one sealed (a fleet changing keys)."""
    import redis as redis_py

    facts = {"core": {"handle": "gemini-handle-42", "transcript": [["user", "my card is 4111"]]}}
    key = FactsKey(FLEET_KEY)
    prefix = f"test-{uuid.uuid4().hex[:8]}:"
    store = await RedisStore.connect(redis_server.url, prefix=prefix, facts_key=key)
    raw = redis_py.Redis(port=redis_server.port, decode_responses=True)
    try:
        await store.save_state("s1", facts, 60)
        stored = raw.get(f"{prefix}state:s1")
        assert stored and "gemini-handle-42" not in stored and "4111" not in stored
        assert await store.load_state("s1") == facts

        raw.set(f"{prefix}state:s2", stored)  # moved under another session
        raw.set(f"{prefix}state:s3", stored[:-4] + ("AAAA" if not stored.endswith("AAAA") else "BBBB"))  # altered
        raw.set(f"{prefix}state:s4", json.dumps(facts))  # written in clear, by a server without the key
        for session_id in ("s2", "s3", "s4"):
            assert await store.load_state(session_id) is None

        other = await RedisStore.connect(redis_server.url, prefix=prefix, facts_key=FactsKey("another-fleets-key-of-32-bytes-or-more"))
        changing = await RedisStore.connect(
            redis_server.url, prefix=prefix, facts_key=FactsKey("the-new-key-of-this-fleet-32-bytes+", FLEET_KEY)
        )
        try:
            assert await other.load_state("s1") is None
            assert await changing.load_state("s1") == facts
        finally:
            await other.aclose()
            await changing.aclose()
    finally:
        raw.close()
        await store.aclose()


def test_a_fleet_key_shorter_than_32_bytes_is_refused_without_being_shown() -> None:
    with pytest.raises(ValueError, match="at least 32 bytes") as refused:
        FactsKey("short-secret")
    assert "short-secret" not in str(refused.value)
    assert FLEET_KEY not in repr(FactsKey(FLEET_KEY))


def test_serve_takes_the_redis_url_from_the_environment_or_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    from live.cli.serve import build_parser

    monkeypatch.delenv("LIVE_REDIS_URL", raising=False)
    alone = build_parser().parse_args([])
    assert alone.redis_url is None and alone.max_sessions_global is None

    monkeypatch.setenv("LIVE_REDIS_URL", "redis://:pw@10.0.0.5:6379/0")
    from_env = build_parser().parse_args(["--max-sessions-global", "40"])
    assert from_env.redis_url == "redis://:pw@10.0.0.5:6379/0" and from_env.max_sessions_global == 40
    flag = build_parser().parse_args(["--redis", "redis://10.0.0.6:6379/1"])
    assert flag.redis_url == "redis://10.0.0.6:6379/1"
    assert "pw@" not in build_parser().format_help(), "the environment's URL is not shown in --help"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--max-sessions-global", "0"])


def test_serve_with_a_url_that_is_not_redis_is_a_one_line_error() -> None:
    import sys

    import os

    proc = subprocess.run(
        [sys.executable, "-m", "live.cli", "serve", "--port", "0", "--redis", "http://admin:hunter2@cache.internal:6379/"],
        capture_output=True, text=True, timeout=30, env={**os.environ, "LIVE_FLEET_KEY": FLEET_KEY},
    )
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        "live serve: not a Redis URL (redis://, rediss:// or unix://): http://admin:***@cache.internal:6379/"
    )
