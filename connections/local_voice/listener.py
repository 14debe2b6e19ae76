"""Turn-taking and live recognition for one `local/voice` session, without I/O.

`Listener` is fed PCM chunks (any rate) and returns what they caused: the user
started speaking, a few more words were recognised, or the utterance ended
(with its audio and the hypothesis of the session's vocabulary-biased decoder).
Speech is found by Silero VAD on 32 ms windows at 16 kHz: it starts after
`min_speech_ms` of windows at or above `start_threshold`, and ends after
`end_silence_ms` below `end_threshold`. Time is counted in samples, so tests
may feed audio faster than real time. It is blocking code (Silero and
PocketSphinx are native): `LocalVoiceConnection` calls it from a worker thread.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

from connections.audio import StreamResampler, float_to_pcm16, pcm16_to_float
from connections.local_voice.speech import RECOGNITION_RATE, Hypothesis, decode

__all__ = ["ListenConfig", "Listener", "PartialText", "SpeechStarted", "Utterance"]

WINDOW = 512  # samples at 16 kHz: the one window size Silero takes
WINDOW_MS = WINDOW * 1000 // RECOGNITION_RATE


@dataclasses.dataclass(frozen=True, slots=True)
class ListenConfig:
    start_threshold: float = 0.5
    end_threshold: float = 0.35
    min_speech_ms: int = 160
    """Speech this long before a turn starts (and a reply is interrupted)."""
    end_silence_ms: int = 640
    preroll_ms: int = 300
    partial_every_ms: int = 320
    max_turn_s: float = 30.0
    """A turn this long ends there, as if the user had paused."""
    phone_image: float = 0.1
    """Narrow-band audio (a phone call: nothing above 4 kHz) reaches the recogniser
    with its 0-4 kHz band mirrored into 4-8 kHz at this gain (0 turns it off):
    PocketSphinx's model was trained on 16 kHz speech and hears an empty upper
    band far worse than a faint copy of the lower one."""


@dataclasses.dataclass(frozen=True, slots=True)
class SpeechStarted:
    """The user started a turn (speech detected, or a manual activity start)."""


@dataclasses.dataclass(frozen=True, slots=True)
class PartialText:
    """Words recognised so far that extend what was already said (a fragment)."""

    text: str


@dataclasses.dataclass(frozen=True, slots=True)
class Utterance:
    """A finished turn: its 16 kHz audio and the biased decoder's hypothesis."""

    audio: bytes
    biased: Hypothesis
    reason: str
    cmn: str
    """The decoder's cepstral mean after the utterance (this speaker, this channel)."""


ListenEvent = SpeechStarted | PartialText | Utterance

_SILENT, _ONSET, _SPEAKING, _MANUAL = range(4)


