"""PCM16 helpers shared by the local model and the server: mime parsing, resampling, levels.

Resampling is linear interpolation, preceded by a short windowed-sinc low-pass
when the rate goes down (so 48 kHz microphones do not alias into the reply).
Both add well under a millisecond of delay and keep their state between chunks,
so a stream resampled chunk by chunk has no seams and no bursts. A high-quality
resampler would sound marginally better but adds tens of milliseconds on every
leg (see the field notes), which a live conversation cannot afford.
"""

from __future__ import annotations

import functools
import math

import numpy as np

__all__ = [
    "DEFAULT_INPUT_RATE",
    "OUTPUT_RATE",
    "StreamResampler",
    "dbfs",
    "float_to_pcm16",
    "parse_pcm_mime",
    "pcm16_to_float",
    "resample_pcm16",
]

DEFAULT_INPUT_RATE = 16000
"""The rate Gemini assumes for `audio/pcm` without a `rate=` parameter."""

OUTPUT_RATE = 24000
"""The rate Gemini Live speaks at."""

_MIN_RATE = 8000
_MAX_RATE = 192000


@functools.lru_cache(maxsize=64)
def parse_pcm_mime(mime_type: str | None) -> int:
    """The sample rate of an `audio/pcm[;rate=N]` mime type (16000 when absent).

    Raises `ValueError` for anything that is not raw PCM, or for a rate outside
    8–192 kHz. Cached: clients repeat the same mime type on every chunk.
    """
    if not mime_type:
        raise ValueError("realtime audio needs a mime type such as 'audio/pcm;rate=16000'")
    media, *params = (piece.strip() for piece in mime_type.split(";"))
    if media.lower() != "audio/pcm":
        raise ValueError(
            f"unsupported realtime mime type {mime_type!r}: only raw 16-bit "
            "little-endian mono PCM is accepted ('audio/pcm;rate=N')"
        )
    rate = DEFAULT_INPUT_RATE
    for param in params:
        key, _, value = param.partition("=")
        if key.strip().lower() == "rate":
            try:
                rate = int(value.strip())
            except ValueError:
                raise ValueError(f"bad rate in mime type {mime_type!r}") from None
    if not _MIN_RATE <= rate <= _MAX_RATE:
        raise ValueError(
            f"sample rate {rate} in {mime_type!r} is outside {_MIN_RATE}-{_MAX_RATE} Hz"
        )
    return rate


def pcm16_to_float(data: bytes) -> np.ndarray:
    """PCM16 LE bytes to float32 samples in [-1, 1)."""
    return np.frombuffer(data, dtype="<i2").astype(np.float32) * np.float32(1 / 32768)


def float_to_pcm16(samples: np.ndarray) -> bytes:
    """Float samples to PCM16 LE bytes, rounded and clipped (no wrap-around at ±1.0)."""
    scaled = np.rint(np.asarray(samples, dtype=np.float32) * 32768.0)
    return np.clip(scaled, -32768, 32767).astype("<i2").tobytes()


def dbfs(samples: np.ndarray) -> float:
    """RMS level of float samples in dB relative to full scale (-100 for silence)."""
    if samples.size == 0:
        return -100.0
    power = float(np.mean(np.square(samples, dtype=np.float64)))
    return max(10.0 * math.log10(power), -100.0) if power > 0 else -100.0


def _lowpass_taps(ratio: float) -> np.ndarray:
    """A Hann-windowed sinc passing up to 90% of the new Nyquist frequency."""
    cutoff = 0.45 * ratio  # cycles per input sample
    half = int(math.ceil(4.0 / ratio))
    n = np.arange(-half, half + 1, dtype=np.float64)
    taps = 2 * cutoff * np.sinc(2 * cutoff * n) * np.hanning(2 * half + 3)[1:-1]
    return (taps / taps.sum()).astype(np.float32)


class StreamResampler:
    """Resamples a float32 stream chunk by chunk, carrying phase across chunks.

    Output sample k sits at input time k / dst_rate, so positions in the two
    streams line up; the only delay is the low-pass filter's (0.17 ms from
    48 kHz to 24 kHz; none when upsampling).
    """

    def __init__(self, src_rate: int, dst_rate: int) -> None:
        if src_rate <= 0 or dst_rate <= 0:
            raise ValueError("sample rates must be positive")
        self.src_rate = src_rate
        self.dst_rate = dst_rate
        self._step = src_rate / dst_rate
        self._taps = _lowpass_taps(dst_rate / src_rate) if dst_rate < src_rate else None
        self._history = (
            np.zeros(len(self._taps) - 1, dtype=np.float32) if self._taps is not None else None
        )
        self._last: np.ndarray | None = None  # the previous chunk's final sample
        self._pos = 0.0  # next output position, relative to the start of the next buffer

    def process(self, samples: np.ndarray) -> np.ndarray:
        """Resample one chunk; returns the output samples it completes (float32)."""
        x = np.asarray(samples, dtype=np.float32)
        if self.src_rate == self.dst_rate or x.size == 0:
            return x.copy()
        if self._taps is not None:
            padded = np.concatenate((self._history, x))
            self._history = padded[-(len(self._taps) - 1) :]
            x = np.convolve(padded, self._taps, mode="valid").astype(np.float32)
        buf = x if self._last is None else np.concatenate((self._last, x))
        last_index = buf.size - 1
        if self._pos > last_index:
            count = 0
        else:
            count = int(math.floor((last_index - self._pos) / self._step)) + 1
        positions = self._pos + self._step * np.arange(count, dtype=np.float64)
        out = np.interp(positions, np.arange(buf.size, dtype=np.float64), buf)
        self._pos = self._pos + self._step * count - last_index
        self._last = buf[-1:]
        return out.astype(np.float32)


def resample_pcm16(data: bytes, src_rate: int, dst_rate: int) -> bytes:
    """Resample a whole PCM16 LE mono buffer (one-shot form of `StreamResampler`)."""
    if src_rate == dst_rate or not data:
        return bytes(data)
    x = pcm16_to_float(data)
    # Hold the last sample so the output spans the whole input: n * dst / src samples.
    out = StreamResampler(src_rate, dst_rate).process(np.concatenate((x, x[-1:])))
    return float_to_pcm16(out[: round(x.size * dst_rate / src_rate)])
