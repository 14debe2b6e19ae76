"""Real speech for tests, made at test time with espeak-ng and sox (no files committed).

    from audio_fixtures import speak, silence, noise, chunked
    pcm = speak("Hello there", rate=16000)   # PCM16 LE mono bytes

Tests that call `speak` are skipped, with the reason, when espeak-ng or sox is
missing (`apt-get install espeak-ng sox`).
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

__all__ = ["best_correlation", "chunked", "noise", "reference_24k", "silence", "speak", "tone", "wav_bytes"]


def _require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} is not installed (apt-get install espeak-ng sox)")
    return path


@functools.lru_cache(maxsize=32)
def speak(text: str, rate: int = 16000, *, voice: str = "en", wpm: int = 160) -> bytes:
    """`text` spoken by espeak-ng, as PCM16 LE mono at `rate` Hz (cached per arguments).

    espeak-ng writes 22.05 kHz WAV; sox converts it to raw PCM at `rate`.
    """
    espeak, sox = _require("espeak-ng"), _require("sox")
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "speech.wav"
        raw = Path(tmp) / "speech.raw"
        subprocess.run(
            [espeak, "-v", voice, "-s", str(wpm), "-w", str(wav), text],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [sox, str(wav), "-t", "raw", "-r", str(rate), "-c", "1", "-b", "16",
             "-e", "signed-integer", "-L", str(raw)],
            check=True,
            capture_output=True,
        )
        return raw.read_bytes()


def silence(seconds: float, rate: int = 16000) -> bytes:
    """Digital silence, PCM16."""
    return bytes(2 * int(seconds * rate))


def tone(seconds: float, rate: int = 16000, freq: float = 440.0, amp: float = 0.3) -> bytes:
    """A sine tone, PCM16: loud, steady "speech" for voice detection that needs no espeak-ng."""
    t = np.arange(int(seconds * rate)) / rate
    return (np.sin(2 * np.pi * freq * t) * amp * 32767).astype("<i2").tobytes()


def noise(seconds: float, rate: int = 16000, *, dbfs: float = -50.0, seed: int = 0) -> bytes:
    """Steady white noise at an RMS level of `dbfs`, PCM16 (reproducible by `seed`)."""
    rng = np.random.default_rng(seed)
    samples = rng.standard_normal(int(seconds * rate)) * (10 ** (dbfs / 20) * 32768)
    return np.clip(np.rint(samples), -32768, 32767).astype("<i2").tobytes()


def chunked(pcm: bytes, rate: int = 16000, ms: int = 20) -> Iterator[bytes]:
    """`pcm` in chunks of `ms` milliseconds (the last may be shorter)."""
    step = rate * ms // 1000 * 2
    for offset in range(0, len(pcm), step):
        yield pcm[offset : offset + step]


def wav_bytes(pcm: bytes, rate: int = 16000) -> bytes:
    """`pcm` wrapped as a mono 16-bit WAV file (for browsers and players)."""
    import io
    import wave

    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm)
    return out.getvalue()


def reference_24k(pcm16k: bytes) -> np.ndarray:
    """An independent resampling (np.interp) to compare a 24 kHz reply with."""
    x = np.frombuffer(pcm16k, "<i2").astype(np.float64)
    t = np.arange(int(x.size * 1.5)) / 24000
    return np.interp(t, np.arange(x.size) / 16000, x)


def best_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Normalised cross-correlation at the best lag (1.0: the same signal, shifted)."""
    n = a.size + b.size
    spec = np.fft.rfft(a, n) * np.conj(np.fft.rfft(b, n))
    return float(np.max(np.fft.irfft(spec, n)) / (np.linalg.norm(a) * np.linalg.norm(b)))
