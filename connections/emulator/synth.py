"""Deterministic synthetic speech and a frame energy meter; numpy only, no TTS.

The reply "voice" is one voiced tone per word (a pitch derived from the word,
three harmonics, soft edges) with short pauses between words, so it looks like
speech to an energy-based detector and its length follows the text.
"""

from __future__ import annotations

import zlib

import numpy as np

__all__ = [
    "OUTPUT_RATE",
    "frame_rms",
    "fragments",
    "speak",
    "speech_seconds",
]

OUTPUT_RATE = 24_000
_GAP_S = 0.04
_MIN_WORD_S = 0.12


def _word_seconds(word: str, chars_per_second: float) -> float:
    return max(_MIN_WORD_S, (len(word) + 1) / chars_per_second - _GAP_S)


def speech_seconds(text: str, chars_per_second: float) -> float:
    """How long `speak(text)` lasts."""
    words = text.split()
    return sum(_word_seconds(w, chars_per_second) + _GAP_S for w in words)


def speak(text: str, chars_per_second: float = 15.0, rate: int = OUTPUT_RATE) -> bytes:
    """PCM16 little-endian mono audio "saying" `text` (same text, same bytes)."""
    pieces: list[np.ndarray] = []
    gap = np.zeros(int(_GAP_S * rate), dtype=np.float64)
    for word in text.split():
        n = int(_word_seconds(word, chars_per_second) * rate)
        t = np.arange(n) / rate
        f0 = 110.0 + zlib.crc32(word.lower().encode()) % 120
        tone = (
            np.sin(2 * np.pi * f0 * t)
            + 0.5 * np.sin(2 * np.pi * 2 * f0 * t)
            + 0.25 * np.sin(2 * np.pi * 3 * f0 * t)
        )
        ramp = min(n // 2, int(0.01 * rate))
        envelope = np.ones(n)
        if ramp:
            envelope[:ramp] = np.linspace(0.0, 1.0, ramp)
            envelope[-ramp:] = np.linspace(1.0, 0.0, ramp)
        pieces.append(0.3 * tone * envelope)
        pieces.append(gap)
    if not pieces:
        return b""
    samples = np.concatenate(pieces)
    return (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes()


def frame_rms(pcm: bytes, rate: int, frame_ms: int = 10) -> list[tuple[float, float]]:
    """(RMS, duration in ms) of each `frame_ms` frame of PCM16 audio."""
    usable = len(pcm) - len(pcm) % 2
    if usable <= 0:
        return []
    samples = np.frombuffer(pcm[:usable], dtype="<i2").astype(np.float64)
    size = max(1, rate * frame_ms // 1000)
    out = []
    for start in range(0, len(samples), size):
        frame = samples[start : start + size]
        out.append((float(np.sqrt(np.mean(frame * frame))), len(frame) * 1000 / rate))
    return out


def fragments(text: str, size: int = 4) -> list[str]:
    """Cut text into sub-word pieces like the service's transcripts (` Hel`, `lo`)."""
    out: list[str] = []
    for i, word in enumerate(text.split()):
        token = word if i == 0 else " " + word
        out.extend(token[j : j + size] for j in range(0, len(token), size))
    return out
