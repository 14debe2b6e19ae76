"""Voice activity and turn-taking without I/O: plain classes fed PCM, returning events.

`EnergyVad` finds speech by frame energy against an adaptive noise floor.
`TurnTracker` builds on it: it keeps the user's utterance (resampled for the
reply), honours manual activity start/end and the end of the audio stream, and
says when a turn starts and ends. Neither knows about tasks, sockets or clocks:
time is counted in samples, so tests may feed audio faster than real time.
"""

from __future__ import annotations

import collections
import dataclasses
import enum

import numpy as np

from connections.audio import OUTPUT_RATE, StreamResampler, float_to_pcm16, pcm16_to_float

__all__ = [
    "EnergyVad",
    "TurnEnded",
    "TurnStarted",
    "TurnTracker",
    "VadConfig",
    "VadEvent",
    "VadEventKind",
]


@dataclasses.dataclass(frozen=True, slots=True)
class VadConfig:
    """Thresholds of `EnergyVad`; the defaults suit a close microphone in a quiet room.

    A frame is voiced when its level is `margin_db` above the noise floor and at
    least `min_speech_dbfs`. The floor starts as the quietest of the first
    `warmup_ms` (nothing is detected then), follows quieter frames within about
    100 ms and rises at most `floor_rise_db_per_s`, so it settles on the
    background between words and adapts to a louder room in a few seconds.
    Digital silence (below `floor_min_dbfs`) says nothing about the room and
    leaves the floor alone once warmed up.
    """

    frame_ms: int = 20
    min_speech_ms: int = 150
    """Voiced time needed before speech counts as started; shorter blips are ignored."""
    onset_gap_ms: int = 200
    """A gap this long before `min_speech_ms` is reached abandons the onset."""
    end_silence_ms: int = 600
    """Unvoiced time after which speech counts as ended."""
    margin_db: float = 12.0
    hysteresis_db: float = 3.0
    """Once speaking, frames stay voiced down to `margin_db - hysteresis_db`."""
    min_speech_dbfs: float = -50.0
    warmup_ms: int = 200
    floor_min_dbfs: float = -90.0
    floor_rise_db_per_s: float = 3.0
    floor_fall: float = 0.2
    """Fraction of the distance to a quieter frame the floor moves per frame."""


class VadEventKind(enum.Enum):
    SPEECH_STARTED = "speech_started"
    SPEECH_ENDED = "speech_ended"


@dataclasses.dataclass(frozen=True, slots=True)
class VadEvent:
    """`time_s` is stream time: the onset for a start, the last voiced frame's end for an end."""

    kind: VadEventKind
    time_s: float


_SILENT, _ONSET, _SPEAKING = range(3)


