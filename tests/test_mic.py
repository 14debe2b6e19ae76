"""`live mic`: its sans-I/O pieces, its error lines, and real audio through PulseAudio.

The audio tests run `live mic` as a subprocess on a private PulseAudio daemon
with virtual devices: `paplay --device=micfeed` speaks into the default
microphone, and `parec` records the default speaker's monitor. The server runs
in the test process with the built-in `local/echo` model, wrapped to record
what it heard and said.
"""

from __future__ import annotations

import contextlib
import io
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import anyio.abc
import numpy as np
import pytest
from anyio.streams.text import TextReceiveStream
from websockets.asyncio.server import serve as ws_serve

from audio_fixtures import silence, speak, wav_bytes
from clients import mic, sound
from clients.client import LiveClient, SessionRefused
from clients.mic import BLOCK_MS, ConversationView, FrameQueue, JitterBuffer, MicGate
from live import protocol as p
from live.agent import Agent
from live.llm import AudioStreamEnd
from live.registry import default_registry
from live_audio import RecordingLlm, rms_dbfs, speech_found
from pulse import Pulse, pulse  # noqa: F401 (a fixture)
from serving import running

ROOT = Path(__file__).resolve().parent.parent
SAID = "Hello there, can you hear me clearly?"


# --------------------------------------------------------------------------- jitter buffer


def samples(n: int, value: int = 1000) -> bytes:
    return value.to_bytes(2, "little", signed=True) * n


def test_jitter_buffer_holds_playback_until_100_ms_are_queued():
    jb = JitterBuffer(rate=24000, prebuffer_ms=100)
    jb.push(samples(2000))  # 83 ms
    assert jb.pull(480) == bytes(960)  # silence while prebuffering
    assert not jb.playing and jb.audible
    jb.push(samples(400))  # now 100 ms
    assert jb.pull(480) == samples(480)
    assert jb.playing and jb.played == 480


def test_jitter_buffer_pads_an_underrun_with_silence_and_prebuffers_again():
    jb = JitterBuffer(rate=24000, prebuffer_ms=100)
    jb.push(samples(2500))
    out = jb.pull(2400) + jb.pull(480)
    assert out == samples(2500) + bytes(2 * 380)
    assert jb.underruns == 1 and not jb.playing and not jb.audible
    jb.push(samples(100))  # a late chunk: too little to restart on
    assert jb.pull(100) == bytes(200)


def test_jitter_buffer_plays_a_short_reply_out_once_it_is_complete():
    jb = JitterBuffer(rate=24000, prebuffer_ms=100)
    jb.push(samples(600, 7))  # 25 ms: the whole reply
    assert jb.pull(480) == bytes(960)
    jb.mark_end()
    assert jb.pull(480) == samples(480, 7)
    assert jb.pull(480) == samples(120, 7) + bytes(720)
    assert jb.underruns == 0 and not jb.audible


def test_a_reply_end_on_an_empty_buffer_does_not_rob_the_next_reply_of_its_prebuffer():
    jb = JitterBuffer(rate=24000, prebuffer_ms=100)
    jb.mark_end()  # generation.complete after everything had already played
    jb.push(samples(600))  # the first 25 ms of the next reply
    assert jb.pull(480) == bytes(960)  # still prebuffering: no click-prone start
    assert not jb.playing


def test_jitter_buffer_flush_drops_everything_at_once():
    jb = JitterBuffer(rate=24000, prebuffer_ms=100)
    jb.push(samples(24000))
    jb.pull(480)
    assert jb.flush() == 24000 - 480
    assert jb.queued == 0 and not jb.audible and jb.flushed == 23520
    assert jb.pull(480) == bytes(960)


def test_jitter_buffer_refuses_what_does_not_fit_instead_of_dropping():
    jb = JitterBuffer(rate=24000, prebuffer_ms=100, capacity_s=0.1)
    assert jb.push(samples(2000))
    assert not jb.push(samples(401))
    assert jb.queued == 2000
    assert jb.push(samples(400)) and jb.room() == 0


# --------------------------------------------------------------------------- gate


def test_half_duplex_gate_mutes_while_the_agent_is_audible_and_for_the_tail():
    gate = MicGate(tail=0.3)
    assert gate.update(0.00, False) is None and gate.is_open
    assert gate.update(0.02, True) == "closed" and not gate.is_open
    assert gate.update(1.00, True) is None
    assert gate.update(1.02, False) is None and not gate.is_open  # drained: the tail starts
    assert gate.update(1.20, False) is None and not gate.is_open
    assert gate.update(1.30, False) == "opened" and gate.is_open


