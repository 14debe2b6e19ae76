"""Frame stamps and a fixed-size latency histogram, shared by every bench process.

Each process of a run stamps or reads `time.monotonic_ns()`: on Linux it is
CLOCK_MONOTONIC, one clock for the whole machine, so a stamp written in one
process can be subtracted from a reading taken in another.
"""

from __future__ import annotations

import dataclasses
import random
import struct
from collections.abc import Iterable
from typing import Any

__all__ = [
    "DOWN",
    "DOWN_CHUNK_BYTES",
    "Histogram",
    "MAGIC",
    "UP",
    "UP_FRAME_BYTES",
    "Latencies",
    "down_chunk",
    "latencies",
    "up_frame",
]

MAGIC = 0x4C564231  # "LVB1"
UP = struct.Struct("<IIIq")  # magic, client id, frame sequence, send time (ns)
DOWN = struct.Struct("<IIIIq")  # magic, client id, model turn, chunk sequence, send time (ns)
UP_FRAME_BYTES = 640  # 20 ms of PCM16 mono at 16 kHz
DOWN_CHUNK_BYTES = 1920  # 40 ms of PCM16 mono at 24 kHz


def _noise(nbytes: int, seed: int) -> bytes:
    """PCM16 noise (sigma ~3000): like speech, it barely compresses (silence would)."""
    rng = random.Random(seed)
    samples = [max(-32768, min(32767, int(rng.gauss(0, 3000)))) for _ in range(nbytes // 2)]
    return struct.pack(f"<{len(samples)}h", *samples)


_UP_TAIL = _noise(UP_FRAME_BYTES - UP.size, 1)
_DOWN_TAIL = _noise(DOWN_CHUNK_BYTES - DOWN.size, 2)


def up_frame(client: int, seq: int, t_ns: int) -> bytes:
    """One 20 ms microphone frame: noise carrying its stamp in the first bytes."""
    return UP.pack(MAGIC, client, seq, t_ns) + _UP_TAIL


def down_chunk(client: int, turn: int, seq: int, t_ns: int) -> bytes:
    """One 40 ms chunk of model audio, stamped with the time the model sent it."""
    return DOWN.pack(MAGIC, client, turn, seq, t_ns) + _DOWN_TAIL


# Bucket edges in microseconds: 10 us steps to 2 ms, 0.5 ms steps to 200 ms,
# 10 ms steps to 60 s. Fixed memory whatever the number of samples.
_FINE_END = 2_000
_MID_END = 200_000
_COARSE_END = 60_000_000
_FINE = _FINE_END // 10
_MID = (_MID_END - _FINE_END) // 500
_COARSE = (_COARSE_END - _MID_END) // 10_000
_BUCKETS = _FINE + _MID + _COARSE + 1


def _bucket(us: int) -> int:
    if us < _FINE_END:
        return us // 10 if us > 0 else 0
    if us < _MID_END:
        return _FINE + (us - _FINE_END) // 500
    if us < _COARSE_END:
        return _FINE + _MID + (us - _MID_END) // 10_000
    return _BUCKETS - 1


def _bucket_mid_us(index: int) -> float:
    if index < _FINE:
        return index * 10 + 5
    index -= _FINE
    if index < _MID:
        return _FINE_END + index * 500 + 250
    index -= _MID
    return _MID_END + index * 10_000 + 5_000


class Histogram:
    """Latencies in nanoseconds, kept as bucket counts (percentiles to 10 us below 2 ms)."""

    __slots__ = ("counts", "n", "max_ns", "sum_ns")

    def __init__(self) -> None:
        self.counts = [0] * _BUCKETS
        self.n = 0
        self.max_ns = 0
        self.sum_ns = 0

    def add(self, ns: int) -> None:
        if ns < 0:
            ns = 0
        self.counts[_bucket(ns // 1000)] += 1
        self.n += 1
        self.sum_ns += ns
        if ns > self.max_ns:
            self.max_ns = ns

    def merge(self, other: Histogram) -> None:
        counts = self.counts
        for i, c in enumerate(other.counts):
            if c:
                counts[i] += c
        self.n += other.n
        self.sum_ns += other.sum_ns
        self.max_ns = max(self.max_ns, other.max_ns)

    def percentile_ms(self, q: float) -> float | None:
        if not self.n:
            return None
        rank = max(1, round(q / 100 * self.n))
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= rank:
                return min(_bucket_mid_us(i), self.max_ns / 1000) / 1000
        return self.max_ns / 1e6

    def summary(self) -> dict[str, float | int | None]:
        return {
            "n": self.n,
            "p50_ms": self.percentile_ms(50),
            "p99_ms": self.percentile_ms(99),
            "max_ms": self.max_ns / 1e6 if self.n else None,
            "mean_ms": self.sum_ns / self.n / 1e6 if self.n else None,
        }

    def to_json(self) -> dict[str, Any]:
        """Sparse form, for sending between processes."""
        return {
            "n": self.n,
            "max_ns": self.max_ns,
            "sum_ns": self.sum_ns,
            "counts": {str(i): c for i, c in enumerate(self.counts) if c},
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Histogram:
        h = cls()
        h.n = obj["n"]
        h.max_ns = obj["max_ns"]
        h.sum_ns = obj["sum_ns"]
        for i, c in obj["counts"].items():
            h.counts[int(i)] = c
        return h

    @classmethod
    def of(cls, values_ns: Iterable[int]) -> Histogram:
        h = cls()
        for v in values_ns:
            h.add(v)
        return h


@dataclasses.dataclass
class Latencies:
    """One run's timings, from the generator's report and the model side's."""

    up: Histogram
    down: Histogram
    interrupt: Histogram
    generator_late: Histogram
    interrupts_unmatched: int  # interruptions the client saw that the model side never sent


def latencies(client: dict[str, Any], model: dict[str, Any]) -> Latencies:
    """Frames up timed where they arrive, chunks down and interruptions timed at the client."""
    pushed = {(c, t): due for c, t, due in model["interrupts"]}
    interrupt = Histogram()
    unmatched = 0
    for c, t, arrived in client["interrupts"]:
        due = pushed.get((c, t))
        if due is None:
            unmatched += 1
        else:
            interrupt.add(arrived - due)
    return Latencies(
        up=Histogram.from_json(model["up_latency"]),
        down=Histogram.from_json(client["down_latency"]),
        interrupt=interrupt,
        generator_late=Histogram.from_json(client["generator_late"]),
        interrupts_unmatched=unmatched,
    )
