"""When resumption cannot save a session: the conversation carried to another
backend of the pool (quota, a region down, a model not served there:
python-genai#986, #2935, adk-python#3692), through every layer. Two or three Live
emulators play the backends (each a key and a region, with its bad days:
`Emulator.outage`, `go_down`), `live serve --backends` runs in front as a user
runs it, and a client converses through it: our own protocol, or an unmodified
google-genai app through the Live API's endpoint.

Each time: the conversation goes on on the next backend, every question is
answered once, no tool runs twice, and the client hears at most one
`session.reconnecting` / `session.resumed` (the Live API app: nothing at all).
"""

from __future__ import annotations

import collections
import json
import re
import urllib.request
from typing import Any

import pytest
from gemini_serving import CONFIG, ca_fixture, cert_files_fixture, said, sdk_client, turn  # noqa: F401 - fixtures
from google.genai import types
from serving import collect, late_tail, replies
from test_store import RedisServer

from bench.emulated_backends import MODEL, Backends, emulated_backends, script, tool_runs
from clients.client import LiveClient
from connections.emulator import QUOTA_REASON, Fault
from live import protocol as p
from live.liveapi import not_found

pytestmark = pytest.mark.anyio

FLEET_KEY = "the-fleet-of-this-test-shares-this-key"  # --redis needs one (docs/fleet.md)
STOCK = 'check_stock returned {"count": 3, "item": "kettle"}.'


async def ask(client: LiveClient, text: str, *, timeout: float = 30.0) -> list[Any]:
    """Events from asking `text` to its answer's end (not a turn cut by a lost connection)."""
    await client.send_text(text)
    events = await collect(client, lambda e: isinstance(e, p.TurnComplete) and e.reason is None, timeout=timeout)
    return events + await late_tail(client, within=0.3)


def hiccups(events: list[Any]) -> list[str]:
    return [e.type for e in events if isinstance(e, (p.SessionReconnecting, p.SessionResumed))]


def answers(events: list[Any]) -> collections.Counter[str]:
    """How often each question (q1x1, ...) was answered."""
    return collections.Counter(q for text in replies(events) for q in set(re.findall(r"q\d+x\d+", text)))


