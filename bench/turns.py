"""Turn-taking, measured: the model's own detector against the server's, side by side.

    python -m bench.turns                    # the whole test set, then CPU at 10 and 50 sessions
    python -m bench.turns --quick            # a seventh of the set, CPU at 10 sessions
    python -m bench.turns --smart            # and a third column: the server with Smart Turn
    python -m bench.turns --sessions-per-mode 14 --cpu-sessions 10,50 --cpu-duration 60
    python -m bench.turns --sessions-per-mode 0 --baseline main   # CPU only, beside main's server

`live serve --model gemini-3.1-flash-live-preview` (a subprocess, as a user
runs it) against the Live emulator, whose detector plays the service's as
users report it: its `gemini-3.1` profile closes a turn after a second of
silence whatever the setup asks, and any sound above the room's floor barges
in (`connections.emulator.profiles`, `turn_end_silence` and
`barge_in_on_any_sound`). So these are figures against our model of the
service, not against the service.

Each simulated user (a `LiveClient`, one voice and one background each, from
`bench.turns_speech`) streams its microphone in real time, 20 ms frames, and
goes through the same conversation: sentences with a pause in mid-sentence
(0.5 to 1.5 s) and whole ones; over each reply, 1 s into it, a backchannel, a
noise burst (a cough, clicks, a knock, a door) or a real interruption.
Backgrounds: a quiet room (-70 dBFS), white noise and babble at 15, 10 and
5 dB SNR. Sessions in both modes (`turn_taking` "auto" and "server") run at
once, on one server, in waves.

It reports, per mode:

- sentences cut early: a paused sentence whose turn the model closed before
  the user finished it (the emulator saw the turn end during it);
- false barge-ins: replies interrupted by a backchannel or a noise burst;
- interruptions missed: real interruptions that did not stop the reply
  within 2.5 s;
- end of speech to the turn's end at the model (`activityEnd`, or the
  model's own detector) and to the first reply audio at the client, p50 and
  p95, over sentences not cut;
- onsets clipped (server mode): the turn's audio at the model lacks the
  frame where the speech began;
- turns with no one speaking: turns the model took that no sentence,
  backchannel, burst or interruption explains (noise taken for speech);
- CPU per session-minute of `live serve` with N sessions all in one mode,
  each mode run `--cpu-repeat` times (3), interleaved so a slow spell of the
  machine touches every mode alike: the median, and the spread in brackets.
  With `--baseline REF`, the server's turns as of git REF run beside them.

Writes bench/results/turns-<timestamp>.json and prints the table.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import datetime as dt
import json
import math
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import numpy as np

from bench.real import (
    Peer,
    _free_port,
    _live_command,
    _Relay,
    baseline_peer,
    tree_usage,
)
from bench.relay import RESULTS, _git, _Proc
from bench.turns_speech import RATE, SpokenSet, load, mix_at_snr, noise
from clients.client import AudioFrame, LiveClient
from connections.emulator import EmulatorSession, Script
from connections.emulator.server import Emulator
from connections.emulator.wire import MAX_AUDIO
from live.cli import capacity
from live.protocol import TurnComplete, TurnInterrupted

MODEL = "gemini-3.1-flash-live-preview"
FRAME = RATE // 50  # 20 ms
PAUSES = (0.5, 0.75, 1.0, 1.25, 1.5)
CONDITIONS = ("quiet", "noise-15", "noise-10", "noise-5", "babble-15", "babble-10", "babble-5")
REPLY = (
    "Sure, I can help you with that. Let me go through the details one at a time "
    "so that nothing is missed along the way."
)  # about 5 s at the emulator's 15 characters a second
OVER_REPLY_AFTER = 1.0  # seconds into a reply the user speaks over it
INTERRUPTED_WITHIN = 2.5
ACTIVITY_KEPT = 60.0  # seconds of each turn's audio kept to find onsets in: the server's longest turn


# ---------------------------------------------------------------------------- the model's side


class _NoAudioKept(bytearray):
    """The emulator keeps no audio of these sessions (minutes of it, many sessions)."""

    def __len__(self) -> int:
        return MAX_AUDIO


class TurnsSession(EmulatorSession):
    """The emulator's session, noting when each user turn ended and what audio each activity held."""

    keep_traffic = False
    opened: list[TurnsSession] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.record.audio = _NoAudioKept()
        self.closes: list[float] = []  # when a user turn ended (monotonic)
        self.activities: list[tuple[float, bytearray]] = []  # (start, its first seconds of audio)
        self._collecting: bytearray | None = None
        TurnsSession.opened.append(self)

    def _on_realtime(self, body: Any) -> None:
        if isinstance(body, dict):
            for key in body:
                if key in ("activityStart", "activity_start"):
                    self._collecting = bytearray()
                    self.activities.append((time.monotonic(), self._collecting))
                elif key in ("activityEnd", "activity_end"):
                    self._collecting = None
        super()._on_realtime(body)

    def heard_audio(self, data: bytes, rate: int) -> None:
        collecting = self._collecting
        if collecting is not None and len(collecting) < ACTIVITY_KEPT * 2 * RATE:
            collecting += data
        super().heard_audio(data, rate)

    def _end_spoken_turn(self) -> None:
        self.closes.append(time.monotonic())
        super()._end_spoken_turn()


