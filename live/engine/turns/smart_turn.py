"""Smart Turn v3.2: does the user's turn sound finished? With no I/O.

An audio end-of-turn model (Daily, BSD-2-Clause): a Whisper-tiny encoder and
a classifier, int8, about 8.7 MB, in the `pipecat-ai` wheel. It takes the
turn's last 8 s at 16 kHz (shorter turns padded with silence in front) as
Whisper log-mel features and answers a probability that the turn is complete.
Every call costs the same (the input is always 8 s), about 30 ms of CPU on
the machine behind docs/performance.md, so the server asks it once per pause.

The features' one matrix product runs on one BLAS thread (threadpoolctl,
for the call only): OpenBLAS's own threads would spin for milliseconds after
each product, CPU that doubles the call's cost on two cores and that no
count of the caller's thread sees.

The features are computed here with numpy (no `transformers`): Whisper's
log-mel as `transformers.WhisperFeatureExtractor(chunk_length=8)` computes it
(n_fft 400, hop 160, 80 Slaney mel bands, the waveform normalised to zero
mean and unit variance first, log10 clamped to 8 below its peak, scaled as
`(x + 4) / 4`, the last frame dropped). tests/test_turns_models.py checks them
against the numpy copy pipecat ships.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

__all__ = ["RATE", "SECONDS", "SmartTurn", "log_mel"]

RATE = 16_000
SECONDS = 8
N_FFT = 400
HOP = 160
N_MELS = 80


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    hz = np.asarray(hz, np.float64)
    linear = 3.0 * hz / 200.0
    log = 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) * (27.0 / np.log(6.4))
    return np.where(hz >= 1000.0, log, linear)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, np.float64)
    linear = 200.0 * mel / 3.0
    log = 1000.0 * np.exp((np.log(6.4) / 27.0) * (mel - 15.0))
    return np.where(mel >= 15.0, log, linear)


@functools.cache
def _mel_filters() -> np.ndarray:
    """[N_MELS, N_FFT // 2 + 1] triangular filters with Slaney's area normalisation."""
    edges = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(RATE / 2), N_MELS + 2))
    bins = np.linspace(0, RATE // 2, N_FFT // 2 + 1)
    widths = np.diff(edges)
    slopes = edges[None, :] - bins[:, None]
    down = -slopes[:, :-2] / widths[:-1]
    up = slopes[:, 2:] / widths[1:]
    filters = np.maximum(0.0, np.minimum(down, up))
    filters *= 2.0 / (edges[2:] - edges[:-2])
    return filters.T


@functools.cache
def _window() -> np.ndarray:
    return np.hanning(N_FFT + 1)[:-1]  # periodic Hann, as torch.hann_window


def log_mel(audio: np.ndarray) -> np.ndarray:
    """Whisper's log-mel features [80, 800] of 8 s of 16 kHz audio (float32)."""
    x = np.zeros(RATE * SECONDS, np.float32)
    audio = np.asarray(audio, np.float32)[: x.size]
    x[: audio.size] = audio
    x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)
    padded = np.pad(x.astype(np.float64), N_FFT // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP]
    power = np.abs(np.fft.rfft(frames * _window(), axis=-1)) ** 2
    mel = np.log10(np.maximum(1e-10, _mel_filters() @ power.T))[:, :-1]
    mel = np.maximum(mel, mel.max() - 8.0)
    return ((mel + 4.0) / 4.0).astype(np.float32)


def last_seconds(audio: np.ndarray) -> np.ndarray:
    """The turn as the model takes it: its last 8 s, silence in front when shorter."""
    size = RATE * SECONDS
    audio = np.asarray(audio, np.float32)[-size:]
    if audio.size < size:
        audio = np.concatenate((np.zeros(size - audio.size, np.float32), audio))
    return audio


@functools.cache
def _blas() -> Any:
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


class SmartTurn:
    """Smart Turn v3.2 run by onnxruntime. `complete(audio)` only computes: it
    may run in a worker thread."""

    def __init__(self, session: Any = None) -> None:
        if session is None:
            from live.engine.turns.models import SMART_TURN, onnx_session

            session = onnx_session(SMART_TURN)
        self.session = session

    def complete(self, audio: np.ndarray) -> float:
        """The probability that a turn (16 kHz float audio, from its onset to now) is finished."""
        with _blas().limit(limits=1, user_api="blas"):
            features = log_mel(last_seconds(audio))[None]
        return float(self.session.run(None, {"input_features": features})[0].reshape(-1)[0])
