"""How many sessions one process holds in real time on this machine: `--max-sessions auto`.

A relayed session costs the process CPU for every frame it moves (reading a
socket, TLS, WebSocket framing, the lean wire's JSON and base64, the session's
bookkeeping), and one process has one core to spend. The real-path benchmark
(`python -m bench.relay --real`) measured that cost on its machine in CPU
seconds per session-minute (`REFERENCE_COST`), and timed there a probe: a fixed
slice of the same per-frame work, run in-process (`REFERENCE_PROBE_US`). Here
the probe is timed again, the cost scaled by how much slower or faster this
machine runs it, and the capacity is the sessions that take `CORE_SHARE` of
one core: the rest is headroom for bursts, hand-overs and garbage collection.

The rule fits relayed models (Gemini), whose work is in the model's service.
A model that runs in the process costs far more per session: `local/voice`'s
recogniser takes about a tenth of real time per session (`IN_PROCESS_COST`),
so the same share of a core holds a few of its sessions, not a hundred.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import pybase64

from live.llm import LlmResponse
from live.access.reattach import ReplayBuffer
from live.engine.session import SessionCore

__all__ = [
    "CORE_SHARE", "Capacity", "IN_PROCESS_COST", "REFERENCE_COST", "REFERENCE_PROBE_US", "estimate", "probe_us",
]

REFERENCE_COST = 0.339
"""CPU s per session-minute of `live serve` on the real Gemini path at 50
sessions, on the benchmark's machine (2-core VM, Python 3.11, uvloop, picows;
2026-12-02, median of two runs; see the README's Performance section)."""

REFERENCE_PROBE_US = 14.9
"""What `probe_us()` took on that machine in the same sitting."""

CORE_SHARE = 0.75
"""The share of one core the sessions may take."""

MIN_SESSIONS = 10

IN_PROCESS_COST = {"local/voice": 6.6}
"""CPU s per session-minute of models that run in this process: `local/voice`
listens at 0.07-0.11 of real time per session (`python -m bench.local_voice`,
docs/local-voice.md), taken at the worst."""

MIN_IN_PROCESS_SESSIONS = 2


@dataclasses.dataclass(frozen=True)
class Capacity:
    """The estimate and what it rests on (for the start-up log line)."""

    sessions: int
    probe_us: float
    speed: float  # this machine against the benchmark's: 2.0 is twice as fast
    model: str | None = None  # a model that runs in this process, whose cost set it

    def describe(self) -> str:
        """The start-up log line, in plain words."""
        if self.model is not None:
            return (
                f"capacity: up to {self.sessions} {self.model} sessions at once in this process: it recognises "
                f"speech here, at about {IN_PROCESS_COST[self.model]:g} CPU seconds per session-minute where the "
                f"limit was measured, and a quick timing at start found this machine {self.speed:.2f}x as fast "
                "(--max-sessions N sets it yourself)"
            )
        return (
            f"capacity: up to {self.sessions} sessions at once in this process: a quick timing at start found "
            f"this machine {self.speed:.2f}x as fast as the one the limit was measured on "
            "(--max-sessions N sets it yourself)"
        )


def estimate(probe: float | None = None, model: str | None = None) -> Capacity:
    """The sessions one process holds here for `model` (at least `MIN_SESSIONS`
    of a relayed model, `MIN_IN_PROCESS_SESSIONS` of one that runs here)."""
    measured = probe_us() if probe is None else probe
    speed = REFERENCE_PROBE_US / measured
    if model in IN_PROCESS_COST:
        cost = IN_PROCESS_COST[model] / speed
        sessions = max(MIN_IN_PROCESS_SESSIONS, math.floor(CORE_SHARE * 60.0 / cost))
        return Capacity(sessions, measured, speed, model)
    cost = REFERENCE_COST / speed  # CPU s per session-minute here
    sessions = max(MIN_SESSIONS, math.floor(CORE_SHARE * 60.0 / cost))
    return Capacity(sessions, measured, speed)


_FRAME = bytes(range(256)) * 2 + bytes(128)  # 20 ms of 16 kHz PCM16
_CHUNK_DATA = pybase64.b64encode(bytes(1920)).decode()  # 40 ms of 24 kHz PCM16


def _round(core: SessionCore, replay: ReplayBuffer, chunk: bytes, decode_lean: Callable[[bytes], Any]) -> None:
    """One microphone frame in and out, and half a reply chunk: the relay's own per-frame work in
    Python, minus the sockets (WebSocket framing and TLS run in compiled code, and system calls
    cost what the moment makes them cost)."""
    blob = core.client_audio(_FRAME)
    text = '{"realtime_input":{"audio":{"data":"%s","mime_type":"%s"}}}' % (
        pybase64.b64encode(blob.data, altchars=b"-_").decode("ascii"),
        blob.mime_type,
    )
    text.encode()
    content = decode_lean(chunk)
    response = LlmResponse(content=content, partial=True)  # type: ignore[arg-type]
    replay.add(response.content.parts[0].inline_data.data)  # type: ignore[union-attr,index]


def probe_us(rounds: int = 40, tries: int = 25) -> float:
    """Microseconds one probe round takes here: the median of `tries` short runs.

    On a shared VM the same work runs up to twice as fast at some moments as
    at others (other tenants); the median is what the process meets most of
    the time, and what the benchmark's long runs measured.
    """
    core = SessionCore(input_rate=16000)
    replay = ReplayBuffer()
    chunk = (
        '{"serverContent":{"modelTurn":{"parts":[{"inlineData":'
        '{"mimeType":"audio/pcm;rate=24000","data":"%s"}}]}}}' % _CHUNK_DATA
    ).encode()
    # The Gemini relay's own decoder (imported here, as live/ imports connections/
    # only where it uses one).
    from connections.gemini_wire import decode_lean

    _round(core, replay, chunk, decode_lean)  # first-call caches
    times = []
    collecting = gc.isenabled()
    gc.disable()  # a collection of the whole heap would be timed with whichever try it fell in
    try:
        for _ in range(tries):
            started = time.perf_counter()
            for _ in range(rounds):
                _round(core, replay, chunk, decode_lean)
            times.append(time.perf_counter() - started)
    finally:
        if collecting:
            gc.enable()
    return statistics.median(times) / rounds * 1e6
