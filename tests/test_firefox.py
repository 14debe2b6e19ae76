"""The demo page in Debian's Firefox ESR: speech in through a real microphone, the reply out.

Firefox is driven over WebDriver BiDi by `puppeteer-core` (tests/browser/,
installed by ./test with `npm ci`; no browser download). Its microphone is the
default source of a private PulseAudio daemon, fed with `paplay`; the page runs
its own capture and playback worklets, against a real server and the scripted
Gemini double.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import anyio
import pytest

from audio_fixtures import silence, speak, wav_bytes
from browsers import http_root, scripted, wait_until
from connections import double
from live.agent import Agent
from live_audio import speech_found
from pulse import Pulse, pulse  # noqa: F401 (a fixture)
from serving import running

pytestmark = [pytest.mark.anyio, pytest.mark.browser, pytest.mark.audio]

FIREFOX = "/usr/bin/firefox-esr"
DRIVER = Path(__file__).resolve().parent / "browser"
SAID = "Hello there, can you hear me?"


def firefox_driver() -> list[str]:
    if not Path(FIREFOX).exists():
        pytest.skip("Debian firefox-esr is not installed (apt-get install firefox-esr)")
    if shutil.which("node") is None or not (DRIVER / "node_modules" / "puppeteer-core").exists():
        pytest.skip("puppeteer-core is not installed (./test runs npm ci in tests/browser)")
    return ["node", str(DRIVER / "firefox_talk.mjs")]


# A fresh headless Firefox sometimes never gets as far as the session and the
# microphone (4 of about 40 runs here, and in about half of some fresh-clone
# runs; the driver's watchdog reports the step): tried again rather than failing
# the suite. What is seen then is inside Firefox, not the page: the microphone's
# input stream has just opened when the page's process stops (its main thread
# parked on a futex, its audio graph threads silent, BiDi unanswered), and in
# the parent process the audio server's "AudioIPC Server RPC" thread waits on
# the PulseAudio mainloop's lock (rt_mutex) while the mainloop thread
# ("threaded-ml") itself waits on a futex: what looks like a lock-order deadlock
# in Firefox's PulseAudio backend. Not the cause: a permission prompt
# (permission.disabled; MediaManager logs the grant), the PulseAudio source (the
# input stream opens and delivers), the autoplay prefs, or the page's own wait.
@pytest.mark.flaky(reruns=5)
async def test_firefox_captures_speech_from_the_microphone_and_plays_the_reply(pulse: Pulse, tmp_path):
    command = firefox_driver()
    speech = silence(0.3) + speak(SAID) + silence(0.5)
    wav = tmp_path / "said.wav"
    wav.write_bytes(wav_bytes(speech))
    reply = speak("Yes, I hear you.", rate=24000)
    llm, session = scripted()
    env = {**pulse.env, "HOME": str(tmp_path), "MOZ_HEADLESS": "1"}
    steps: list[dict] = []
    async with running(Agent(name="test", model="gemini-2.5-flash"), llm) as (_, url):
        firefox = await anyio.open_process(
            [*command, http_root(url), str(len(reply) // 2)], env=env, cwd=DRIVER,
            stderr=(tmp_path / "driver.log").open("wb"),
        )
        try:
            async with anyio.create_task_group() as tg:

                async def read_steps() -> None:
                    buffer = b""
                    assert firefox.stdout is not None
                    async for chunk in firefox.stdout:
                        buffer += chunk
                        *lines, buffer = buffer.split(b"\n")
                        steps.extend(json.loads(line) for line in lines if line.strip())

                tg.start_soon(read_steps)

                async def reached(step: str):
                    if any(s["step"] == "failed" for s in steps):
                        raise AssertionError(f"Firefox: {steps[-1]}")
                    return next((s for s in steps if s["step"] == step), None)

                listening = await wait_until(lambda: reached("listening"), 120, "Firefox to listen")
                record = llm.sessions[0]
                await anyio.run_process(["paplay", "--device=micfeed", str(wav)], env=pulse.env)

                async def heard_the_speech():
                    return len(b"".join(d for _, d in record.audio_in)) >= len(speech)

                await wait_until(heard_the_speech, 15, "the speech to reach the server")
                step = 24000 * 2 // 25
                session.push(
                    double.input_transcript("Hello there, can you hear me?"),
                    double.output_transcript("Yes, I hear you."),
                    *[double.audio(reply[i : i + step]) for i in range(0, len(reply), step)],
                    double.generation_complete(),
                    double.turn_complete(),
                )
                played = await wait_until(lambda: reached("played"), 30, "Firefox to play the reply")
                with anyio.fail_after(30):
                    await firefox.wait()
                tg.cancel_scope.cancel()
        except BaseException:
            print((tmp_path / "driver.log").read_text(errors="replace")[-3000:])
            raise
        finally:
            if firefox.returncode is None:
                firefox.terminate()  # puppeteer closes Firefox on SIGTERM
                with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                    await firefox.wait()
                if firefox.returncode is None:
                    firefox.kill()
            await firefox.aclose()
    assert firefox.returncode == 0, steps
    assert "Firefox/" in listening["userAgent"]
    assert listening["state"] == "Listening"
    # What Firefox captured reached the model as 16 kHz speech in 20 ms frames.
    received = b"".join(d for _, d in record.audio_in)
    assert all(len(d) % 640 == 0 for _, d in record.audio_in)
    match = speech_found(speech, received)
    stats = played["stats"]
    print(f"firefox: capture at {stats['captureRate']} Hz, {match.found}/{match.speech_blocks} speech "
          f"blocks found ({match.fraction:.0%}); playback at {stats['playbackRate']} Hz, "
          f"{stats['samplesPlayed']} samples played")
    # Real-time capture through a sound server: measured 0.80-0.95 here, down to
    # 0.6 while other jobs saturate both cores; unrelated speech scores 0.1-0.4.
    assert match.speech_blocks > 50 and match.fraction >= 0.5
    # The reply played in full, and the page showed both sides.
    assert stats["samplesReceived"] == len(reply) // 2
    assert stats["samplesPlayed"] >= len(reply) // 2 and stats["samplesFlushed"] == 0
    assert played["you"] == ["Hello there, can you hear me?"]
    assert played["agent"] == ["Yes, I hear you."]
    assert played["errors"] == [] and played["pageErrors"] == []
