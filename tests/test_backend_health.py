"""Backends' breakers: their rules without I/O, and shared by two servers
through one store (in one process, or on a real `redis-server`), so that the
second server does not learn an outage again."""

from __future__ import annotations

import anyio
import pytest

from live.engine.breaker import CLOSED, HALF_OPEN, OPEN, Breaker, BreakerPolicy
from live.fleet.health import BackendHealth
from live.fleet.store import StoreUnavailable
from test_store import Servers, redis_server, servers  # noqa: F401 - fixtures

pytestmark = pytest.mark.anyio

POLICY = BreakerPolicy(failures=3, cooldown=30.0, probe_timeout=10.0)


def test_a_breaker_opens_after_failures_in_a_row_half_opens_after_its_cooldown_and_closes_on_success():
    b = Breaker()
    for now in (0.0, 1.0):
        b = POLICY.failed(b, now)
        assert b.state(now) == CLOSED and b.may_try(now)
    b = POLICY.failed(b, 2.0)
    assert b.state(2.0) == OPEN and not b.may_try(31.9)
    assert b.state(32.0) == HALF_OPEN and b.may_try(32.0)
    probing = POLICY.probing(b, 32.0)
    assert not probing.may_try(33.0) and probing.may_try(42.0)  # one probe at a time, for its time
    assert POLICY.failed(probing, 33.0).state(33.0) == OPEN  # a failed probe opens it again at once
    assert POLICY.succeeded(probing, 33.0) == Breaker()


def test_quota_opens_a_breaker_at_once_and_a_success_forgets_earlier_failures():
    assert POLICY.failed(Breaker(), 0.0, at_once=True).state(0.0) == OPEN
    two = POLICY.failed(POLICY.failed(Breaker(), 0.0), 1.0)
    assert POLICY.failed(POLICY.succeeded(two, 2.0), 3.0).state(3.0) == CLOSED


def test_a_stored_breaker_that_cannot_be_read_is_a_closed_one():
    assert Breaker.from_json({"failures": "x"}) == Breaker()
    assert Breaker.from_json(["no"]) == Breaker()
    assert Breaker.from_json(Breaker(2, 5.0, 6.0).to_json()) == Breaker(2, 5.0, 6.0)


async def test_what_one_server_learns_of_a_backend_the_next_one_knows(servers: Servers) -> None:  # noqa: F811
    first, second = BackendHealth(POLICY, await servers()), BackendHealth(POLICY, await servers())
    await first.failed("backend:a", at_once=True)  # quota: open at once
    seen = await second.read(["backend:a", "backend:b"])
    assert seen["backend:a"].state(second.now) == OPEN
    assert seen["backend:b"] == Breaker()
    await second.succeeded("backend:a")
    assert (await first.read(["backend:a"]))["backend:a"] == Breaker()


async def test_failures_from_two_servers_at_once_are_all_counted(servers: Servers) -> None:  # noqa: F811
    healths = [BackendHealth(POLICY, await servers()) for _ in range(3)]
    async with anyio.create_task_group() as tg:
        for health in healths:
            tg.start_soon(health.failed, "backend:a")
    (breaker,) = (await healths[0].read(["backend:a"])).values()
    assert breaker.failures == 3 and breaker.state(healths[0].now) == OPEN


async def test_one_probe_at_a_time_across_servers(servers: Servers) -> None:  # noqa: F811
    quick = BreakerPolicy(failures=1, cooldown=0.05, probe_timeout=30.0)
    first, second = BackendHealth(quick, await servers()), BackendHealth(quick, await servers())
    await first.failed("backend:a")
    await anyio.sleep(0.1)  # half-open
    assert (await second.read(["backend:a"]))["backend:a"].may_try(second.now)
    await first.probing("backend:a")
    assert not (await second.read(["backend:a"]))["backend:a"].may_try(second.now)


async def test_a_store_that_fails_keeps_the_breakers_here_and_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    class Gone:
        async def load_breakers(self, *args):  # noqa: ANN002, ANN202
            raise StoreUnavailable("cannot reach Redis at redis://127.0.0.1:1/0: Connection refused")

        swap_breaker = load_breakers

    health = BackendHealth(POLICY, Gone())  # type: ignore[arg-type]
    await health.failed("backend:a", at_once=True)
    await health.failed("backend:a", at_once=True)
    assert (await health.read(["backend:a"]))["backend:a"].state(health.now) == OPEN
    assert sum("shared store is unavailable" in r.message for r in caplog.records) == 1
