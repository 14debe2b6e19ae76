"""What a phone call costs the server, beside the WebSocket path: latency, CPU, word error rate.

    python -m bench.phone                       # about 2 minutes
    python -m bench.phone --calls 10 --seconds 30 --skip-wer
    python -m bench.phone --skip-wer --baseline main --repeat 2   # beside another version

Three parts, each printed as it finishes:

1. **Word error rate** of `local/voice` (PocketSphinx's en-US model, trained
   on 16 kHz speech) on phone audio: the sentences of `bench.local_voice`
   through what a call does to them (24 kHz speech to 8 kHz, μ-law both ways,
   back up to 16 kHz in the door) beside the same sentences at 16 kHz.
2. **Latency**: `live serve --twilio` (a process of its own) answers through
   the Live emulator; the carrier double (`clients.phone_double`) calls it and
   times from the end of the caller's speech to the first reply frame; the
   same speech through `/live` (`LiveClient`, 16 kHz) on the same server and
   emulator. The difference is what the phone path adds (resampling blocks,
   G.711, 20 ms framing); both include the emulator's 500 ms end of turn.
3. **CPU per call-minute**: N calls at once, each asking, listening to the
   whole reply and asking again, at real time; the server process's CPU
   seconds over the window per minute of call, and the same for N `/live`
   sessions.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import time

import anyio

from clients.client import AudioFrame, LiveClient
from clients.phone_double import TwilioDouble
from connections.emulator import Script, running_emulator
from live.phone.audio import Resampler, ulaw_decode, ulaw_encode

AUTH_TOKEN = "0123456789abcdef0123456789abcdef"
MODEL = "gemini-live-2.5-flash-preview"
QUESTION = "What is the weather like in Paris today?"
REPLY = "It is mild in Paris today, with a light breeze and a few clouds in the afternoon."


def speech_24k(text: str) -> bytes:
    from connections.local_voice.speech import synthesize

    return synthesize(text, voice="en-us", wpm=140).audio


# Silence after the question, the same on both paths: the latency is timed from
# the end of what was sent, and the model's end of turn from the end of speech.
TRAILING_SILENCE = 0.2


def to_phone(pcm24: bytes) -> bytes:
    """What the caller's handset sends: 8 kHz μ-law, with `TRAILING_SILENCE` after the speech."""
    down = Resampler(24_000, 8_000)
    return ulaw_encode(down(pcm24) + down.flush() + bytes(int(16_000 * TRAILING_SILENCE)))


def to_live(pcm24: bytes) -> bytes:
    """What `/live` gets of the same speech: 16 kHz PCM, the same silence after it."""
    down = Resampler(24_000, 16_000)
    return down(pcm24) + down.flush() + bytes(int(32_000 * TRAILING_SILENCE))


def phone_to_session(ulaw: bytes) -> bytes:
    """What the door gives the session: 16 kHz PCM, frame by frame as it arrives."""
    up = Resampler(8_000, 16_000)
    return b"".join(up(ulaw_decode(ulaw[i : i + 160])) for i in range(0, len(ulaw), 160)) + up(ulaw_decode(b"\xff" * 1600))


