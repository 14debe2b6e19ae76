"""An optional noise suppressor in front of the voice detector, for noisy phone lines.

Speex's noise suppression (`speexdsp-ns`, BSD, Xiph's speexdsp), 10 ms frames
at the detector's own rate (8 kHz on a phone line). It filters the detector's
copy of the audio only: the model hears the line as it is. About 40 us of CPU
per 20 ms of audio; it leaves speech the detector already finds alone, and
takes out steady hiss and hum (docs/turn-taking.md).
"""

from __future__ import annotations

import numpy as np

from live.extras import require

__all__ = ["NoiseFilter"]


class NoiseFilter:
    """Float audio in, the same audio denoised out (10 ms late at most: whole frames only)."""

    def __init__(self, rate: int) -> None:
        require("noise", "the noise filter (TurnSettings.noise_filter)", "speexdsp_ns")
        from speexdsp_ns import NoiseSuppression

        self.frame = rate // 100
        self._suppressor = NoiseSuppression.create(self.frame, rate)
        self._rest = np.zeros(0, np.float32)

    def __call__(self, samples: np.ndarray) -> np.ndarray:
        x = np.concatenate((self._rest, samples)) if self._rest.size else samples
        whole = x.size // self.frame * self.frame
        self._rest = x[whole:].copy()
        if not whole:
            return x[:0]
        pcm = (np.clip(x[:whole], -1.0, 1.0) * 32767).astype("<i2")
        out = bytearray()
        frame_bytes = self.frame * 2
        data = pcm.tobytes()
        for start in range(0, len(data), frame_bytes):
            out += self._suppressor.process(data[start : start + frame_bytes])
        return np.frombuffer(bytes(out), "<i2").astype(np.float32) / 32768
