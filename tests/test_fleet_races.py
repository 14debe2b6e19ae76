"""A server's part in the fleet against a real `redis-server` that stalls (SIGSTOP):
what a heartbeat in flight may write after the sessions it names are gone."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Iterator

import anyio
import pytest

from live.fleet.member import Admission, Fleet
from live.fleet.store import RedisStore
from test_store import RedisServer

pytestmark = pytest.mark.anyio

CAP = 5


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
async def store(redis: RedisServer) -> AsyncIterator[RedisStore]:
    store = await RedisStore.connect(redis.url)
    try:
        yield store
    finally:
        await store.aclose()


async def full_fleet(store: RedisStore) -> tuple[Fleet, set[str]]:
    """A server at the fleet-wide limit: CAP conversations started."""
    fleet = Fleet(store, address="ws://a/live", server_id="A", lease_seconds=2.0, max_sessions_global=CAP)
    live = {f"s{i}" for i in range(CAP)}

    async def start(session_id: str) -> None:
        assert await fleet.admit(session_id) is Admission.ADMITTED
        await fleet.started(session_id, {"n": session_id})

    async with anyio.create_task_group() as tg:  # at once, as a busy server does
        for session_id in live:
            tg.start_soon(start, session_id)
    assert await fleet.admit("one more") is Admission.FULL
    return fleet, live


async def test_conversations_that_end_while_redis_stalls_give_their_slots_back_at_the_next_beat(
    redis: RedisServer, store: RedisStore
):
    """Redis stalls for most of a second (less than the client's timeout, so every
    call lands when it wakes), a heartbeat is in flight, and every conversation
    ends meanwhile: once it is back, the next heartbeat leaves every slot free,
    and a new conversation is admitted, not refused for half a minute."""
    fleet, live = await full_fleet(store)

    def facts(session_id: str) -> dict[str, str] | None:
        return {"n": session_id} if session_id in live else None

    assert redis.process is not None
    redis.process.send_signal(signal.SIGSTOP)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(fleet.beat, sorted(live), facts)  # its snapshot: every conversation
            await anyio.sleep(0.1)
            for session_id in sorted(live):  # ... and each ends while Redis is stalled
                live.discard(session_id)
                tg.start_soon(fleet.ended, session_id)
            await anyio.sleep(0.7)
            redis.process.send_signal(signal.SIGCONT)
    finally:
        redis.process.send_signal(signal.SIGCONT)
    await fleet.beat(sorted(live), facts)  # the next heartbeat
    assert await store.slots_in_use() == 0
    assert all([await store.holder(f"s{i}") is None for i in range(CAP)])
    assert await fleet.admit("a new conversation") is Admission.ADMITTED

