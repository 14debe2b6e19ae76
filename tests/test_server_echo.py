"""The server's built-in default, local/echo, fed real speech over a loopback socket."""

from __future__ import annotations

import anyio
import numpy as np
import pytest

from audio_fixtures import best_correlation, reference_24k, silence, speak
from clients.client import LiveClient
from connections.local_echo import EchoConfig, LocalEcho
from live import protocol as p
from live.agent import Agent
from serving import audio_bytes, collect, kinds, running

# Every test on both WebSocket layers the server can listen with.
pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("both_socket_layers")]

FRAME = 640  # 20 ms at 16 kHz


def agent() -> Agent:
    return Agent(name="echo", model="local/echo")


async def send_paced(client: LiveClient, pcm: bytes, speed: float = 4.0) -> None:
    for start in range(0, len(pcm), FRAME):
        await client.send_audio(pcm[start : start + FRAME])
        await anyio.sleep(0.02 / speed)


async def test_a_spoken_turn_comes_back_as_24khz_audio_in_order_without_transcripts():
    speech = speak("Hello, this is a test of the echo model.", rate=16_000)
    llm = LocalEcho(config=EchoConfig(speed=4.0))
    async with running(agent(), llm) as (_, url), LiveClient.connect(url) as client:
        assert client.session.model == "local/echo"
        await send_paced(client, silence(0.3) + speech + silence(1.0))
        events = await collect(client, lambda e: isinstance(e, p.TurnComplete), timeout=15)
    assert kinds(events) == ["audio", "generation.complete", "turn.complete"]
    reply = audio_bytes(events)
    # The reply is the utterance, resampled to 24 kHz: the same length within the
    # trimming of silence, and the same waveform.
    assert abs(len(reply) / 48_000 - len(speech) / 32_000) < 0.5
    got = np.frombuffer(reply, "<i2").astype(np.float64)
    assert best_correlation(reference_24k(speech), got) > 0.8
    assert not any(isinstance(e, (p.TranscriptInput, p.TranscriptOutput)) for e in events)


async def test_speaking_over_the_echo_interrupts_it():
    speech = speak("One two three four five six seven eight nine ten.", rate=16_000)
    llm = LocalEcho(config=EchoConfig(speed=1.0))
    async with running(agent(), llm) as (_, url), LiveClient.connect(url) as client:
        await send_paced(client, speech + silence(1.0), speed=8.0)
        first = await collect(client, lambda e: isinstance(e, bytes) or hasattr(e, "data"), timeout=10)
        await send_paced(client, speak("Stop, please.", rate=16_000), speed=1.0)
        events = first + await collect(client, lambda e: isinstance(e, p.TurnInterrupted), timeout=10)
    heard = len(audio_bytes(events)) / 48_000
    assert heard < len(speech) / 32_000 - 0.5  # the reply was cut short
    assert kinds(events)[-1] == "turn.interrupted"
