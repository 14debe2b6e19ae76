"""Helpers for tests that drive the web client in Debian Chromium (through Playwright)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import anyio
import pytest

from audio_fixtures import silence, speak, wav_bytes
from connections import double
from connections.gemini import Gemini
from live_audio import RecordingLlm

CHROMIUM = "/usr/bin/chromium"
SAID = "Hello there, can you hear me?"
LEAD_S = 0.6  # silence before the speech: the page starts capturing a little late


def speech_wav(tmp_path: Path) -> tuple[Path, bytes]:
    pcm = silence(LEAD_S) + speak(SAID) + silence(0.8)
    path = tmp_path / "speech.wav"
    path.write_bytes(wav_bytes(pcm))
    return path, pcm


@contextlib.asynccontextmanager
async def chromium_page(microphone: Path, args: Sequence[str] = (), *, init_script: str | None = None,
                        color_scheme: str | None = None,
                        autoplay_policy: str = "no-user-gesture-required") -> AsyncIterator[object]:
    """A page in headless Chromium whose microphone plays `microphone` (a WAV)
    once, from the moment it is opened. `init_script` runs before the page's own;
    `autoplay_policy` is Chromium's (document-user-activation-required is a
    desktop browser's default)."""
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian chromium is not installed (apt-get install chromium)")
    playwright_api = pytest.importorskip("playwright.async_api")
    async with playwright_api.async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                f"--use-file-for-fake-audio-capture={microphone.resolve()}%noloop",
                f"--autoplay-policy={autoplay_policy}",
                *args,
            ],
        )
        try:
            page = await browser.new_page(color_scheme=color_scheme)
            if init_script:
                await page.add_init_script(init_script)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.errors = errors  # type: ignore[attr-defined]
            yield page
        finally:
            await browser.close()


async def stats(page) -> dict:
    return await page.evaluate("window.live.stats()")


async def wait_until(predicate, timeout: float, what: str, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await anyio.sleep(step)


def http_root(url: str) -> str:
    return url.replace("ws://", "http://").removesuffix("/live") + "/"


def scripted() -> tuple[RecordingLlm, double.ScriptedSession]:
    session = double.ScriptedSession()
    return RecordingLlm(Gemini("gemini-2.5-flash", transport=double.DoubleTransport(session))), session


async def start_talking(page, url: str) -> None:
    await page.goto(http_root(url))
    await press_talk(page)


async def press_talk(page) -> None:
    """Press the page's talk button and wait until the microphone is on and the session open."""
    await page.click("#talk")
    await page.wait_for_function(
        "window.live && window.live.state.microphone && window.live.state.connection === 'open'",
        timeout=15000,  # a model that loads on connect (local/voice), on a busy machine
    )
