"""Soak: many conversations through `live serve` against the emulator's bad days.

    python -m bench.soak                          # 50 sessions, 10 minutes
    python -m bench.soak --sessions 5 --minutes 1 # a quick one

The Live emulator runs with the real service's behaviour for the model family
(handles withheld, native audio's 1008 on input during a call, transcript
tails after the turn, ...) and its reported faults at plausible rates
(`FaultRates.realistic()`: 1011 mid-turn, 1008 after a tool response, drops
before the first handle, stale handles), plus a go-away every two minutes per
connection. `live serve` is a separate process pointed at it, as a user runs
it. Each simulated user talks for a moment, then asks a numbered question,
typed (a third of them asking for a tool), waits for the answer, and pauses.

At the end it prints what a user would notice, all of which should be zero:
sessions that ended on their own, questions never answered, questions
answered twice; and what the service threw at them (closes by code, fresh
starts). Exit status 1 when any of the first three is not zero.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import random
import re
import subprocess
import sys
import time
from typing import Any

import anyio

from clients.client import LiveClient
from connections.emulator import Script, running_emulator
from connections.emulator.faults import FaultRates
from live import protocol as p

MODEL = "gemini-2.5-flash-native-audio-preview-12-2025"
FRAME = b"\x10\x00" * 320  # 20 ms of quiet 16 kHz audio
ANSWER_TIMEOUT = 60.0  # seconds a question may take, reconnects included


class User:
    """One simulated user: their questions and what came back."""

    def __init__(self, index: int, rng: random.Random) -> None:
        self.index = index
        self.rng = rng
        self.asked: list[str] = []
        self.tool_questions: set[str] = set()
        # Answers by question: a plain one's answer names it; a tool question's
        # answer is the tool's result, counted for the question being awaited.
        self.answers: collections.Counter[str] = collections.Counter()
        self.stray_tool_answers = 0  # a tool's result while no tool question was awaited
        self.ended: str | None = None
        self.reconnects = 0
        self.resumed = 0

    async def talk(self, url: str, until: float) -> None:
        try:
            async with LiveClient.connect(url) as client:
                n = 0
                while time.monotonic() < until:
                    for _ in range(self.rng.randrange(10, 40)):  # a moment of talking
                        await client.send_audio(FRAME)
                        await anyio.sleep(0.02)
                    n += 1
                    question = f"q{self.index}x{n}"
                    self.asked.append(question)
                    if self.rng.random() < 1 / 3:
                        self.tool_questions.add(question)
                        await client.send_text(f"please check_stock for {question}")
                    else:
                        await client.send_text(question)
                    await self._await_answer(client, question)
                    await anyio.sleep(self.rng.uniform(1.0, 4.0))
                await client.send_raw(json.dumps({"type": "session.close"}))
        except Exception as exc:  # the session ended under us: what a user notices
            self.ended = f"{type(exc).__name__}: {exc}"

    async def _await_answer(self, client: LiveClient, question: str) -> None:
        said: list[str] = []
        with anyio.move_on_after(ANSWER_TIMEOUT):
            async for event in client.events():
                if self._take(event, said) and said:
                    # The last words of a reply may follow its turn's end (late).
                    with anyio.move_on_after(0.5):
                        async for tail in client.events():
                            self._take(tail, said)
                            if isinstance(tail, p.TranscriptOutput) and tail.late:
                                break
                    if self._count(said, question):
                        return
        self._count(said, question)

    def _take(self, event: object, said: list[str]) -> bool:
        """Note one event; whether it ended a turn (not one cut by a lost connection)."""
        if isinstance(event, p.SessionReconnecting):
            self.reconnects += 1
        elif isinstance(event, p.SessionResumed):
            self.resumed += 1
        elif isinstance(event, p.SessionClosed):
            raise RuntimeError(f"session closed: {event.reason}")
        elif isinstance(event, p.TranscriptOutput) and not event.heard:
            if event.late and said:
                said[-1] += event.text
            elif event.final:
                said.append(event.text)
        return isinstance(event, p.TurnComplete) and event.reason is None

    def _count(self, said: list[str], question: str) -> bool:
        """Count the replies in `said` (then forget them); whether `question` was answered."""
        answered = False
        for text in said:
            for named in set(re.findall(r"q\d+x\d+", text)):
                self.answers[named] += 1
                answered = answered or named == question
            if "check_stock returned" in text:
                if question in self.tool_questions:
                    self.answers[question] += 1
                    answered = True
                else:
                    self.stray_tool_answers += 1
        said.clear()
        return answered


async def soak(sessions: int, minutes: float, seed: int, log_path: str | None = None) -> int:
    rng = random.Random(seed)
    script = Script(
        speed=1,
        fault_rates=FaultRates.realistic(),
        seed=seed,
        go_away_after=120,
        go_away_time_left=10,
        tool_args={"check_stock": {"item": "kettle"}},
        replies=lambda ctx: (
            " ".join(f"{r.get('name')} returned {json.dumps(r.get('response'), sort_keys=True)}." for r in ctx.tool_results)
            if ctx.tool_results
            # The question's number first: a reply's last words may be lost with its connection.
            else f"{_number(ctx.user_text)}, you said: {ctx.user_text.strip().rstrip('.?!')}."
        ),
    )
    async with running_emulator(script) as emu:
        env = emu.environment()
        log = open(log_path, "w") if log_path else subprocess.DEVNULL  # noqa: SIM115 - closed below
        server = subprocess.Popen(
            [sys.executable, "-m", "live.cli", "serve", "--port", "0", "--agent", "bench.soak:AGENT",
             "--max-sessions", str(sessions + 10), "--max-sessions-per-ip", str(sessions + 10)],
            stdout=subprocess.PIPE, stderr=log, text=True, env=env,
        )
        try:
            line = await anyio.to_thread.run_sync(server.stdout.readline)
            match = re.search(r"(ws://\S+/live)", line)
            if not match:
                raise SystemExit(f"live serve did not start: {line!r} (see its log)")
            url = match.group(1)
            users = [User(i, random.Random(rng.random())) for i in range(sessions)]
            until = time.monotonic() + minutes * 60
            started = time.monotonic()
            async with anyio.create_task_group() as tg:
                for user in users:
                    tg.start_soon(user.talk, url, until)
                    await anyio.sleep(0.1)
            elapsed = time.monotonic() - started
        finally:
            server.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(10)
            if log_path:
                log.close()
        closes = collections.Counter(s.close[0] for s in emu.sessions if s.close is not None)
        fresh = sum(1 for s in emu.sessions if s.resumed_from is None) - sessions
    asked = [q for u in users for q in u.asked]
    answered: collections.Counter[str] = collections.Counter()
    for u in users:
        answered.update(u.answers)
    lost = [q for q in asked if answered[q] == 0]
    twice = [q for q, n in answered.items() if n > 1]
    stray = sum(u.stray_tool_answers for u in users)
    ended = [u for u in users if u.ended]
    tool_asked = sum(len(u.tool_questions) for u in users)
    print(f"soak: {sessions} sessions, {elapsed / 60:.1f} minutes, model {MODEL}, seed {seed}")
    print(f"  questions asked {len(asked)} ({tool_asked} for a tool)")
    print(f"  sessions ended on their own: {len(ended)}")
    print(f"  questions never answered:    {len(lost)}")
    print(f"  questions answered twice:    {len(twice) + stray}")
    print(f"  model connections: {len(emu.sessions)} ({fresh} fresh starts after the first), "
          f"closes by code: {dict(sorted(closes.items()))}")
    print(f"  the client heard: {sum(u.reconnects for u in users)} session.reconnecting, "
          f"{sum(u.resumed for u in users)} session.resumed")
    for u in ended[:5]:
        print(f"  ended: user {u.index}: {u.ended}")
    for q in lost[:10]:
        kind = "tool" if any(q in u.tool_questions for u in users) else "plain"
        heard = [s for s in emu.sessions if any(q in t for t in s.user_turns)]
        print(f"  never answered: {q} ({kind}; the model heard it on connection(s) {[s.index for s in heard] or 'none'})")
        for s in heard:
            after = [n.index for n in emu.sessions if n.resumed_from in s.handles]
            print(f"    connection {s.index}: closed {s.close}, client close {s.client_close}, "
                  f"{len(s.handles)} handle(s), resumed by {after}, model turns {s.model_turns[-2:]}")
    for q in twice[:5]:
        print(f"  answered twice: {q}")
    twice += ["a tool result with no tool question awaited"] * stray
    return 1 if ended or lost or twice else 0


def _number(text: str) -> str:
    found = re.search(r"q\d+x\d+", text)
    return found.group(0) if found else "that"


def check_stock(item: str) -> dict[str, Any]:
    """How many of an item are in stock."""
    return {"item": item, "count": 3}


def _agent() -> Any:
    from live.agent import Agent

    return Agent(name="soak", model=MODEL, tools=[check_stock], tool_timeout=5.0)


AGENT = _agent()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--server-log", metavar="FILE", help="write live serve's log here")
    args = parser.parse_args(argv)
    return anyio.run(soak, args.sessions, args.minutes, args.seed, args.server_log)


if __name__ == "__main__":
    raise SystemExit(main())
