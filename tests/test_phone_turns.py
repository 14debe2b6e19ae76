"""A phone call whose turns the server takes: the carrier double calls as Twilio
does (8 kHz μ-law), the server listens at the line's own rate and answers
through the Live emulator in manual activity mode."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import anyio
import numpy as np
import pytest

from connections.emulator import Script, running_emulator
from emulated import gemini_for
from live import protocol as p
from live.agent import Agent, TurnSettings
from live.phone.audio import ulaw_decode
from live.phone.twilio import TwilioDoor
from phone_serving import running_phone

pytestmark = pytest.mark.anyio

MODEL = "gemini-3.1-flash-live-preview"  # its own detector closes a turn at a 1 s pause
LONG_REPLY = (
    "Your account shows two payments this month, one on the third and one on the "
    "seventeenth, and nothing is overdue."
)


def ulaw(text: str, tmp: Path, wpm: int = 140) -> bytes:
    """`text` spoken by espeak-ng, as the line carries it (8 kHz μ-law, through sox)."""
    if not (shutil.which("espeak-ng") and shutil.which("sox")):
        pytest.skip("espeak-ng and sox make the caller's speech")
    name = f"{abs(hash((text, wpm)))}"
    wav, raw = tmp / f"{name}.wav", tmp / f"{name}.ul"
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", str(wpm), "-w", str(wav), text], check=True, capture_output=True)
    subprocess.run(["sox", str(wav), "-r", "8000", "-e", "u-law", "-c", "1", "-t", "ul", str(raw)], check=True, capture_output=True)
    said = raw.read_bytes()
    level = np.abs(np.frombuffer(ulaw_decode(said), "<i2"))
    loud = np.flatnonzero(level > 300)  # espeak-ng's own silence before and after, cut: the pauses are the test's
    return said[loud[0] : loud[-1] + 1]


@pytest.fixture
def told(monkeypatch: pytest.MonkeyPatch) -> list:
    """Every event the session gave the Twilio door (a phone has no screen: the test does)."""
    seen: list = []
    original = TwilioDoor.event

    def event(self, event):
        seen.append(event)
        return original(self, event)

    monkeypatch.setattr(TwilioDoor, "event", event)
    return seen


async def test_a_caller_who_pauses_mid_sentence_is_answered_whole_and_mm_hm_leaves_the_reply_alone(tmp_path, told):
    agent = Agent("accounts", MODEL, turn_taking="server", turns=TurnSettings(end_silence=1.6))
    head = ulaw("My account number is four five six", tmp_path)
    tail = ulaw("seven eight nine.", tmp_path)
    mm_hm = ulaw("mm-hm", tmp_path, wpm=220)
    script = Script(replies=[LONG_REPLY, "Yes?"], speed=1)
    async with running_emulator(script) as emu, running_phone(agent, gemini_for(emu)) as phone:
        async with phone.call() as call:
            await call.silence(0.4)
            await call.speak(head, silence_after=1.2)  # the caller looks for the rest of the number
            await call.speak(tail)
            await call.wait_for_audio(timeout=10)
            await anyio.sleep(1.0)
            await call.speak(mm_hm)
            await call.wait_quiet(quiet=1.0, timeout=20)
        [model] = emu.sessions
    assert len(model.user_turns) == 1  # the number, whole
    assert model.model_turns == [LONG_REPLY]  # never cut
    assert call.heard.clears == []  # the line was never told to drop the reply
    stopped = [e.reason for e in told if isinstance(e, p.UserStopped)]
    assert stopped == ["silence", "backchannel"]
    # The caller heard all of it: the reply is about 7 s at 8 kHz.
    assert len(call.played()) >= 8000 * 6
