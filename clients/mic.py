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

The pieces live by job: the buffers and the gate, without I/O
(`clients.mic_buffers`), how the conversation is printed (`clients.mic_view`),
and the sound devices (`clients.sound`); this module is the command.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

import anyio

from clients.client import (
    DEFAULT_URL,
    AudioFrame,
    ConnectionLost,
    LiveClient,
    Reattaching,
    SessionRefused,
)
from clients.mic_buffers import BLOCK_MS, GATE_TAIL_S, FrameQueue, JitterBuffer, MicGate
from clients.mic_view import ConversationView
from clients.sound import AudioDeviceError, AudioIO, PcmResampler, Playback, list_devices, quiet_sound_libraries
from live.protocol import (
    ErrorEvent,
    GenerationComplete,
    SessionClosed,
    SessionReattached,
    SessionStarted,
    ToolCallEvent,
    TurnComplete,
    TurnInterrupted,
)

__all__ = [
    "BLOCK_MS", "AudioDeviceError", "AudioIO", "Conversation", "ConversationView", "FrameQueue", "JitterBuffer",
    "MicGate", "PcmResampler", "Playback", "main",
]


class UsageError(Exception):
    """A problem the user can fix, printed as one line."""


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

    async def run(self, *, handle_signals: bool, on_ready: Callable[[], None] = lambda: None) -> None:
        async with anyio.create_task_group() as tg:
            if handle_signals:
                # Ctrl-C is ours before the user is told it ends the session.
                await tg.start(self._stop_on_signal, tg.cancel_scope)
            on_ready()
            tg.start_soon(self._send_microphone)
            await self._receive()
            tg.cancel_scope.cancel()

    async def _stop_on_signal(self, scope: anyio.CancelScope, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            task_status.started()
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

            def ready() -> None:
                view.line(f"live mic: connected to {args.url} (model {started.model}); {mode}. Ctrl-C ends.")
                view.status("listening")

            conversation = Conversation(client, audio, view, headphones=args.headphones)
            await conversation.run(handle_signals=handle_signals, on_ready=ready)
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


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    message = None
    with quiet_sound_libraries():
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
                    break
            else:
                raise
    print(f"live mic: {message}", file=sys.stderr)
    return 1
