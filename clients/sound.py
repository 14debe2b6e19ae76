"""The sound devices `live mic` talks through: PortAudio's microphone and
speaker streams (via sounddevice), resampling for devices that refuse the
protocol's rates, and what to tell a user whose machine has no sound.

Threads: PortAudio calls two callbacks on its own threads. They only copy
bytes: the microphone callback appends to a bounded `FrameQueue`, the speaker
callback pulls from a lock-guarded `JitterBuffer`.
"""

from __future__ import annotations

import contextlib
import glob
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, TextIO

import anyio
import numpy as np

from clients.mic_buffers import BLOCK_MS, FrameQueue, JitterBuffer
from live.protocol import DEFAULT_INPUT_RATE, OUTPUT_RATE

__all__ = [
    "AudioDeviceError", "AudioIO", "PcmResampler", "Playback", "QuietStderr", "is_library_noise", "list_devices",
    "no_device", "quiet_sound_libraries",
]


class PcmResampler:
    """PCM16 mono from one rate to another, chunk by chunk, through libsoxr.

    Used only where a device refuses the protocol's rate (a microphone at
    44.1/48 kHz, a speaker that will not take 24 kHz). soxr's "HQ" filter keeps
    what the lower rate cannot carry from folding back as audible aliases.
    """

    def __init__(self, src_rate: int, dst_rate: int) -> None:
        import soxr

        self.src_rate = src_rate
        self.dst_rate = dst_rate
        self._stream = soxr.ResampleStream(src_rate, dst_rate, 1, dtype="int16", quality="HQ")

    def process(self, pcm: bytes) -> bytes:
        samples = np.frombuffer(pcm, dtype="<i2")
        return self._stream.resample_chunk(samples).astype("<i2", copy=False).tobytes()


class AudioDeviceError(Exception):
    """No usable microphone or speaker; the message says which and why."""


def _import_sounddevice() -> Any:
    try:
        import sounddevice
    except OSError:  # the PortAudio library itself is missing
        raise AudioDeviceError(
            "no sound library: PortAudio is not installed; install it (Debian and Ubuntu: "
            "sudo apt-get install libportaudio2; macOS: brew install portaudio) and run live mic again"
        ) from None
    return sounddevice


# What the sound libraries write to the process's stderr from C, bypassing
# Python: alsa-lib's default error handler ("ALSA lib pcm.c:8740:(snd_pcm_recover)
# underrun occurred", alsa-lib src/error.c), PortAudio's checks in its ALSA host
# API ("Expression '...' failed in 'src/hostapi/alsa/pa_linux_alsa.c', line: N")
# and JACK's client when no JACK server runs ("Cannot connect to server socket").
_LIBRARY_NOISE = (
    b"ALSA lib ",
    b"Expression '",
    b"Cannot connect to server",
    b"jack server is not running",
    b"JackShmReadWritePtr",
)


def is_library_noise(line: bytes) -> bool:
    """A line a sound library wrote to stderr on its own (not for the user)."""
    return line.lstrip().startswith(_LIBRARY_NOISE)


@contextlib.contextmanager
def quiet_sound_libraries() -> Iterator[QuietStderr | None]:
    """Keep the sound libraries' own stderr lines out of the conversation.

    ALSA, PortAudio and JACK write to file descriptor 2 from C (an underrun, a
    probe of a device that is not there): on a terminal those lines land in
    the middle of the transcript. While this is open, fd 2 goes through a pipe
    whose reader thread drops such lines and passes every other line on;
    Python's own stderr is the same descriptor, so its lines pass too.
    Nothing is done where fd 2 cannot be redirected (no POSIX pipes).
    """
    try:
        quiet = QuietStderr()
    except (OSError, AttributeError):
        yield None
        return
    with quiet:
        yield quiet


class QuietStderr:
    """fd 2 through a filtering pipe, from `__enter__` to `__exit__` (which joins its thread)."""

    def __init__(self) -> None:
        self.dropped = 0
        self._saved = os.dup(2)
        self._reader: int | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> QuietStderr:
        sys.stderr.flush()
        reader, writer = os.pipe()
        os.dup2(writer, 2)
        os.close(writer)
        self._reader = reader
        self._thread = threading.Thread(target=self._pump, name="live-mic-stderr", daemon=True)
        self._thread.start()
        return self

    def _pump(self) -> None:
        assert self._reader is not None
        with os.fdopen(self._reader, "rb", buffering=0) as pipe:
            for line in iter(pipe.readline, b""):
                if is_library_noise(line):
                    self.dropped += 1
                else:
                    os.write(self._saved, line)

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(ValueError, OSError):
            sys.stderr.flush()
        os.dup2(self._saved, 2)  # the pipe's last writer closes: the reader sees its end
        if self._thread is not None:
            self._thread.join(timeout=5)
        os.close(self._saved)