# ---------------------------------------------------------------------------- the user's side


class Mic:
    """A microphone: the background, with speech put on it, sent as 20 ms frames in real time."""

    def __init__(self, background: np.ndarray) -> None:
        self.background = background
        self.sent = 0  # frames sent
        self.sent_at: list[float] = []
        self.frames: dict[int, bytes] = {}  # the frames of speech onsets, kept to find them at the model
        self._speech: collections.deque[tuple[int, np.ndarray]] = collections.deque()
        self._free_from = 0  # the first sample no speech is queued at

    def say(self, audio: np.ndarray) -> int:
        """Queue speech at the next free frame; returns its first sample (stream index)."""
        start = max(self._free_from, (self.sent + 1) * FRAME)
        self._speech.append((start, audio))
        self._free_from = start + audio.size
        return start

    def frame(self) -> bytes:
        n = self.sent
        begin = n * FRAME
        bg = self.background
        offset = begin % bg.size
        x = np.resize(np.roll(bg, -offset)[:FRAME], FRAME).copy() if offset + FRAME > bg.size else bg[offset : offset + FRAME].copy()
        while self._speech and self._speech[0][0] + self._speech[0][1].size <= begin:
            self._speech.popleft()
        for start, audio in self._speech:
            if start >= begin + FRAME:
                break
            lo, hi = max(start, begin), min(start + audio.size, begin + FRAME)
            if hi > lo:
                x[lo - begin : hi - begin] += audio[lo - start : hi - start]
        return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()

    def time_of(self, sample: int) -> float:
        return self.sent_at[sample // FRAME]

    async def until(self, sample: int) -> None:
        while self.sent * FRAME <= sample:
            await anyio.sleep(0.02)

    async def run(self, client: LiveClient, keep: set[int]) -> None:
        due = time.monotonic()
        while True:
            frame = self.frame()
            if self.sent in keep:
                self.frames[self.sent] = frame
            now = time.monotonic()
            self.sent_at.append(now)
            self.sent += 1
            await client.send_audio(frame)
            due += 0.02
            await anyio.sleep(max(0.0, due - time.monotonic()))


def _voiced(audio: np.ndarray) -> tuple[int, int]:
    loud = np.flatnonzero(np.abs(audio) > 10 ** (-45 / 20))
    return (int(loud[0]), int(loud[-1])) if loud.size else (0, audio.size)


def _background(condition: str, rng: np.random.Generator, spoken: SpokenSet) -> np.ndarray:
    if condition == "quiet":
        return mix_at_snr(noise("white", 20, rng), 50.0)  # -70 dBFS: a quiet room's microphone
    kind, snr = condition.split("-")
    source = "white" if kind == "noise" else "babble"
    return mix_at_snr(noise(source, 20, rng, spoken.babble), float(snr))


@dataclasses.dataclass
class Said:
    """Something the user said (or a sound), when, and what kind."""

    kind: str  # paused, whole, backchannel, burst, interruption
    onset: float
    end: float
    onset_frame: int
    pause: float = 0.0


@dataclasses.dataclass
class SessionRun:
    mode: str  # auto, server, smart (the server with Smart Turn)
    voice: str
    condition: str
    url: str = ""
    turn_taking: str = "auto"
    said: list[Said] = dataclasses.field(default_factory=list)
    interrupted: list[float] = dataclasses.field(default_factory=list)
    reply_starts: list[float] = dataclasses.field(default_factory=list)
    turn_ends: list[float] = dataclasses.field(default_factory=list)
    reply_bytes: int = 0  # reply audio received, PCM16 at 24 kHz
    over_reply: bool = True  # the user speaks over replies (a backchannel, a noise, an interruption)
    model: TurnsSession | None = None
    mic: Mic | None = None
    error: str | None = None


class User:
    """One simulated user: a voice, a background, and the conversation of the module's docstring."""

    def __init__(self, run: SessionRun, spoken: SpokenSet, seed: int) -> None:
        self.run = run
        self.spoken = spoken
        self.rng = np.random.default_rng(seed)
        self.mic = run.mic = Mic(_background(run.condition, self.rng, spoken))
        self._last_audio = 0.0
        self._reply = anyio.Event()
        self._done = anyio.Event()
        self._keep: set[int] = set()

    async def read(self, client: LiveClient) -> None:
        run = self.run
        async for event in client.events():
            now = time.monotonic()
            if isinstance(event, AudioFrame):
                run.reply_bytes += len(event.data)
                if now - self._last_audio > 0.3:
                    run.reply_starts.append(now)
                    self._reply.set()
                self._last_audio = now
            elif isinstance(event, TurnInterrupted):
                run.interrupted.append(now)
                self._done.set()
            elif isinstance(event, TurnComplete):
                run.turn_ends.append(now)
                self._done.set()

    async def _say(self, kind: str, audio: np.ndarray, pause: float = 0.0) -> Said:
        start = self.mic.say(audio)
        first, last = _voiced(audio)
        onset_frame = (start + first) // FRAME
        self._keep.add(onset_frame)
        await self.mic.until(start + last + FRAME)
        said = Said(kind, self.mic.time_of(start + first), self.mic.time_of(start + last), onset_frame, pause)
        self.run.said.append(said)
        return said

    async def _reply_then(self, timeout: float = 8.0) -> bool:
        """Wait for the next reply to start; False when none came."""
        self._reply = anyio.Event()
        with anyio.move_on_after(timeout):
            await self._reply.wait()
            return True
        return False

    async def _quiet(self, gap: float = 1.2, cap: float = 14.0) -> None:
        """Wait until the agent has been quiet for `gap` seconds (at most `cap`)."""
        end = time.monotonic() + cap
        while time.monotonic() < end:
            await anyio.sleep(0.1)
            if time.monotonic() - self._last_audio > gap:
                return

    async def converse(self, client: LiveClient, steps: int) -> None:
        spoken = self.spoken
        voice = self.run.voice
        sentences = spoken.sentences[voice]
        order = self.rng.permutation(len(sentences))
        overs = ["backchannel", "burst", "interruption"]
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.mic.run, client, self._keep)
            tg.start_soon(self.read, client)
            await anyio.sleep(0.6)
            for step in range(steps):
                utterance = sentences[int(order[step % len(order)])]
                paused = step % 3 != 1
                pause = PAUSES[int(self.rng.integers(len(PAUSES)))] if paused else 0.0
                audio = utterance.with_pause(pause) if paused else utterance.audio
                await self._say("paused" if paused else "whole", audio, pause)
                if not self.run.over_reply:
                    await self._reply_then()
                elif await self._reply_then():
                    await anyio.sleep(OVER_REPLY_AFTER)
                    kind = overs[step % 3]
                    if kind == "backchannel":
                        clip = spoken.backchannels[voice][int(self.rng.integers(len(spoken.backchannels[voice])))]
                    elif kind == "burst":
                        clip = list(spoken.bursts.values())[int(self.rng.integers(len(spoken.bursts)))]
                    else:
                        clip = spoken.interruptions[voice][int(self.rng.integers(len(spoken.interruptions[voice])))]
                    await self._say(kind, clip)
                await self._quiet()
            tg.cancel_scope.cancel()