def cpu_of(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# ---------------------------------------------------------------------- 1. word error rate


async def word_errors() -> None:
    from bench.local_voice import EVERYDAY, PLAIN
    from connections.local_voice import LocalVoice, VoiceConfig, word_error_rate
    from google.genai import types

    llm = LocalVoice(config=VoiceConfig(speed=8.0))

    async def heard(pcm16: bytes) -> str:
        async with llm.connect(PLAIN.request()) as conn:
            async def feed() -> None:
                for i in range(0, len(pcm16), 640):
                    await conn.send_realtime(types.Blob(data=pcm16[i : i + 640], mime_type="audio/pcm;rate=16000"))

            async with anyio.create_task_group() as tg:
                tg.start_soon(feed)
                async for response in conn.receive():
                    t = response.input_transcription
                    if t is not None and t.finished:
                        tg.cancel_scope.cancel()
                        return t.text or ""
        return ""

    print("word error rate of local/voice (espeak en-us, 140 wpm):")
    wide, phone = [], []
    for said in EVERYDAY:
        pcm24 = bytes(14_400) + speech_24k(said) + bytes(72_000)
        direct = await heard(Resampler(24_000, 16_000)(pcm24) + bytes(32_000))
        called = await heard(phone_to_session(to_phone(pcm24)) + bytes(32_000))
        wide.append(word_error_rate(said, direct))
        phone.append(word_error_rate(said, called))
        print(f"  16 kHz {wide[-1]:4.2f}  phone {phone[-1]:4.2f}  {said!r} -> {called!r}")
    print(f"  mean: 16 kHz {statistics.mean(wide):.2f}, 8 kHz call {statistics.mean(phone):.2f}")


# ---------------------------------------------------------------------- 2 and 3: the server


class Server:
    def __init__(self, emu, *, pythonpath: str | None = None, cwd: str | None = None) -> None:
        self.port, self.phone_port = free_port(), free_port()
        self.public = f"http://127.0.0.1:{self.phone_port}"
        env = dict(os.environ, GOOGLE_GEMINI_BASE_URL=emu.base_url, SSL_CERT_FILE=str(emu.ca_file),
                   GOOGLE_API_KEY=emu.api_key, TWILIO_AUTH_TOKEN=AUTH_TOKEN, NO_PROXY="127.0.0.1,localhost")
        if pythonpath:  # another version of the server (--baseline), on this environment's packages
            env["PYTHONPATH"] = pythonpath
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "live.cli", "serve", "--model", MODEL, "--port", str(self.port), "--twilio",
             "--public-url", self.public, "--phone-port", str(self.phone_port),
             "--stream-url", f"ws://127.0.0.1:{self.port}/twilio/media", "--log-level", "WARNING",
             "--max-sessions", "200", "--max-sessions-per-ip", "200"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=cwd,
        )

    async def ready(self) -> None:
        for _ in range(2):
            await anyio.to_thread.run_sync(self.proc.stdout.readline)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def phone_turn(double: TwilioDouble, server: Server, ulaw: bytes, turns: int = 1) -> list[float]:
    """Seconds from the end of each question to the first frame of its reply."""
    waits = []
    async with double.call(server.public + "/twilio/voice", stream_url=f"ws://127.0.0.1:{server.port}/twilio/media") as call:
        for _ in range(turns):
            before = len(call.heard.media)
            await call.speak(ulaw)
            ended = call.now()
            with anyio.fail_after(20):
                while len(call.heard.media) == before:
                    await anyio.sleep(0.005)
            waits.append(call.heard.media[before][0] - ended)
            await call.wait_quiet(0.5, timeout=30)
    return waits


async def live_turn(server: Server, pcm16: bytes, turns: int = 1) -> list[float]:
    waits = []
    async with LiveClient.connect(f"ws://127.0.0.1:{server.port}/live") as client:
        events = client.events()
        for _ in range(turns):
            deadline = time.monotonic()
            for i in range(0, len(pcm16), 640):
                await client.send_audio(pcm16[i : i + 640])
                deadline += 0.02
                await anyio.sleep(max(0.0, deadline - time.monotonic()))
            ended = time.monotonic()
            got: list[float] = []

            async def silence() -> None:
                nonlocal deadline
                while True:
                    await client.send_audio(bytes(640))
                    deadline += 0.02
                    await anyio.sleep(max(0.0, deadline - time.monotonic()))

            async with anyio.create_task_group() as tg:
                tg.start_soon(silence)
                last = None
                with anyio.move_on_after(30):
                    async for event in events:
                        if isinstance(event, AudioFrame):
                            if not got:
                                got.append(time.monotonic() - ended)
                            last = time.monotonic()
                        elif getattr(event, "type", "") == "turn.complete" and last is not None:
                            break
                tg.cancel_scope.cancel()
            waits += got
    return waits