def test_gate_tail_restarts_when_more_reply_audio_arrives():
    gate = MicGate(tail=0.3)
    gate.update(0.00, True)
    assert gate.update(0.20, False) is None  # in the tail
    assert gate.update(0.25, True) is None  # a late chunk: still closed
    assert gate.update(0.45, False) is None
    assert gate.update(0.54, False) is None and not gate.is_open  # the tail counts from 0.25
    assert gate.update(0.56, False) == "opened"


def test_headphones_gate_never_mutes():
    gate = MicGate(half_duplex=False)
    assert gate.update(0.0, True) is None and gate.is_open


class _ScriptedClient:
    """What `Conversation` uses of `LiveClient`, replaying a fixed list of events."""

    def __init__(self, events: list) -> None:
        self._events = events
        self.sent: list = []

    async def events(self):
        for event in self._events:
            yield event

    async def send_audio(self, pcm: bytes) -> None:
        self.sent.append(pcm)

    async def audio_end(self) -> None:
        self.sent.append("audio.end")

    async def send_tool_result(self, *args) -> None:
        self.sent.append(args)

    async def report_playback(self, played: float) -> None:
        self.sent.append(("playback", played))


class _NoAudioDevices:
    """What `Conversation` uses of `AudioIO`, without devices: the test pulls the speaker."""

    def __init__(self) -> None:
        self.frames = FrameQueue()
        self.playback = mic.Playback(JitterBuffer(rate=24000, prebuffer_ms=100))
        self.output_latency = 0.0

    def to_speaker(self, pcm: bytes) -> bytes:
        return pcm

    def to_server(self, pcm: bytes) -> bytes:
        return pcm


@pytest.mark.anyio
async def test_a_turn_cut_by_a_lost_model_connection_still_plays_out_and_reopens_the_microphone():
    """`turn.complete` (connection_lost) comes without `generation.complete`: the
    tail of the reply, shorter than the prebuffer, must still play, or the
    half-duplex gate stays closed for good."""
    audio = _NoAudioDevices()
    events = [mic.AudioFrame(samples(1200)), p.TurnComplete("connection_lost")]
    conversation = mic.Conversation(_ScriptedClient(events), audio, ConversationView(io.StringIO()),
                                    headphones=False)
    await conversation._receive()
    assert audio.playback.audible()
    assert conversation.gate.update(0.0, audio.playback.audible()) == "closed"
    played = b"".join(audio.playback.buffer.pull(480) for _ in range(3))
    assert played[: 2 * 1200] == samples(1200)  # the 50 ms tail played
    assert not audio.playback.audible()
    assert conversation.gate.update(0.5, audio.playback.audible()) == "opened"


@pytest.mark.anyio
async def test_a_barge_in_reports_how_much_of_the_reply_was_played():
    """So the server can say what the user heard: the seconds of this reply the
    speaker took, not what was received or queued."""
    audio = _NoAudioDevices()
    events: list = [mic.AudioFrame(samples(24000))]  # one second of reply arrives

    class Client(_ScriptedClient):
        async def events(self):
            yield events[0]
            audio.playback.buffer.pull(2400)  # the prebuffer fills, then...
            audio.playback.buffer.pull(7200)  # ...0.4 s in all reach the speaker
            yield p.TurnInterrupted()

    client = Client([])
    conversation = mic.Conversation(client, audio, ConversationView(io.StringIO()), headphones=True)
    await conversation._receive()
    [(kind, played)] = [m for m in client.sent if isinstance(m, tuple) and m[0] == "playback"]
    assert abs(played - 0.4) < 0.01
    assert not audio.playback.audible()  # and the rest was flushed


# --------------------------------------------------------------------------- resampling


