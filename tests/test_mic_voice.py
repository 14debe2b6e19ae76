"""`live mic` against local/voice on virtual audio devices: a spoken question, a tool call, a spoken answer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from audio_fixtures import silence, speak, wav_bytes
from connections.local_voice import LocalVoice
from samples import weather
from serving import running
from test_mic import live_mic, pulse, recording_speaker, speak_into_mic, wait_for  # noqa: F401 (pulse is a fixture)

pytestmark = [pytest.mark.anyio, pytest.mark.audio]


async def test_the_mic_client_hears_the_weather_answer_from_local_voice(pulse, tmp_path: Path):  # noqa: F811
    question = tmp_path / "question.wav"
    question.write_bytes(
        wav_bytes(silence(0.3) + speak("What is the weather in Paris?", rate=16_000, voice="en-us", wpm=140) + silence(1.2))
    )
    agent = weather.agent.with_model("local/voice")
    async with running(agent, LocalVoice()) as (_, url), live_mic(pulse, url) as proc:
        await proc.wait_for_line("live mic: connected")
        with recording_speaker(pulse, tmp_path / "speaker.raw") as recorded:
            await speak_into_mic(pulse, question)
            await wait_for(lambda: any(line.startswith("— turn complete") for line in proc.lines), 30, "the answer")
        await proc.interrupt()
    lines = proc.lines
    print("\n".join(lines))
    you = [line for line in lines if line.startswith("you ▸")]
    assert you and "paris" in you[0].lower()
    assert '⚙ get_weather({"city": "Paris"})' in lines
    [agent_line] = [line for line in lines if line.startswith("agent ▸")]
    assert agent_line.startswith("agent ▸ get weather: city Paris, sky overcast")
    # The answer came out of the speaker: seconds of sound, not silence.
    played = np.frombuffer(recorded.read_bytes(), "<i2").astype(np.float64)
    loud = np.abs(played) > 1000
    assert loud.sum() / 16_000 > 1.0