async def measure(emu, label: str, args: argparse.Namespace, ulaw: bytes, pcm16: bytes, **server: str) -> dict:
    """Latency and CPU of the phone path and `/live` on one server."""
    double = TwilioDouble(AUTH_TOKEN)
    proc = Server(emu, **server)
    out: dict = {}
    try:
        await proc.ready()
        phone, live = [], []
        for _ in range(5):
            phone += await phone_turn(double, proc, ulaw)
            live += await live_turn(proc, pcm16)
        out["phone_ms"], out["live_ms"] = statistics.median(phone) * 1000, statistics.median(live) * 1000
        for path in ("phone", "live"):
            start_cpu, start = cpu_of(proc.proc.pid), time.monotonic()
            with anyio.move_on_after(args.seconds):
                async with anyio.create_task_group() as tg:
                    for _ in range(args.calls):
                        if path == "phone":
                            tg.start_soon(phone_turn, double, proc, ulaw, 1000)
                        else:
                            tg.start_soon(live_turn, proc, pcm16, 1000)
                        await anyio.sleep(0.1)
            cpu, wall = cpu_of(proc.proc.pid) - start_cpu, time.monotonic() - start
            out[f"{path}_cpu"] = cpu / (args.calls * wall / 60)
            await anyio.sleep(1.0)
    finally:
        proc.stop()
    print(f"{label}: end of speech to first reply frame, median of 5 (includes the emulator's 0.5 s end of turn): "
          f"phone {out['phone_ms']:.0f} ms, /live {out['live_ms']:.0f} ms (the phone path adds "
          f"{out['phone_ms'] - out['live_ms']:.0f} ms); CPU s per minute, {args.calls} at once: "
          f"phone {out['phone_cpu']:.2f}, /live {out['live_cpu']:.2f} ({out['phone_cpu'] / out['live_cpu']:.2f}x)",
          flush=True)
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=10, help="calls at once for the CPU figure (default 10)")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the CPU window (default 30)")
    parser.add_argument("--skip-wer", action="store_true")
    parser.add_argument("--baseline", metavar="REF", help="also run the server as of git REF (checked out in a "
                        "temporary worktree, on this environment's packages), alternately with this checkout's")
    parser.add_argument("--repeat", type=int, default=1, metavar="K", help="rounds, alternating (default 1)")
    args = parser.parse_args()
    if not args.skip_wer:
        await word_errors()
    pcm24 = speech_24k(QUESTION)
    ulaw, pcm16 = to_phone(pcm24), to_live(pcm24)
    with contextlib.ExitStack() as stack:
        servers: list[tuple[str, dict]] = [("this checkout", {})]
        if args.baseline:
            from bench.real import baseline_peer

            peer = stack.enter_context(baseline_peer(args.baseline))
            servers.append((peer.name, {"pythonpath": peer.env["PYTHONPATH"], "cwd": peer.cwd}))
        results: dict[str, list[dict]] = {name: [] for name, _ in servers}
        async with running_emulator(Script(replies=[REPLY] * 1000, speed=1)) as emu:
            for _ in range(args.repeat):
                for name, server in servers:
                    results[name].append(await measure(emu, name, args, ulaw, pcm16, **server))
    if args.repeat > 1 or args.baseline:
        for name, rows in results.items():
            med = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
            print(f"median of {len(rows)}, {name}: the phone path adds {med['phone_ms'] - med['live_ms']:.0f} ms; "
                  f"CPU per minute phone {med['phone_cpu']:.2f}, /live {med['live_cpu']:.2f} "
                  f"({med['phone_cpu'] / med['live_cpu']:.2f}x)")


if __name__ == "__main__":
    anyio.run(main)