def _tone(hz: float, rate: int, seconds: float = 1.0, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (amplitude * 32767 * np.sin(2 * np.pi * hz * t)).astype("<i2")


def _through(resampler: mic.PcmResampler, pcm: np.ndarray, block: int) -> np.ndarray:
    out = b"".join(resampler.process(pcm[i : i + block].tobytes()) for i in range(0, len(pcm), block))
    return np.frombuffer(out, dtype="<i2").astype(np.float64)


def _level_db(signal: np.ndarray, reference: np.ndarray) -> float:
    rms = lambda x: np.sqrt(np.mean(np.square(x.astype(np.float64))))  # noqa: E731
    return 20 * np.log10(max(rms(signal), 1e-9) / rms(reference))


@pytest.mark.parametrize("device_rate", [44100, 48000])
def test_a_microphone_at_the_devices_rate_is_resampled_without_audible_aliases(device_rate):
    """A tone above 8 kHz cannot exist at 16 kHz: it must be filtered out, not folded
    back into the speech band (where it would be heard at 16000 - f)."""
    block = device_rate * BLOCK_MS // 1000
    for hz in (9000, 10000, 12000):
        tone = _tone(hz, device_rate)
        out = _through(mic.PcmResampler(device_rate, 16000), tone, block)[1600:]  # past the filter's start
        level = _level_db(out, tone)
        print(f"{device_rate} -> 16000: {hz} Hz tone comes out at {level:.0f} dB")
        assert level <= -40
    speech_band = _tone(1000, device_rate)
    out = _through(mic.PcmResampler(device_rate, 16000), speech_band, block)[1600:]
    assert abs(_level_db(out, speech_band)) < 0.5  # and the speech band passes whole


@pytest.mark.parametrize("speaker_rate", [44100, 48000])
def test_reply_audio_for_a_speaker_at_another_rate_has_no_images(speaker_rate):
    """24 kHz up to the speaker's rate: a 10 kHz tone must not bring its mirror at 24000 - f."""
    tone = _tone(10000, 24000)
    out = _through(mic.PcmResampler(24000, speaker_rate), tone, 480)[speaker_rate // 10 :]
    spectrum = np.abs(np.fft.rfft(out * np.hanning(len(out))))
    freqs = np.fft.rfftfreq(len(out), 1 / speaker_rate)
    wanted = spectrum[np.abs(freqs - 10000) < 200].max()
    image = spectrum[np.abs(freqs - 14000) < 200].max()
    level = 20 * np.log10(image / wanted)
    print(f"24000 -> {speaker_rate}: image of a 10 kHz tone at {level:.0f} dB")
    assert level <= -40


# --------------------------------------------------------------------------- frame queue


def test_frame_queue_drops_the_oldest_frame_when_full():
    q = FrameQueue(maxlen=3)
    for i in range(5):
        q.put(bytes([i]))
    assert q.dropped == 2
    assert [q.get_nowait() for _ in range(3)] == [b"\x02", b"\x03", b"\x04"]
    assert q.get_nowait() is None


@pytest.mark.anyio
async def test_frame_queue_wakes_the_loop_from_another_thread():
    q = FrameQueue()

    def produce() -> None:
        for i in range(50):
            q.put(bytes([i]))
            time.sleep(0.001)

    thread = threading.Thread(target=produce)
    with anyio.fail_after(2):
        thread.start()
        got = [await q.get() for _ in range(50)]
    thread.join()
    assert got == [bytes([i]) for i in range(50)] and q.dropped == 0


# --------------------------------------------------------------------------- conversation view


def test_view_on_a_terminal_updates_partials_in_place_and_keeps_finals():
    out = io.StringIO()
    view = ConversationView(out, tty=True)
    view.event(p.TranscriptInput("What's the", False))
    view.event(p.TranscriptInput(" weather?", False))
    view.event(p.ToolCallEvent("c1", "get_weather", {"city": "Lisbon"}, "server"))
    view.event(p.ToolResultEvent("c1", "get_weather", {"sky": "sunny"}))
    view.event(p.TranscriptOutput("It's", False))
    view.event(p.TranscriptOutput(" sunny.", False))
    view.event(p.TranscriptInput("What's the weather?", True))
    view.event(p.TranscriptOutput("It's sunny.", True))
    view.event(p.TurnComplete())
    screen = _render_terminal(out.getvalue())
    assert screen == [
        "you ▸ What's the weather?",
        '⚙ get_weather({"city": "Lisbon"})',
        '  ↳ get_weather: {"sky": "sunny"}',
        "agent ▸ It's sunny.",
        "— turn complete",
    ]
    assert "\r\x1b[2Kyou ▸ What's the" in out.getvalue()  # the partial was shown first


def test_view_in_a_pipe_prints_only_final_lines():
    out = io.StringIO()
    view = ConversationView(out, tty=False)
    view.event(p.TranscriptInput("Hi", False))
    view.event(p.TranscriptInput("Hi there", True))
    view.event(p.TranscriptOutput("Hello!", True))
    view.event(p.TurnInterrupted())
    view.event(p.ErrorEvent("model_error", "oops", False))
    assert out.getvalue().splitlines() == [
        "you ▸ Hi there", "agent ▸ Hello!", "— interrupted", "! model_error: oops",
    ]
    assert "\x1b" not in out.getvalue() and "\r" not in out.getvalue()


def test_view_keeps_partials_of_a_turn_that_ends_without_finals():
    out = io.StringIO()
    view = ConversationView(out, tty=False)
    view.event(p.TranscriptOutput("Half a", False))
    view.event(p.TranscriptOutput(" sentence", False))
    view.event(p.TurnComplete())
    assert out.getvalue().splitlines() == ["agent ▸ Half a sentence", "— turn complete"]


def test_gate_status_lines_do_not_print_the_users_words_twice():
    for tty in (True, False):
        out = io.StringIO()
        view = ConversationView(out, tty=tty)
        view.event(p.TranscriptInput("Hello there,", False))
        view.status("agent speaking — microphone muted")
        view.event(p.TranscriptInput(" can you hear me?", False))
        view.status("listening")
        view.event(p.TranscriptInput("Hello there, can you hear me?", True))
        view.event(p.TurnComplete())
        screen = _render_terminal(out.getvalue())
        assert screen == [
            "· agent speaking — microphone muted",
            "· listening",
            "you ▸ Hello there, can you hear me?",
            "— turn complete",
        ], (tty, screen)


def test_a_partial_kept_for_a_tool_call_is_not_printed_again_by_its_final():
    out = io.StringIO()
    view = ConversationView(out, tty=True)
    view.event(p.TranscriptOutput("Let me look", False))
    view.event(p.ToolCallEvent("c1", "lookup", {}, "server"))
    view.event(p.TranscriptOutput(" that up. Done.", False))
    view.event(p.TranscriptOutput("Let me look that up. Done.", True))
    view.event(p.TurnInterrupted())
    view.event(p.TurnComplete())
    assert _render_terminal(out.getvalue()) == [
        "agent ▸ Let me look",
        "⚙ lookup({})",
        "agent ▸ … that up. Done.",
        "— interrupted",
        "— turn complete",
    ]


def test_a_partial_wider_than_the_terminal_stays_on_one_row():
    """`\\r\\x1b[2K` clears only the cursor's row: a wrapped live line would
    leave its earlier rows behind on every redraw."""
    out = io.StringIO()
    view = ConversationView(out, tty=True, width=40)
    words = "one two three four five six seven eight nine ten eleven twelve".split()
    for word in words:
        view.event(p.TranscriptInput(" " + word, False))
    redraws = [chunk for chunk in out.getvalue().split("\r\x1b[2K") if chunk]
    assert all(len(chunk) < 40 for chunk in redraws), redraws
    assert redraws[-1].endswith("eleven twelve") and "…" in redraws[-1]
    view.event(p.TranscriptInput(" ".join(words), True))
    assert _render_terminal(out.getvalue()) == ["you ▸ " + " ".join(words)]  # the final is whole


def _render_terminal(text: str) -> list[str]:
    """What stays on screen: `\\r\\x1b[2K` clears the current line."""
    lines: list[str] = []
    current = ""
    i = 0
    while i < len(text):
        if text.startswith("\r\x1b[2K", i):
            current = ""
            i += 5
        elif text[i] == "\n":
            lines.append(current)
            current = ""
            i += 1
        else:
            current += text[i]
            i += 1
    if current:
        lines.append(current)
    return lines


# --------------------------------------------------------------------------- one-line errors


class _FakePortAudioError(Exception):
    """sounddevice.PortAudioError: (message, PortAudio error code)."""


class _FakeStream:
    """A PortAudio stream that starts and stays silent, or fails to start as a busy device does."""

    def __init__(self, sd: _FakeSounddevice, **kwargs) -> None:
        self.sd = sd
        self.latency = 0.01

    def __enter__(self) -> _FakeStream:
        if self.sd.start_fails:
            raise _FakePortAudioError("Error starting stream: Device unavailable [PaErrorCode -9985]", -9985)
        return self

    def __exit__(self, *exc) -> None:
        pass

    def close(self) -> None:
        self.sd.closed += 1


class _FakeSounddevice:
    """What `live mic` uses of sounddevice, failing the way PortAudio does."""

    PortAudioError = _FakePortAudioError

    def __init__(self, *, query_error: Exception | None = None, start_fails: bool = False) -> None:
        self.query_error = query_error
        self.start_fails = start_fails
        self.closed = 0

    def query_devices(self, device=None, kind=None):
        if self.query_error is not None:
            raise self.query_error
        return {"name": f"Fake {kind}", "default_samplerate": 48000.0}

    def InputStream(self, **kwargs) -> _FakeStream:  # noqa: N802 - sounddevice's names
        return _FakeStream(self, **kwargs)

    OutputStream = InputStream


@pytest.fixture
def silent_devices(monkeypatch) -> _FakeSounddevice:
    """Audio devices that start and stay silent: for what happens before any audio."""
    fake = _FakeSounddevice()
    monkeypatch.setattr(sound, "_import_sounddevice", lambda: fake)
    return fake


def run_main_in_thread(argv: list[str]) -> int:
    """`live mic` in-process, in a worker thread: it runs its own event loop and,
    off the main thread, installs no signal handlers. These fail before any audio
    (on `silent_devices`, or a fake that fails)."""
    return mic.main(argv)


ECHO = Agent(name="echo", model="local/echo")


@pytest.mark.anyio
async def test_a_refused_session_is_one_line(capsys, silent_devices):
    llm = default_registry().resolve("local/echo")
    async with running(ECHO, llm, token="s3cret") as (_, url):
        rc = await anyio.to_thread.run_sync(run_main_in_thread, ["--url", url, "--token", "wrong"])
    [line] = capsys.readouterr().err.splitlines()
    assert rc == 1
    assert line.startswith("live mic: the server refused the session: unauthorized: ")


@pytest.mark.anyio
async def test_a_full_server_is_one_line(capsys, silent_devices):
    llm = default_registry().resolve("local/echo")
    async with running(ECHO, llm, max_sessions=0) as (_, url):
        rc = await anyio.to_thread.run_sync(run_main_in_thread, ["--url", url])
    [line] = capsys.readouterr().err.splitlines()
    assert rc == 1
    assert line.startswith("live mic: the server refused the session: capacity: ")


@pytest.mark.anyio
async def test_no_server_is_one_line(capsys, silent_devices):
    with socket_closed_port() as port:
        rc = await anyio.to_thread.run_sync(run_main_in_thread, ["--url", f"ws://127.0.0.1:{port}/live"])
    [line] = capsys.readouterr().err.splitlines()
    assert rc == 1
    assert line.startswith(f"live mic: cannot connect to ws://127.0.0.1:{port}/live: ")


@pytest.mark.anyio
async def test_a_server_that_never_starts_the_session_is_given_up_on():
    async def silent(ws) -> None:
        async for _ in ws:  # reads session.start, never answers, until the client leaves
            pass

    async with ws_serve(silent, "127.0.0.1", 0) as server:
        url = f"ws://127.0.0.1:{next(iter(server.sockets)).getsockname()[1]}/live"
        t0 = time.monotonic()
        with anyio.fail_after(5), pytest.raises(SessionRefused) as refused:
            async with LiveClient.connect(url, start_timeout=0.5):
                pass
    assert refused.value.code == "timeout"
    assert 0.45 <= time.monotonic() - t0 < 3
    assert mic._explain(refused.value, url).startswith(f"the server at {url} accepted the connection")


class _NoSound(_FakeSounddevice):
    """PortAudio on a machine without sound: no device at all, and asking for the
    default one fails as Pa_GetDefaultInputDevice's paNoDevice (-1) makes it fail."""

    def query_devices(self, device=None, kind=None):
        if device is None and kind is None:
            return []
        raise _FakePortAudioError("Error querying device -1", -9996)


@pytest.mark.parametrize("argv", [[], ["--list-devices"]])
def test_no_sound_device_is_one_line_that_names_the_sound_problem(monkeypatch, capsys, argv):
    monkeypatch.setattr(sound, "_import_sounddevice", lambda: _NoSound())
    assert mic.main(["--url", "ws://127.0.0.1:9/live", *argv]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("live mic: no sound device: this machine has no microphone or speaker")
    assert "PulseAudio" in line and "-1" not in line


def test_on_a_machine_without_sound_live_mic_says_so_before_any_connection(tmp_path):
    """The real PortAudio, on a machine with no sound card and no sound server."""
    import os

    if Path("/dev/snd").exists():
        pytest.skip("this machine has a sound card")
    env = {k: v for k, v in os.environ.items() if k != "PULSE_SERVER"}
    env["XDG_RUNTIME_DIR"] = str(tmp_path)  # no PulseAudio or PipeWire socket there
    with socket_closed_port() as port:
        done = subprocess.run([sys.executable, "-m", "live.cli", "mic", "--url", f"ws://127.0.0.1:{port}/live"],
                              capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.startswith("live mic: no sound device: ") and "no PulseAudio or PipeWire server running" in line
    assert "cannot connect" not in line  # the devices come first: no server was asked


def test_a_missing_portaudio_says_what_to_install(monkeypatch, capsys):
    def missing():
        raise OSError("PortAudio library not found")

    import builtins

    real_import = builtins.__import__

    def without_portaudio(name, *args, **kwargs):
        if name == "sounddevice":
            missing()
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_portaudio)
    assert mic.main(["--list-devices"]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("live mic: no sound library: PortAudio is not installed")
    assert "apt-get install libportaudio2" in line


# A sounddevice that writes to the process's stderr (file descriptor 2, from
# under Python, as C does) what alsa-lib's default error handler writes
# ("ALSA lib %s:%i:(%s) " then the message, alsa-lib src/error.c) and what
# PortAudio's ALSA host API writes when a call fails (PA_ENSURE: "Expression
# '%s' failed in '%s', line: %d"), once its streams start.
FAKE_SOUNDDEVICE = """
import os

class PortAudioError(Exception):
    pass

def query_devices(device=None, kind=None):
    return {"name": f"Fake {kind}", "default_samplerate": 48000.0}

class _Stream:
    latency = 0.01
    def __init__(self, **kwargs):
        pass
    def __enter__(self):
        os.write(2, b"ALSA lib pcm.c:8740:(snd_pcm_recover) underrun occurred\\n")
        os.write(2, b"Expression 'ret' failed in 'src/hostapi/alsa/pa_linux_alsa.c', line: 1736\\n")
        os.write(2, b"fake sounddevice: a line that is not a library's\\n")
        return self
    def __exit__(self, *exc):
        os.write(2, b"ALSA lib pcm.c:8740:(snd_pcm_recover) underrun occurred\\n")
    def close(self):
        pass

InputStream = OutputStream = _Stream
"""


@pytest.mark.anyio
async def test_the_sound_libraries_own_lines_stay_out_of_the_conversation(tmp_path):
    import os

    (tmp_path / "sounddevice.py").write_text(FAKE_SOUNDDEVICE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    llm, server = echo_server()
    async with server as (_, url):
        process = await anyio.open_process([sys.executable, "-m", "live.cli", "mic", "--url", url], env=env, cwd=ROOT)
        try:
            out = b""
            with anyio.fail_after(20):
                async for chunk in process.stdout:
                    out += chunk
                    if b"live mic: connected" in out:
                        break
            process.send_signal(signal.SIGINT)
            with anyio.fail_after(10):
                await process.wait()
            stderr = b""
            async for chunk in process.stderr:
                stderr += chunk
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    assert process.returncode == 0, stderr
    assert b"ALSA lib" not in stderr and b"Expression '" not in stderr
    assert b"fake sounddevice: a line that is not a library's" in stderr  # other lines pass
    assert b"ALSA lib" not in out


def test_an_ambiguous_device_name_says_which_devices_it_matches(monkeypatch):
    fake = _FakeSounddevice(query_error=ValueError(
        "Multiple input devices found for 'USB':\n[1] USB Mic A\n[2] USB Mic B"
    ))
    monkeypatch.setattr(sound, "_import_sounddevice", lambda: fake)
    with pytest.raises(mic.AudioDeviceError) as error:
        mic.AudioIO("USB", None).__enter__()
    assert str(error.value) == (
        "the microphone name 'USB' matches several devices ([1] USB Mic A; [2] USB Mic B): "
        "give its index or more of its name"
    )


@pytest.mark.anyio
async def test_a_device_that_fails_to_start_is_one_line_and_costs_no_model_session(monkeypatch, capsys):
    fake = _FakeSounddevice(start_fails=True)
    monkeypatch.setattr(sound, "_import_sounddevice", lambda: fake)
    llm = RecordingLlm(default_registry().resolve("local/echo"))
    async with running(ECHO, llm) as (_, url):
        rc = await anyio.to_thread.run_sync(run_main_in_thread, ["--url", url])
    assert rc == 1
    assert capsys.readouterr().err.splitlines() == [
        "live mic: cannot start 'Fake output': Error starting stream: Device unavailable [PaErrorCode -9985]"
    ]
    assert fake.closed == 1  # the stream that opened was closed
    assert llm.sessions == []  # the devices are opened before the model session


@contextlib.contextmanager
def socket_closed_port() -> Iterator[int]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    yield port


# --------------------------------------------------------------------------- PulseAudio


@pytest.fixture
def loopback(pulse: Pulse) -> Iterator[None]:
    """The speaker is heard by the microphone, as on a laptop without headphones."""
    module = pulse.pactl("load-module", "module-loopback", "source=speaker.monitor",
                         "sink=micfeed", "latency_msec=30")
    try:
        yield
    finally:
        pulse.pactl("unload-module", module)


@pytest.fixture
def spoken_wav(tmp_path: Path) -> tuple[Path, bytes]:
    pcm = silence(0.3) + speak(SAID) + silence(0.2)
    path = tmp_path / "said.wav"
    path.write_bytes(wav_bytes(pcm))
    return path, pcm


def own_lines(stderr: str) -> list[str]:
    """What live mic itself wrote: alsa-lib reports each xrun of a busy machine
    on its own ("ALSA lib pcm.c:...(snd_pcm_recover) underrun occurred"), and
    live mic counts them in its closing lines instead."""
    return [line for line in stderr.splitlines() if not (line.startswith("ALSA lib ") and "run occurred" in line)]


class MicProcess:
    def __init__(self, process: anyio.abc.Process) -> None:
        self.process = process
        self.lines: list[str] = []
        self.stderr = ""

    @property
    def stdout(self) -> str:
        return "\n".join(self.lines)

    async def wait_for_line(self, prefix: str, timeout: float = 10.0) -> None:
        with anyio.fail_after(timeout):
            while not any(line.startswith(prefix) for line in self.lines):
                if self.process.returncode is not None:
                    raise AssertionError(f"live mic exited: {self.stdout}\n{self.stderr}")
                await anyio.sleep(0.02)

    async def interrupt(self, timeout: float = 5.0) -> int:
        self.process.send_signal(signal.SIGINT)
        with anyio.fail_after(timeout):
            return await self.process.wait()


@contextlib.asynccontextmanager
async def live_mic(pulse: Pulse, url: str, *args: str) -> AsyncIterator[MicProcess]:
    process = await anyio.open_process(
        [sys.executable, "-m", "live.cli", "mic", "--url", url, *args],
        env=pulse.env, cwd=ROOT,
    )
    proc = MicProcess(process)

    async def read_stdout() -> None:
        buffer = ""
        assert process.stdout is not None
        async for text in TextReceiveStream(process.stdout):
            buffer += text
            *done, buffer = buffer.split("\n")
            proc.lines.extend(done)

    async def read_stderr() -> None:
        assert process.stderr is not None
        async for text in TextReceiveStream(process.stderr):
            proc.stderr += text

    async with anyio.create_task_group() as tg:
        tg.start_soon(read_stdout)
        tg.start_soon(read_stderr)
        try:
            yield proc
        finally:
            if process.returncode is None:
                process.kill()
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await process.wait()


@contextlib.contextmanager
def recording_speaker(pulse: Pulse, path: Path) -> Iterator[Path]:
    """Everything played on the default speaker, as 16 kHz PCM16, into `path`."""
    with path.open("wb") as out:
        rec = subprocess.Popen(
            ["parec", "--device=speaker.monitor", "--raw", "--rate=16000", "--channels=1",
             "--format=s16le", "--latency-msec=20"],
            env=pulse.env, stdout=out,
        )
        try:
            yield path
        finally:
            rec.terminate()
            rec.wait(timeout=5)


async def speak_into_mic(pulse: Pulse, wav: Path) -> None:
    await anyio.run_process(["paplay", "--device=micfeed", str(wav)], env=pulse.env)


def echo_server():
    llm = RecordingLlm(default_registry().resolve("local/echo"))
    return llm, running(ECHO, llm)


async def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await anyio.sleep(0.02)


@pytest.mark.audio
@pytest.mark.anyio
async def test_speech_reaches_the_server_and_the_reply_comes_out_of_the_speaker(
    pulse, spoken_wav, tmp_path, caplog
):
    wav, fed = spoken_wav
    llm, server = echo_server()
    caplog.set_level(logging.INFO, logger="live.server")
    async with server as (_, url), live_mic(pulse, url) as proc:
        await proc.wait_for_line("live mic: connected")
        with recording_speaker(pulse, tmp_path / "speaker.raw") as recorded:
            await speak_into_mic(pulse, wav)
            record = llm.sessions[0]
            await wait_for(lambda: record.count_out(lambda r: r.turn_complete) >= 1, 8, "the echo's reply")
            await anyio.sleep(0.6)  # the client's buffer and the device still hold the end

            def listening_again() -> bool:
                ends = [i for i, line in enumerate(proc.lines) if line == "— turn complete"]
                return bool(ends) and "· listening" in proc.lines[ends[0]:]

            await wait_for(listening_again, 5, "the microphone to reopen after the reply")
        rc = await proc.interrupt()
    # Ctrl-C ends the session cleanly: exit 0, the server saw the client close it.
    assert rc == 0, proc.stderr
    assert own_lines(proc.stderr) == []
    assert proc.lines[-1] == "live mic: session ended"
    assert any("reason=client closed the session" in r.getMessage() for r in caplog.records)
    assert record.closed
    # The conversation was shown: who spoke, and the turn end.
    assert "· agent speaking — microphone muted" in proc.lines
    assert "— turn complete" in proc.lines
    assert proc.lines.index("— turn complete") < len(proc.lines) - 1
    assert "· listening" in proc.lines[proc.lines.index("— turn complete"):]

    # What was said reached the server, as 16 kHz speech in 20 ms frames.
    reply_at = record.first_out(lambda r: bool(r.audio_chunks))
    heard = record.audio_before(reply_at)
    sizes = [len(d) for _, d in record.audio_in]
    # 20 ms frames; frames that waited for the model may reach it joined, never split.
    assert min(sizes) == 640 and all(n % 640 == 0 for n in sizes)
    said = speech_found(fed, heard)
    print(f"mic capture: {said.found}/{said.speech_blocks} speech blocks found "
          f"({said.fraction:.0%}), correlation {said.correlation:.2f}")
    assert said.speech_blocks > 50 and said.fraction >= 0.8

    # The reply (the echo of what was said) came out of the speaker.
    played = recorded.read_bytes()
    back = speech_found(fed, played)
    print(f"speaker: {back.found}/{back.speech_blocks} speech blocks of the reply recorded "
          f"({back.fraction:.0%}), correlation {back.correlation:.2f}")
    assert back.fraction >= 0.8


@pytest.mark.audio
@pytest.mark.anyio
async def test_half_duplex_does_not_send_the_agents_voice_back(pulse, loopback, spoken_wav):
    wav, _ = spoken_wav
    llm, server = echo_server()
    async with server as (_, url), live_mic(pulse, url) as proc:
        await proc.wait_for_line("live mic: connected")
        await speak_into_mic(pulse, wav)
        record = llm.sessions[0]
        await wait_for(lambda: record.count_out(lambda r: r.turn_complete) >= 1, 8, "the echo's reply")
        await anyio.sleep(1.5)  # long enough for a self-triggered second turn to start
        await proc.interrupt()
    reply_at = record.first_out(lambda r: bool(r.audio_chunks))
    done_at = record.first_out(lambda r: r.turn_complete)
    during = record.audio_between(reply_at + 0.1, done_at)
    print(f"half duplex: {len(during)} bytes of microphone audio reached the server during a "
          f"{done_at - reply_at:.2f} s reply; after it: {rms_dbfs(record.audio_between(done_at + 0.6, 1e12)):.0f} dBFS")
    assert during == b""  # the microphone was muted while the agent spoke
    assert record.count_out(lambda r: r.interrupted) == 0  # the agent did not interrupt itself
    assert record.count_out(lambda r: r.turn_complete) == 1  # nor answer its own voice
    assert any(isinstance(i, AudioStreamEnd) for _, i in record.other_in)  # audio.end at the mute
    assert "— interrupted" not in proc.lines


@pytest.mark.audio
@pytest.mark.anyio
async def test_headphones_mode_keeps_the_microphone_open_for_barge_in(pulse, loopback, spoken_wav):
    """With the speaker audible to the microphone, full duplex lets the agent hear
    itself and interrupt itself: the reason the default gates the microphone."""
    wav, _ = spoken_wav
    llm, server = echo_server()
    async with server as (_, url), live_mic(pulse, url, "--headphones") as proc:
        await proc.wait_for_line("live mic: connected")
        await speak_into_mic(pulse, wav)
        record = llm.sessions[0]
        await wait_for(lambda: record.count_out(lambda r: r.interrupted) >= 1, 8, "a barge-in")
        await proc.wait_for_line("— interrupted", timeout=2)
        await proc.interrupt()
    reply_at = record.first_out(lambda r: bool(r.audio_chunks))
    cut_at = record.first_out(lambda r: r.interrupted)
    assert rms_dbfs(record.audio_between(reply_at + 0.1, cut_at)) > -45  # its own voice came back


@pytest.mark.audio
@pytest.mark.anyio
async def test_a_lost_connection_is_one_line(pulse):
    async def handler(ws) -> None:
        await ws.recv()
        await ws.send(p.encode(p.SessionStarted("s1", "fake", 16000)))
        await anyio.sleep(0.5)
        ws.transport.abort()  # no close frame: the network went away

    async with ws_serve(handler, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        url = f"ws://127.0.0.1:{port}/live"
        async with live_mic(pulse, url) as proc:
            with anyio.fail_after(8):
                rc = await proc.process.wait()
            await anyio.sleep(0.1)
    assert rc == 1
    assert own_lines(proc.stderr) == [f"live mic: the connection to {url} was lost"]


@pytest.mark.audio
@pytest.mark.anyio
async def test_a_missing_audio_device_is_one_line(pulse):
    llm, server = echo_server()
    async with server as (_, url), live_mic(pulse, url, "--input-device", "no-such-mic") as proc:
        with anyio.fail_after(8):
            rc = await proc.process.wait()
        await anyio.sleep(0.1)
    assert rc == 1
    [line] = own_lines(proc.stderr)
    assert line.startswith("live mic: no microphone 'no-such-mic' found")
    assert "--list-devices" in line
    assert llm.sessions == []  # no model session was opened for nothing
