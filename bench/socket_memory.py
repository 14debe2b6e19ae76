"""Worst-case server memory per socket: hostile clients against a stalled model.

    python -m bench.socket_memory                 # 40 sockets of each kind
    python -m bench.socket_memory --sockets 100

A server process with default limits serves a model that accepts a connection
and then never takes any input (every send waits forever), so whatever clients
send piles up in the server's bounded queues. Three kinds of client, each never
reading what the server sends:

- `pending`: never sends `session.start`; floods the largest frames allowed.
- `audio`: starts a session, floods the largest audio frames allowed.
- `text`: starts a session, floods the largest typed turns allowed.

The server's resident memory is read before and after each wave; the growth per
socket is the figure, next to the bound the README states.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence

import anyio
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from live.agent import Agent
from live.llm import BaseLlm, BaseLlmConnection, LlmRequest, LlmResponse, RealtimeInput
from live.server.port import LiveServer, ServerConfig, tune_gc_for_serving


class _StalledConnection(BaseLlmConnection):
    async def send_history(self, history: Sequence[object]) -> None:
        await anyio.sleep_forever()

    async def send_content(self, content: object) -> None:
        await anyio.sleep_forever()

    async def send_realtime(self, input: RealtimeInput) -> None:
        await anyio.sleep_forever()

    async def receive(self) -> AsyncIterator[LlmResponse]:  # type: ignore[override]
        await anyio.sleep_forever()
        yield  # pragma: no cover

    async def close(self) -> None:
        pass


class StalledLlm(BaseLlm):
    """Connects, then takes nothing: the worst case for the server's queues."""

    @contextlib.asynccontextmanager
    async def connect(self, request: LlmRequest) -> AsyncIterator[BaseLlmConnection]:
        yield _StalledConnection()


def rss_bytes(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


async def _serve() -> None:
    # Long enough timeouts that nothing is closed during a wave.
    config = ServerConfig(
        port=0, start_timeout=120, idle_timeout=600, stall_timeout=600,
        max_pending=100_000, max_sessions_per_ip=100_000, max_sessions=100_000,
    )
    server = LiveServer(Agent(name="bench", model="stalled"), StalledLlm("stalled"), config)
    tune_gc_for_serving()
    async with anyio.create_task_group() as tg:
        port = await tg.start(server.serve)
        print(json.dumps({"port": port, "max_frame_bytes": config.max_frame_bytes}), flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        server.stop()


async def _flood(url: str, kind: str, frame_bytes: int, seconds: float) -> None:
    async with ws_connect(url, max_size=None, compression=None, open_timeout=30) as ws:
        if kind != "pending":
            await ws.send(json.dumps({"type": "session.start"}))
        if kind == "text":
            # The longest typed turn the protocol takes, as ASCII.
            frame: str | bytes = json.dumps({"type": "text", "text": "x" * 32_768})
        else:
            frame = b"\x00" * (frame_bytes & ~1)
        with anyio.move_on_after(seconds):
            with contextlib.suppress(ConnectionClosed):
                while True:
                    await ws.send(frame)
        await anyio.sleep(seconds)  # hold the socket while memory is read


async def _wave(url: str, pid: int, kind: str, sockets: int, frame_bytes: int) -> tuple[int, int]:
    before = rss_bytes(pid)
    flood_s = 4.0
    async with anyio.create_task_group() as tg:
        for _ in range(sockets):
            tg.start_soon(_flood, url, kind, frame_bytes, flood_s)
        await anyio.sleep(flood_s + 1.0)
        peak = rss_bytes(pid)
    return before, peak


async def _one_wave(kind: str, sockets: int) -> tuple[int, int, int]:
    """A fresh server process per wave, so no wave reuses memory another freed."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.socket_memory", "--serve"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        hello = json.loads(await anyio.to_thread.run_sync(proc.stdout.readline))
        url = f"ws://127.0.0.1:{hello['port']}/live"
        before, peak = await _wave(url, proc.pid, kind, sockets, hello["max_frame_bytes"])
        return hello["max_frame_bytes"], before, peak
    finally:
        # Sessions on a model that never takes input cannot end cleanly (a typed
        # turn is sent whole or not at all); the process is simply killed.
        proc.kill()
        proc.wait()


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.socket_memory")
    parser.add_argument("--sockets", type=int, default=40)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        await _serve()
        return
    print(f"{args.sockets} sockets per wave, flooding 4 s each, a fresh server per wave")
    print("| clients | max_frame_bytes | server RSS before MiB | after MiB | KiB per socket |")
    print("|---|---|---|---|---|")
    for kind in ("pending", "audio", "text"):
        frame, before, peak = await _one_wave(kind, args.sockets)
        per = (peak - before) / args.sockets / 1024
        print(f"| {kind} | {frame} | {before / 2**20:.1f} | {peak / 2**20:.1f} | {per:.0f} |", flush=True)


if __name__ == "__main__":
    anyio.run(main)
