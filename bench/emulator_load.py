"""The upstream of the real-path benchmark: `live emulator` with a load script.

    python -m bench.emulator_load

Runs the Live emulator (`connections.emulator`: the Gemini Live wire protocol
over TLS, its own CA, the service's checks on every frame) with a session that
talks like a busy model instead of its synthetic conversation. It prints one
JSON line, `{"base_url", "ws_url", "ca_file", "api_key", "port", "idle_rss"}`,
then obeys one command per line on stdin, as `bench.endpoint` does: `mark`
starts the measurement window, `report` prints the window's figures as one JSON
line, `quit` (or end of input) stops.

What every session does once its first microphone frame arrives (that frame
names the client, `bench.stats.UP`), starting at a random point of a turn so
sessions spread out:

- the model speaks without pause: turns of 10 bursts of 5 or 6 chunks of 40 ms
  of 24 kHz PCM16, one burst every 200-240 ms (real time), each chunk an
  audio-only `serverContent` message (camelCase keys, standard base64), as the
  service sends them; every chunk carries the time it was *due*
  (`bench.stats.down_chunk`), so a late emulator counts as latency, in both
  the relayed and the direct run alike;
- a turn ends with `generationComplete` and `turnComplete`, and the next one
  starts at once; the first turn and every third after it is cut after half:
  `interrupted`, then `turnComplete` 80 ms later, then the next turn;
- every realtime audio chunk is checked as the service checks it, and every
  20 ms frame in it is timed against the send time it carries.
"""

from __future__ import annotations

import json
import random
from base64 import b64encode
import resource
import sys
import time
from typing import Any

import anyio
import anyio.to_thread

from bench.endpoint import rss_bytes
from bench.stats import DOWN, MAGIC, UP, UP_FRAME_BYTES, Histogram, down_chunk
from connections.emulator import Emulator, EmulatorSession
from live.net.loop import backend_options
from live.server.port import tune_gc_for_serving

__all__ = ["LoadDirector", "LoadSession", "main"]

CHUNK_S = 0.04
OUTPUT_MIME = "audio/pcm;rate=24000"
BURSTS = 10
INTERRUPT_EVERY = 3
INTERRUPT_AFTER_BURSTS = 5
TURN_COMPLETE_AFTER_INTERRUPT_S = 0.08
TURN_S = BURSTS * 5.5 * CHUNK_S  # about 2.2 s of speech

_GENERATION_COMPLETE = {"serverContent": {"generationComplete": True}}
_TURN_COMPLETE = {"serverContent": {"turnComplete": True}}
_INTERRUPTED = {"serverContent": {"interrupted": True}}


# A chunk is its 24-byte stamp and a fixed tail; 24 bytes are whole base64
# groups, so the tail is encoded once and every chunk's data is the stamp's
# 32 characters before it (the same text as encoding the whole chunk).
assert DOWN.size % 3 == 0
_TAIL_B64 = b64encode(down_chunk(0, 0, 0, 0)[DOWN.size :]).decode("ascii")


def _audio(client: int, turn: int, seq: int, stamp: int) -> dict[str, Any]:
    """An audio-only serverContent message, as the service sends one."""
    head = b64encode(DOWN.pack(MAGIC, client, turn, seq, stamp)).decode("ascii")
    data = head + _TAIL_B64
    return {"serverContent": {"modelTurn": {"parts": [{"inlineData": {"mimeType": OUTPUT_MIME, "data": data}}]}}}


class LoadDirector:
    """The figures of every session of this process, kept for the measured window."""

    def __init__(self, seed: int = 1) -> None:
        self.rng = random.Random(seed)
        self.measuring = False
        self.sessions: list[LoadSession] = []
        self.reset(measuring=False)

    def reset(self, *, measuring: bool = True) -> None:
        """A new measured window starts (its figures from zero)."""
        self.measuring = measuring
        self.up_latency = Histogram()
        self.up_frames = 0
        self.up_gaps = 0
        self.down_chunks = 0
        self.interrupts: list[tuple[int, int, int]] = []  # client, turn, due (ns)
        self.late = Histogram()  # how late the emulator sent what was due: its own lag


