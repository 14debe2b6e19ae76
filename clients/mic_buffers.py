"""What `live mic` keeps between the network, the event loop and the audio
threads, without I/O: the speaker's jitter buffer, the microphone's gate, and
the queue of microphone frames from PortAudio's thread to the event loop."""

from __future__ import annotations

import asyncio
import collections
import threading

from live.protocol import OUTPUT_RATE

__all__ = ["BLOCK_MS", "FrameQueue", "GATE_TAIL_S", "JitterBuffer", "MicGate"]

BLOCK_MS = 20
PREBUFFER_MS = 100
GATE_TAIL_S = 0.3
MIC_QUEUE_FRAMES = 25  # 0.5 s of 20 ms frames
PLAYBACK_CAPACITY_S = 20.0


class JitterBuffer:
    """PCM16 mono reply audio between the network and the speaker.

    Playback starts once `prebuffer` samples are queued (or the reply is marked
    complete), so network jitter does not turn into clicks; if the queue runs
    dry mid-reply it waits for the prebuffer again. `pull` always returns exactly
    the samples asked for, padded with silence. Holds at most `capacity`
    samples: `push` refuses (returns False) what does not fit, and the caller
    waits for room, so nothing is dropped silently. Not thread-safe by itself.
    """

    def __init__(self, *, rate: int = OUTPUT_RATE, prebuffer_ms: int = PREBUFFER_MS,
                 capacity_s: float = PLAYBACK_CAPACITY_S) -> None:
        self.rate = rate
        self.prebuffer = rate * prebuffer_ms // 1000
        self.capacity = int(rate * capacity_s)
        self._buf = bytearray()
        self._playing = False
        self._ending = False
        self.played = 0  # samples handed to the speaker (not counting padding)
        self.flushed = 0  # samples discarded by flush()
        self.underruns = 0

    @property
    def queued(self) -> int:
        return len(self._buf) // 2

    @property
    def playing(self) -> bool:
        """True while a reply is being played (between prebuffer and drain)."""
        return self._playing

    @property
    def audible(self) -> bool:
        """True while there is reply audio queued or playing."""
        return self._playing or bool(self._buf)

    def room(self) -> int:
        return self.capacity - self.queued

    def push(self, pcm: bytes) -> bool:
        """Queue reply audio; False (nothing queued) if it does not fit."""
        if len(pcm) // 2 > self.room():
            return False
        self._buf += pcm
        return True

    def mark_end(self) -> None:
        """The reply is complete: play what is queued without waiting for the prebuffer.

        On an empty buffer this does nothing: the next reply still waits for
        its own prebuffer.
        """
        if self._buf:
            self._ending = True

    def flush(self) -> int:
        """Drop everything queued (barge-in); returns the samples dropped."""
        dropped = self.queued
        self.flushed += dropped
        self._buf.clear()
        self._playing = False
        self._ending = False
        return dropped

    def pull(self, samples: int) -> bytes:
        """Exactly `samples` samples for the speaker: audio, or silence while buffering."""
        if not self._playing:
            if self._buf and (self.queued >= self.prebuffer or self._ending):
                self._playing = True
            else:
                return bytes(2 * samples)
        take = min(samples, self.queued) * 2
        out = bytes(self._buf[:take])
        del self._buf[:take]
        self.played += take // 2
        if not self._buf:
            if not self._ending and take < 2 * samples:
                self.underruns += 1
            self._playing = False
            self._ending = False
        if take < 2 * samples:
            out += bytes(2 * samples - take)
        return out


class MicGate:
    """Decides, frame by frame, whether the microphone may be sent.

    Half-duplex (the default): closed while the agent's audio is audible and
    for `tail` seconds after it drains (the speaker's own latency, and the
    room's, still carry the last words). Full duplex (`half_duplex=False`):
    always open. `update` returns "closed" or "opened" on a change, else None.
    """

    def __init__(self, *, half_duplex: bool = True, tail: float = GATE_TAIL_S) -> None:
        self.half_duplex = half_duplex
        self.tail = tail
        self.is_open = True
        self._last_audible: float | None = None

    def update(self, now: float, agent_audible: bool) -> str | None:
        if not self.half_duplex:
            return None
        if agent_audible:
            self._last_audible = now
        quiet = self._last_audible is None or now - self._last_audible >= self.tail
        should_open = not agent_audible and quiet
        if should_open == self.is_open:
            return None
        self.is_open = should_open
        return "opened" if should_open else "closed"


class FrameQueue:
    """Microphone frames from the audio thread to the event loop.

    `put` may be called from any thread and never blocks: when `maxlen` frames
    are waiting the oldest is dropped and counted in `dropped` (the loop fell
    behind; sending stale speech late would only confuse the model). `get`
    waits on the loop that created the queue.
    """

    def __init__(self, maxlen: int = MIC_QUEUE_FRAMES) -> None:
        self._frames: collections.deque[bytes] = collections.deque()
        self._maxlen = maxlen
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiter: asyncio.Future[None] | None = None
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._frames)

    def put(self, frame: bytes) -> None:
        with self._lock:
            if len(self._frames) >= self._maxlen:
                self._frames.popleft()
                self.dropped += 1
            self._frames.append(frame)
            waiter, loop = self._waiter, self._loop
            self._waiter = None
        if waiter is not None and loop is not None:
            loop.call_soon_threadsafe(_wake, waiter)

    def get_nowait(self) -> bytes | None:
        with self._lock:
            return self._frames.popleft() if self._frames else None

    async def get(self) -> bytes:
        while True:
            loop = asyncio.get_running_loop()
            with self._lock:
                if self._frames:
                    return self._frames.popleft()
                self._loop = loop
                self._waiter = loop.create_future()
                waiter = self._waiter
            await waiter


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