# ---------------------------------------------------------------------------- running


async def _session(run: SessionRun, spoken: SpokenSet, seed: int, steps: int, ready: anyio.Event,
                   stop: anyio.Event | None = None) -> None:
    try:
        async with LiveClient.connect(run.url, turn_taking=run.turn_taking, reattach_for=0) as client:
            run.model = TurnsSession.opened[-1] if TurnsSession.opened else None  # an emulator in this process
            ready.set()
            user = User(run, spoken, seed)
            if stop is None:
                await user.converse(client, steps)
            else:
                async with anyio.create_task_group() as tg:
                    async def talk() -> None:
                        while True:
                            await user.converse(client, 6)

                    tg.start_soon(talk)
                    await stop.wait()
                    tg.cancel_scope.cancel()
    except Exception as exc:  # a session that failed is reported, the run goes on
        run.error = f"{type(exc).__name__}: {exc}"
        ready.set()


async def _sessions(runs: list[SessionRun], spoken: SpokenSet, seed: int, steps: int,
                    stop: anyio.Event | None = None, after_start: Any = None) -> None:
    """Run `runs` at once; they connect one at a time, so the newest emulator
    session is always the one that just connected."""
    async with anyio.create_task_group() as tg:
        for i, run in enumerate(runs):
            ready = anyio.Event()
            tg.start_soon(_session, run, spoken, seed + i, steps, ready, stop)
            with anyio.move_on_after(20):
                await ready.wait()
        if after_start is not None:
            await after_start()


