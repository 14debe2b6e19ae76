"""local/voice through the session server: real recognition, real synthesis, real barge-in.

Speech is made by espeak-ng with an American voice at 140 words a minute (the
field notes: PocketSphinx hears it best), sent over a loopback socket faster
than real time (the listener counts samples, not seconds).
"""

from __future__ import annotations

import dataclasses

import anyio
import pytest
from google.genai import types

from audio_fixtures import silence, speak
from clients.client import AudioFrame, LiveClient
from connections.local_voice import LocalVoice, VoiceConfig, word_error_rate
from live import protocol as p
from live.agent import Agent
from live.registry import default_registry
from samples import weather
from serving import audio_bytes, collect, running

pytestmark = pytest.mark.anyio

FRAME = 640  # 20 ms at 16 kHz
PLAIN = Agent(name="plain", model="local/voice")
WEATHER = weather.agent.with_model("local/voice")


@pytest.fixture(scope="module")
def voice() -> LocalVoice:
    """One model for the module: its general English decoders load once."""
    return LocalVoice(config=VoiceConfig(speed=4.0))


def spoken(text: str) -> bytes:
    return speak(text, rate=16_000, voice="en-us", wpm=140)


async def send_paced(client: LiveClient, pcm: bytes, speed: float = 4.0) -> None:
    for start in range(0, len(pcm), FRAME):
        await client.send_audio(pcm[start : start + FRAME])
        await anyio.sleep(0.02 / speed)


def final_input(events: list[object]) -> str:
    [final] = [e.text for e in events if isinstance(e, p.TranscriptInput) and e.final]
    return final


def test_local_voice_is_registered_by_default():
    assert "local/voice" in default_registry().patterns
    assert isinstance(default_registry().resolve("local/voice"), LocalVoice)


async def test_a_spoken_sentence_is_transcribed_and_answered_aloud_with_its_transcript(voice):
    said = "I like green apples and bananas."
    async with running(PLAIN, voice) as (_, url), LiveClient.connect(url) as client:
        assert client.session.model == "local/voice"
        await send_paced(client, silence(0.3) + spoken(said) + silence(1.0))
        events = await collect(client, lambda e: isinstance(e, p.TurnComplete), timeout=30)

    heard = final_input(events)
    wer = word_error_rate(said, heard)
    print(f"said {said!r}, heard {heard!r}: word error rate {wer:.2f}")
    assert wer <= 0.5
    # Partial transcripts came while the user spoke, before the final one.
    kinds = [type(e).__name__ for e in events]
    assert kinds.index("TranscriptInput") < kinds.index("AudioFrame")

    # The reply is speech at 24 kHz, its transcript released word by word
    # in between the audio, adding up to the final transcript.
    reply = audio_bytes(events)
    assert len(reply) / 48_000 > 1.0
    outputs = [e for e in events if isinstance(e, p.TranscriptOutput)]
    final = [e.text for e in outputs if e.final]
    assert final == [f"You said: {heard}."]
    fragments = "".join(e.text for e in outputs if not e.final)
    assert fragments == final[0]
    first_audio = next(i for i, e in enumerate(events) if isinstance(e, AudioFrame))
    last_audio = max(i for i, e in enumerate(events) if isinstance(e, AudioFrame))
    inside = [i for i, e in enumerate(events) if isinstance(e, p.TranscriptOutput) and not e.final]
    assert sum(first_audio < i < last_audio for i in inside) >= len(inside) - 1


async def test_speaking_over_the_reply_interrupts_it(voice):
    said = "I like green apples and bananas."
    async with running(PLAIN, voice) as (_, url), LiveClient.connect(url) as client:
        await send_paced(client, silence(0.3) + spoken(said) + silence(1.0))
        first = await collect(client, lambda e: isinstance(e, AudioFrame), timeout=30)
        # The reply plays in real time / 4; speak over it straight away.
        await send_paced(client, spoken("Stop, please stop."), speed=4.0)
        rest = await collect(
            client, lambda e: isinstance(e, (p.TurnInterrupted, p.TurnComplete)), timeout=15
        )
    events = first + rest
    assert isinstance(events[-1], p.TurnInterrupted)
    heard = final_input(events)
    full_reply_s = len(f"You said: {heard}.".split()) * 60 / 160  # at 160 words a minute
    assert len(audio_bytes(events)) / 48_000 < full_reply_s - 0.5  # cut short


