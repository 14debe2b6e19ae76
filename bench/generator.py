"""The client side of the benchmark: N simulated users at real-time pace.

    python -m bench.generator URL SESSIONS DURATION [WARMUP [PROTOCOL]]

Each user is a client over a real loopback socket: a `LiveClient` by default,
or an adapter of `bench.client_protocols` (PROTOCOL: `live-deflate`, offering
deflate as browsers do, also called `deflate`; `gemini`, the Live API itself;
or `module:attr`). One ticker sends every user's 20 ms microphone frame on
schedule (users are spread over four 5 ms phases); each frame carries its send
time. Each user's reader takes the stamp out of every reply chunk and measures
its latency. Prints
`{"event": "measuring"}` when every user is connected and warmed up, then one
JSON line of figures after DURATION seconds, then closes every session.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from typing import Any

import anyio

from bench.client_protocols import resolve
from bench.stats import DOWN, DOWN_CHUNK_BYTES, MAGIC, Histogram, up_frame
from clients.client import AudioFrame
from live.net.loop import backend_options
from live.protocol import ErrorEvent, TurnComplete, TurnInterrupted

FRAME_S = 0.02
PHASES = 4
CONNECT_SPACING_S = 0.004


class User:
    __slots__ = (
        "id", "client", "seq", "last_turn", "last_chunk", "down_gaps", "turns",
        "interrupts", "errors", "ended",
    )

    def __init__(self, user_id: int) -> None:
        self.id = user_id
        self.client: Any = None  # a session of the run's client protocol
        self.seq = 0
        self.last_turn = -1
        self.last_chunk = -1
        self.down_gaps = 0
        self.turns = 0
        self.interrupts: list[tuple[int, int, int]] = []
        self.errors: dict[str, int] = {}
        self.ended = False


class Run:
    def __init__(self, url: str, sessions: int, protocol: str = "live") -> None:
        self.url = url
        self.connect = resolve(protocol)
        self.users = [User(i + 1) for i in range(sessions)]
        self.measuring = False
        self.down_latency = Histogram()
        self.down_chunks = 0
        self.sent = 0
        self.late = Histogram()  # how late the ticker sent frames (the generator's own lag)
        self.connected = 0
        self.all_connected = anyio.Event()
        self.failed: list[str] = []

    def reset(self) -> None:
        self.measuring = True
        self.down_latency = Histogram()
        self.late = Histogram()
        self.down_chunks = self.sent = 0
        for user in self.users:
            user.down_gaps = user.turns = 0
            user.interrupts = []
            user.errors = {}

    async def user(self, user: User, done: anyio.Event) -> None:
        try:
            async with self.connect(self.url) as client:
                user.client = client
                self.connected += 1
                if self.connected == len(self.users):
                    self.all_connected.set()
                try:
                    await self._read(user, client)
                finally:
                    user.ended = True
        except Exception as exc:  # noqa: BLE001 - a failed user is a figure, not a crash
            self.failed.append(f"user {user.id}: {type(exc).__name__}: {exc}")
            user.ended = True
            if len(self.failed) + self.connected >= len(self.users):
                self.all_connected.set()
        finally:
            done.set()

    async def _read(self, user: User, client: Any) -> None:
        unpack = DOWN.unpack_from
        clock = time.monotonic_ns
        async for event in client.events():
            if isinstance(event, AudioFrame):
                now = clock()
                data = event.data
                # A frame may hold several 40 ms chunks (the server joins a burst): each is timed.
                for offset in range(0, len(data) - DOWN.size + 1, DOWN_CHUNK_BYTES):
                    magic, _, turn, chunk, sent_ns = unpack(data, offset)
                    if magic != MAGIC:
                        continue
                    if self.measuring:
                        self.down_latency.add(now - sent_ns)
                        self.down_chunks += 1
                        if turn == user.last_turn and chunk > user.last_chunk + 1:
                            user.down_gaps += chunk - user.last_chunk - 1
                    user.last_turn, user.last_chunk = turn, chunk
            elif isinstance(event, TurnInterrupted):
                if self.measuring:
                    user.interrupts.append((user.id, user.last_turn, clock()))
            elif isinstance(event, TurnComplete):
                user.turns += 1
            elif isinstance(event, ErrorEvent):
                user.errors[event.code] = user.errors.get(event.code, 0) + 1

    async def ticker(self) -> None:
        """Every user's next frame, on schedule; a late frame is sent late, never skipped."""
        phases = [self.users[p::PHASES] for p in range(PHASES)]
        step = FRAME_S / PHASES
        start = time.monotonic()
        tick = 0
        while True:
            tick += 1
            due = start + tick * step
            delay = due - time.monotonic()
            if delay > 0:
                await anyio.sleep(delay)
            if self.measuring:
                self.late.add(int(max(0.0, time.monotonic() - due) * 1e9))
            for user in phases[tick % PHASES]:
                client = user.client
                if client is None or user.ended:
                    continue
                frame = up_frame(user.id, user.seq, time.monotonic_ns())
                user.seq += 1
                try:
                    await client.send_audio(frame)
                except Exception:  # noqa: BLE001 - the reader records the end
                    user.ended = True
                if self.measuring:
                    self.sent += 1

    def result(self, window_s: float) -> dict[str, Any]:
        errors: dict[str, int] = {}
        for user in self.users:
            for code, count in user.errors.items():
                errors[code] = errors.get(code, 0) + count
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "event": "result",
            "window_s": window_s,
            "sessions": len(self.users),
            "connected": self.connected,
            "alive": sum(1 for u in self.users if not u.ended),
            "failed": self.failed[:10],
            "up_sent": self.sent,
            "down_latency": self.down_latency.to_json(),
            "down_chunks": self.down_chunks,
            "down_gaps": sum(u.down_gaps for u in self.users),
            "turns": sum(u.turns for u in self.users),
            "interrupts": [i for u in self.users for i in u.interrupts],
            "errors": errors,
            "generator_late": self.late.to_json(),
            "generator_cpu_s": usage.ru_utime + usage.ru_stime,
        }


async def main(
    url: str, sessions: int, duration: float, warmup: float, protocol: str = "live"
) -> None:
    run = Run(url, sessions, protocol)
    done = [anyio.Event() for _ in run.users]
    async with anyio.create_task_group() as tg:
        for user, event in zip(run.users, done, strict=True):
            tg.start_soon(run.user, user, event)
            await anyio.sleep(CONNECT_SPACING_S)
        with anyio.move_on_after(60):
            await run.all_connected.wait()
        tg.start_soon(run.ticker)
        await anyio.sleep(warmup)
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        run.reset()
        _emit({"event": "measuring"})
        started = time.monotonic()
        await anyio.sleep(duration)
        run.measuring = False
        result = run.result(time.monotonic() - started)
        result["generator_cpu_s"] -= cpu0.ru_utime + cpu0.ru_stime
        _emit(result)
        with anyio.move_on_after(10):
            for user in run.users:
                if user.client is not None and not user.ended:
                    await user.client.close()
            for event in done:
                await event.wait()
        tg.cancel_scope.cancel()


_PROTOCOL_ALIASES = {"deflate": "live-deflate"}


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    args = sys.argv[1:]
    anyio.run(
        main,
        args[0],
        int(args[1]),
        float(args[2]),
        float(args[3]) if len(args) > 3 else 2.0,
        _PROTOCOL_ALIASES.get(args[4], args[4]) if len(args) > 4 else "live",
        backend_options=backend_options("auto"),
    )
