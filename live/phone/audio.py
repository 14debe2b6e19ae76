"""Telephone audio without I/O: G.711 (μ-law, A-law) and streaming resamplers.

Python 3.13 removed `audioop`; G.711 is a 256-entry decode table and a
65 536-entry encode table (every PCM16 value), built once with numpy from the
ITU-T G.711 segment rules (as in Sun's reference `g711.c`). Encoding and
decoding a frame are then one table lookup each.

Rates change with a streaming polyphase filter, one per direction of a call
(`Resampler`): it keeps its state between chunks, so nothing is dropped or
clicks at chunk edges (a stateless resample per frame would do both).
"""

from __future__ import annotations

import functools
import math

import numpy as np

__all__ = [
    "alaw_from_samples",
    "alaw_samples",
    "ulaw_from_samples",
    "ulaw_samples",
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


_ULAW_FLOAT = _ULAW_DECODE.astype(np.float32)
_ALAW_FLOAT = _ALAW_DECODE.astype(np.float32)


def ulaw_samples(data: bytes) -> np.ndarray:
    """G.711 μ-law bytes as samples (float32), for a resampler."""
    return _ULAW_FLOAT[np.frombuffer(data, np.uint8)]


def alaw_samples(data: bytes) -> np.ndarray:
    return _ALAW_FLOAT[np.frombuffer(data, np.uint8)]


def ulaw_from_samples(pcm: np.ndarray) -> bytes:
    """PCM16 samples as G.711 μ-law bytes."""
    return _ULAW_ENCODE[pcm.view("<u2")].tobytes()


def alaw_from_samples(pcm: np.ndarray) -> bytes:
    return _ALAW_ENCODE[pcm.view("<u2")].tobytes()


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
    """PCM16 mono from one rate to another, as a stream (one per direction of a call).

    A polyphase FIR filter (a Kaiser-windowed sinc) at the ratio of the two
    rates: flat (within 0.1 dB) to 85 % of the lower rate's Nyquist frequency
    (3.4 kHz for a phone's 8 kHz: all a phone carries) and 50 dB down (below
    G.711's own noise) where the lower rate would fold or image, with about
    1.5 ms of delay. soxr's streams, which the first version used, release
    their output in blocks of 60-110 ms (latency at the end of every turn),
    and the preset fast enough for a call ("LQ") cut 3.4 kHz by 7.9 dB.

    The filter runs on blocks of `BLOCK_MS` of output at a time, every block
    of a chunk in one matrix product (`_block_matrix`, shared by every call at
    the same rates). Input short of a whole block waits for the next chunk
    (`flush` pads it out at the end of a reply); the filter's state (the last
    input samples) is kept between chunks, so nothing is dropped or clicks at
    chunk edges. `samples` takes and gives numpy arrays, so a codec's table
    lookup feeds it with no bytes in between.
    """

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._odd = b""  # half a sample left from a chunk of odd length
        self._matrix = None if in_rate == out_rate else _block_matrix(in_rate, out_rate)
        if self._matrix is not None:
            self._block = self._matrix.shape[1] * in_rate // out_rate
            self._history = self._matrix.shape[0] - self._block
            self._frame_in = self._history + in_rate // 50
        self.reset()

    def reset(self) -> None:
        """Forget what is in the filter (after a barge-in the old reply must not leak into the next)."""
        self._odd = b""
        if self._matrix is not None:
            # The input not yet filtered, after the last `taps - 1` samples that were.
            self._input = np.zeros(self._history, np.float32)

    def __call__(self, pcm: bytes) -> bytes:
        if self._odd:
            pcm, self._odd = self._odd + pcm, b""
        if len(pcm) % 2:
            pcm, self._odd = pcm[:-1], pcm[-1:]
        if self._matrix is None or not pcm:
            return pcm
        return self.samples(np.frombuffer(pcm, "<i2")).tobytes()

    def samples(self, x: np.ndarray) -> np.ndarray:
        """Samples (any numeric array) in, PCM16 samples out (as many as whole blocks allow)."""
        if self._matrix is None:
            return x.astype("<i2", copy=False)
        data = self._input = np.concatenate((self._input, x), dtype=np.float32)
        if len(data) == self._frame_in:
            # A carrier's 20 ms frame and nothing waiting (the caller's side, frame
            # after frame): one matrix-vector product over the input as it lies.
            out = _frame_matrix(self.in_rate, self.out_rate) @ data
            self._input = data[len(data) - self._history :]
            np.minimum(np.maximum(out, -32768, out=out), 32767, out=out)
            return out.astype("<i2")
        return self._filter()

    def flush(self) -> bytes:
        """The input still short of a block, padded with silence to one (at the end of a reply)."""
        if self._matrix is None:
            return b""
        kept = len(self._input) - self._history
        if kept <= 0:
            return b""
        self._input = np.concatenate((self._input, np.zeros(self._block - kept, np.float32)))
        return self._filter().tobytes()

    def _filter(self) -> np.ndarray:
        matrix, block, data = self._matrix, self._block, self._input
        blocks = (len(data) - self._history) // block
        if blocks <= 0:
            return _NO_SAMPLES
        # Every block's window of input as a row (copied: the windows overlap),
        # then one matrix product for the whole chunk.
        step = data.strides[0]
        out = np.ndarray((blocks, matrix.shape[0]), np.float32, data, 0, (block * step, step)).copy() @ matrix
        self._input = data[blocks * block :]
        out = out.ravel()
        np.minimum(np.maximum(out, -32768, out=out), 32767, out=out)  # (np.clip: more overhead per call)
        return out.astype("<i2")


_NO_SAMPLES = np.zeros(0, "<i2")


# Output samples per block: the filter runs on a few milliseconds of input at a
# time (at 8 kHz out, 2 ms), so its matrix is mostly taps, not zeros.
BLOCK_MS = 2


@functools.cache
def _block_matrix(in_rate: int, out_rate: int) -> np.ndarray:
    """The filter from `in_rate` to `out_rate` as a matrix: a block of output
    (`BLOCK_MS`) from a block of input and the `taps - 1` samples before it."""
    common = math.gcd(in_rate, out_rate)
    up, down = out_rate // common, in_rate // common
    phases = _polyphase(in_rate, out_rate, up)
    taps = phases.shape[1]
    # A whole number of `up` outputs per block, so every block starts on phase 0.
    outputs = max(up, out_rate * BLOCK_MS // 1000 // up * up)
    matrix = np.zeros((outputs, outputs * down // up + taps - 1), np.float32)
    for row in range(outputs):
        position = row * down  # in the input stuffed with `up - 1` zeros per sample
        newest = taps - 1 + position // up
        matrix[row, newest - np.arange(taps)] = phases[position % up]
    matrix = np.ascontiguousarray(matrix.T)  # input samples by output samples: (window @ matrix)
    matrix.setflags(write=False)
    return matrix


@functools.cache
def _frame_matrix(in_rate: int, out_rate: int) -> np.ndarray:
    """The filter for one 20 ms frame, as one matrix: output samples by the
    frame's input and the `taps - 1` samples before it (`_block_matrix`'s
    blocks, laid along its diagonal)."""
    block = _block_matrix(in_rate, out_rate)
    width, outputs = block.shape
    step = width - (block.shape[0] - (outputs * in_rate // out_rate))  # input samples per block
    step = outputs * in_rate // out_rate
    count = out_rate // 50 // outputs
    matrix = np.zeros((count * outputs, (count - 1) * step + width), np.float32)
    for k in range(count):
        matrix[k * outputs : (k + 1) * outputs, k * step : k * step + width] = block.T
    matrix.setflags(write=False)
    return matrix


# The passband, as a share of the lower rate's Nyquist frequency, and how far
# down what would fold or image is.
PASSBAND = 0.85
ATTENUATION_DB = 50.0


def _polyphase(in_rate: int, out_rate: int, up: int) -> np.ndarray:
    """A Kaiser-windowed sinc for `in_rate` to `out_rate`, as `up` phases of its
    taps (newest input first): output at stuffed position m is the sum over j
    of phase[m % up][j] * input[m // up - j]."""
    rate = in_rate * up  # the filter runs at the rate the input is stuffed to
    nyquist = min(in_rate, out_rate) / 2
    edge = PASSBAND * nyquist
    stop = 2 * nyquist - edge  # what lies beyond folds (or images) onto the passband
    transition = 2 * math.pi * (stop - edge) / rate
    length = int(math.ceil((ATTENUATION_DB - 7.95) / (2.285 * transition))) + 1
    length = -(-length // up) * up  # a whole number of taps per phase
    beta = 0.1102 * (ATTENUATION_DB - 8.7)
    cutoff = (edge + stop) / 2 / rate  # cycles per sample
    t = np.arange(length) - (length - 1) / 2
    h = 2 * cutoff * np.sinc(2 * cutoff * t) * np.kaiser(length, beta)
    h *= up / h.sum()  # unity gain at 0 Hz once `up - 1` zeros follow each input sample
    return np.stack([h[p::up] for p in range(up)])


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

    def whole(self, data: bytes) -> bytes:
        """The whole frames `data` completes, as one run of bytes; the remainder waits."""
        rest = self._rest
        rest += data
        whole = len(rest) - len(rest) % self.size
        out = bytes(rest[:whole])
        del rest[:whole]
        return out

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