@contextlib.asynccontextmanager
async def _emulator() -> AsyncIterator[Emulator]:
    emulator = Emulator(script=Script(replies=lambda ctx: REPLY), session_class=TurnsSession)
    async with emulator.serving(0) as running:
        yield running


def _server(emulator: Any, args: list[str], code: Peer | None = None) -> _Relay:
    """`live serve` against the emulator; `code`: the server of another commit (`--baseline`)."""
    peer = Peer(
        "live",
        [*_live_command(), "serve", "--model", MODEL, "--port", "{port}", "--max-sessions", "300",
         "--max-sessions-per-ip", "300", "--max-pending", "300", "--log-level", "WARNING", *args],
        "ws://127.0.0.1:{port}/live",
        "live",
        env=code.env if code else {},
        cwd=code.cwd if code else None,
    )
    relay = _Relay(peer, {"port": _free_port()}, emulator.environment())
    relay.wait_listening()
    return relay


# The columns: a name, the session's turn_taking, and the `live serve` flags
# of its server (sessions of columns with the same flags share one server).
AUTO = ("auto", "auto", ())
SERVER = ("server", "server", ())
SMART = ("server + Smart Turn", "server", ("--end-of-turn", "smart"))


def variant(spec: str) -> tuple[str, str, tuple[str, ...]]:
    """`NAME=FLAGS`, e.g. `server 1.6 s=--end-silence 1.6`: the server's turns with those flags."""
    name, _, flags = spec.partition("=")
    return name.strip(), "server", tuple(flags.split())


