"""Soak: many conversations through `live serve --backends` while backends fail
and recover at random.

    python -m bench.backend_soak                          # 50 sessions, 10 minutes
    python -m bench.backend_soak --sessions 5 --minutes 1 # a quick one

Three Live emulators are the backends a, b and c of one pool
(`bench.emulated_backends`), in real time, each with the real service's
behaviour for the model family, its random faults at the rates of an ordinary
day (`FaultRates.realistic()`) and a go-away every two minutes per connection
(the sibling `bench.soak` runs the same users against one backend). Every few
seconds (seeded) one backend fails for a while, then recovers: its key runs
out of quota, it refuses connects, it answers 1011 to every setup, or it stops
serving the model; at most two are unwell at once. The users are
`bench.soak`'s: each talks for a moment, then asks a numbered question, typed
(a third for a tool), waits for the answer, and pauses.

At the end it prints what a user would notice, all of which should be zero:
sessions that ended on their own, questions never answered, questions answered
twice; how often the tool ran for the questions that asked for it; and what
happened: each backend's failures, the moves by cause, the connections per
backend. Exit status 1 when any of the first three is not zero.
"""

from __future__ import annotations

import argparse
import collections
import random
import re
import time
import urllib.request

import anyio

from bench.emulated_backends import MODEL, Backends, emulated_backends, script, tool_runs
from bench.soak import User
from connections.emulator.faults import FaultRates

FAILURES = ("quota", "refuse", "unavailable", "model")


async def _chaos(pool: Backends, rng: random.Random, until: float, log: list[str]) -> None:
    """Backends fail and recover at random until `until`; at most two at once."""
    unwell: dict[str, str] = {}

    async def spell(name: str, kind: str, length: float) -> None:
        emulator = pool.emulators[name]
        unwell[name] = kind
        log.append(f"{time.strftime('%H:%M:%S')} {name}: {kind} for {length:.0f} s")
        if kind == "quota":
            emulator.outage.exhausted_keys.add(pool.keys[name])
        elif kind in ("refuse", "unavailable"):
            await emulator.go_down(kind)
        else:
            emulator.outage.missing_models.add(f"models/{MODEL}")
        await anyio.sleep(length)
        emulator.outage.exhausted_keys.clear()
        emulator.outage.missing_models.clear()
        await emulator.come_back()
        del unwell[name]
        log.append(f"{time.strftime('%H:%M:%S')} {name}: well again")

    async with anyio.create_task_group() as tg:
        while time.monotonic() < until:
            await anyio.sleep(rng.uniform(5.0, 20.0))
            well = [name for name in pool.emulators if name not in unwell]
            if len(well) <= 1 or time.monotonic() >= until:
                continue
            length = min(rng.uniform(10.0, 60.0), max(1.0, until - time.monotonic()))
            tg.start_soon(spell, rng.choice(well), rng.choice(FAILURES), length)


def _metrics(port: int) -> dict[tuple[str, str, str], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    found: dict[tuple[str, str, str], float] = {}
    for match in re.finditer(r'^(live_backend_(?:failures|moves)_total)\{backend="(\w+)",cause="(\w+)"\} (\S+)$', text, re.M):
        found[(match.group(1), match.group(2), match.group(3))] = float(match.group(4))
    return found


async def soak(sessions: int, minutes: float, seed: int) -> int:
    rng = random.Random(seed)
    scripts = {
        name: script(
            speed=1, fault_rates=FaultRates.realistic(), seed=seed + i, go_away_after=120, go_away_time_left=10,
            profile_overrides={},
        )
        for i, name in enumerate("abc")
    }
    async with emulated_backends(("a", "b", "c"), script_for=scripts) as pool:
        server = pool.serve()
        chaos: list[str] = []
        try:
            users = [User(i, random.Random(rng.random())) for i in range(sessions)]
            until = time.monotonic() + minutes * 60
            started = time.monotonic()
            async with anyio.create_task_group() as tg:
                tg.start_soon(_chaos, pool, random.Random(rng.random()), until - 5, chaos)
                for user in users:
                    tg.start_soon(user.talk, server.url, until)
                    await anyio.sleep(0.1)
            elapsed = time.monotonic() - started
            counted = _metrics(server.port)
            runs = tool_runs(pool.tool_log)
        finally:
            server.stop()
        connections = {name: len(e.sessions) for name, e in pool.emulators.items()}
        closes = {
            name: dict(sorted(collections.Counter(s.close[0] for s in e.sessions if s.close).items()))
            for name, e in pool.emulators.items()
        }
    asked = [q for u in users for q in u.asked]
    answered: collections.Counter[str] = collections.Counter()
    for u in users:
        answered.update(u.answers)
    lost = [q for q in asked if answered[q] == 0]
    twice = [q for q, n in answered.items() if n > 1]
    stray = sum(u.stray_tool_answers for u in users)
    ended = [u for u in users if u.ended]
    tool_asked = sum(len(u.tool_questions) for u in users)
    failures = collections.Counter({(b, c): n for (m, b, c), n in counted.items() if m.endswith("failures_total") and n})
    moves = collections.Counter({(b, c): n for (m, b, c), n in counted.items() if m.endswith("moves_total") and n})
    print(f"backend soak: {sessions} sessions, {elapsed / 60:.1f} minutes, model {MODEL}, seed {seed}, backends a b c")
    print(f"  questions asked {len(asked)} ({tool_asked} for a tool; the tool ran {runs} times)")
    again = [
        (name, s.index) for name, e in pool.emulators.items() for s in e.sessions
        if s.resumed_from and any("you called these tools" in t and "check_stock for" in t for t in s.user_turns)
    ]
    if runs > tool_asked:
        print(f"  (a tool question asked again with its tool's result as context, after a resume: {len(again)})")
    print(f"  sessions ended on their own: {len(ended)}")
    print(f"  questions never answered:    {len(lost)}")
    print(f"  questions answered twice:    {len(twice) + stray}")
    print(f"  backend outages: {sum(1 for line in chaos if not line.endswith('well again'))}")
    for line in chaos:
        print(f"    {line}")
    print(f"  failures by backend and cause: {dict(sorted(failures.items()))}")
    print(f"  moves by backend and cause:    {dict(sorted(moves.items()))}")
    print(f"  model connections per backend: {connections}; closes by code: {closes}")
    print(f"  the client heard: {sum(u.reconnects for u in users)} session.reconnecting, "
          f"{sum(u.resumed for u in users)} session.resumed")
    for u in ended[:5]:
        print(f"  ended: user {u.index}: {u.ended}")
    for q in lost[:10]:
        print(f"  never answered: {q}")
    for q in twice[:5]:
        print(f"  answered twice: {q}")
    return 1 if ended or lost or twice or stray else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    return anyio.run(soak, args.sessions, args.minutes, args.seed)


if __name__ == "__main__":
    raise SystemExit(main())