async def test_a_spoken_weather_question_calls_the_tool_and_reads_back_its_result(voice):
    async with running(WEATHER, voice) as (_, url), LiveClient.connect(url) as client:
        await send_paced(client, silence(0.3) + spoken("What is the weather in Paris?") + silence(1.0))
        events = await collect(client, lambda e: isinstance(e, p.TurnComplete), timeout=30)
    calls = [e for e in events if isinstance(e, p.ToolCallEvent)]
    assert [(c.name, c.args) for c in calls] == [("get_weather", {"city": "Paris"})]
    results = [e for e in events if isinstance(e, p.ToolResultEvent)]
    assert results[0].response["sky"] == "overcast"
    [answer] = [e.text for e in events if isinstance(e, p.TranscriptOutput) and e.final]
    assert "overcast" in answer and "12 degrees" in answer
    order = [type(e).__name__ for e in events]
    assert order.index("ToolCallEvent") < order.index("ToolResultEvent") < order.index("AudioFrame")
    assert len(audio_bytes(events)) / 48_000 > 2.0


async def test_a_typed_question_names_a_tool_too(voice):
    async with running(WEATHER, voice) as (_, url), LiveClient.connect(url) as client:
        await client.send_text("forecast for Tokyo for the next two days")
        events = await collect(client, lambda e: isinstance(e, p.TurnComplete), timeout=20)
    [call] = [e for e in events if isinstance(e, p.ToolCallEvent)]
    assert (call.name, call.args) == ("get_forecast", {"city": "Tokyo", "days": 2})
    [answer] = [e.text for e in events if isinstance(e, p.TranscriptOutput) and e.final]
    assert answer.startswith("get forecast: city Tokyo, days")


async def test_an_unknown_city_is_asked_for_and_the_tools_error_is_read_back(voice):
    async with running(WEATHER, voice) as (_, url), LiveClient.connect(url) as client:
        await client.send_text("what is the weather in Atlantis")
        events = await collect(client, lambda e: isinstance(e, p.TurnComplete), timeout=20)
    [call] = [e for e in events if isinstance(e, p.ToolCallEvent)]
    assert call.args == {"city": "Atlantis"}
    [answer] = [e.text for e in events if isinstance(e, p.TranscriptOutput) and e.final]
    assert answer.startswith("get weather failed: no weather data for 'Atlantis'")


async def test_bad_audio_is_an_error_event_and_the_session_goes_on(voice):
    async with running(PLAIN, voice) as (_, url), LiveClient.connect(url) as client:
        await client.send_audio(b"\x01\x02\x03")  # odd length: not PCM16
        [error] = [
            e for e in await collect(client, lambda e: isinstance(e, p.ErrorEvent), timeout=10)
            if isinstance(e, p.ErrorEvent)
        ]
        assert not error.fatal
        await client.send_text("hello there")
        events = await collect(client, lambda e: isinstance(e, p.TurnComplete), timeout=20)
    [answer] = [e.text for e in events if isinstance(e, p.TranscriptOutput) and e.final]
    assert answer == "You said: hello there."


async def test_with_its_own_voice_detection_off_the_turn_is_what_lies_between_activity_start_and_end(voice):
    config = types.LiveConnectConfig(
        realtime_input_config=types.RealtimeInputConfig(
            automatic_activity_detection=types.AutomaticActivityDetection(disabled=True)
        )
    )
    agent = dataclasses.replace(WEATHER, config=config)
    async with running(agent, voice) as (_, url), LiveClient.connect(url) as client:
        # Speech with no activity signals is not a turn: nothing is answered.
        await send_paced(client, silence(0.3) + spoken("What is the weather in Paris?") + silence(1.0))
        with anyio.move_on_after(2):
            early = await collect(client, lambda e: isinstance(e, p.TurnComplete), timeout=3)
            pytest.fail(f"answered without a manual turn: {early}")
        await client.activity_start()
        await send_paced(client, spoken("What is the weather in Tokyo?"))
        await client.activity_end()
        events = await collect(client, lambda e: isinstance(e, p.TurnComplete), timeout=30)
    [call] = [e for e in events if isinstance(e, p.ToolCallEvent)]
    assert call.args == {"city": "Tokyo"}


async def test_a_tool_named_without_its_argument_is_not_called_and_the_reply_says_what_is_missing(voice):
    async with running(WEATHER, voice) as (_, url), LiveClient.connect(url) as client:
        await client.send_text("what is the weather")
        events = await collect(client, lambda e: isinstance(e, p.TurnComplete), timeout=20)
    assert not [e for e in events if isinstance(e, p.ToolCallEvent)]
    [answer] = [e.text for e in events if isinstance(e, p.TranscriptOutput) and e.final]
    assert answer == "You said: what is the weather. To call get weather I need the city."