async def quality(
    spoken: SpokenSet, per_mode: int, wave: int, steps: int, columns: list[tuple[str, str, tuple[str, ...]]]
) -> dict[str, list[SessionRun]]:
    """The test set through every column, sessions of all of them at once, in waves."""
    voices = spoken.voices
    plans: dict[str, list[SessionRun]] = {}
    for name, _, _ in columns:
        # Every background in turn, and a voice that shifts by one each round:
        # any seven sessions in a row hold every voice and every background.
        plans[name] = [
            SessionRun(name, voices[(i + i // len(CONDITIONS)) % len(voices)], CONDITIONS[i % len(CONDITIONS)])
            for i in range(per_mode)
        ]
    turn_taking = {name: mode for name, mode, _ in columns}
    async with _emulator() as emulator:
        servers: dict[tuple[str, ...], _Relay] = {}
        try:
            for name, _, flags in columns:
                if flags not in servers:
                    servers[flags] = _server(emulator, list(flags))
                for run in plans[name]:
                    run.url = f"ws://127.0.0.1:{servers[flags].port}/live"
                    run.turn_taking = turn_taking[name]
            pairs = [r for group in zip(*plans.values()) for r in group]
            for start in range(0, len(pairs), wave):
                batch = pairs[start : start + wave]
                print(f"  wave {start // wave + 1} of {math.ceil(len(pairs) / wave)}: {len(batch)} sessions", file=sys.stderr)
                await _sessions(batch, spoken, start * 7919, steps)
        finally:
            for server in servers.values():
                server.stop()
    return plans


class _EmulatorProcess:
    """The emulator in a process of its own (`python -m bench.turns --emulator`):
    at 50 sessions the users alone keep this process busy."""

    def __init__(self) -> None:
        self.proc = _Proc(["bench.turns", "--emulator"])
        info = self.proc.read(60)
        self.base_url, self.ca_file, self.api_key = info["base_url"], info["ca_file"], info["api_key"]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("GEMINI_API_KEY", None)
        env.update(GOOGLE_API_KEY=self.api_key, GOOGLE_GEMINI_BASE_URL=self.base_url, SSL_CERT_FILE=self.ca_file,
                   NO_PROXY="127.0.0.1,localhost")
        return env

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.send("quit")
        self.proc.stop()


async def _serve_emulator() -> None:
    async with _emulator() as emulator:
        print(json.dumps({"base_url": emulator.base_url, "ca_file": str(emulator.ca_file), "api_key": emulator.api_key}), flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)


async def cpu(
    spoken: SpokenSet, mode: str, sessions: int, duration: float, condition: str | None = None, code: Peer | None = None
) -> dict[str, Any]:
    """`live serve`'s CPU per session-minute with `sessions` users in one mode,
    talking all along; `condition`: every user in that background (default:
    the test set's mix). In a quiet room the users do not speak over replies,
    so both modes relay the same replies and do the same work; in the test
    set's backgrounds they do, and the model's detector cuts more replies.
    `code`: `live serve` of another commit (`--baseline`), for the mode named
    after it."""
    voices = spoken.voices
    runs = [SessionRun(mode, voices[i % len(voices)], condition or CONDITIONS[(i // len(voices)) % len(CONDITIONS)],
                       turn_taking="auto" if mode == "auto" else "server", over_reply=condition != "quiet")
            for i in range(sessions)]
    measured: dict[str, float] = {}
    emulator = _EmulatorProcess()
    try:
        server = _server(emulator, ["--end-of-turn", "smart"] if mode == "smart" else [], code)
        try:
            for run in runs:
                run.url = f"ws://127.0.0.1:{server.port}/live"
            stop = anyio.Event()

            def frames() -> int:
                return sum(r.mic.sent for r in runs if r.mic is not None)

            def replied() -> int:
                return sum(r.reply_bytes for r in runs)

            async def measure() -> None:
                await anyio.sleep(5.0)  # every session past its first turn
                cpu0, _ = tree_usage(server.popen.pid)
                turns0 = await anyio.to_thread.run_sync(_turn_taking_cpu, server.port)
                t0, sent0, replied0 = time.monotonic(), frames(), replied()
                await anyio.sleep(duration)
                cpu1, rss = tree_usage(server.popen.pid)
                turns1 = await anyio.to_thread.run_sync(_turn_taking_cpu, server.port)
                measured.update(cpu=cpu1 - cpu0, seconds=time.monotonic() - t0, rss=rss, frames=frames() - sent0,
                                replied=replied() - replied0, turns=turns1 - turns0)
                stop.set()

            await _sessions(runs, spoken, 1000, 0, stop, measure)
        finally:
            server.stop()
    finally:
        emulator.stop()
    cpu_s, elapsed, rss = measured["cpu"], measured["seconds"], measured["rss"]
    # Per minute of audio the users really streamed: a loaded generator that
    # falls behind real time sends less, and the server has less to do.
    audio_minutes = measured["frames"] * 0.02 / 60
    # The model's detector cuts its replies on noise, so a mode can relay less
    # reply audio with the same users: the share of each minute it spoke.
    reply_minutes = measured["replied"] / (2 * 24_000) / 60
    failed = [r.error for r in runs if r.error]
    return {
        "mode": mode,
        "background": condition or "test set",
        "sessions": sessions,
        "cpu_s": round(cpu_s, 2),
        "seconds": round(elapsed, 1),
        "cpu_per_session_minute": round(cpu_s / max(audio_minutes, 1e-9), 4),
        "reply_share": round(reply_minutes / max(audio_minutes, 1e-9), 3),
        "turn_taking_cpu_per_session_minute": round(measured["turns"] / max(audio_minutes, 1e-9), 4),
        "real_time": round(audio_minutes / (sessions * elapsed / 60), 3),
        "rss_mb": round(rss / 2**20, 1),
        "failed": failed,
    }


def cpu_median(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One mode's repeated CPU runs as one row: the medians, the spread of the
    CPU figure (`cpu_range`), and every run as it came (`runs`)."""
    figures = [r["cpu_per_session_minute"] for r in rows]
    merged = dict(rows[0])
    for key in ("cpu_per_session_minute", "turn_taking_cpu_per_session_minute", "reply_share", "real_time", "rss_mb"):
        merged[key] = round(statistics.median(r[key] for r in rows), 4)
    merged["cpu_range"] = [min(figures), max(figures)]
    merged["failed"] = [f for r in rows for f in r["failed"]]
    merged["runs"] = rows
    return merged


def _turn_taking_cpu(port: int) -> float:
    """The server's own count of the CPU its turn-taking spent (`/metrics`)."""
    import urllib.request

    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with direct.open(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("live_turn_taking_cpu_seconds_total{")
    )


# ---------------------------------------------------------------------------- figures


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "n": 0}
    ordered = sorted(values)
    return {
        "p50": round(statistics.median(ordered) * 1000),
        "p95": round(ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)] * 1000),
        "n": len(ordered),
    }


def figures(runs: list[SessionRun]) -> dict[str, Any]:
    paused = cut = 0
    overs = false_barge = 0
    interruptions = missed = 0
    sentences = clipped = 0
    phantom = 0
    to_end: list[float] = []
    to_audio: list[float] = []
    # paused, cut, overs, false barge-ins, sentences, onsets clipped
    by_condition: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0, 0, 0, 0])
    by_kind: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])  # over-reply kind: heard, cut the reply
    by_pause: dict[float, list[int]] = collections.defaultdict(lambda: [0, 0])  # pause: sentences, cut
    failed = [r.error for r in runs if r.error]
    for run in runs:
        model = run.model
        if model is None or run.error:
            continue
        closes = model.closes
        explained = 0
        for said in run.said:
            if said.kind in ("paused", "whole"):
                sentences += 1
                by_condition[run.condition][4] += 1
                was_cut = any(said.onset < t < said.end - 0.01 for t in closes)
                if said.kind == "paused":
                    paused += 1
                    cut += was_cut
                    by_pause[said.pause][0] += 1
                    by_pause[said.pause][1] += was_cut
                    by_condition[run.condition][0] += 1
                    by_condition[run.condition][1] += was_cut
                if not was_cut:
                    end = next((t for t in closes if said.end - 0.05 <= t <= said.end + 5.0), None)
                    if end is not None:
                        to_end.append(end - said.end)
                    audio = next((t for t in run.reply_starts if said.end < t <= said.end + 8.0), None)
                    if audio is not None:
                        to_audio.append(audio - said.end)
                if run.turn_taking != "auto" and model.activities:
                    frame = run.mic.frames.get(said.onset_frame) if run.mic else None
                    if frame is not None and not any(frame in bytes(audio) for _, audio in model.activities):
                        clipped += 1
                        by_condition[run.condition][5] += 1
            elif said.kind in ("backchannel", "burst"):
                overs += 1
                hit = any(said.onset - 0.05 <= t <= said.end + 1.0 for t in run.interrupted)
                false_barge += hit
                by_kind[said.kind][0] += 1
                by_kind[said.kind][1] += hit
                by_condition[run.condition][2] += 1
                by_condition[run.condition][3] += hit
            else:
                interruptions += 1
                missed += not any(said.onset <= t <= said.onset + INTERRUPTED_WITHIN for t in run.interrupted)
        # Turns the model took that nothing the user did explains.
        for t in closes:
            if any(s.onset - 0.2 <= t <= s.end + 3.0 for s in run.said):
                explained += 1
        phantom += len(closes) - explained
    return {
        "sessions": len(runs),
        "failed": failed,
        "paused_sentences": paused,
        "cut_early": cut,
        "over_reply": overs,
        "false_barge_ins": false_barge,
        "interruptions": interruptions,
        "interruptions_missed": missed,
        "end_of_speech_to_turn_end_ms": _percentiles(to_end),
        "end_of_speech_to_reply_audio_ms": _percentiles(to_audio),
        "sentences": sentences,
        "onsets_clipped": clipped if any(r.turn_taking != "auto" for r in runs) else None,
        "turns_with_no_one_speaking": phantom,
        "by_kind": {k: {"over_reply": v[0], "cut_the_reply": v[1]} for k, v in by_kind.items()},
        "by_pause": {str(k): {"paused": v[0], "cut": v[1]} for k, v in sorted(by_pause.items())},
        "by_condition": {
            k: {"paused": v[0], "cut": v[1], "over_reply": v[2], "false_barge_ins": v[3], "sentences": v[4], "onsets_clipped": v[5]}
            for k, v in by_condition.items()
        },
    }


