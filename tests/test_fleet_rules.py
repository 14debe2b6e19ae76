"""A server's part in the fleet when the store misbehaves: emptied, away, or
another server holding a session. Against the in-process store (the same
contract as Redis), with the store's failures injected."""

from __future__ import annotations

from typing import Any

import pytest

from live.fleet.member import Admission, Fleet
from live.fleet.store import MemoryStore, StoreUnavailable

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FlakyStore(MemoryStore):
    """A MemoryStore that can be made unreachable, or emptied (a restart without data)."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock=clock)
        self.down = False

    def __getattribute__(self, name: str) -> Any:
        attr = super().__getattribute__(name)
        if not name.startswith("_") and name not in ("down", "empty") and callable(attr):
            if super().__getattribute__("down"):

                async def refused(*args: Any, **kwargs: Any) -> Any:
                    raise StoreUnavailable("cannot reach Redis at redis://test: Connection refused")

                return refused
        return attr

    def empty(self) -> None:
        clock = self._leases._clock
        MemoryStore.__init__(self, clock=clock)


def fleet_on(store: MemoryStore, clock: Clock, name: str, **kw: Any) -> Fleet:
    return Fleet(store, address=f"ws://{name}/live", server_id=name, lease_seconds=3.0, clock=clock, **kw)


async def test_a_store_restarted_empty_gets_the_lease_and_the_facts_back_at_the_next_beat():
    clock = Clock()
    store = FlakyStore(clock)
    a = fleet_on(store, clock, "A", max_sessions_global=5)
    assert await a.admit("s1") is Admission.ADMITTED
    await a.started("s1", {"handle": "h1"})
    store.empty()
    lost: list[str] = []
    await a.beat(["s1"], lambda sid: {"handle": "h1"}, on_lost=lost.append)
    assert lost == [] and a.reclaimed == 1
    assert await store.holder("s1") == "A"
    assert await store.load_state("s1") == {"handle": "h1"}  # unchanged facts, written again
    assert await store.slots_in_use() == 1  # and counted again


async def test_a_session_another_server_holds_is_let_go_and_its_facts_left_alone():
    clock = Clock()
    store = FlakyStore(clock)
    a, b = fleet_on(store, clock, "A"), fleet_on(store, clock, "B")
    await a.started("s1", {"handle": "h1"})
    clock.now += 4  # A's lease ran out (it was paused) ...
    assert await b.take_over("s1")  # ... and B carries the session on
    await b.save("s1", {"handle": "h2"})
    lost: list[str] = []
    await a.beat(["s1"], lambda sid: {"handle": "h1"}, on_lost=lost.append)
    assert lost == ["s1"]
    await a.ended("s1")  # A's session ends: it must not delete what B uses
    assert await store.load_state("s1") == {"handle": "h2"}
    assert await store.holder("s1") == "B"


async def test_with_the_store_away_a_new_session_is_not_admitted_past_the_limit():
    clock = Clock()
    store = FlakyStore(clock)
    a = fleet_on(store, clock, "A", max_sessions_global=5)
    store.down = True
    assert await a.admit("s1") is Admission.UNKNOWN
    store.down = False
    assert await a.admit("s1") is Admission.ADMITTED


async def test_a_slot_of_a_session_that_ended_while_the_store_was_away_comes_back():
    clock = Clock()
    store = FlakyStore(clock)
    a = fleet_on(store, clock, "A", max_sessions_global=1, reattach_grace=10)
    assert await a.admit("s1") is Admission.ADMITTED
    await a.started("s1", {})
    store.down = True
    await a.ended("s1")  # its release is lost
    store.down = False
    assert await a.admit("s2") is Admission.FULL
    clock.now += a.state_ttl + 0.1  # no heartbeat pushed its slot on
    assert await a.admit("s2") is Admission.ADMITTED


async def test_leases_not_renewed_for_most_of_a_lease_make_the_server_unsure_of_its_sessions():
    clock = Clock()
    store = FlakyStore(clock)
    a = fleet_on(store, clock, "A")
    await a.started("s1", {})
    await a.beat(["s1"], lambda sid: {})
    store.down = True
    unsure: list[str] = []
    clock.now += 1.0  # a third of the lease: nothing to fear yet
    await a.beat(["s1"], lambda sid: {}, on_unsure=unsure.append)
    assert unsure == []
    clock.now += 1.5
    await a.beat(["s1"], lambda sid: {}, on_unsure=unsure.append)
    assert unsure == ["s1"]


async def test_a_takeover_keeps_the_conversation_counted_even_at_the_limit():
    clock = Clock()
    store = FlakyStore(clock)
    a, b = fleet_on(store, clock, "A", max_sessions_global=1), fleet_on(store, clock, "B", max_sessions_global=1)
    assert await a.admit("s1") is Admission.ADMITTED
    await a.started("s1", {})
    clock.now += 4
    assert await b.take_over("s1")
    assert await store.slots_in_use() == 1
    assert await b.admit("s2") is Admission.FULL


async def test_a_session_that_ended_while_the_store_was_away_is_let_go_at_the_next_beat():
    clock = Clock()
    store = FlakyStore(clock)
    a = fleet_on(store, clock, "A", max_sessions_global=1)
    assert await a.admit("s1") is Admission.ADMITTED
    await a.started("s1", {"handle": "h1"})
    store.down = True
    await a.ended("s1")
    store.down = False
    await a.beat([], lambda sid: None)
    assert await store.slots_in_use() == 0
    assert await store.load_state("s1") is None and await store.holder("s1") is None


async def test_a_dead_servers_session_can_be_taken_over_within_the_reattach_grace_and_not_after():
    clock = Clock()
    store = FlakyStore(clock)
    a = fleet_on(store, clock, "A", reattach_grace=30)
    b = fleet_on(store, clock, "B", reattach_grace=30)
    await a.started("s1", {"handle": "h1"})
    await a.beat(["s1"], lambda sid: {"handle": "h1"})  # A's last heartbeat: it dies
    clock.now += 3 + 25  # the lease ran out; the client is back 25 s later
    assert (await b.locate("s1"))[2] == {"handle": "h1"}
    clock.now += 10  # 35 s: longer than the grace
    assert await b.locate("s1") == (None, None, None)


async def test_facts_a_store_cannot_carry_are_skipped_not_fatal():
    """A client's tool result with a NaN in it: the facts cannot be stored as
    JSON; the heartbeat goes on (the session just cannot be taken over)."""
    clock = Clock()
    store = FlakyStore(clock)
    a = fleet_on(store, clock, "A")
    await a.started("s1", {"handle": "h1"})
    await a.beat(["s1"], lambda sid: {"handle": "h2", "tools": [{"response": {"x": float("nan")}}]})
    assert await store.load_state("s1") == {"handle": "h1"}
    assert await store.holder("s1") == "A"


async def test_a_store_that_fails_while_a_lease_is_claimed_back_does_not_end_the_session():
    clock = Clock()
    store = FlakyStore(clock)
    a = fleet_on(store, clock, "A")
    await a.started("s1", {})
    store.empty()
    real_holder = store.holder

    async def failing_holder(session_id: str) -> str | None:
        raise StoreUnavailable("cannot reach Redis at redis://test: timed out")

    store.holder = failing_holder  # type: ignore[method-assign]
    lost: list[str] = []
    await a.beat(["s1"], lambda sid: {}, on_lost=lost.append)
    assert lost == []  # unknown is not "another server holds it"
    store.holder = real_holder  # type: ignore[method-assign]
    await a.beat(["s1"], lambda sid: {}, on_lost=lost.append)
    assert lost == [] and await store.holder("s1") == "A"