class EnergyVad:
    """Energy-based voice activity detection over fixed frames.

    Feed PCM of any chunk size; leftovers shorter than a frame wait for the next
    chunk. Per chunk the work is one numpy pass for the frame energies plus a few
    comparisons per frame.
    """

    def __init__(self, config: VadConfig | None = None) -> None:
        self.config = config or VadConfig()
        self._floor = float("inf")
        self._warmup_ms = 0
        self._rate = 0
        self._frame_len = 0
        self._rest = np.zeros(0, dtype=np.float32)
        self._time = 0.0
        self._state = _SILENT
        self.reset()

    @property
    def speaking(self) -> bool:
        """True between a speech start and its end."""
        return self._state == _SPEAKING

    @property
    def noise_floor_dbfs(self) -> float:
        """The current noise floor estimate (inf before the first frame)."""
        return self._floor

    @property
    def time_s(self) -> float:
        """Stream time of the audio analysed so far (whole frames only)."""
        return self._time

    @property
    def last_voiced_s(self) -> float:
        """End of the last voiced frame of the speech in progress."""
        return self._last_voiced

    def reset(self) -> None:
        """Forget speech in progress and partial frames; keep the noise floor and time."""
        self._state = _SILENT
        self._rest = np.zeros(0, dtype=np.float32)
        self._onset = 0.0
        self._voiced_ms = 0
        self._gap_ms = 0
        self._silence_ms = 0
        self._last_voiced = self._time

    def feed(self, pcm: bytes, rate: int) -> list[VadEvent]:
        """Analyse PCM16 LE mono at `rate`; returns the events it completes, in order."""
        return self.feed_samples(pcm16_to_float(pcm), rate)

    def feed_samples(self, samples: np.ndarray, rate: int) -> list[VadEvent]:
        """Like `feed`, for float32 samples in [-1, 1)."""
        cfg = self.config
        if rate != self._rate:
            self._rate = rate
            self._frame_len = max(1, rate * cfg.frame_ms // 1000)
            self._rest = np.zeros(0, dtype=np.float32)
        x = np.concatenate((self._rest, samples)) if self._rest.size else samples
        n = x.size // self._frame_len
        used = n * self._frame_len
        self._rest = x[used:].astype(np.float32, copy=True)
        if n == 0:
            return []
        frames = x[:used].reshape(n, self._frame_len)
        power = np.einsum("ij,ij->i", frames, frames, dtype=np.float64) / self._frame_len
        levels = (10.0 * np.log10(np.maximum(power, 1e-10))).tolist()

        frame_s = self._frame_len / rate
        frame_ms = cfg.frame_ms
        rise = cfg.floor_rise_db_per_s * frame_s
        events: list[VadEvent] = []
        for level in levels:
            start = self._time
            self._time = start + frame_s
            if self._warmup_ms < cfg.warmup_ms:
                self._warmup_ms += frame_ms
                self._floor = min(self._floor, max(level, cfg.floor_min_dbfs))
                continue
            threshold = max(self._floor + cfg.margin_db, cfg.min_speech_dbfs)
            if self._state == _SPEAKING:
                threshold -= cfg.hysteresis_db
            voiced = level >= threshold
            if level < cfg.floor_min_dbfs:
                pass
            elif level < self._floor:
                self._floor += (level - self._floor) * cfg.floor_fall
            else:
                self._floor = min(level, self._floor + rise)

            if self._state == _SILENT:
                if voiced:
                    self._state, self._onset = _ONSET, start
                    self._voiced_ms, self._gap_ms = frame_ms, 0
            elif self._state == _ONSET:
                if voiced:
                    self._voiced_ms += frame_ms
                    self._gap_ms = 0
                    if self._voiced_ms >= cfg.min_speech_ms:
                        self._state, self._silence_ms = _SPEAKING, 0
                        self._last_voiced = self._time
                        events.append(VadEvent(VadEventKind.SPEECH_STARTED, self._onset))
                else:
                    self._gap_ms += frame_ms
                    if self._gap_ms >= cfg.onset_gap_ms:
                        self._state = _SILENT
            elif voiced:
                self._silence_ms = 0
                self._last_voiced = self._time
            else:
                self._silence_ms += frame_ms
                if self._silence_ms >= cfg.end_silence_ms:
                    self._state = _SILENT
                    events.append(VadEvent(VadEventKind.SPEECH_ENDED, self._last_voiced))
        return events


@dataclasses.dataclass(frozen=True, slots=True)
class TurnStarted:
    """The user started a turn (speech detected, or a manual activity start)."""

    manual: bool


@dataclasses.dataclass(frozen=True, slots=True)
class TurnEnded:
    """The user's turn ended; `audio` is the utterance as PCM16 LE mono at `rate`.

    `reason` is "silence", "activity_end" or "audio_stream_end". `truncated`
    says the utterance was longer than the tracker keeps (the start is kept).
    """

    audio: bytes
    rate: int
    reason: str
    truncated: bool = False


TurnEvent = TurnStarted | TurnEnded


class TurnTracker:
    """Turn-taking for one audio stream, and the utterance of each turn.

    Audio is resampled to `out_rate` as it arrives, so a turn's audio is ready
    the moment it ends. While idle only the last `history_s` are kept (for the
    `preroll_s` before a detected onset); during a turn at most `max_turn_s` are
    kept — speech beyond that is dropped, and the turn still ends normally, on
    silence or a signal. Between a manual `activity_start` and `activity_end`
    the energy detector is bypassed and everything received is the turn.
    """

    def __init__(
        self,
        vad_config: VadConfig | None = None,
        *,
        automatic: bool = True,
        out_rate: int = OUTPUT_RATE,
        max_turn_s: float = 30.0,
        preroll_s: float = 0.2,
        tail_s: float = 0.1,
        history_s: float = 1.5,
    ) -> None:
        self.vad = EnergyVad(vad_config)
        self.automatic = automatic
        self.out_rate = out_rate
        self._max = int(max_turn_s * out_rate)
        self._preroll = int(preroll_s * out_rate)
        self._tail = int(tail_s * out_rate)
        self._history = int(history_s * out_rate)
        self._resampler: StreamResampler | None = None
        self._chunks: collections.deque[np.ndarray] = collections.deque()
        self._buf_start = 0  # absolute output index of self._chunks[0]
        self._buf_len = 0
        self._out_pos = 0  # absolute output index of the end of the stream so far
        self._time_offset = 0  # out index where the VAD's time 0 falls
        self._turn_start: int | None = None
        self._manual = False

    @property
    def in_turn(self) -> bool:
        return self._turn_start is not None

    @property
    def manual(self) -> bool:
        return self._manual

    def feed(self, pcm: bytes, rate: int) -> list[TurnEvent]:
        """Take one PCM16 LE mono chunk at `rate`; returns the turn events it causes."""
        if not pcm:
            return []
        samples = pcm16_to_float(pcm)
        if self._resampler is None or self._resampler.src_rate != rate:
            self._resampler = StreamResampler(rate, self.out_rate)
        self._append(self._resampler.process(samples))
        if self._manual or not self.automatic:
            return []
        events: list[TurnEvent] = []
        for ev in self.vad.feed_samples(samples, rate):
            at = self._time_offset + round(ev.time_s * self.out_rate)
            if ev.kind is VadEventKind.SPEECH_STARTED:
                self._turn_start = max(at - self._preroll, self._buf_start)
                events.append(TurnStarted(manual=False))
            elif self._turn_start is not None:
                events.append(self._end(at + self._tail, "silence"))
        return events

    def activity_start(self) -> list[TurnEvent]:
        """Begin a manual turn now; a detected turn in progress is abandoned."""
        if self._manual:
            return []
        self._manual = True
        self.vad.reset()
        self._turn_start = self._out_pos
        return [TurnStarted(manual=True)]

    def activity_end(self) -> list[TurnEvent]:
        """End the manual turn; the audio since `activity_start` is the utterance."""
        if not self._manual:
            return []
        self._manual = False
        event = self._end(self._out_pos, "activity_end")
        self._restart_vad()
        return [event]

    def audio_stream_end(self) -> list[TurnEvent]:
        """The microphone stopped: end any turn in progress, forget a mere onset."""
        events: list[TurnEvent] = []
        if self._manual:
            self._manual = False
            events.append(self._end(self._out_pos, "audio_stream_end"))
        elif self._turn_start is not None:
            end = self._time_offset + round(self.vad.last_voiced_s * self.out_rate)
            events.append(self._end(end + self._tail, "audio_stream_end"))
        self._resampler = None  # the next audio is a new stream
        self._restart_vad()
        return events

    def _restart_vad(self) -> None:
        self.vad.reset()
        self._time_offset = self._out_pos - round(self.vad.time_s * self.out_rate)

    def _append(self, out: np.ndarray) -> None:
        start = self._out_pos
        self._out_pos += out.size
        if self._turn_start is not None:
            room = self._turn_start + self._max - start
            if room <= 0:
                return  # beyond the kept maximum: dropped
            out = out[:room]
        self._chunks.append(out)
        self._buf_len += out.size
        self._trim()

    def _trim(self) -> None:
        if self._turn_start is not None:
            return
        while self._chunks and self._buf_len - self._chunks[0].size >= self._history:
            dropped = self._chunks.popleft()
            self._buf_len -= dropped.size
            self._buf_start += dropped.size

    def _end(self, end: int, reason: str) -> TurnEnded:
        start = self._turn_start if self._turn_start is not None else self._out_pos
        self._turn_start = None
        kept_end = min(end, self._out_pos, start + self._max)
        truncated = min(end, self._out_pos) > start + self._max
        data = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.float32)
        lo = max(start - self._buf_start, 0)
        hi = max(kept_end - self._buf_start, lo)
        audio = float_to_pcm16(data[lo:hi])
        # Keep the recent past for the next turn's preroll, if it is contiguous
        # (after a truncated turn it is not, and is simply dropped).
        data_end = self._buf_start + data.size
        self._chunks.clear()
        keep = data[max(data.size - self._history, 0) :] if data_end == self._out_pos else data[:0]
        if keep.size:
            self._chunks.append(keep.copy())
        self._buf_len = keep.size
        self._buf_start = self._out_pos - keep.size
        return TurnEnded(audio=audio, rate=self.out_rate, reason=reason, truncated=truncated)