def _rate(n: int, of: int) -> str:
    return f"{n}/{of} ({100 * n / of:.0f} %)" if of else "-"


def table(results: dict[str, dict[str, Any]], cpu_rows: list[dict[str, Any]]) -> str:
    modes = list(dict.fromkeys([*results, *(c["mode"] for c in cpu_rows)]))
    head = "| | " + " | ".join(f"`{m}`" for m in modes) + " |"
    lines = [head, "|---|" + "---|" * len(modes)]

    def row(label: str, cell: Any) -> None:
        if results:
            lines.append(f"| {label} | " + " | ".join(cell(results[m]) if m in results else "—" for m in modes) + " |")

    row("sentences cut early (paused mid-sentence)", lambda r: _rate(r["cut_early"], r["paused_sentences"]))
    row("replies cut by a backchannel or a noise burst", lambda r: _rate(r["false_barge_ins"], r["over_reply"]))
    row("real interruptions missed", lambda r: _rate(r["interruptions_missed"], r["interruptions"]))
    row("end of speech → turn end at the model, p50 / p95", lambda r: _pp(r["end_of_speech_to_turn_end_ms"]))
    row("end of speech → first reply audio, p50 / p95", lambda r: _pp(r["end_of_speech_to_reply_audio_ms"]))
    row("onsets clipped", lambda r: "—" if r["onsets_clipped"] is None else _rate(r["onsets_clipped"], r["sentences"]))
    row("turns with no one speaking", lambda r: str(r["turns_with_no_one_speaking"]))
    by_size: dict[tuple[int, str], dict[str, Any]] = collections.defaultdict(dict)
    for c in cpu_rows:
        by_size[(c["sessions"], c["background"])][c["mode"]] = c
    for (n, background), cells in sorted(by_size.items()):
        lines.append(
            f"| CPU s per session-minute, {n} sessions, "
            f"{'quiet, no one speaking over replies' if background == 'quiet' else background} | "
            + " | ".join(_cpu(cells[m]) if m in cells else "—" for m in modes)
            + " |"
        )
    return "\n".join(lines)


