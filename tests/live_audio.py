"""What a server's model heard and said, and how much of a speech signal survived a trip.

`RecordingLlm` wraps any `BaseLlm` and timestamps what goes through each
connection, so a test can check the audio a real client delivered without
touching the server. `speech_found` compares a received signal with the
speech that was fed in: audio from a browser or a sound server is resampled,
processed and delayed, so tests count speech blocks that came through rather
than compare bytes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Sequence

import numpy as np
from google.genai import types

from live.llm import BaseLlm, BaseLlmConnection, LlmRequest, LlmResponse, RealtimeInput


@dataclasses.dataclass
class Recorded:
    """Everything one connection carried, with `time.monotonic()` stamps."""

    audio_in: list[tuple[float, bytes]] = dataclasses.field(default_factory=list)
    other_in: list[tuple[float, object]] = dataclasses.field(default_factory=list)
    out: list[tuple[float, LlmResponse]] = dataclasses.field(default_factory=list)
    closed: bool = False

    def audio_between(self, start: float, end: float) -> bytes:
        return b"".join(d for t, d in self.audio_in if start <= t <= end)

    def audio_before(self, end: float) -> bytes:
        return self.audio_between(0.0, end)

    def first_out(self, predicate) -> float | None:
        return next((t for t, r in self.out if predicate(r)), None)

    def count_out(self, predicate) -> int:
        return sum(1 for _, r in self.out if predicate(r))


class _RecordingConnection(BaseLlmConnection):
    def __init__(self, inner: BaseLlmConnection, record: Recorded) -> None:
        self._inner = inner
        self._record = record

    async def send_history(self, history: Sequence[types.Content]) -> None:
        await self._inner.send_history(history)

    async def send_content(self, content: types.Content) -> None:
        self._record.other_in.append((time.monotonic(), content))
        await self._inner.send_content(content)

    async def send_realtime(self, input: RealtimeInput) -> None:
        if isinstance(input, types.Blob) and (input.mime_type or "").startswith("audio/"):
            self._record.audio_in.append((time.monotonic(), input.data or b""))
        else:
            self._record.other_in.append((time.monotonic(), input))
        await self._inner.send_realtime(input)

    async def receive(self) -> AsyncIterator[LlmResponse]:
        async for response in self._inner.receive():
            self._record.out.append((time.monotonic(), response))
            yield response

    async def close(self) -> None:
        self._record.closed = True
        await self._inner.close()


class RecordingLlm(BaseLlm):
    """`inner`, with one `Recorded` per connection in `sessions`."""

    def __init__(self, inner: BaseLlm) -> None:
        super().__init__(inner.model)
        self.inner = inner
        self.sessions: list[Recorded] = []

    @contextlib.asynccontextmanager
    async def connect(self, request: LlmRequest) -> AsyncIterator[BaseLlmConnection]:
        record = Recorded()
        self.sessions.append(record)
        try:
            async with self.inner.connect(request) as conn:
                yield _RecordingConnection(conn, record)
        finally:
            record.closed = True


def pcm(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.float64) / 32768.0


def best_lag(reference: np.ndarray, received: np.ndarray) -> int:
    """Where `reference` starts inside `received` (by FFT cross-correlation)."""
    n = len(reference) + len(received)
    size = 1 << (n - 1).bit_length()
    corr = np.fft.irfft(np.fft.rfft(received, size) * np.conj(np.fft.rfft(reference, size)), size)
    lags = np.concatenate((np.arange(0, len(received)), np.arange(-len(reference) + 1, 0)))
    values = np.concatenate((corr[: len(received)], corr[size - len(reference) + 1 :]))
    return int(lags[int(np.argmax(values))])


@dataclasses.dataclass(frozen=True)
class Match:
    lag: int  # samples: where the reference starts in the received signal
    speech_blocks: int
    found: int
    correlation: float  # over the whole aligned reference

    @property
    def fraction(self) -> float:
        return self.found / self.speech_blocks if self.speech_blocks else 0.0


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    denom = np.sqrt(np.dot(a, a) * np.dot(b, b))
    return float(np.dot(a, b) / denom) if denom > 0 else 0.0


def speech_found(
    reference: bytes, received: bytes, *, rate: int = 16000, block_ms: int = 20,
    segment_ms: int = 200, drift_ms: int = 60, min_dbfs: float = -35.0,
    min_corr: float = 0.5, slack_ms: int = 1,
) -> Match:
    """How many voiced blocks of `reference` arrived in `received`.

    Both are PCM16 at `rate`. The reference is aligned as a whole by
    cross-correlation, then each `segment_ms` piece is re-aligned within
    `drift_ms` (capture pipelines drop or repeat 10 ms buffers under load, which
    shifts everything after). A block louder than `min_dbfs` counts as found
    when the received signal at its place, give or take `slack_ms`, correlates
    with it by at least `min_corr`, whatever the gain.
    """
    ref, got = pcm(reference), pcm(received)
    if len(got) == 0 or len(ref) == 0:
        return Match(0, 0, 0, 0.0)
    lag = best_lag(ref, got)
    block = rate * block_ms // 1000
    segment = rate * segment_ms // 1000
    drift = rate * drift_ms // 1000
    slack = rate * slack_ms // 1000
    speech = found = 0
    for seg_start in range(0, len(ref), segment):
        piece = ref[seg_start : seg_start + segment]
        local = lag
        if np.dot(piece, piece) > 0:
            best = -2.0
            for shift in range(-drift, drift + 1):
                at = seg_start + lag + shift
                if at < 0 or at + len(piece) > len(got):
                    continue
                c = _corr(piece, got[at : at + len(piece)])
                if c > best:
                    best, local = c, lag + shift
        for start in range(seg_start, min(seg_start + segment, len(ref)) - block + 1, block):
            r = ref[start : start + block]
            if 10 * np.log10(np.mean(r * r) + 1e-12) < min_dbfs:
                continue
            speech += 1
            hits = [
                _corr(r, got[start + local + d : start + local + d + block])
                for d in range(-slack, slack + 1)
                if 0 <= start + local + d and start + local + d + block <= len(got)
            ]
            found += max(hits, default=0.0) >= min_corr
    lo, hi = max(lag, 0), min(lag + len(ref), len(got))
    whole = _corr(ref[lo - lag : hi - lag], got[lo:hi]) if hi > lo else 0.0
    return Match(lag, speech, found, whole)


def rms_dbfs(data: bytes) -> float:
    x = pcm(data)
    if len(x) == 0:
        return -120.0
    return float(10 * np.log10(np.mean(x * x) + 1e-12))