def metric(port: int, name: str, **labels: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{{{wanted}}} is not served")


async def conversation(pool: Backends, break_a, *, questions: int = 2) -> list[Any]:
    """A tool question and a question on A, then `break_a(A)`, then `questions`
    more: every event the client got."""
    server = pool.serve()
    try:
        async with LiveClient.connect(server.url) as client:
            events = await ask(client, "please check_stock for q1x1")
            events += await ask(client, "q1x2")
            await break_a(pool.emulators["a"])
            for n in range(3, 3 + questions):
                events += await ask(client, f"q1x{n}")
            await client.close()
    finally:
        server.stop()
    return events


def went_on_at_b(pool: Backends, events: list[Any], questions: int = 4) -> None:
    """What holds after every failure of A: the conversation went on on B."""
    assert answers(events) == {f"q1x{n}": 1 for n in range(2, questions + 1)}  # none lost, none twice
    assert replies(events)[0] == STOCK
    assert hiccups(events) == ["session.reconnecting", "session.resumed"]  # one hiccup
    assert not [e for e in events if isinstance(e, (p.ErrorEvent, p.SessionClosed))]
    assert tool_runs(pool.tool_log) == 1  # the tool ran once, on A
    (on_b,) = pool.emulators["b"].sessions
    assert on_b.resumed_from is None  # fresh on B, seeded with the conversation:
    seed = json.dumps(on_b.frames)
    assert "q1x2" in seed and "check_stock" in seed and '\\"count\\":3' in seed
    assert not on_b.sent_of("toolCall")  # B never called the tool again
    assert f"q1x{questions}" in on_b.user_turns


async def test_when_a_keys_quota_runs_out_mid_conversation_it_goes_on_on_b():
    async def quota_gone(a):
        a.outage.exhausted_keys.add("key-of-a")

    async with emulated_backends(("a", "b")) as pool:
        events = await conversation(pool, quota_gone)
        went_on_at_b(pool, events)
    assert pool.emulators["a"].sessions[-1].close == (1011, QUOTA_REASON)
    assert len(pool.emulators["a"].sessions) == 1  # not retried there: quota is no drop


@pytest.mark.parametrize("how", ["refuse", "unavailable"])
async def test_when_a_goes_down_for_good_it_goes_on_on_b(how: str):
    async def down(a):
        await a.go_down(how)

    async with emulated_backends(("a", "b")) as pool:
        events = await conversation(pool, down)
        went_on_at_b(pool, events)
    if how == "unavailable":  # 1011 on every resume: tried here twice, then elsewhere
        closes = [s.close for s in pool.emulators["a"].sessions[1:]]
        assert closes == [(1011, "The service is currently unavailable.")] * 2


async def test_when_as_model_disappears_it_goes_on_on_b():
    a_script = script(faults=[Fault("after_turn", code=1011, n=3)])  # a drop after q1x3's answer

    async def retired(a):
        a.outage.missing_models.add(f"models/{MODEL}")

    async with emulated_backends(("a", "b"), script_for={"a": a_script}) as pool:
        events = await conversation(pool, retired, questions=3)
        went_on_at_b(pool, events, questions=5)
    last = pool.emulators["a"].sessions[-1]
    assert last.close[0] == 1008 and not_found(f"models/{MODEL}", "v1beta").startswith(last.close[1])  # the resume there: not found
    assert pool.emulators["b"].sessions[0].user_turns[-2:] == ["q1x4", "q1x5"]


async def test_with_a_out_of_quota_and_b_down_the_conversation_lands_on_c_in_one_hiccup():
    async def both(a):
        a.outage.exhausted_keys.add("key-of-a")
        await pool.emulators["b"].go_down("refuse")

    async with emulated_backends(("a", "b", "c")) as pool:
        events = await conversation(pool, both)
        assert tool_runs(pool.tool_log) == 1
    assert answers(events) == {"q1x2": 1, "q1x3": 1, "q1x4": 1}
    assert hiccups(events) == ["session.reconnecting", "session.resumed"]
    (on_c,) = pool.emulators["c"].sessions
    assert on_c.user_turns[-1] == "q1x4" and not on_c.sent_of("toolCall")
    assert not pool.emulators["b"].sessions


async def test_the_second_server_of_a_fleet_starts_new_sessions_on_b_at_once_while_as_breaker_is_open():
    redis = RedisServer().start()
    try:
        async with emulated_backends(("a", "b")) as pool:
            first = pool.serve("--redis", redis.url, "--fleet-key", FLEET_KEY, log_name="first")
            second = pool.serve("--redis", redis.url, "--fleet-key", FLEET_KEY, log_name="second")
            try:
                async with LiveClient.connect(first.url) as client:
                    await ask(client, "q1x1")
                    pool.emulators["a"].outage.exhausted_keys.add("key-of-a")
                    moved = await ask(client, "q1x2")  # the first server learns: A's quota is gone
                    assert answers(moved) == {"q1x2": 1}
                    async with LiveClient.connect(second.url) as other:
                        fresh = await ask(other, "q2x1")
                    assert answers(fresh) == {"q2x1": 1} and not hiccups(fresh)
                    assert metric(second.port, "live_backend_breaker_state", backend="a") == 2  # open, as the fleet knows
                    assert metric(second.port, "live_backend_failures_total", backend="a", cause="quota") == 0
                    assert metric(first.port, "live_backend_moves_total", backend="a", cause="quota") == 1
            finally:
                first.stop()
                second.stop()
    finally:
        redis.kill()
    # The second server never tried A (no 429 counted there): its session started, and stayed, on B.
    assert sorted(s.user_turns[-1] for s in pool.emulators["b"].sessions) == ["q1x2", "q2x1"]


async def test_a_live_api_app_notices_nothing_when_as_quota_runs_out(ca, cert_files):  # noqa: F811
    async with emulated_backends(("a", "b")) as pool:
        server = pool.serve(
            "--gemini-endpoint", "--certfile", cert_files["certfile"], "--keyfile", cert_files["keyfile"]
        )
        try:
            client = sdk_client(f"wss://127.0.0.1:{server.port}/", ca, "any-key")
            heard: list[types.LiveServerMessage] = []
            async with client.aio.live.connect(model=MODEL, config=CONFIG) as session:
                await session.send_realtime_input(text="q1x1")
                heard += await turn(session, timeout=30)
                pool.emulators["a"].outage.exhausted_keys.add("key-of-a")
                await session.send_realtime_input(text="q1x2")
                second = await turn(session, timeout=30)
                heard += second
                await session.send_realtime_input(text="q1x3")
                third = await turn(session, timeout=30)
                heard += third
        finally:
            server.stop()
    assert said(second) == "q1x2, you said: q1x2." and said(third) == "q1x3, you said: q1x3."
    assert not [m for m in heard if m.go_away or (m.server_content and m.server_content.interrupted)]
    (on_b,) = pool.emulators["b"].sessions
    assert on_b.user_turns == ["q1x2", "q1x3"] and "q1x1" in json.dumps(on_b.frames)
