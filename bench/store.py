"""What the shared store costs per call, and how soon a lost Redis is noticed.

    python -m bench.store                      # starts its own redis-server
    python -m bench.store --redis redis://host:6379/0 --iterations 2000

Against Redis on loopback (or the one named), each call a server makes on the
session path is timed over many iterations: claim, holder, save_state (a 1 KiB
state), a heartbeat renewing 100 leases in one round trip, acquire_slot with
its slots filling up. Then, on a redis-server of its own, the time from Redis
being killed (SIGKILL: connections refused) or frozen (SIGSTOP: no answer) to the
call in flight raising StoreUnavailable, with the default 1 s timeout.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio

from live.fleet.store import RedisStore, StoreUnavailable


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def redis_server() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (Debian: apt-get install redis-server)")
    port = _free_port()
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                raise SystemExit("redis-server did not start")
            time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}/0", process
    finally:
        process.send_signal(signal.SIGCONT)
        process.kill()
        process.wait()


def _quantiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 3)

    return {"p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": round(ordered[-1] * 1000, 3)}


async def _time(iterations: int, call: Callable[[int], Awaitable[Any]]) -> dict[str, float]:
    samples = []
    for i in range(iterations):
        started = time.perf_counter()
        await call(i)
        samples.append(time.perf_counter() - started)
    return _quantiles(samples)


async def calls(url: str, iterations: int) -> dict[str, dict[str, float]]:
    store = await RedisStore.connect(url, prefix=f"bench-{uuid.uuid4().hex[:8]}:")
    try:
        for server in ("A", "B", "C", "D"):
            await store.announce(server, f"ws://{server}/live", 60)
        state = {"agent": "weather", "handle": "h" * 200, "pending": [{"id": str(n), "out": "x" * 100} for n in range(6)]}
        held = [f"held-{n}" for n in range(100)]
        for session in held:
            await store.claim(session, "A", 60)
        return {
            "claim": await _time(iterations, lambda i: store.claim(f"s{i}", "A", 30)),
            "holder": await _time(iterations, lambda i: store.holder(f"s{i}")),
            "save_state_1k": await _time(iterations, lambda i: store.save_state(f"s{i}", state, 60)),
            "heartbeat_100_leases": await _time(iterations, lambda i: store.heartbeat("A", held, 60)),
            "acquire_slot": await _time(
                iterations, lambda i: store.acquire_slot(f"s{i}", iterations + 1, 60)
            ),
        }
    finally:
        await store.aclose()


async def detection() -> dict[str, float]:
    out = {}
    for how, sig in (("killed", signal.SIGKILL), ("frozen", signal.SIGSTOP)):
        with redis_server() as (url, process):
            store = await RedisStore.connect(url)
            try:
                await store.claim("s", "A", 30)
                process.send_signal(sig)
                if sig == signal.SIGKILL:
                    process.wait()
                started = time.perf_counter()
                try:
                    await store.holder("s")
                except StoreUnavailable:
                    out[f"{how}_to_unavailable_ms"] = round((time.perf_counter() - started) * 1000, 1)
                else:
                    out[f"{how}_to_unavailable_ms"] = float("nan")
            finally:
                await store.aclose()
    return out


async def run(url: str | None, iterations: int) -> dict[str, Any]:
    if url is None:
        with redis_server() as (own, _):
            timings = await calls(own, iterations)
    else:
        timings = await calls(url, iterations)
    return {"iterations": iterations, "calls": timings, "failure": await detection()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.store", description=__doc__.split("\n")[0])
    parser.add_argument("--redis", metavar="URL", help="a Redis to time the calls against (default: start one)")
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--json", metavar="FILE", help="also write the figures here")
    args = parser.parse_args(argv)
    report = anyio.run(run, args.redis, args.iterations)
    for name, figures in report["calls"].items():
        print(f"{name:24} p50 {figures['p50_ms']:7.3f} ms  p99 {figures['p99_ms']:7.3f} ms  max {figures['max_ms']:7.3f} ms")
    for name, value in report["failure"].items():
        print(f"{name:24} {value} ms")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=2)
    return report


if __name__ == "__main__":
    main()
