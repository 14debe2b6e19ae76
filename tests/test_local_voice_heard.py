"""local/voice hears what the docs tell people to say, at 16 kHz and on a phone call.

The README's example ("What is the weather in Paris?") and the Lisbon question
of the client pages, spoken by espeak-ng's default voice (`en`) and an American
female one (`en-us+f3`) at their default 160 words a minute, go through the
`local/voice` model connection with the weather sample's tools; the turn must
end in `get_weather` for the city said. "8 kHz" is the speech a carrier door
hands the session: resampled to 8 kHz, G.711 μ-law encoded and decoded, and
resampled back to 16 kHz 20 ms at a time with `live.phone.audio`.
"""

from __future__ import annotations

import anyio
import pytest
from google.genai import types

from audio_fixtures import speak
from connections.local_voice import LocalVoice, VoiceConfig
from live.phone.audio import Resampler, ulaw_decode, ulaw_encode
from samples import weather

pytestmark = pytest.mark.anyio

AGENT = weather.agent.with_model("local/voice")
FRAME = 640  # 20 ms at 16 kHz


@pytest.fixture(scope="module")
def voice() -> LocalVoice:
    return LocalVoice(config=VoiceConfig(speed=50.0))


def phone_call(pcm16k: bytes) -> bytes:
    down = Resampler(16_000, 8_000)
    ulaw = ulaw_encode(down(pcm16k) + down.flush())
    up = Resampler(8_000, 16_000)
    return b"".join(up(ulaw_decode(ulaw[i : i + 160])) for i in range(0, len(ulaw), 160))


async def calls_made(llm: LocalVoice, pcm: bytes) -> tuple[str, list[tuple[str, dict]]]:
    """The final transcript of one spoken turn and the tool calls it made (answered by the sample's tools)."""
    audio = bytes(9_600) + pcm + bytes(48_000)
    heard, calls = "", []
    async with llm.connect(AGENT.request()) as conn:
        async def feed() -> None:
            for i in range(0, len(audio), FRAME):
                await conn.send_realtime(types.Blob(data=audio[i : i + FRAME], mime_type="audio/pcm;rate=16000"))

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(feed)
                async for response in conn.receive():
                    t = response.input_transcription
                    if t is not None and t.finished:
                        heard = t.text or ""
                    for call in response.function_calls:
                        calls.append((call.name, dict(call.args or {})))
                        result = AGENT.tools_by_name[call.name](**(call.args or {}))
                        answer = types.FunctionResponse(id=call.id, name=call.name, response=result)
                        await conn.send_content(types.Content(role="user", parts=[types.Part(function_response=answer)]))
                    if response.turn_complete or response.interrupted:
                        break
                tg.cancel_scope.cancel()
    return heard, calls


# On a call the Paris question (both voices) and the Lisbon one in `en` are
# still misheard most of the time (docs/local-voice.md, "Hearing the agent's
# words", and `python -m bench.local_voice_wer`): not asserted here, as they
# neither pass nor fail every time.
CASES = [
    pytest.param(said, city, speaker, rate, id=f"{city}-{speaker}-{rate}")
    for said, city, speaker, rate in [
        (said, city, speaker, "16k")
        for said, city in (("What is the weather in Paris?", "Paris"), ("What's the weather in Lisbon?", "Lisbon"))
        for speaker in ("en", "en-us+f3")
    ]
    + [("What's the weather in Lisbon?", "Lisbon", "en-us+f3", "8k")]
]


@pytest.mark.parametrize(("said", "city", "speaker", "rate"), CASES)
async def test_the_docs_weather_question_calls_get_weather_for_the_city_said(voice, said, city, speaker, rate):
    pcm = speak(said, 16_000, voice=speaker)
    if rate == "8k":
        pcm = phone_call(pcm)
    heard, calls = await calls_made(voice, pcm)
    assert calls == [("get_weather", {"city": city})], f"heard {heard!r}"
