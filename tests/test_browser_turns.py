"""The server's own turn-taking from the browser page, in Debian Chromium: a
WAV is the fake microphone, the server answers through the Live emulator.

The user pauses mid-sentence and says "mm-hm" a second into the reply (with
headphones ticked, so the page keeps the microphone open while the agent
speaks): the sentence is answered whole and the reply plays to its end; the
page shows why the user's turn ended and that the backchannel was left alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from audio_fixtures import silence, speak, wav_bytes
from browsers import LEAD_S, chromium_page, press_talk, http_root
from connections.emulator import Script, running_emulator
from emulated import gemini_for
from live.agent import Agent, TurnSettings
from serving import running

pytestmark = [pytest.mark.anyio, pytest.mark.browser]

MODEL = "gemini-3.1-flash-live-preview"  # its own detector closes a turn at a 1 s pause
LONG_REPLY = (
    "Certainly. Flights to Boston next Friday morning leave at seven, at nine and at "
    "eleven, and the nine o'clock one still has window seats by the wing."
)  # about 9 s: the backchannel falls well inside it however the page's start shifts


async def test_the_page_shows_a_paused_sentence_answered_whole_and_mm_hm_left_alone(tmp_path: Path):
    said = speak("I would like to book a flight to") + silence(1.2) + speak("Boston next Friday morning.")
    # The reply starts about 2 s after the sentence (1.6 s of silence ends the
    # turn, then the model's first audio); "mm-hm" comes a second into it.
    microphone = tmp_path / "microphone.wav"
    microphone.write_bytes(wav_bytes(silence(LEAD_S) + said + silence(3.2) + speak("mm-hm", wpm=220) + silence(12)))
    agent = Agent("booking", MODEL, turn_taking="server", turns=TurnSettings(end_silence=1.6))
    async with running_emulator(Script(replies=[LONG_REPLY, "Yes?"], speed=1)) as emu:
        async with running(agent, gemini_for(emu)) as (_, url), chromium_page(microphone) as page:
            await page.goto(http_root(url))
            await page.check("#headphones")  # the microphone stays open while the agent speaks
            await press_talk(page)
            backchannel = page.locator("#log li.user-turn[data-reason=backchannel]")
            await backchannel.wait_for(timeout=25_000)
            await page.locator("#log li.turn-end").first.wait_for(timeout=20_000)
            turns = await page.locator("#log li.user-turn").evaluate_all("(items) => items.map((li) => li.dataset.reason)")
            ends = await page.locator("#log li.turn-end").all_text_contents()
            agent_said = await page.locator("#log li[data-side=agent][data-final] .text").all_text_contents()
            errors = page.errors
        [model] = emu.sessions
    assert turns == ["silence", "backchannel"]  # one turn for the whole sentence; the mm-hm left alone
    assert len(model.user_turns) == 1 and model.model_turns == [LONG_REPLY]
    assert ends and all(not end.startswith("interrupted") for end in ends)
    assert agent_said and agent_said[0].replace(" ", "").endswith("bythewing.")
    assert errors == []