def _sound_servers() -> str:
    """Why this machine may have no sound, as far as it can be seen from here."""
    if sys.platform != "linux":
        return "no sound device is connected"
    reasons = []
    if not os.path.exists("/dev/snd"):
        reasons.append("no sound card (/dev/snd)")
    runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}"
    pulse = os.environ.get("PULSE_SERVER") or (
        os.path.join(runtime, "pulse", "native") if os.path.exists(os.path.join(runtime, "pulse", "native")) else None
    )
    if pulse is None:
        reasons.append("no PulseAudio or PipeWire server running")
    elif not glob.glob("/usr/lib/*/alsa-lib/libasound_module_pcm_pulse.so") and not glob.glob(
        "/usr/lib*/alsa-lib/libasound_module_pcm_pulse.so"
    ):
        reasons.append("a PulseAudio server, but not ALSA's plugin to reach it (sudo apt-get install libasound2-plugins)")
    return " and ".join(reasons) or "PortAudio sees no device"


def no_device(sd: Any, kind: str) -> AudioDeviceError:
    """What to tell a user whose default microphone (`kind` "input") or speaker is missing."""
    word = "microphone" if kind == "input" else "speaker"
    try:
        devices = [dict(d) for d in sd.query_devices()]
    except Exception:  # noqa: BLE001 - a library that cannot list devices has none to offer
        devices = []
    if not devices:
        return AudioDeviceError(
            f"no sound device: this machine has no microphone or speaker that PortAudio can open "
            f"({_sound_servers()}); start PulseAudio (pulseaudio --start) or plug a sound device in, "
            "or talk from the browser page of live serve on a machine that has one"
        )
    names = "; ".join(f"[{i}] {d.get('name', '?')}" for i, d in enumerate(devices))
    if not any(d.get(f"max_{kind}_channels", 0) > 0 for d in devices):
        return AudioDeviceError(f"no {word}: none of the sound devices here has one ({names}); plug one in")
    return AudioDeviceError(
        f"no default {word}: choose one with --{kind}-device INDEX ({names}; live mic --list-devices shows them)"
    )


def _device(spec: str | None) -> int | str | None:
    if spec is None:
        return None
    return int(spec) if spec.isdigit() else spec


class Playback:
    """The speaker side: a `JitterBuffer` shared with the audio thread under a lock."""

    def __init__(self, buffer: JitterBuffer) -> None:
        self.buffer = buffer
        self.lock = threading.Lock()

    def callback(self, outdata: Any, frames: int, _time: Any, _status: Any) -> None:
        with self.lock:
            data = self.buffer.pull(frames)
        outdata[:, 0] = np.frombuffer(data, dtype="<i2")

    async def push(self, pcm: bytes) -> None:
        """Queue audio; waits (back-pressure on the socket) while the buffer is full."""
        while True:
            with self.lock:
                if self.buffer.push(pcm):
                    return
            await anyio.sleep(BLOCK_MS / 1000)

    def flush(self) -> int:
        with self.lock:
            return self.buffer.flush()

    def mark_end(self) -> None:
        with self.lock:
            self.buffer.mark_end()

    def audible(self) -> bool:
        with self.lock:
            return self.buffer.audible


