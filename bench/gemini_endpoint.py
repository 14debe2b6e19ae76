"""What the Live API's own endpoint (`live serve --gemini-endpoint`) adds to each message.

    python -m bench.gemini_endpoint                 # about 45 s
    python -m bench.gemini_endpoint --turns 30 --json

One process runs the Live emulator over TLS, with replies at `--speed` (by
default no pacing at all, so the emulator's own timing is not what is
measured), and in front of it the session server with the endpoint's door,
over TLS, built as `live serve --gemini-endpoint --certfile ...` builds it
(the process's garbage collector tuned as `live serve` tunes it). The
unmodified google-genai client, changed only in its base URL, key and trusted
CA, talks over three paths, each on a session of its own:

- `direct`: google-genai -> emulator;
- `endpoint`: google-genai -> the server's endpoint -> emulator, with the
  server's default pacing (`--audio-lead 0.5`);
- `endpoint-unpaced`: the same with pacing off (`--audio-lead 0`).

Every round asks each path in turn (the order rotates) the same three things:

1. a typed turn, `send_client_content(turns=..., turn_complete=True)`: time
   to the first serverContent message and to turnComplete;
2. a spoken turn ended by the model's voice detection: 16 kHz PCM in 20 ms
   chunks at real time, a tone then the 500 ms of silence after which the
   emulator's detection (an energy detector counting audio time, not wall
   time) ends the turn; time from sending the chunk that completes the
   silence to the first reply audio (silence keeps streaming after it until
   the turn is complete, as a microphone does);
3. a spoken turn ended by `audioStreamEnd` (the microphone closed): time from
   sending it to the first reply audio.

The gaps between consecutive audio messages of each reply are kept too. The
added latency is each endpoint path's figure less the direct one's.

The server paces reply audio for its client: once `audio_lead` seconds of it
are ahead of playback, it sends the rest at playback speed. On the paced path
turnComplete therefore comes about when the reply has played (less the lead),
and the gaps between audio messages are the pacing's: the time to the *first*
reply message is the fair measure of what the endpoint adds, not the time to
the last byte. The unpaced path shows turnComplete and the gaps without
pacing. A question asked while the client still holds more than the lead of
unplayed audio would rightly have the next reply's first audio held back
until it does not; on the paced path each question therefore waits until the
client holds 0.1 s less than the lead, as a user who listens to the answer
before asking again. The server also joins reply audio it may send at once
into one message (up to 16 KiB), so its replies come in fewer, larger
messages than the service's; the report says how many and how large.

The client, the server and the emulator share one event loop, as in the
tests: a figure includes the server's work on the same CPU, serially, which
is what one message's latency costs anyway.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import json
import math
import os
import secrets
import ssl
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import trustme
from google import genai
from google.genai import types

from connections.emulator import Emulator, Script, emulator_client, running_emulator
from connections.gemini import Gemini
from live.agent import Agent
from live.access.auth import mint_token
from live.doors.gemini_live import gemini_doors
from live.server.port import DEFAULT_DOORS, LiveServer, ServerConfig, tune_gc_for_serving

MODEL = "gemini-live-2.5-flash-preview"
REPLY = "Half past nine."  # about a second of speech: 25 chunks of 40 ms from the service
RATE = 16_000
CHUNK = 640  # 20 ms of 16 kHz PCM16
SILENCE_MS = 500  # the emulator's end of turn (automaticActivityDetection's default)
MIME = f"audio/pcm;rate={RATE}"
OUTPUT_BYTES_PER_SECOND = 48_000  # the reply's 24 kHz PCM16
PLAYED_MARGIN = 0.1  # a paced path's question waits until the client holds this much less than the lead
PATHS = ("direct", "endpoint", "endpoint-unpaced")
LEADS = {"endpoint": 0.5, "endpoint-unpaced": None}  # `live serve --audio-lead`: its default, and 0
MEASURES = {
    "text_first": "text: first serverContent",
    "text_done": "text: turnComplete",
    "vad_first_audio": "audio, VAD end: first reply audio",
    "end_first_audio": "audio, audioStreamEnd: first reply audio",
    "audio_gap": "reply audio: gap between messages",
    "reply_span": "reply audio: first to last message",
}
PACED = ("text_done", "audio_gap", "reply_span")  # what the paced path's pacing decides
CONFIG = types.LiveConnectConfig(
    response_modalities=[types.Modality.AUDIO],
    output_audio_transcription=types.AudioTranscriptionConfig(),
    input_audio_transcription=types.AudioTranscriptionConfig(),
)


def tone(seconds: float, hz: float = 440.0) -> bytes:
    t = np.arange(int(seconds * RATE)) / RATE
    return (np.sin(2 * np.pi * hz * t) * 8000).astype("<i2").tobytes()


SPEECH = tone(0.2)
SILENCE = bytes(CHUNK)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest rank, as `bench.stats.Histogram` ranks."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, round(q / 100 * len(ordered))) - 1]


def summary(values_ms: Sequence[float]) -> dict[str, Any]:
    return {
        "n": len(values_ms),
        "median_ms": percentile(values_ms, 50),
        "p90_ms": percentile(values_ms, 90),
        "p99_ms": percentile(values_ms, 99),
        "mean_ms": sum(values_ms) / len(values_ms) if values_ms else None,
    }


class Reply:
    """When a turn's messages arrived (perf_counter seconds)."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.first_audio: float | None = None
        self.done: float | None = None
        self.audio: list[tuple[float, int]] = []  # arrival, bytes
        self.done_event = anyio.Event()

    async def receive(self, session: Any) -> None:
        """Messages up to turnComplete (`receive()` stops after it); others are skipped."""
        async for message in session.receive():
            now = time.perf_counter()
            content = message.server_content
            if content is None:
                continue  # usageMetadata, which may follow the last turn's turnComplete
            if self.first is None:
                self.first = now
            for part in (content.model_turn.parts or []) if content.model_turn else []:
                if part.inline_data and part.inline_data.data:
                    if self.first_audio is None:
                        self.first_audio = now
                    self.audio.append((now, len(part.inline_data.data)))
            if content.turn_complete:
                self.done = now
        self.done_event.set()


