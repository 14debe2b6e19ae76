"""`live mic`: talk to a live server from this terminal's microphone and speaker.

The microphone is captured as 16 kHz mono PCM16 in 20 ms blocks and streamed to
the server; the agent's 24 kHz reply plays through a small jitter buffer that is
flushed the moment the server says `turn.interrupted`. The conversation is
printed as it happens.

Speaker echo: a laptop microphone hears the laptop's speaker, and the model then
takes its own voice for the user barging in. So by default the microphone is
*gated* (half-duplex): while the agent's audio plays, and for a short tail after
it drains, nothing is sent; `audio.end` goes out when the gate closes so the
model does not wait for the rest of an utterance. Sending nothing (rather than
silence) keeps the model's voice detection from seeing a fake pause and costs no
bandwidth. With `--headphones` the microphone is always open (full duplex) and
you can interrupt the agent by talking.

Threads: PortAudio calls two callbacks on its own threads. They only copy
bytes: the microphone callback appends to a bounded `FrameQueue` (oldest frame
dropped when full: stale speech is worse than lost speech), the speaker callback
pulls from a lock-guarded `JitterBuffer`. Everything else runs on the event loop.

The pieces without I/O (`JitterBuffer`, `MicGate`, `FrameQueue`,
`ConversationView`) are plain classes, tested on their own.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import io
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

import anyio
import numpy as np

from clients.client import (
    DEFAULT_URL,
    AudioFrame,
    ConnectionLost,
    LiveClient,
    Reattaching,
    SessionRefused,
)
from live.protocol import (
    DEFAULT_INPUT_RATE,
    OUTPUT_RATE,
    ErrorEvent,
    GenerationComplete,
    ServerEvent,
    SessionClosed,
    SessionGoAway,
    SessionReattached,
    SessionReconnecting,
    SessionResumed,
    SessionStarted,
    TextEvent,
    ToolCallEvent,
    ToolCancelled,
    ToolResultEvent,
    TranscriptInput,
    TranscriptOutput,
    TurnComplete,
    TurnInterrupted,
)

__all__ = ["ConversationView", "FrameQueue", "JitterBuffer", "MicGate", "main"]

BLOCK_MS = 20
PREBUFFER_MS = 100
GATE_TAIL_S = 0.3
MIC_QUEUE_FRAMES = 25  # 0.5 s of 20 ms frames
PLAYBACK_CAPACITY_S = 20.0


class UsageError(Exception):
    """A problem the user can fix, printed as one line."""


# --------------------------------------------------------------------------- sans I/O


class JitterBuffer:
    """PCM16 mono reply audio between the network and the speaker.

    Playback starts once `prebuffer` samples are queued (or the reply is marked
    complete), so network jitter does not turn into clicks; if the queue runs
    dry mid-reply it waits for the prebuffer again. `pull` always returns exactly
    the samples asked for, padded with silence. Holds at most `capacity`
    samples: `push` refuses (returns False) what does not fit, and the caller
    waits for room, so nothing is dropped silently. Not thread-safe by itself.
    """

    def __init__(self, *, rate: int = OUTPUT_RATE, prebuffer_ms: int = PREBUFFER_MS,
                 capacity_s: float = PLAYBACK_CAPACITY_S) -> None:
        self.rate = rate
        self.prebuffer = rate * prebuffer_ms // 1000
        self.capacity = int(rate * capacity_s)
        self._buf = bytearray()
        self._playing = False
        self._ending = False
        self.played = 0  # samples handed to the speaker (not counting padding)
        self.flushed = 0  # samples discarded by flush()
        self.underruns = 0

    @property
    def queued(self) -> int:
        return len(self._buf) // 2

    @property
    def playing(self) -> bool:
        """True while a reply is being played (between prebuffer and drain)."""
        return self._playing

    @property
    def audible(self) -> bool:
        """True while there is reply audio queued or playing."""
        return self._playing or bool(self._buf)

    def room(self) -> int:
        return self.capacity - self.queued

    def push(self, pcm: bytes) -> bool:
        """Queue reply audio; False (nothing queued) if it does not fit."""
        if len(pcm) // 2 > self.room():
            return False
        self._buf += pcm
        return True

    def mark_end(self) -> None:
        """The reply is complete: play what is queued without waiting for the prebuffer.

        On an empty buffer this does nothing: the next reply still waits for
        its own prebuffer.
        """
        if self._buf:
            self._ending = True

    def flush(self) -> int:
        """Drop everything queued (barge-in); returns the samples dropped."""
        dropped = self.queued
        self.flushed += dropped
        self._buf.clear()
        self._playing = False
        self._ending = False
        return dropped

    def pull(self, samples: int) -> bytes:
        """Exactly `samples` samples for the speaker: audio, or silence while buffering."""
        if not self._playing:
            if self._buf and (self.queued >= self.prebuffer or self._ending):
                self._playing = True
            else:
                return bytes(2 * samples)
        take = min(samples, self.queued) * 2
        out = bytes(self._buf[:take])
        del self._buf[:take]
        self.played += take // 2
        if not self._buf:
            if not self._ending and take < 2 * samples:
                self.underruns += 1
            self._playing = False
            self._ending = False
        if take < 2 * samples:
            out += bytes(2 * samples - take)
        return out


class MicGate:
    """Decides, frame by frame, whether the microphone may be sent.

    Half-duplex (the default): closed while the agent's audio is audible and
    for `tail` seconds after it drains (the speaker's own latency, and the
    room's, still carry the last words). Full duplex (`half_duplex=False`):
    always open. `update` returns "closed" or "opened" on a change, else None.
    """

    def __init__(self, *, half_duplex: bool = True, tail: float = GATE_TAIL_S) -> None:
        self.half_duplex = half_duplex
        self.tail = tail
        self.is_open = True
        self._last_audible: float | None = None

    def update(self, now: float, agent_audible: bool) -> str | None:
        if not self.half_duplex:
            return None
        if agent_audible:
            self._last_audible = now
        quiet = self._last_audible is None or now - self._last_audible >= self.tail
        should_open = not agent_audible and quiet
        if should_open == self.is_open:
            return None
        self.is_open = should_open
        return "opened" if should_open else "closed"


class FrameQueue:
    """Microphone frames from the audio thread to the event loop.

    `put` may be called from any thread and never blocks: when `maxlen` frames
    are waiting the oldest is dropped and counted in `dropped` (the loop fell
    behind; sending stale speech late would only confuse the model). `get`
    waits on the loop that created the queue.
    """

    def __init__(self, maxlen: int = MIC_QUEUE_FRAMES) -> None:
        self._frames: collections.deque[bytes] = collections.deque()
        self._maxlen = maxlen
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiter: asyncio.Future[None] | None = None
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._frames)

    def put(self, frame: bytes) -> None:
        with self._lock:
            if len(self._frames) >= self._maxlen:
                self._frames.popleft()
                self.dropped += 1
            self._frames.append(frame)
            waiter, loop = self._waiter, self._loop
            self._waiter = None
        if waiter is not None and loop is not None:
            loop.call_soon_threadsafe(_wake, waiter)

    def get_nowait(self) -> bytes | None:
        with self._lock:
            return self._frames.popleft() if self._frames else None

    async def get(self) -> bytes:
        while True:
            loop = asyncio.get_running_loop()
            with self._lock:
                if self._frames:
                    return self._frames.popleft()
                self._loop = loop
                self._waiter = loop.create_future()
                waiter = self._waiter
            await waiter


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class ConversationView:
    """Prints the conversation: who speaks, transcripts, tools, turn ends, errors.

    On a terminal, transcript fragments update one line in place and each
    turn's final text is kept; elsewhere (a pipe, a log) only final lines are
    written, so the output reads as a plain transcript. Every word is printed
    once: a partial that had to be kept (a tool call or the other side came
    between) is not printed again when its final arrives, only what it lacked.
    Status lines (the gate, reconnects) go above the line being spoken and
    leave it in place. The live line is cut to the terminal's width, since
    `\r\x1b[2K` can only clear the row the cursor is on.
    """

    YOU = "you ▸ "
    AGENT = "agent ▸ "

    def __init__(self, out: TextIO, *, tty: bool | None = None, width: int | None = None) -> None:
        self.out = out
        self.tty = out.isatty() if tty is None else tty
        self._width = width  # None: ask the terminal each time (it may be resized)
        self._live: str | None = None  # the line being rewritten (tty only)
        self._partial: dict[str, str] = {"you": "", "agent": ""}
        self._shown: dict[str, str] = {"you": "", "agent": ""}  # partial text already kept
        self._active: str | None = None  # whose partial is on the live line

    # -- low level

    def _clear_live(self) -> None:
        if self._live is not None:
            self.out.write("\r\x1b[2K")
            self._live = None

    def line(self, text: str) -> None:
        """A line that stays; a transcript being spoken is kept above it."""
        self._commit_partial()
        self._write(text)

    def _write(self, text: str) -> None:
        self._clear_live()
        self.out.write(text + "\n")
        self.out.flush()

    def _columns(self) -> int:
        if self._width is not None:
            return self._width
        try:
            return os.get_terminal_size(self.out.fileno()).columns
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            return 80

    def _set_live(self, text: str) -> None:
        if not self.tty:
            return
        room = max(self._columns() - 1, 8)  # the last column would wrap on some terminals
        if len(text) > room:
            side = self._prefix(self._active or "you")
            text = side + "…" + text[len(text) - (room - len(side) - 1):]
        self.out.write("\r\x1b[2K" + text)
        self.out.flush()
        self._live = text

    def _commit_partial(self) -> None:
        """Keep the live partial line (a tool call or the other side came between).

        Only a terminal shows partials; in a pipe they wait for their final.
        """
        side = self._active
        self._active = None
        if side is None or not self.tty or not self._partial[side].strip():
            return
        self._keep(side, self._partial[side])

    def _keep(self, side: str, text: str) -> None:
        """Write `text` as a kept line, less what of it was already kept."""
        shown, whole = _normalize(self._shown[side]), _normalize(text)
        self._shown[side] = text
        if not whole or whole == shown:
            return
        if shown and whole.startswith(shown):
            self._write(self._prefix(side) + "… " + whole[len(shown):].strip())
        else:
            self._write(self._prefix(side) + whole)

    def _prefix(self, side: str) -> str:
        return self.YOU if side == "you" else self.AGENT

    # -- what the client calls

    def status(self, text: str) -> None:
        """A status line above the transcript being spoken, which stays live."""
        live = self._live
        self._write(f"· {text}")
        if live is not None and self._active is not None:
            self._set_live(self._prefix(self._active) + self._partial[self._active].strip())

    def transcript(self, side: str, text: str, final: bool) -> None:
        if not final:
            if self._active not in (None, side):
                self._commit_partial()
            self._active = side
            self._partial[side] += text
            self._set_live(self._prefix(side) + self._partial[side].strip())
            return
        if self._active == side:
            self._clear_live()
            self._active = None
        self._keep(side, text)
        self._partial[side] = ""
        self._shown[side] = ""

    def event(self, event: ServerEvent) -> None:
        if isinstance(event, TranscriptInput):
            self.transcript("you", event.text, event.final)
        elif isinstance(event, TranscriptOutput):
            if event.late:
                self.line(f"{self._prefix('agent')}… {event.text.strip()}")  # the end of the last reply
            else:
                self.transcript("agent", event.text, event.final)
        elif isinstance(event, TextEvent):
            if not event.partial:
                self.transcript("agent", event.text, True)
            else:
                self.transcript("agent", event.text, False)
        elif isinstance(event, ToolCallEvent):
            where = "" if event.runs_on == "server" else f" (runs on {event.runs_on})"
            self.line(f"⚙ {event.name}({_compact(event.args)}){where}")
        elif isinstance(event, ToolResultEvent):
            self.line(f"  ↳ {event.name}: {_compact(event.response)}")
        elif isinstance(event, ToolCancelled):
            self.line(f"  ✗ tool calls cancelled: {', '.join(event.ids)}")
        elif isinstance(event, TurnInterrupted):
            # Finals of the interrupted turn may still follow: keep the partials for them.
            self.line("— interrupted")
        elif isinstance(event, TurnComplete):
            self._flush_partials()
            self.line("— turn complete" + (f" ({event.reason})" if event.reason else ""))
        elif isinstance(event, ErrorEvent):
            self.line(f"! {event.code}: {event.message}")
        elif isinstance(event, SessionGoAway):
            pass  # the server reconnects on its own; the reconnect events say so
        elif isinstance(event, SessionReconnecting):
            self.status(f"reconnecting to the model ({event.reason})")
        elif isinstance(event, SessionResumed):
            self.status("reconnected")
        elif isinstance(event, SessionClosed):
            self._flush_partials()

    def _flush_partials(self) -> None:
        """A turn ended without final transcripts: keep what was heard, once."""
        self._clear_live()
        self._active = None
        for side in ("you", "agent"):
            if self._partial[side].strip():
                self._keep(side, self._partial[side])
            self._partial[side] = ""
            self._shown[side] = ""


def _normalize(text: str) -> str:
    return " ".join(text.split())


def _compact(value: Any, limit: int = 200) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    return text if len(text) <= limit else text[: limit - 1] + "…"


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


# --------------------------------------------------------------------------- audio I/O


class AudioDeviceError(Exception):
    """No usable microphone or speaker; the message says which and why."""


def _import_sounddevice() -> Any:
    try:
        import sounddevice
    except OSError as exc:  # the PortAudio library itself is missing
        raise AudioDeviceError(f"PortAudio is not available ({exc}); apt-get install libportaudio2") from None
    return sounddevice


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
            raise AudioDeviceError(f"the audio system cannot list devices: {_portaudio_reason(exc)}") from None

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


# --------------------------------------------------------------------------- the session


class Conversation:
    """One `live mic` session: the microphone pump and the event pump."""

    def __init__(self, client: LiveClient, audio: AudioIO, view: ConversationView,
                 *, headphones: bool) -> None:
        assert audio.playback is not None
        self.client = client
        self.audio = audio
        self.playback = audio.playback
        self.view = view
        self.gate = MicGate(half_duplex=not headphones, tail=GATE_TAIL_S + audio.output_latency)
        self.fatal: ErrorEvent | None = None
        self.closed_reason: str | None = None
        self.frames_sent = 0
        self._reply_from: int | None = None  # speaker samples played when the current reply began

    async def run(self, *, handle_signals: bool) -> None:
        async with anyio.create_task_group() as tg:
            if handle_signals:
                tg.start_soon(self._stop_on_signal, tg.cancel_scope)
            tg.start_soon(self._send_microphone)
            await self._receive()
            tg.cancel_scope.cancel()

    async def _stop_on_signal(self, scope: anyio.CancelScope) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                self.view.status("ending the session")
                scope.cancel()
                return

    async def _send_microphone(self) -> None:
        agent_audible = False
        while True:
            frame = await self.audio.frames.get()
            audible = self.playback.audible()
            change = self.gate.update(time.monotonic(), audible)
            if change == "closed":
                await self.client.audio_end()
                self.view.status("agent speaking — microphone muted")
            elif change == "opened":
                self.view.status("listening")
            elif self.gate.half_duplex is False and audible != agent_audible:
                self.view.status("agent speaking — talk to interrupt" if audible else "listening")
            agent_audible = audible
            if self.gate.is_open:
                await self.client.send_audio(self.audio.to_server(frame))
                self.frames_sent += 1

    async def _receive(self) -> None:
        async for event in self.client.events():
            if isinstance(event, AudioFrame):
                if self._reply_from is None:
                    # A reply begins: it plays after what is still queued.
                    with self.playback.lock:
                        self._reply_from = self.playback.buffer.played + self.playback.buffer.queued
                await self.playback.push(self.audio.to_speaker(event.data))
                continue
            if isinstance(event, TurnInterrupted):
                with self.playback.lock:
                    played = self.playback.buffer.played
                self.playback.flush()
                # What the user heard of the cut reply, so the server can say it.
                start = self._reply_from if self._reply_from is not None else played
                self._reply_from = None
                await self.client.report_playback(max(0, played - start) / self.playback.buffer.rate)
            elif isinstance(event, GenerationComplete | TurnComplete):
                self._reply_from = None
                # A turn can end without `generation.complete` (the model's
                # connection was lost): its tail must still play, or the gate
                # would wait for it forever.
                self.playback.mark_end()
            elif isinstance(event, ToolCallEvent) and event.runs_on == "client":
                # This terminal runs no tools; answer at once so the model does not wait.
                await self.client.send_tool_result(
                    event.id, event.name, {"error": f"the live mic client cannot run {event.name!r}"}
                )
            elif isinstance(event, ErrorEvent) and event.fatal:
                self.fatal = event
            elif isinstance(event, Reattaching):
                self.view.status(f"connection lost; reattaching (attempt {event.attempt})...")
                continue
            elif isinstance(event, SessionReattached):
                self.view.status("reattached: the conversation goes on")
                continue
            self.view.event(event)
            if isinstance(event, SessionClosed):
                self.closed_reason = event.reason
                return


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="live mic",
        description=(
            "Talk to a live server from this terminal: your microphone goes to the agent, "
            "its voice comes out of your speaker, and the conversation is printed as it "
            "happens. Ctrl-C ends the session."
        ),
        epilog=(
            "Echo: by default the microphone is muted while the agent speaks, and for "
            f"{GATE_TAIL_S * 1000:.0f} ms after (half duplex), so the agent never hears itself "
            "through your speaker and interrupts itself; you wait for it to finish. "
            "With --headphones the microphone stays open (full duplex) and you can "
            "interrupt the agent by talking; use it only when the speaker cannot reach "
            "the microphone."
        ),
    )
    parser.add_argument("--url", default=DEFAULT_URL, help=f"the server's WebSocket (default {DEFAULT_URL})")
    parser.add_argument("--token", default=os.environ.get("LIVE_TOKEN"),
                        help="the server's shared token (default: $LIVE_TOKEN)")
    parser.add_argument("--input-device", metavar="DEVICE", help="microphone: index or name (default: the system's)")
    parser.add_argument("--output-device", metavar="DEVICE", help="speaker: index or name (default: the system's)")
    parser.add_argument("--headphones", action="store_true",
                        help="full duplex: keep the microphone open while the agent speaks (barge-in by voice)")
    parser.add_argument("--turn-taking", choices=("auto", "server"),
                        help="who ends your turns: the model's voice detection (auto) or the server's "
                             "(server: pauses and backchannels do not cut you or the agent off) "
                             "(default: the agent's)")
    parser.add_argument("--list-devices", action="store_true", help="list audio devices and exit")
    return parser


async def _session(args: argparse.Namespace, view: ConversationView) -> int:
    handle_signals = threading.current_thread() is threading.main_thread()
    # The devices first: a missing microphone must not cost a model session.
    with AudioIO(args.input_device, args.output_device) as audio:
        async with LiveClient.connect(
            args.url, token=args.token or None, reports_playback=True, turn_taking=getattr(args, "turn_taking", None)
        ) as client:
            started: SessionStarted = client.session
            while audio.frames.get_nowait() is not None:
                pass  # what was said before the session began is not sent late
            audio.frames.dropped = 0
            mode = ("full duplex: talk over the agent to interrupt it" if args.headphones
                    else "half duplex: the microphone is muted while the agent speaks")
            view.line(f"live mic: connected to {args.url} (model {started.model}); {mode}. Ctrl-C ends.")
            view.status("listening")
            conversation = Conversation(client, audio, view, headphones=args.headphones)
            await conversation.run(handle_signals=handle_signals)
        if audio.frames.dropped:
            view.line(f"live mic: {audio.frames.dropped} microphone frames dropped (the loop fell behind)")
        if audio.overflows or audio.underflows:
            view.line(
                f"live mic: the microphone overflowed {audio.overflows} times and the speaker ran dry "
                f"{audio.underflows} times (the machine was too busy for the audio devices)"
            )
    if conversation.closed_reason is not None:
        if conversation.fatal is not None:
            raise UsageError(f"the server ended the session: {conversation.fatal.code}: {conversation.fatal.message}")
        view.line(f"live mic: session closed ({conversation.closed_reason})")
    else:
        view.line("live mic: session ended")
    return 0


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


def _explain(exc: BaseException, url: str) -> str | None:
    """One readable line for the failures a user can meet, or None for a bug."""
    from websockets.exceptions import InvalidHandshake, InvalidURI

    if isinstance(exc, SessionRefused):
        if exc.code == "closed":
            return f"the server at {url} closed the connection before the session started"
        if exc.code == "timeout":
            return f"the server at {url} accepted the connection but did not start a session ({exc.message})"
        return f"the server refused the session: {exc.code}: {exc.message}"
    if isinstance(exc, ConnectionLost):
        return f"the connection to {url} was lost"
    if isinstance(exc, UsageError | AudioDeviceError):
        return str(exc)
    if isinstance(exc, InvalidURI):
        return f"{url!r} is not a WebSocket URL (ws://HOST:PORT/live)"
    if isinstance(exc, InvalidHandshake):
        return f"{url} did not accept a WebSocket connection ({exc})"
    if isinstance(exc, TimeoutError):
        return f"no answer from {url} in time"
    if isinstance(exc, OSError):
        return f"cannot connect to {url}: {exc.strerror or exc}"
    from websockets.exceptions import ConnectionClosed

    if isinstance(exc, ConnectionClosed):
        return f"the connection to {url} was lost"
    return None


def _portaudio_reason(exc: BaseException) -> str:
    args = getattr(exc, "args", ())
    return str(args[0]) if args else str(exc)


def list_devices(out: TextIO) -> int:
    sd = _import_sounddevice()
    try:
        devices = sd.query_devices()
    except sd.PortAudioError as exc:
        raise AudioDeviceError(f"the audio system cannot list devices: {_portaudio_reason(exc)}") from None
    if not len(devices):
        out.write("no audio devices found\n")
        return 1
    out.write(f"{devices}\n")
    return 0


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.list_devices:
            return list_devices(sys.stdout)
        view = ConversationView(sys.stdout)
        return anyio.run(_session, args, view)
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:  # noqa: BLE001 - turned into one line below, or re-raised
        for leaf in _leaves(exc):
            if isinstance(leaf, KeyboardInterrupt):
                return 130
            message = _explain(leaf, args.url)
            if message is not None:
                print(f"live mic: {message}", file=sys.stderr)
                return 1
        raise