class Listener:
    """One session's ears. `vad` is a Silero detector, `decoder` a PocketSphinx decoder."""

    def __init__(self, vad, decoder, config: ListenConfig | None = None, *, automatic: bool = True) -> None:  # type: ignore[no-untyped-def]
        self.config = config or ListenConfig()
        self.automatic = automatic
        self._vad = vad
        self._decoder = decoder
        self._resampler: StreamResampler | None = None
        self._pending = np.zeros(0, dtype=np.float32)
        self._state = _SILENT
        self._preroll: collections.deque[bytes] = collections.deque(
            maxlen=max(1, self.config.preroll_ms // WINDOW_MS)
        )
        self._onset: list[bytes] = []
        self._voiced = 0
        self._quiet = 0
        self._utterance = bytearray()
        self._since_partial = 0
        self._said: list[str] = []
        self._band = _BandMeter()

    @property
    def in_turn(self) -> bool:
        return self._state in (_SPEAKING, _MANUAL)

    def feed(self, pcm: bytes, rate: int) -> list[ListenEvent]:
        """Take one PCM16 LE mono chunk at `rate`; returns the events it causes."""
        if not pcm:
            return []
        samples = pcm16_to_float(pcm)
        if rate != RECOGNITION_RATE:
            if self._resampler is None or self._resampler.src_rate != rate:
                self._resampler = StreamResampler(rate, RECOGNITION_RATE)
            samples = self._resampler.process(samples)
        x = np.concatenate((self._pending, samples)) if self._pending.size else samples
        n = x.size // WINDOW
        self._pending = x[n * WINDOW :].copy()
        events: list[ListenEvent] = []
        for i in range(n):
            window = x[i * WINDOW : (i + 1) * WINDOW]
            heard = window
            if self.config.phone_image and self._band.narrow(window):
                heard = window + self.config.phone_image * window * _ALTERNATE
            events.extend(self._window(window, float_to_pcm16(heard)))
        return events

    def _window(self, window: np.ndarray, pcm: bytes) -> list[ListenEvent]:
        cfg = self.config
        if self._state == _MANUAL:
            return self._hear(pcm)
        if not self.automatic:
            return []
        p = self._vad.process_samples(window.tolist())
        if self._state == _SILENT:
            if p >= cfg.start_threshold:
                self._state, self._voiced, self._onset = _ONSET, 1, [pcm]
            else:
                self._preroll.append(pcm)
            return []
        if self._state == _ONSET:
            self._onset.append(pcm)
            self._voiced = self._voiced + 1 if p >= cfg.start_threshold else 0
            if self._voiced == 0 and len(self._onset) * WINDOW_MS > 2 * cfg.min_speech_ms:
                self._preroll.extend(self._onset)  # a blip, not speech
                self._state = _SILENT
                return []
            if self._voiced * WINDOW_MS >= cfg.min_speech_ms:
                self._state, self._quiet = _SPEAKING, 0
                self._begin()
                for piece in [*self._preroll, *self._onset]:
                    self._hear(piece)
                self._preroll.clear()
                return [SpeechStarted()]
            return []
        # speaking
        self._quiet = self._quiet + 1 if p < cfg.end_threshold else 0
        events = self._hear(pcm)
        if self._quiet * WINDOW_MS >= cfg.end_silence_ms:
            events.append(self._end("silence"))
        return events

    def _begin(self) -> None:
        self._utterance = bytearray()
        self._since_partial = 0
        self._said = []
        self._decoder.start_utt()

    def _hear(self, pcm: bytes) -> list[ListenEvent]:
        self._decoder.process_raw(pcm, False, False)
        self._utterance += pcm
        self._since_partial += WINDOW_MS
        if len(self._utterance) / (2 * RECOGNITION_RATE) >= self.config.max_turn_s:
            return [self._end("max_turn")]
        if self._since_partial < self.config.partial_every_ms:
            return []
        self._since_partial = 0
        return self._partial()

    def _partial(self) -> list[ListenEvent]:
        hyp = self._decoder.hyp()
        if hyp is None:
            return []
        stable = result_words(hyp.hypstr)[:-1]  # the last word may still change
        if len(stable) <= len(self._said) or stable[: len(self._said)] != self._said:
            return []
        fresh = " ".join(stable[len(self._said) :])
        text = fresh if not self._said else " " + fresh
        self._said = stable
        return [PartialText(text)]

    def _end(self, reason: str) -> Utterance:
        """End the turn. The utterance is decoded once more: live decoding starts
        from the cepstral mean of the previous turn (or the model's default),
        and a first turn, or a new microphone, is misheard until it adapts; the
        second pass starts adapted (it costs about 5% of the turn's duration)."""
        self._decoder.end_utt()
        self._state = _SILENT
        self._preroll.clear()
        self._vad.reset()
        audio = bytes(self._utterance)
        biased = decode(self._decoder, audio)
        return Utterance(audio, biased, reason, self._decoder.get_cmn())

    def activity_start(self) -> list[ListenEvent]:
        """A manual turn starts now; a detected one in progress is abandoned."""
        if self._state == _MANUAL:
            return []
        if self._state == _SPEAKING:
            self._decoder.end_utt()
        self._state = _MANUAL
        self._begin()
        return [SpeechStarted()]

    def activity_end(self) -> list[ListenEvent]:
        if self._state != _MANUAL:
            return []
        return [self._end("activity_end")]

    def audio_stream_end(self) -> list[ListenEvent]:
        """The microphone stopped: a turn in progress ends, an onset is forgotten."""
        self._resampler = None
        self._pending = np.zeros(0, dtype=np.float32)
        if self._state in (_SPEAKING, _MANUAL):
            return [self._end("audio_stream_end")]
        self._state = _SILENT
        self._vad.reset()
        return []


_ALTERNATE = np.where(np.arange(WINDOW) % 2, -1.0, 1.0).astype(np.float32)
"""(-1)^n: multiplied by it, a 16 kHz signal's spectrum is mirrored about 4 kHz."""


class _BandMeter:
    """Whether the audio so far is narrow-band: over the last second or so of
    windows loud enough to tell (above -50 dBFS), the energy above 4.8 kHz is
    under 1e-4 of the whole (a phone's 8 kHz audio resampled to 16 kHz shows
    about 1e-6; speech recorded at 16 kHz 1e-3 and more)."""

    def __init__(self) -> None:
        self._high = 0.0
        self._total = 0.0
        self._narrow = False

    def narrow(self, window: np.ndarray) -> bool:
        total = float(np.dot(window, window))
        if total / window.size > 1e-5:  # -50 dBFS
            spectrum = np.abs(np.fft.rfft(window)) ** 2
            high = float(spectrum[int(4800 / RECOGNITION_RATE * WINDOW) :].sum())
            self._high = 0.97 * self._high + high
            self._total = 0.97 * self._total + float(spectrum.sum())
            self._narrow = self._high < 2e-3 * self._total
        return self._narrow


def result_words(text: str) -> list[str]:
    return [w for w in text.split() if not w.startswith(("<", "[", "++"))]