def _cpu(c: dict[str, Any]) -> str:
    late = "" if c["real_time"] >= 0.95 else f", {c['real_time']:.0%} of real time"
    own = c.get("turn_taking_cpu_per_session_minute") or 0.0
    turns = f", turn-taking {own:.3f}" if own else ""
    low, high = c.get("cpu_range") or (None, None)
    spread = f" [{low:.3f}–{high:.3f}]" if low is not None and len(c.get("runs", ())) > 1 else ""
    return f"{c['cpu_per_session_minute']:.3f}{spread} (replies {c['reply_share']:.0%} of the time{turns}{late})"


def _pp(p: dict[str, Any]) -> str:
    return "—" if p["p50"] is None else f"{p['p50']} / {p['p95']} ms"


# ---------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.turns", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="7 sessions per mode, CPU at 10 sessions only")
    parser.add_argument("--sessions-per-mode", type=int, default=None, help="sessions of the test set per column (default 49: every voice in every background)")
    parser.add_argument("--steps", type=int, default=6, help="exchanges per session (default 6)")
    parser.add_argument("--wave", type=int, default=14, help="sessions at once in the quality run (default 14)")
    parser.add_argument("--smart", action="store_true", help="a column for the server with Smart Turn (--end-of-turn smart)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                        help="a column for the server's turns with these `live serve` flags, e.g. "
                             "'server, 1.6 s=--end-silence 1.6' (repeatable)")
    parser.add_argument("--cpu-sessions", default=None, help="comma-separated N for the CPU runs (default 10,50; 0 skips)")
    parser.add_argument("--cpu-duration", type=float, default=60.0, help="measured seconds per CPU run (default 60)")
    parser.add_argument("--cpu-repeat", type=int, default=3,
                        help="CPU runs per mode and size, interleaved across the modes; the table gives the median "
                             "and the spread (default 3)")
    parser.add_argument("--baseline", default=None, metavar="REF",
                        help="a CPU column for the server's turns as of git REF, beside this checkout's")
    parser.add_argument("--json", default=None, help="where to write the run (default bench/results/)")
    parser.add_argument("--emulator", action="store_true", help=argparse.SUPPRESS)  # the emulator's own process
    args = parser.parse_args(argv)
    if args.emulator:
        anyio.run(_serve_emulator)
        return {}
    per_mode = args.sessions_per_mode if args.sessions_per_mode is not None else (7 if args.quick else len(CONDITIONS) * 7)
    cpu_sizes = [int(n) for n in (args.cpu_sessions or ("10" if args.quick else "10,50")).split(",") if int(n) > 0]
    spoken = load()
    probe = capacity.probe_us()
    print(f"quality: {per_mode} sessions per mode, {args.steps} exchanges each", file=sys.stderr)
    columns = [AUTO, SERVER, *(variant(v) for v in args.variant)]
    if args.smart:
        columns.append(SMART)
    plans = anyio.run(quality, spoken, per_mode, args.wave, args.steps, columns) if per_mode else {}
    results = {mode: figures(runs) for mode, runs in plans.items()}
    cpu_rows = []
    with contextlib.ExitStack() as stack:
        baseline = stack.enter_context(baseline_peer(args.baseline)) if args.baseline else None
        for n in cpu_sizes:
            for background in ("quiet", None):
                modes = ["auto", "server"] + (["smart"] if args.smart and n <= 10 else [])
                codes: dict[str, Peer | None] = dict.fromkeys(modes)
                labels = {"smart": SMART[0]}  # the quality column's name
                if baseline is not None:
                    codes[f"server@{baseline.name.partition('@')[2]}"] = baseline
                # Interleaved: a slow spell of the machine touches every mode alike.
                runs: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
                for attempt in range(max(1, args.cpu_repeat)):
                    for mode, code in codes.items():
                        print(f"cpu: {n} sessions, {mode}, background {background or 'as the test set'}, "
                              f"run {attempt + 1}", file=sys.stderr)
                        row = anyio.run(cpu, spoken, "server" if code else mode, n, args.cpu_duration, background, code)
                        runs[mode].append(row | {"mode": labels.get(mode, mode)})
                cpu_rows.extend(cpu_median(rows) for rows in runs.values())
    out = {
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git": _git(),
        "model": MODEL,
        "emulator_profile": "gemini-3.1 (turn_end_silence 1.0 s, barge_in_on_any_sound)",
        "probe_us": probe,
        "voices": spoken.voices,
        "results": results,
        "cpu": cpu_rows,
    }
    print(table(results, cpu_rows))
    path = Path(args.json) if args.json else RESULTS / f"turns-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"written to {path}", file=sys.stderr)
    return out


if __name__ == "__main__":
    main()