class Route:
    """One path's session and what it measured.

    `lead` is the server's pacing (None: none); `played_until` when the client
    will have played the reply audio it received, as the server's pacer counts.
    """

    def __init__(self, name: str, session: Any, lead: float | None = None) -> None:
        self.name = name
        self.session = session
        self.lead = lead
        self.played_until = 0.0
        self.reset()

    def reset(self) -> None:
        """Forget what was measured (after the warm-up)."""
        self.samples: dict[str, list[float]] = {key: [] for key in MEASURES}
        self.audio_messages = 0
        self.audio_bytes = 0
        self.replies = 0

    def keep(self, key: str, start: float, end: float | None) -> None:
        if end is None:
            raise RuntimeError(f"{self.name}: {key}: the reply never came")
        self.samples[key].append((end - start) * 1000)

    def keep_reply(self, reply: Reply) -> None:
        times = [t for t, _ in reply.audio]
        self.samples["audio_gap"] += [(b - a) * 1000 for a, b in itertools.pairwise(times)]
        if times:
            self.samples["reply_span"].append((times[-1] - times[0]) * 1000)
        nbytes = sum(n for _, n in reply.audio)
        self.audio_messages += len(reply.audio)
        self.audio_bytes += nbytes
        self.replies += 1
        if times:
            self.played_until = max(self.played_until, times[0]) + nbytes / OUTPUT_BYTES_PER_SECOND

    async def ready(self) -> None:
        """On a paced path, wait until the client holds less than the lead of unplayed audio."""
        if self.lead is not None:
            await anyio.sleep(max(0.0, self.played_until - self.lead + PLAYED_MARGIN - time.perf_counter()))


async def send_audio(session: Any, pcm: bytes) -> float:
    """`pcm` in 20 ms chunks at real time; when the last chunk's send began."""
    due = time.perf_counter()
    last = due
    for i in range(0, len(pcm), CHUNK):
        last = time.perf_counter()
        await session.send_realtime_input(audio=types.Blob(data=pcm[i : i + CHUNK], mime_type=MIME))
        due += CHUNK / 2 / RATE
        await anyio.sleep(max(0.0, due - time.perf_counter()))
    return last


async def microphone(session: Any, until: anyio.Event) -> None:
    """Silence at real time, as an open microphone sends, until `until`."""
    due = time.perf_counter()
    while not until.is_set():
        await session.send_realtime_input(audio=types.Blob(data=SILENCE, mime_type=MIME))
        due += CHUNK / 2 / RATE
        with anyio.move_on_after(max(0.0, due - time.perf_counter())):
            await until.wait()


