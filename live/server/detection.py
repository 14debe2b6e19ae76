"""The turn models at work for every session of the server: one batch per tick, one worker.

Sessions that take their own turns (`turn_taking="server"`) share two
components the server owns and runs in its task group:

- `VoiceDetection`: every 32 ms it gathers the next window of each session's
  audio (`live.engine.turns.vad`) into one batch per rate (8 kHz phone lines,
  16 kHz the rest), scores it with one Silero run in a worker thread, and
  hands each session its score, in its order. Sessions with more than one
  window waiting (a burst of frames) get up to `max_rounds` batches a tick;
  a session whose audio waits more than a second drops the oldest (counted in
  `dropped`: the detector is behind) and its detector starts afresh.
- `EndOfTurnChecks`: Smart Turn on one worker thread, for the sessions that
  ask it at a pause. At most `max_waiting` questions wait; one more is
  refused at once (`refused`), and that session ends its turn by silence
  timing instead: an answer never holds a turn longer than the silence rule.

Both load their model in a worker thread when the first session needs it,
and count the CPU time they spend (`cpu_seconds`, and `on_cpu` as it goes:
the server's `live_turn_taking_cpu_seconds`), so an operator sees what the
server's own turn-taking costs beside the rest of its work.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread
import numpy as np

from live.engine.turns.vad import RATES, Silero, VoiceStream, next_batch

__all__ = ["EndOfTurnChecks", "VoiceDetection"]

log = logging.getLogger("live.server")

TICK = 0.032  # one detector window


class VoiceDetection:
    """Batched voice detection for every session of one server (see the module)."""

    def __init__(
        self,
        *,
        model: Callable[[], Any] = Silero,
        tick: float = TICK,
        max_rounds: int = 4,
        on_cpu: Callable[[float], None] | None = None,
    ) -> None:
        self._make_model = model
        self._on_cpu = on_cpu
        self.cpu_seconds = 0.0  # the model's runs, the batches' making, each session's handling of its scores
        self._model: Any = None
        self.tick = tick
        self.max_rounds = max_rounds
        self._streams: dict[VoiceStream, Callable[[float], None]] = {}
        self._limiter = anyio.CapacityLimiter(1)
        self._wake = anyio.Event()
        self.runs = 0  # model runs, all told
        self.scored = 0  # windows scored by the model
        self.quiet = 0  # windows scored by the energy floor alone
        self.late_ticks = 0  # ticks that started more than a tick late

    def add(self, stream: VoiceStream, on_score: Callable[[float], None]) -> None:
        """Score `stream`'s windows from now on; `on_score(probability)` gets each, in order."""
        self._streams[stream] = on_score
        self._wake.set()

    def remove(self, stream: VoiceStream) -> None:
        self._streams.pop(stream, None)

    @property
    def dropped(self) -> int:
        return sum(stream.dropped for stream in self._streams)

    def __len__(self) -> int:
        return len(self._streams)

    async def run(self) -> None:
        """Score every session's audio, a tick at a time, until cancelled."""
        while True:
            if not self._streams:
                self._wake = anyio.Event()
                await self._wake.wait()
                continue
            if self._model is None:
                self._model = await anyio.to_thread.run_sync(self._make_model, limiter=self._limiter)
            due = anyio.current_time()
            while self._streams:
                await self._round()
                due += self.tick
                now = anyio.current_time()
                if now > due + self.tick:
                    self.late_ticks += 1
                    due = now  # behind: no burst of ticks to catch up, the backlog is scored in rounds
                await anyio.sleep(max(0.0, due - now))

    async def _round(self) -> None:
        spent = 0.0
        started = time.thread_time()
        for _ in range(self.max_rounds):
            busy = False
            streams = list(self._streams)
            for rate in RATES:
                batch = next_batch(streams, rate)
                if batch is None:
                    continue
                busy = True
                probabilities: Any = ()
                if batch.streams:
                    spent += time.thread_time() - started
                    probabilities, state, cpu = await anyio.to_thread.run_sync(
                        self._run_model, rate, batch.inputs, batch.state, limiter=self._limiter
                    )
                    spent += cpu
                    started = time.thread_time()
                    batch.done(state)
                    self.runs += 1
                    self.scored += len(batch.streams)
                else:
                    batch.done(batch.state)
                self.quiet += len(batch.quiet)
                # Each session hears its score; one that left meanwhile is skipped.
                for stream, probability in zip(batch.streams, probabilities, strict=True):
                    self._deliver(stream, float(probability))
                for stream in batch.quiet:
                    self._deliver(stream, 0.0)
            if not busy:
                break
        self._spent(spent + time.thread_time() - started)

    def _run_model(self, rate: int, inputs: np.ndarray, state: np.ndarray) -> tuple[Any, Any, float]:
        started = time.thread_time()
        probabilities, new_state = self._model.run(rate, inputs, state)
        return probabilities, new_state, time.thread_time() - started

    def _spent(self, seconds: float) -> None:
        self.cpu_seconds += seconds
        if self._on_cpu is not None:
            self._on_cpu(seconds)

    def _deliver(self, stream: VoiceStream, probability: float) -> None:
        on_score = self._streams.get(stream)
        if on_score is None:
            return
        try:
            on_score(probability)
        except Exception:  # one session's failure is its own, never the detector's
            log.exception("a session failed on its voice detection score")
            self._streams.pop(stream, None)