class LoadSession(EmulatorSession):
    """One emulated Live connection that speaks continuously and times what it hears."""

    keep_traffic = False  # thousands of frames a minute per session: nothing kept

    def __init__(self, *args: Any, director: LoadDirector, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.director = director
        director.sessions.append(self)
        self.client: int | None = None
        self.last_seq = -1
        self.turn = 0
        self._burst = 0
        self._chunk = 0
        self._sizes: list[int] = []

    def heard_audio(self, data: bytes, rate: int) -> None:
        director = self.director
        now = time.monotonic_ns()
        # A relay may send frames that waited as one chunk: each keeps its stamp.
        for offset in range(0, len(data) - UP.size + 1, UP_FRAME_BYTES):
            magic, client, seq, sent_ns = UP.unpack_from(data, offset)
            if magic != MAGIC:
                continue
            if director.measuring:
                director.up_latency.add(now - sent_ns)
                director.up_frames += 1
                if self.client is not None and seq > self.last_seq + 1:
                    director.up_gaps += seq - self.last_seq - 1
            if self.client is None:
                self.client = client
                start = self._now + director.rng.uniform(0, TURN_S)
                self._at(start, lambda: self._start_turn(start))
            self.last_seq = max(self.last_seq, seq)

    # -- the script, one scheduled step at a time (times in seconds, the loop's clock)

    def _start_turn(self, due: float) -> None:
        self.turn += 1
        self._burst = self._chunk = 0
        rng = self.director.rng
        self._sizes = [rng.choice((5, 6)) for _ in range(BURSTS)]
        self._speak(due)

    def _speak(self, due: float) -> None:
        director = self.director
        if director.measuring:
            director.late.add(int((time.monotonic() - due) * 1e9))
        if self.turn % INTERRUPT_EVERY == 1 and self._burst == INTERRUPT_AFTER_BURSTS:
            self._send(_INTERRUPTED)
            if director.measuring:
                director.interrupts.append((self.client or 0, self.turn, int(due * 1e9)))
            after = due + TURN_COMPLETE_AFTER_INTERRUPT_S
            self._at(after, lambda: self._end_turn(after, complete=False))
            return
        if self._burst == BURSTS:
            self._end_turn(due, complete=True)
            return
        size = self._sizes[self._burst]
        self._burst += 1
        stamp = int(due * 1e9)
        client, turn, first = self.client or 0, self.turn, self._chunk
        for seq in range(first, first + size):
            self._send(_audio(client, turn, seq, stamp))
        self._chunk += size
        if director.measuring:
            director.down_chunks += size
        following = due + size * CHUNK_S
        self._at(following, lambda: self._speak(following))

    def _end_turn(self, due: float, *, complete: bool) -> None:
        if complete:
            self._send(_GENERATION_COMPLETE)
        self._send(_TURN_COMPLETE)
        self._start_turn(due)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def main(port: int = 0) -> None:
    director = LoadDirector()

    def session(*args: Any, **kwargs: Any) -> LoadSession:
        return LoadSession(*args, director=director, **kwargs)

    emulator = Emulator(session_class=session)
    tune_gc_for_serving()
    async with emulator.serving(port):
        idle_rss = rss_bytes()
        _emit(
            {
                "base_url": emulator.base_url,
                "ws_url": emulator.ws_url(),
                "ca_file": emulator.ca_file,
                "api_key": emulator.api_key,
                "port": emulator.port,
                "idle_rss": idle_rss,
            }
        )
        marked_cpu, marked_at = _cpu_seconds(), time.monotonic()
        open_at_mark = 0
        while True:
            command = (await anyio.to_thread.run_sync(sys.stdin.readline)).strip()
            if command == "mark":
                director.reset()
                marked_cpu, marked_at = _cpu_seconds(), time.monotonic()
                open_at_mark = sum(1 for s in director.sessions if not s.closed)
            elif command == "report":
                director.measuring = False
                _emit(
                    {
                        "window_s": time.monotonic() - marked_at,
                        "cpu_s": _cpu_seconds() - marked_cpu,
                        "rss": rss_bytes(),
                        "idle_rss": idle_rss,
                        # Open when the window started; the clients close theirs once
                        # it ends, so a count taken now would race them.
                        "sessions": open_at_mark,
                        # Closed by the emulator (an error the service would close with).
                        "closes": [s.record.close for s in director.sessions if s.record.close][:10],
                        "up_latency": director.up_latency.to_json(),
                        "up_frames": director.up_frames,
                        "up_gaps": director.up_gaps,
                        "down_chunks": director.down_chunks,
                        "interrupts": director.interrupts,
                        "late": director.late.to_json(),
                    }
                )
            else:  # quit, or stdin closed
                return


if __name__ == "__main__":
    anyio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 0, backend_options=backend_options("auto"))