class AudioIO:
    """The microphone and speaker streams (opened on enter, closed on exit).

    Each stream is opened at the protocol's rate (16 kHz in, 24 kHz out). A
    device that refuses that rate is opened at its own default rate instead,
    and the event loop resamples; the callbacks never do more than copy.
    """

    def __init__(self, input_device: str | None, output_device: str | None) -> None:
        self.sd = _import_sounddevice()
        self.input_device = _device(input_device)
        self.output_device = _device(output_device)
        self.frames = FrameQueue()
        self.playback: Playback | None = None
        self.mic_rate = DEFAULT_INPUT_RATE
        self.speaker_rate = OUTPUT_RATE
        self.output_latency = 0.0
        self.overflows = 0  # microphone blocks the device dropped (the machine was busy)
        self.underflows = 0  # speaker blocks the device played as silence
        self._stack = contextlib.ExitStack()
        self._to_server: PcmResampler | None = None  # when the mic runs at another rate
        self._to_speaker: PcmResampler | None = None

    def _check(self, device: int | str | None, kind: str) -> dict[str, Any]:
        word = "microphone" if kind == "input" else "speaker"
        try:
            return dict(self.sd.query_devices(device, kind=kind))
        except ValueError as exc:
            text = str(exc)
            if text.startswith("Multiple"):
                matches = "; ".join(text.splitlines()[1:])
                raise AudioDeviceError(
                    f"the {word} name {device!r} matches several devices ({matches}): "
                    "give its index or more of its name"
                ) from None
            which = f" {device!r}" if device is not None else ""
            raise AudioDeviceError(
                f"no {word}{which} found ({text}); `live mic --list-devices` shows what there is"
            ) from None
        except self.sd.PortAudioError as exc:
            if device is None:  # "Error querying device -1": there is no default one
                raise no_device(self.sd, kind) from None
            raise AudioDeviceError(f"the audio system cannot find the {word} {device!r}: {_portaudio_reason(exc)}") from None

    def _open(self, factory: Callable[..., Any], device: Any, rate: int, info: dict[str, Any],
              **kwargs: Any) -> tuple[Any, int]:
        sd = self.sd
        try:
            stream = factory(device=device, samplerate=rate, channels=1, dtype="int16",
                             blocksize=rate * BLOCK_MS // 1000, latency="low", **kwargs)
            return stream, rate
        except sd.PortAudioError:
            pass
        native = int(info.get("default_samplerate") or 48000)
        try:
            stream = factory(device=device, samplerate=native, channels=1, dtype="int16",
                             blocksize=native * BLOCK_MS // 1000, latency="low", **kwargs)
        except sd.PortAudioError as exc:
            raise AudioDeviceError(f"cannot open {info.get('name', 'the device')!r}: {exc}") from None
        return stream, native

    def __enter__(self) -> AudioIO:
        sd = self.sd
        in_info = self._check(self.input_device, "input")
        out_info = self._check(self.output_device, "output")
        try:
            out_stream, self.speaker_rate = self._open(
                sd.OutputStream, self.output_device, OUTPUT_RATE, out_info,
                callback=self._speaker_callback,
            )
            self.playback = Playback(JitterBuffer(rate=self.speaker_rate))
            self._start(out_stream, out_info)
            in_stream, self.mic_rate = self._open(
                sd.InputStream, self.input_device, DEFAULT_INPUT_RATE, in_info,
                callback=self._mic_callback,
            )
            self._start(in_stream, in_info)
        except BaseException:
            self._stack.close()
            raise
        self.output_latency = float(out_stream.latency or 0.0)
        if self.mic_rate != DEFAULT_INPUT_RATE:
            self._to_server = PcmResampler(self.mic_rate, DEFAULT_INPUT_RATE)
        if self.speaker_rate != OUTPUT_RATE:
            self._to_speaker = PcmResampler(OUTPUT_RATE, self.speaker_rate)
        return self

    def _start(self, stream: Any, info: dict[str, Any]) -> None:
        try:
            self._stack.enter_context(stream)
        except self.sd.PortAudioError as exc:
            stream.close()
            raise AudioDeviceError(
                f"cannot start {info.get('name', 'the device')!r}: {_portaudio_reason(exc)}"
            ) from None

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _mic_callback(self, indata: Any, _frames: int, _time: Any, status: Any) -> None:
        if status and status.input_overflow:
            self.overflows += 1
        self.frames.put(indata.tobytes())

    def _speaker_callback(self, outdata: Any, frames: int, time_: Any, status: Any) -> None:
        if status and status.output_underflow:
            self.underflows += 1
        if self.playback is None:
            outdata.fill(0)
        else:
            self.playback.callback(outdata, frames, time_, status)

    def to_server(self, frame: bytes) -> bytes:
        return frame if self._to_server is None else self._to_server.process(frame)

    def to_speaker(self, pcm: bytes) -> bytes:
        return pcm if self._to_speaker is None else self._to_speaker.process(pcm)


def _portaudio_reason(exc: BaseException) -> str:
    args = getattr(exc, "args", ())
    return str(args[0]) if args else str(exc)


def list_devices(out: TextIO) -> int:
    sd = _import_sounddevice()
    try:
        devices = sd.query_devices()
    except sd.PortAudioError:
        devices = []
    if not len(devices):
        raise no_device(sd, "input")
    out.write(f"{devices}\n")
    return 0