async def one_round(path: Route, timeout: float) -> None:
    session = path.session
    with anyio.fail_after(timeout):
        # 1. A typed turn.
        await path.ready()
        reply = Reply()
        async with anyio.create_task_group() as tg:
            tg.start_soon(reply.receive, session)
            start = time.perf_counter()
            await session.send_client_content(
                turns=types.Content(role="user", parts=[types.Part(text="what time is it")]), turn_complete=True
            )
        path.keep("text_first", start, reply.first)
        path.keep("text_done", start, reply.done)
        path.keep_reply(reply)
        # 2. Spoken, ended by the model's voice detection.
        await path.ready()
        reply = Reply()
        async with anyio.create_task_group() as tg:
            tg.start_soon(reply.receive, session)
            end = await send_audio(session, SPEECH + bytes(SILENCE_MS * RATE * 2 // 1000))
            tg.start_soon(microphone, session, reply.done_event)
        path.keep("vad_first_audio", end, reply.first_audio)
        path.keep_reply(reply)
        # 3. Spoken, ended by closing the microphone.
        await path.ready()
        reply = Reply()
        async with anyio.create_task_group() as tg:
            tg.start_soon(reply.receive, session)
            await send_audio(session, SPEECH)
            end = time.perf_counter()
            await session.send_realtime_input(audio_stream_end=True)
        path.keep("end_first_audio", end, reply.first_audio)
        path.keep_reply(reply)


def certificate(ca: trustme.CA, folder: str) -> tuple[str, str]:
    cert = ca.issue_cert("127.0.0.1", "localhost")
    certfile, keyfile = Path(folder, "cert.pem"), Path(folder, "key.pem")
    cert.private_key_and_cert_chain_pem.write_to_path(str(certfile))
    cert.private_key_pem.write_to_path(str(keyfile))
    return str(certfile), str(keyfile)


@contextlib.asynccontextmanager
async def endpoint(emu: Emulator, agent: Agent, secret: str, tls: tuple[str, str], lead: float | None) -> AsyncIterator[int]:
    """The server with the endpoint's door, its model the emulator; yields its port."""
    llm = Gemini(agent.model, api_key=emu.api_key, base_url=emu.base_url, api_version="v1beta", ssl_context=emu.ssl_context())
    config = ServerConfig(port=0, token_secret=secret, certfile=tls[0], keyfile=tls[1], audio_lead=lead)
    server = LiveServer(agent, llm, config, doors={**DEFAULT_DOORS, **gemini_doors([agent.model])})
    async with anyio.create_task_group() as tg:
        port = await tg.start(server.serve)
        try:
            yield port
        finally:
            server.stop()


def endpoint_client(port: int, ca: trustme.CA, token: str) -> genai.Client:
    """google-genai as an app builds it, pointed at the endpoint."""
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return genai.Client(
        vertexai=False,
        api_key=token,
        http_options=types.HttpOptions(
            base_url=f"https://127.0.0.1:{port}", api_version="v1beta", async_client_args={"ssl": context}
        ),
    )


async def run(turns: int, speed: float, warmup: int) -> dict[str, Any]:
    script = Script(speed=speed, replies=lambda ctx: REPLY, profile_overrides={"late_transcripts": False})
    agent = Agent(name="bench", model=MODEL)
    secret = secrets.token_urlsafe(32)
    ca = trustme.CA()
    timeout = 30.0
    with tempfile.TemporaryDirectory(prefix="bench-gemini-endpoint-") as folder:
        tls = certificate(ca, folder)
        async with contextlib.AsyncExitStack() as stack:
            emu = await stack.enter_async_context(running_emulator(script))
            clients = {"direct": emulator_client(emu)}
            for name, lead in LEADS.items():
                port = await stack.enter_async_context(endpoint(emu, agent, secret, tls, lead))
                clients[name] = endpoint_client(port, ca, mint_token(secret, agent=agent.name, ttl=600))
            paths = []
            for name in PATHS:
                session = await stack.enter_async_context(clients[name].aio.live.connect(model=MODEL, config=CONFIG))
                paths.append(Route(name, session, LEADS.get(name)))
            threshold = gc.get_threshold()
            tune_gc_for_serving()
            try:
                for n in range(warmup + turns):
                    if n == warmup:
                        for path in paths:
                            path.reset()
                    for path in paths[n % len(paths) :] + paths[: n % len(paths)]:
                        await one_round(path, timeout)
            finally:  # a caller's process (a test run) keeps its own settings
                gc.unfreeze()
                gc.set_threshold(*threshold)
            upstream = len(emu.sessions)
    return report(paths, turns, speed, upstream)


def report(paths: list[Route], turns: int, speed: float, upstream: int) -> dict[str, Any]:
    figures = {p.name: {key: summary(values) for key, values in p.samples.items()} for p in paths}
    direct = figures["direct"]
    added: dict[str, dict[str, dict[str, float | None]]] = {}
    for name in PATHS[1:]:
        added[name] = {}
        for key in MEASURES:
            if name == "endpoint" and key in PACED:
                continue
            ours = figures[name][key]
            added[name][key] = {
                q: None if ours[q] is None or direct[key][q] is None else ours[q] - direct[key][q]
                for q in ("median_ms", "p90_ms", "p99_ms")
            }
    messages = {
        p.name: {
            "audio_messages_per_reply": p.audio_messages / p.replies if p.replies else None,
            "bytes_per_audio_message": p.audio_bytes / p.audio_messages if p.audio_messages else None,
        }
        for p in paths
    }
    return {
        "benchmark": "gemini-endpoint",
        "turns": turns,
        "emulator_speed": None if math.isinf(speed) else speed,
        "reply": REPLY,
        "audio_lead": LEADS,
        "paths": figures,
        "added": added,
        "messages": messages,
        "upstream_connections": upstream,  # one a path: the server never reconnected
    }


def _ms(value: float | None, sign: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.2f}" if sign else f"{value:.2f}"


def table(result: dict[str, Any]) -> list[str]:
    """The report as lines: per measure, each path's figures and what the endpoint adds."""
    speed = result["emulator_speed"]
    pacing = "inf (no pacing)" if speed is None else f"{speed:g}"
    head = f"{'measure':<42} {'path':<17} {'n':>5} {'median':>8} {'p90':>8} {'p99':>8}"
    lines = [
        f"{result['turns']} rounds; emulator speed {pacing}; reply {result['reply']!r}; ms",
        f"{head}   {'+median':>8} {'+p90':>8} {'+p99':>8}",
    ]
    for key, label in MEASURES.items():
        for name in PATHS:
            f = result["paths"][name][key]
            row = f"{label if name == 'direct' else '':<42} {name:<17} {f['n']:>5} {_ms(f['median_ms']):>8} {_ms(f['p90_ms']):>8} {_ms(f['p99_ms']):>8}"
            if name != "direct":
                diff = result["added"][name].get(key)
                if diff is None:
                    row += f"   {'(paced)':>8}"
                else:
                    row += "   " + " ".join(f"{_ms(diff[q], sign=True):>8}" for q in ("median_ms", "p90_ms", "p99_ms"))
            lines.append(row.rstrip())
    for name, m in result["messages"].items():
        per_reply, size = m["audio_messages_per_reply"], m["bytes_per_audio_message"]
        lines.append(
            f"{name}: {per_reply:.1f} audio messages per reply, {size:.0f} bytes each"
            if per_reply is not None and size is not None
            else f"{name}: no reply audio"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=8, help="rounds measured, each path asked three times a round (default 8)")
    parser.add_argument("--warmup", type=int, default=1, help="rounds run first and not counted (default 1)")
    parser.add_argument("--speed", type=float, default=math.inf, help="the emulator's pacing factor (default inf: none)")
    parser.add_argument("--json", action="store_true", help="write the results to stdout as JSON instead of the table")
    args = parser.parse_args(argv)
    # Loopback only: websockets honours HTTPS_PROXY, and no proxy reaches it.
    os.environ["NO_PROXY"] = ",".join(filter(None, ("127.0.0.1,localhost", os.environ.get("NO_PROXY"))))
    if args.turns < 1 or args.warmup < 0 or not args.speed > 0:
        parser.error("--turns must be at least 1, --warmup at least 0, --speed positive")
    result = anyio.run(run, args.turns, args.speed, args.warmup)
    if args.json:
        json.dump(result, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print("\n".join(table(result)))
    sys.stdout.flush()
    return result


if __name__ == "__main__":
    main()
