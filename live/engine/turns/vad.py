"""Voice detection for many sessions at once: Silero VAD v6, batched, with no I/O.

Silero scores one window of audio at a time (32 ms: 512 samples at 16 kHz,
256 at 8 kHz) with a recurrent state. A `VoiceStream` is one session's audio
cut into those windows, with its state kept as a row; `next_batch` gathers the
next window of every stream at one rate into one input, so one model run
(`Silero.run`) scores every session (the output is the same as one run per
session, to the bit), and `Batch.done` gives each stream its state back.

A window that is plainly not speech is scored 0 without the model (it costs
nothing): quieter than the stream's energy floor (a quiet room), or no louder
than the background it sits in (steady noise: the background's level is
tracked as the quietest recent windows, rising at most `FLOOR_RISE_DB` a
second, and speech stands `ABOVE_BACKGROUND_DB` above it even at 5 dB SNR). A
stream that was quiet for a while starts again from a fresh state: Silero's
state drifts over long non-speech and then under-reports the speech that
follows.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = ["RATES", "Batch", "Silero", "VoiceStream", "next_batch"]

# Detector rate -> (window, context) in samples.
RATES = {16_000: (512, 64), 8_000: (256, 32)}
STATE_SHAPE = (2, 128)
# Quiet windows after which a stream's state starts afresh (about 0.5 s).
RESET_AFTER_QUIET = 16
FLOOR_RISE_DB = 3.0  # per second: the background level follows louder noise this slowly
ABOVE_BACKGROUND_DB = 4.0  # a window this close to the background is the background


class VoiceStream:
    """One session's audio as the detector takes it.

    `feed` takes PCM16 at the session's `input_rate`; the detector runs at
    `rate` (16 kHz, or 8 kHz for a phone line), so audio at another rate is
    resampled (soxr's streaming resampler). At most `max_backlog` seconds wait
    for the detector; beyond it the oldest audio is dropped (`dropped`
    windows) and the stream starts afresh: the detector is behind, and the
    newest audio matters most.
    """

    def __init__(
        self,
        input_rate: int,
        rate: int = 16_000,
        *,
        floor_dbfs: float = -55.0,
        max_backlog: float = 1.0,
        noise_filter: Any = None,
    ) -> None:
        if rate not in RATES:
            raise ValueError(f"the detector runs at {' or '.join(map(str, RATES))} Hz, not {rate}")
        self.input_rate = input_rate
        self.rate = rate
        self.window, self.context_size = RATES[rate]
        self.window_seconds = self.window / rate
        # RMS of a full-scale float window at the floor, squared (no sqrt per window).
        self._floor_power = (10 ** (floor_dbfs / 20)) ** 2
        self._resampler = None
        if input_rate != rate:
            import soxr

            self._resampler = soxr.ResampleStream(input_rate, rate, 1, dtype="int16", quality="LQ")
        self._noise_filter = noise_filter
        # The audio waiting for the detector, PCM16 at `rate`: appending bytes
        # costs less than converting each frame; a window is converted once.
        self._pending = bytearray()
        self._window_bytes = 2 * self.window
        self._max_backlog = max(self.window, int(max_backlog * rate)) * 2
        self.state = np.zeros(STATE_SHAPE, np.float32)
        self.context = np.zeros(self.context_size, np.float32)
        self.background_db = math.nan  # the background's level, from the quietest recent windows
        self._rise_db = FLOOR_RISE_DB * self.window_seconds
        self.quiet = 0  # quiet windows in a row
        self.dropped = 0  # windows dropped because the detector was behind
        self.scored = 0  # windows scored, by the model or the floor

    def feed(self, pcm: bytes) -> None:
        """Audio of the session (PCM16 at its input rate), for the detector."""
        if self._resampler is not None:
            pcm = self._resampler.resample_chunk(np.frombuffer(pcm, "<i2")).tobytes()
        if self._noise_filter is not None:
            pcm = self._noise_filter(pcm)
        pending = self._pending
        pending += pcm
        if len(pending) > self._max_backlog:
            self._drop_backlog()

    @property
    def ready(self) -> int:
        """Whole windows waiting for the detector."""
        return len(self._pending) // self._window_bytes

    def take(self) -> bytes:
        """The next window, PCM16 at `rate` (call only when `ready`)."""
        size = self._window_bytes
        window = bytes(self._pending[:size])
        del self._pending[:size]
        return window

    def is_quiet(self, power: float) -> bool:
        """Below the energy floor, or no louder than the background: not speech,
        whatever the model would say. `power` is the window's mean square
        (full scale 1). Tracks the background as it goes."""
        if power < self._floor_power:
            return True
        level = 10 * math.log10(power)
        background = self.background_db
        if not level >= background + self._rise_db:  # quieter, or the first window (nan)
            self.background_db = level
        else:
            self.background_db = background + self._rise_db
        return level < background + ABOVE_BACKGROUND_DB

    def restart(self) -> None:
        """Forget the detector's state (after a long quiet, or a gap in the audio)."""
        self.state = np.zeros(STATE_SHAPE, np.float32)
        self.context = np.zeros(self.context_size, np.float32)

    def _drop_backlog(self) -> None:
        keep = self._max_backlog // self._window_bytes * self._window_bytes
        drop = (len(self._pending) - keep) // self._window_bytes * self._window_bytes
        if drop <= 0:
            return
        self.dropped += drop // self._window_bytes
        del self._pending[:drop]
        self.restart()


@dataclasses.dataclass(slots=True)
class Batch:
    """The next window of some streams at one rate: what the model scores in one run.

    `quiet` streams' windows were below their floor: they score 0 without it.
    """

    rate: int
    streams: list[VoiceStream]
    inputs: np.ndarray  # [B, context + window]
    state: np.ndarray  # [2, B, 128]
    quiet: list[VoiceStream]

    def done(self, state: np.ndarray) -> None:
        """The model ran: each stream keeps its row of the new state and its context
        (views of the batch's arrays: nothing writes to them, the next batch stacks them)."""
        inputs = self.inputs
        for i, stream in enumerate(self.streams):
            stream.state = state[:, i, :]
            stream.context = inputs[i, -stream.context_size :]
            stream.scored += 1
        for stream in self.quiet:
            stream.scored += 1


def next_batch(streams: Iterable[VoiceStream], rate: int) -> Batch | None:
    """The next window of every stream at `rate` that has one; None when none has.

    The windows are converted and their energy measured together, as one
    array: per stream, only the floor's bookkeeping is Python's."""
    window, context = RATES[rate]
    ready = [stream for stream in streams if stream.rate == rate and stream.ready]
    if not ready:
        return None
    samples = np.frombuffer(b"".join([stream.take() for stream in ready]), "<i2").reshape(len(ready), window)
    samples = samples.astype(np.float32)
    samples *= 1 / 32768
    # Not einsum or a matrix product: those may call OpenBLAS, whose idle
    # threads then spin for a millisecond at every tick.
    powers = (np.square(samples).sum(axis=1) / window).tolist()
    scored: list[VoiceStream] = []
    rows: list[int] = []
    quiet: list[VoiceStream] = []
    for i, stream in enumerate(ready):
        if stream.is_quiet(powers[i]):
            stream.quiet += 1
            quiet.append(stream)
            continue
        if stream.quiet >= RESET_AFTER_QUIET:
            stream.restart()
        stream.quiet = 0
        scored.append(stream)
        rows.append(i)
    inputs = np.empty((len(scored), context + window), np.float32)
    if scored:
        inputs[:, context:] = samples[rows]
        inputs[:, :context] = np.stack([stream.context for stream in scored])
        state = np.stack([stream.state for stream in scored], axis=1)
    else:
        state = np.zeros((2, 0, 128), np.float32)
    return Batch(rate, scored, inputs, state, quiet)


class Silero:
    """Silero VAD v6 (ONNX) run by onnxruntime: one call scores a batch of streams.

    `session` is an onnxruntime session of `silero_vad.onnx`; by default the
    process's shared one (`live.engine.turns.models`). `run` only computes:
    it may run in a worker thread (onnxruntime releases the GIL).
    """

    def __init__(self, session: Any = None) -> None:
        if session is None:
            from live.engine.turns.models import SILERO, onnx_session

            session = onnx_session(SILERO)
        self.session = session
        self._rates = {rate: np.array(rate, np.int64) for rate in RATES}

    def run(self, rate: int, inputs: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Speech probabilities [B] and the new state [2, B, 128] for a batch."""
        if not inputs.shape[0]:
            return np.zeros(0, np.float32), state
        output, new_state = self.session.run(None, {"input": inputs, "state": state, "sr": self._rates[rate]})
        return output[:, 0], new_state


def dbfs(window: np.ndarray) -> float:
    """The level of a float window in dBFS (for tests and logs)."""
    power = float(np.dot(window, window)) / max(1, window.size)
    return 10 * math.log10(power) if power > 0 else -math.inf
