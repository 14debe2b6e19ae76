"""Whether the user is speaking, as the conversation policies need to know it (no I/O).

The policies that wait for the user's silence, or keep a must-hear segment
from being interrupted, need one fact: when the user starts and stops
speaking. They take it as two events (`UserVoice`: `user_started(now)`,
`user_stopped(now)`), so any detector can feed them: `ScoredSpeech` here
over the server's voice detection (Silero's speech probability per window,
the `turns` extra), else `EnergyDetector`, a plain level detector over the
user's audio, which takes a loud steady noise for speech.

`EnergyDetector` measures the RMS level of each 20 ms of audio (PCM16 at the
session's input rate, in frames of any size): speech begins after `attack`
of audio above `threshold_dbfs` (short clicks are not speech) and ends after
`hangover` below it (the pauses between words are not silence). Time is the
user's audio time, counted in windows, never a clock: a phone line sends 50
frames a second whether anyone speaks or not, and only the level tells.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np

__all__ = ["EnergyDetector", "ScoredSpeech", "SpeechDetector", "UserVoice"]


class UserVoice(Protocol):
    """Where a detector tells that the user started or stopped speaking."""

    def user_started(self, now: float) -> object: ...

    def user_stopped(self, now: float) -> object: ...


class SpeechDetector(Protocol):
    """A detector fed the user's audio as it comes: `feed` answers True when
    speech began in it, False when it ended, None when nothing changed."""

    speaking: bool

    def feed(self, pcm: bytes) -> bool | None: ...


WINDOW_SECONDS = 0.02


class EnergyDetector:
    """Speech by level: RMS over 20 ms windows, with an attack and a hangover (see the module)."""

    __slots__ = ("speaking", "_window", "_threshold", "_attack", "_hangover", "_pending", "_run", "_quiet")

    def __init__(
        self,
        rate: int,
        *,
        threshold_dbfs: float = -40.0,
        attack: float = 0.1,
        hangover: float = 0.5,
    ) -> None:
        self.speaking = False
        self._window = max(1, int(rate * WINDOW_SECONDS)) * 2  # bytes of PCM16 per window
        # Compared as the mean of squares: no square root per window.
        level = 32768.0 * 10 ** (threshold_dbfs / 20)
        self._threshold = level * level
        self._attack = max(1, math.ceil(attack / WINDOW_SECONDS - 1e-9))
        self._hangover = max(1, math.ceil(hangover / WINDOW_SECONDS - 1e-9))
        self._pending = b""  # audio short of a window
        self._run = 0  # loud windows in a row (while not speaking)
        self._quiet = 0  # quiet windows in a row (while speaking)

    def feed(self, pcm: bytes) -> bool | None:
        data = self._pending + pcm if self._pending else pcm
        window = self._window
        whole = len(data) - len(data) % window
        self._pending = data[whole:]
        if not whole:
            return None
        samples = np.frombuffer(data, "<i2", whole // 2).astype(np.float32).reshape(-1, window // 2)
        powers = np.einsum("ij,ij->i", samples, samples) / (window // 2)
        changed: bool | None = None
        for loud in (powers > self._threshold).tolist():
            if self.speaking:
                self._quiet = 0 if loud else self._quiet + 1
                if self._quiet >= self._hangover:
                    self.speaking, self._quiet, changed = False, 0, False
            else:
                self._run = self._run + 1 if loud else 0
                if self._run >= self._attack:
                    self.speaking, self._run, changed = True, 0, True
        return changed


class ScoredSpeech:
    """Speech by a voice detector's scores: a speech probability per window of
    `window` seconds. Speech begins after `attack` of windows at or above
    `threshold`, and stays speech down to `threshold - hysteresis` until
    `hangover` below it: the attack and hangover of `EnergyDetector`, on what
    a model says is speech instead of on loudness."""

    __slots__ = ("speaking", "_threshold", "_low", "_attack", "_hangover", "_run", "_quiet")

    def __init__(self, window: float, *, threshold: float = 0.5, hysteresis: float = 0.15,
                 attack: float = 0.1, hangover: float = 0.5) -> None:
        self.speaking = False
        self._threshold = threshold
        self._low = threshold - hysteresis
        self._attack = max(1, math.ceil(attack / window - 1e-9))
        self._hangover = max(1, math.ceil(hangover / window - 1e-9))
        self._run = 0  # speech windows in a row (while not speaking)
        self._quiet = 0  # windows below speech in a row (while speaking)

    def scored(self, probability: float) -> bool | None:
        """The next window's probability: True when speech began, False when it ended."""
        if self.speaking:
            self._quiet = 0 if probability >= self._low else self._quiet + 1
            if self._quiet >= self._hangover:
                self.speaking, self._quiet = False, 0
                return False
        else:
            self._run = self._run + 1 if probability >= self._threshold else 0
            if self._run >= self._attack:
                self.speaking, self._run = True, 0
                return True
        return None
