"""Telephone audio without I/O: G.711 (μ-law, A-law) and streaming resamplers.

Python 3.13 removed `audioop`; G.711 is a 256-entry decode table and a
65 536-entry encode table (every PCM16 value), built once with numpy from the
ITU-T G.711 segment rules (as in Sun's reference `g711.c`). Encoding and
decoding a frame are then one table lookup each.

Rates change with soxr's streaming resampler, one per direction of a call: it
keeps its filter state between chunks, so nothing is dropped or clicks at
chunk edges (a stateless resample per frame would do both).
"""

from __future__ import annotations

import numpy as np
import soxr

__all__ = [
    "CARRIER_RATE",
    "FRAME_BYTES",
    "FrameCutter",
    "Resampler",
    "alaw_decode",
    "alaw_encode",
    "ulaw_decode",
    "ulaw_encode",
]

CARRIER_RATE = 8_000
# 20 ms at 8 kHz, one byte a sample: the frame carriers send and expect.
FRAME_BYTES = 160

_ULAW_BIAS = 0x84
_ULAW_CLIP = 8159  # in 14-bit units
_SEGMENT_ENDS_ULAW = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF])
_SEGMENT_ENDS_ALAW = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])


def _ulaw_decode_table() -> np.ndarray:
    code = ~np.arange(256, dtype=np.int32) & 0xFF
    t = (((code & 0x0F) << 3) + _ULAW_BIAS) << ((code & 0x70) >> 4)
    return np.where(code & 0x80, _ULAW_BIAS - t, t - _ULAW_BIAS).astype("<i2")


def _ulaw_encode_table() -> np.ndarray:
    pcm = np.arange(-32768, 32768, dtype=np.int32) >> 2
    mask = np.where(pcm < 0, 0x7F, 0xFF)
    pcm = np.minimum(np.abs(pcm), _ULAW_CLIP) + (_ULAW_BIAS >> 2)
    segment = np.searchsorted(_SEGMENT_ENDS_ULAW, pcm)
    code = (segment << 4) | ((pcm >> (segment + 1)) & 0x0F)
    code = np.where(segment >= 8, 0x7F, code) ^ mask
    # Indexed by the PCM16 value's bits read as unsigned (`view('<u2')`).
    return np.roll(code.astype(np.uint8), -32768)


def _alaw_decode_table() -> np.ndarray:
    code = np.arange(256, dtype=np.int32) ^ 0x55
    t = (code & 0x0F) << 4
    segment = (code & 0x70) >> 4
    t = np.where(segment == 0, t + 8, (t + 0x108) << np.maximum(segment - 1, 0))
    return np.where(code & 0x80, t, -t).astype("<i2")


def _alaw_encode_table() -> np.ndarray:
    pcm = np.arange(-32768, 32768, dtype=np.int32) >> 3
    mask = np.where(pcm >= 0, 0xD5, 0x55)
    pcm = np.where(pcm >= 0, pcm, -pcm - 1)
    segment = np.searchsorted(_SEGMENT_ENDS_ALAW, pcm)
    low = np.where(segment < 2, pcm >> 1, pcm >> np.maximum(segment, 1)) & 0x0F
    code = np.where(segment >= 8, 0x7F, (segment << 4) | low) ^ mask
    return np.roll(code.astype(np.uint8), -32768)


_ULAW_DECODE = _ulaw_decode_table()
_ULAW_ENCODE = _ulaw_encode_table()
_ALAW_DECODE = _alaw_decode_table()
_ALAW_ENCODE = _alaw_encode_table()


def ulaw_decode(data: bytes) -> bytes:
    """G.711 μ-law bytes as PCM16 little-endian."""
    return _ULAW_DECODE[np.frombuffer(data, np.uint8)].tobytes()


def ulaw_encode(pcm: bytes) -> bytes:
    """PCM16 little-endian as G.711 μ-law bytes."""
    return _ULAW_ENCODE[np.frombuffer(pcm, "<u2")].tobytes()


def alaw_decode(data: bytes) -> bytes:
    """G.711 A-law bytes as PCM16 little-endian."""
    return _ALAW_DECODE[np.frombuffer(data, np.uint8)].tobytes()


def alaw_encode(pcm: bytes) -> bytes:
    """PCM16 little-endian as G.711 A-law bytes."""
    return _ALAW_ENCODE[np.frombuffer(pcm, "<u2")].tobytes()


class Resampler:
    """PCM16 mono from one rate to another, as a stream (one per direction of a call)."""

    # soxr's streams release output in blocks, and a block's wait is latency
    # at the end of every turn. Measured with 20 ms frames: from 8 to 16 kHz
    # "LQ" (passband to 3.2 kHz, enough for a phone's 300-3400 Hz) lags 36 ms
    # in 60 ms blocks where "MQ" lags 42 ms in 110 ms blocks and "HQ" 74 ms;
    # from 24 to 8 kHz "MQ" lags 24 ms with the steeper filter a decimation
    # needs against aliasing. "QQ" lags nothing but does not filter at all.
    def __init__(self, in_rate: int, out_rate: int, quality: str | None = None) -> None:
        self.in_rate = in_rate
        self.out_rate = out_rate
        if quality is None:
            quality = "LQ" if out_rate > in_rate else "MQ"
        self._stream = (
            None if in_rate == out_rate
            else soxr.ResampleStream(in_rate, out_rate, 1, dtype="int16", quality=quality)
        )
        self._odd = b""  # half a sample left from a chunk of odd length

    def __call__(self, pcm: bytes) -> bytes:
        if self._odd:
            pcm, self._odd = self._odd + pcm, b""
        if len(pcm) % 2:
            pcm, self._odd = pcm[:-1], pcm[-1:]
        if self._stream is None:
            return pcm
        return self._stream.resample_chunk(np.frombuffer(pcm, "<i2")).tobytes()

    def reset(self) -> None:
        """Forget what is in the filter (after a barge-in the old reply must not leak into the next)."""
        self._odd = b""
        if self._stream is not None:
            self._stream.clear()


class FrameCutter:
    """Cuts a byte stream into frames of `size` bytes, keeping the remainder for the next call."""

    def __init__(self, size: int = FRAME_BYTES) -> None:
        self.size = size
        self._rest = bytearray()

    def __call__(self, data: bytes) -> list[bytes]:
        rest = self._rest
        rest += data
        size = self.size
        whole = len(rest) - len(rest) % size
        frames = [bytes(rest[i : i + size]) for i in range(0, whole, size)]
        del rest[:whole]
        return frames

    def flush(self, fill: bytes | int) -> bytes | None:
        """The remainder padded to a whole frame with `fill` (one sample of silence), or None."""
        if not self._rest:
            return None
        fill = bytes([fill]) if isinstance(fill, int) else fill
        missing = self.size - len(self._rest)
        frame = bytes(self._rest) + (fill * (missing // len(fill) + 1))[:missing]
        self._rest.clear()
        return frame

    def clear(self) -> None:
        self._rest.clear()

    def __len__(self) -> int:
        return len(self._rest)
