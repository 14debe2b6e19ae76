"""An optional noise suppressor in front of the voice detector, for noisy phone lines.

Speex's noise suppression (`speexdsp-ns`, BSD, Xiph's speexdsp), 10 ms frames
at the detector's own rate (8 kHz on a phone line). It filters the detector's
copy of the audio only: the model hears the line as it is. About 40 us of CPU
per 20 ms of audio; it leaves speech the detector already finds alone, and
takes out steady hiss and hum (docs/turn-taking.md).
"""

from __future__ import annotations

from live.extras import require

__all__ = ["NoiseFilter"]


class NoiseFilter:
    """PCM16 in, the same audio denoised out, in whole 10 ms frames (the rest waits for the next call)."""

    def __init__(self, rate: int) -> None:
        require("noise", "the noise filter (TurnSettings.noise_filter)", "speexdsp_ns")
        from speexdsp_ns import NoiseSuppression

        self.frame_bytes = rate // 100 * 2
        self._suppressor = NoiseSuppression.create(rate // 100, rate)
        self._rest = b""

    def __call__(self, pcm: bytes) -> bytes:
        data = self._rest + pcm if self._rest else pcm
        size = self.frame_bytes
        whole = len(data) // size * size
        self._rest = data[whole:]
        process = self._suppressor.process
        return b"".join(process(data[start : start + size]) for start in range(0, whole, size))
