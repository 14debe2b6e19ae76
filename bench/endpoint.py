"""One model-side process of the benchmark: the relay under test, or the baseline.

    python -m bench.endpoint relay      # LiveServer -> Gemini(transport=double)
    python -m bench.endpoint baseline   # a bare WebSocket bridge -> the same double
    python -m bench.endpoint relay-bare    # the relay with its metrics observer switched off
    python -m bench.endpoint relay-record  # the relay recording every session (--record)

Both tune the garbage collector as `live serve` does (BENCH_DEFAULT_GC=1 leaves
CPython's defaults), host the same `Director` and conversations (the double is in-process by
design: it is the upstream), listen on a free loopback port and print
`{"port": ...}`. Then they obey one command per line on stdin: `mark` starts
the measurement window, `report` prints the window's figures as one JSON line,
`quit` stops. The baseline bridge is the least any relay does: binary frames to
`send_realtime_input(audio=...)`, model audio to binary frames, and the events
the client needs as JSON; no session rules, queues, pacing or mapping.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from typing import Any

import anyio
import anyio.to_thread
from google.genai import types
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from bench.model import Director
from bench.stats import Histogram
from connections.double import DoubleTransport
from connections.gemini import Gemini
from live.agent import Agent
from live.protocol import (
    GenerationComplete,
    SessionStarted,
    TranscriptInput,
    TranscriptOutput,
    TurnComplete,
    TurnInterrupted,
    encode,
)
from live.server import runner as live_runner
from live.observe.watch import SessionObserver
from live.observe.record import Recorder
from live.server.port import LiveServer, ServerConfig, tune_gc_for_serving

MODEL = "gemini-2.5-flash-native-audio-preview-09-2025"
INPUT_MIME = "audio/pcm;rate=16000"


def rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class GcClock:
    """Time spent in the garbage collector, per generation (pauses stop the loop)."""

    def __init__(self) -> None:
        self._started = 0.0
        self.reset()
        gc.callbacks.append(self._callback)

    def reset(self) -> None:
        self.total_s = [0.0, 0.0, 0.0]
        self.max_s = [0.0, 0.0, 0.0]
        self.count = [0, 0, 0]

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        spent = time.perf_counter() - self._started
        generation = info["generation"]
        self.total_s[generation] += spent
        self.count[generation] += 1
        self.max_s[generation] = max(self.max_s[generation], spent)

    def to_json(self) -> dict[str, list[float] | list[int]]:
        return {"total_s": self.total_s, "max_s": self.max_s, "count": self.count}


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _bridge(ws: ServerConnection, transport: DoubleTransport) -> None:
    """The baseline: the client talks to the double through a bare WebSocket."""
    try:
        await ws.recv()  # session.start
    except ConnectionClosed:
        return
    async with transport(MODEL, types.LiveConnectConfig()) as session:
        await ws.send(encode(SessionStarted("baseline", MODEL, 16_000)))

        async def down() -> None:
            while True:
                async for message in session.receive():
                    sc = message.server_content
                    if sc is None:
                        continue
                    if sc.interrupted:
                        await ws.send(encode(TurnInterrupted()))
                    if sc.model_turn is not None:
                        for part in sc.model_turn.parts or ():
                            if part.inline_data is not None and part.inline_data.data:
                                await ws.send(part.inline_data.data)
                    if sc.input_transcription is not None:
                        await ws.send(encode(TranscriptInput(sc.input_transcription.text or "", False)))
                    if sc.output_transcription is not None:
                        await ws.send(encode(TranscriptOutput(sc.output_transcription.text or "", False)))
                    if sc.generation_complete:
                        await ws.send(encode(GenerationComplete()))
                    if sc.turn_complete:
                        await ws.send(encode(TurnComplete()))

        async with anyio.create_task_group() as tg:

            async def down_until_closed() -> None:
                try:
                    await down()
                except Exception:  # noqa: BLE001 - the double ends receive() with APIError on close
                    pass

            tg.start_soon(down_until_closed)
            try:
                async for frame in ws:
                    if isinstance(frame, bytes):
                        blob = types.Blob.model_construct(data=frame, mime_type=INPUT_MIME)
                        await session.send_realtime_input(audio=blob)
                    elif '"session.close"' in frame:
                        break
            except ConnectionClosed:
                pass
            tg.cancel_scope.cancel()


class LoopLag:
    """How late the event loop runs a 10 ms timer: every session waits as long."""

    def __init__(self) -> None:
        self.lag = Histogram()
        self.spikes: list[tuple[float, float]] = []  # (seconds into the window, lag in ms)
        self.started = time.monotonic()

    def reset(self) -> None:
        self.lag = Histogram()
        self.spikes = []
        self.started = time.monotonic()

    async def run(self) -> None:
        while True:
            due = time.monotonic() + 0.01
            await anyio.sleep(0.01)
            late = time.monotonic() - due
            self.lag.add(int(late * 1e9))
            if late > 0.01 and len(self.spikes) < 200:
                self.spikes.append((round(due - self.started, 3), round(late * 1e3, 1)))


async def main(mode: str, port: int = 0, workers: int = 1) -> None:
    """Serve `mode` ("relay" or "baseline") on `port`; with `workers` > 1 the port
    is shared (SO_REUSEPORT) with the other endpoint processes of the run."""
    director = Director()
    transport = DoubleTransport(factory=director.make)
    if os.environ.get("BENCH_DEFAULT_GC") != "1":
        tune_gc_for_serving()  # as `live serve` does; the baseline gets the same
    gc.collect()
    idle_rss = rss_bytes()
    lag = LoopLag()
    async with anyio.create_task_group() as tg:
        tg.start_soon(director.run)
        tg.start_soon(lag.run)
        if mode.startswith("relay"):
            agent = Agent(name="bench", model=MODEL)
            record_dir = tempfile.mkdtemp(prefix="bench-records-") if mode == "relay-record" else None
            if mode == "relay-bare":
                live_runner.SessionObserver = _Unobserved  # type: ignore[misc]
            server = LiveServer(
                agent,
                Gemini(MODEL, transport=transport),
                # Every simulated client comes from this machine, all at once.
                ServerConfig(
                    port=port,
                    max_sessions=100_000,
                    max_pending=100_000,
                    max_sessions_per_ip=100_000,
                    reuse_port=workers > 1,
                ),
                recorder=Recorder(record_dir, session_cap=1 << 34, total_cap=1 << 40)
                if record_dir
                else None,
            )
            if mode == "relay-bare":
                server.measured_llm = server.llm  # nor the model side counted
            port = await tg.start(server.serve)
        else:
            async with serve(
                lambda ws: _bridge(ws, transport),
                "127.0.0.1",
                port,
                compression=None,
                reuse_port=workers > 1 or None,
            ) as ws_server:
                port = ws_server.sockets[0].getsockname()[1]
                await _commands(director, lag, mode, port, idle_rss)
                tg.cancel_scope.cancel()
                return
        try:
            await _commands(director, lag, mode, port, idle_rss)
        finally:
            server.stop()
            tg.cancel_scope.cancel()
            if record_dir is not None:
                shutil.rmtree(record_dir, ignore_errors=True)


async def _commands(
    director: Director, lag: LoopLag, mode: str, port: int, idle_rss: int
) -> None:
    _emit({"port": port, "mode": mode, "idle_rss": idle_rss})
    gc_clock = GcClock()
    marked_cpu = cpu_seconds()
    marked_at = time.monotonic()
    for _ in range(1000):
        line = await anyio.to_thread.run_sync(sys.stdin.readline)
        command = line.strip()
        if command == "mark":
            director.reset()
            gc_clock.reset()
            lag.reset()
            marked_cpu = cpu_seconds()
            marked_at = time.monotonic()
        elif command == "report":
            director.measuring = False
            _emit(
                {
                    "mode": mode,
                    "window_s": time.monotonic() - marked_at,
                    "cpu_s": cpu_seconds() - marked_cpu,
                    "idle_rss": idle_rss,
                    "rss": rss_bytes(),
                    "sessions": sum(1 for c in director.conversations if not c.closed),
                    "up_latency": director.up_latency.to_json(),
                    "up_frames": director.up_frames,
                    "up_gaps": director.up_gaps,
                    "down_chunks": director.down_chunks,
                    "interrupts": director.interrupts,
                    "gc": gc_clock.to_json(),
                    "loop_lag": lag.lag.to_json(),
                    "loop_lag_spikes": lag.spikes,
                }
            )
        elif command in ("quit", ""):
            return


class _Unobserved(SessionObserver):
    """No metrics at all: what the server costs without its observer (relay-bare)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def _nothing(self, *args: Any, **kwargs: Any) -> None:
        return None

    opened = started = ended = abandon = catch_up = frames_in = frame_out = audio_overflow = event = _nothing
    model_response = actions = reconnecting = resumed = _nothing


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    args = sys.argv[1:]
    anyio.run(
        main,
        args[0] if args else "relay",
        int(args[1]) if len(args) > 1 else 0,
        int(args[2]) if len(args) > 2 else 1,
    )
