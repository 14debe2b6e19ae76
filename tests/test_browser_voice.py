"""The weather sample on local/voice in Debian Chromium: a spoken question, a tool call, a spoken answer.

Nothing is scripted: the page's fake microphone plays espeak-ng's question,
local/voice recognises it, calls `get_weather`, and speaks the result back,
which the page shows and plays.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from audio_fixtures import silence, speak, wav_bytes
from connections.local_voice import LocalVoice
from samples import weather
from serving import running
from browsers import chromium_page, start_talking, stats, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.browser]


# PocketSphinx on synthetic speech captured through Chromium's fake microphone
# hears the question differently from run to run (at 140 words a minute, about
# one run in five here and more on a loaded machine, it missed "the weather in
# Paris" and no tool was named; at 120, none in eight): the speech path is what
# this test checks, so a misheard run is tried again, up to five times.
@pytest.mark.flaky(reruns=5)
async def test_a_spoken_weather_question_is_answered_with_a_tool_call_and_speech(tmp_path: Path):
    question = speak("What is the weather in Paris?", rate=16_000, voice="en-us", wpm=120)
    wav = tmp_path / "question.wav"
    wav.write_bytes(wav_bytes(silence(0.8) + question + silence(1.5)))
    agent = weather.agent.with_model("local/voice")
    async with running(agent, LocalVoice()) as (_, url), chromium_page(wav) as page:
        await start_talking(page, url)
        tool = page.locator("#log li.tool")
        await tool.first.wait_for(timeout=20_000)
        assert await tool.first.text_content() == '⚙ get_weather({"city":"Paris"})'

        you = page.locator("#log li[data-side=you][data-final] .text")
        agent_said = page.locator("#log li[data-side=agent][data-final] .text")
        await agent_said.first.wait_for(timeout=20_000)
        heard = await you.all_text_contents()
        [answer] = await agent_said.all_text_contents()
        print(f"page: you {heard!r}; agent {answer!r}")
        shown = await tool.all_text_contents()
        assert len(shown) == 2 and '"sky":"overcast"' in shown[1]  # the call, then its result
        assert "paris" in heard[0].lower()
        assert answer.startswith("get weather: city Paris, sky overcast, temperature 12 degrees")

        # The answer is spoken: the page receives and plays several seconds of it.
        async def played():
            s = await stats(page)
            return s if s["samplesPlayed"] >= 3 * 24_000 else None

        final = await wait_until(played, 20, "the spoken answer to play")
        await page.locator("#log li.turn-end").first.wait_for(timeout=15_000)
        [turn_end] = await page.locator("#log li.turn-end").all_text_contents()
        assert turn_end.startswith("turn complete · answered ")  # local/voice speaks: the wait is shown
        assert final["samplesFlushed"] == 0
        assert page.errors == []