class EndOfTurnChecks:
    """Smart Turn for every session of one server, on one worker thread (see the module).

    `ask(audio, answer, wanted)` queues a question, or returns False when
    `max_waiting` already wait. `answer(probability)` is called in the event
    loop with the model's answer, or with None when it failed. A question no
    longer `wanted()` when its turn comes (its pause ended) is skipped.
    """

    def __init__(
        self,
        *,
        model: Callable[[], Any] | None = None,
        max_waiting: int = 4,
        on_cpu: Callable[[float], None] | None = None,
    ) -> None:
        if model is None:
            from live.engine.turns.smart_turn import SmartTurn

            model = SmartTurn
        self._make_model = model
        self._model: Any = None
        self.max_waiting = max_waiting
        self._send, self._receive = anyio.create_memory_object_stream[
            tuple[np.ndarray, Callable[[float | None], None], Callable[[], bool]]
        ](max_waiting)
        self._limiter = anyio.CapacityLimiter(1)
        self.asked = 0
        self.refused = 0  # questions refused because `max_waiting` were waiting
        self.skipped = 0  # questions whose pause was over before their turn came
        self.cpu_seconds = 0.0
        self._on_cpu = on_cpu

    def ask(
        self, audio: np.ndarray, answer: Callable[[float | None], None], wanted: Callable[[], bool]
    ) -> bool:
        try:
            self._send.send_nowait((audio, answer, wanted))
        except (anyio.WouldBlock, anyio.BrokenResourceError):  # full, or the server stopping
            self.refused += 1
            return False
        self.asked += 1
        return True

    async def run(self) -> None:
        """Answer the questions, one at a time, until cancelled."""
        async with self._receive:
            async for audio, answer, wanted in self._receive:
                if not wanted():
                    self.skipped += 1
                    continue
                try:
                    if self._model is None:
                        self._model = await anyio.to_thread.run_sync(self._make_model, limiter=self._limiter)
                    probability, cpu = await anyio.to_thread.run_sync(self._complete, audio, limiter=self._limiter)
                    self.cpu_seconds += cpu
                    if self._on_cpu is not None:
                        self._on_cpu(cpu)
                except Exception:
                    log.exception("the end-of-turn model failed; the turn ends by silence timing")
                    probability = None
                if probability is not None and not math.isfinite(probability):
                    probability = None
                try:
                    answer(probability)
                except Exception:
                    log.exception("a session failed on its end-of-turn answer")

    def _complete(self, audio: np.ndarray) -> tuple[float, float]:
        started = time.thread_time()
        probability = self._model.complete(audio)
        return probability, time.thread_time() - started
