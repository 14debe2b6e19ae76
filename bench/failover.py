"""How long a conversation is away when the server holding it dies.

Two `live serve --redis` processes with their default fleet settings, a real
`redis-server`, the Live emulator and a round-robin TCP balancer without
stickiness in front. The emulator paces its replies in real time, as the
service does (`--speed` to change it). A client asks a question, the server
holding its session is killed (SIGKILL), and two times are measured from the
kill: until the client has reattached (`session.reattached`), and until the
next question, asked at once, is answered (its whole reply heard). Each
server has served a conversation before (as a fleet's servers have: a
process's first model connection also checks the SDK's wire format once), and
the kill comes at a random moment of the holder's heartbeat (seeded), as a
crash does. Repeated `--runs` times; prints each run, the median and the worst.

    .venv/bin/python -m bench.failover --runs 10
    .venv/bin/python -m bench.failover --runs 10 --fleet-lease 2   # another lease, side by side
"""

from __future__ import annotations

import argparse
import json
import random
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request

import anyio

from bench.balancer import round_robin
from bench.store import redis_server
from clients.client import LiveClient
from connections.emulator import Script, running_emulator
from live import protocol as p

MODEL = "gemini-live-2.5-flash-preview"
FLEET_KEY = "the-benchmark-fleet-shares-this-key"


def _serve(env: dict[str, str], redis_url: str, extra: list[str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "live.cli", "serve", "--port", "0", "--model", MODEL,
         "--redis", redis_url, "--fleet-key", FLEET_KEY, *extra],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True,
    )
    assert proc.stdout is not None
    match = re.search(r"http://127\.0\.0\.1:(\d+)/", proc.stdout.readline())
    if match is None:
        raise SystemExit("live serve did not start")
    proc.port = int(match.group(1))  # type: ignore[attr-defined]
    return proc


def _sessions(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
        return int(json.load(response)["sessions"])


async def _answered(client: LiveClient, text: str) -> None:
    await client.send_text(text)
    async for event in client.events():
        if isinstance(event, p.TurnComplete) and event.reason is None:
            return


async def _one_run(env: dict[str, str], redis_url: str, extra: list[str], pause: float) -> tuple[float, float]:
    servers = [_serve(env, redis_url, extra) for _ in range(2)]
    try:
        for server in servers:  # each has served before
            async with LiveClient.connect(f"ws://127.0.0.1:{server.port}/live", reattach_for=0):  # type: ignore[attr-defined]
                pass
        while any(_sessions(s.port) for s in servers):  # type: ignore[attr-defined]
            await anyio.sleep(0.05)
        async with round_robin([s.port for s in servers]) as port:  # type: ignore[attr-defined]
            async with LiveClient.connect(f"ws://127.0.0.1:{port}/live") as client:
                await _answered(client, "one")
                await anyio.sleep(pause)
                [holder] = [s for s in servers if _sessions(s.port) > 0]  # type: ignore[attr-defined]
                killed = time.monotonic()
                holder.send_signal(signal.SIGKILL)
                async for event in client.events():
                    if isinstance(event, p.SessionReattached):
                        break
                back = time.monotonic() - killed
                await _answered(client, "two")
                return back, time.monotonic() - killed
    finally:
        for server in servers:
            server.kill()
            server.wait()


async def main(runs: int, speed: float, lease: float | None) -> None:
    extra = [] if lease is None else ["--fleet-lease", str(lease)]
    pauses = random.Random(7)
    with redis_server() as (redis_url, _):
        async with running_emulator(Script(speed=speed)) as emu:
            env = emu.environment()
            backs, answers = [], []
            for n in range(runs):
                # Past the facts' write, then anywhere in a heartbeat's period.
                back, answer = await _one_run(env, redis_url, extra, 0.3 + pauses.uniform(0, 1))
                backs.append(back)
                answers.append(answer)
                print(f"run {n + 1}: reattached {back:.2f} s, next answer {answer:.2f} s after the kill", flush=True)
    settings = "default settings" if lease is None else f"--fleet-lease {lease:g}"
    print(
        f"{settings}, emulator speed {speed:g}, {runs} runs: kill to reattach median "
        f"{statistics.median(backs):.2f} s, worst {max(backs):.2f} s; kill to next answer median "
        f"{statistics.median(answers):.2f} s, worst {max(answers):.2f} s"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--speed", type=float, default=1.0, help="the emulator's pacing (1: real time)")
    parser.add_argument("--fleet-lease", type=float, help="passed to each server (default: the server's own)")
    options = parser.parse_args()
    anyio.run(main, options.runs, options.speed, options.fleet_lease)
