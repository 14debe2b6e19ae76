"""Camera and screen from the demo page in Debian Chromium, through the server, to the emulator.

Chromium's fake camera (`--use-fake-device-for-media-stream`, a moving test
pattern) and its fake screen capture stand in for real ones; the page's own
buttons start them. The server talks to the Live emulator over the real SDK
path, and the emulator checks every frame it receives as a JPEG.
"""

from __future__ import annotations

import io
import time

import anyio
import pytest
from PIL import Image as PILImage

from audio_fixtures import silence, wav_bytes
from emulated import gemini_for
from connections.emulator import Emulator
from live.agent import Agent
from serving import running
from browsers import chromium_page, press_talk, http_root, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.browser]

MODEL = "gemini-live-2.5-flash-preview"
SCREEN_FLAGS = ["--auto-select-desktop-capture-source=Entire screen", "--enable-usermedia-screen-capturing"]


async def show_the_agent(page, url: str, button: str, seconds: float, emulator: Emulator):
    """Start talking, press the camera or screen button, and watch frames and audio arrive."""
    await page.goto(http_root(url))
    await press_talk(page)
    await page.click(button)
    await page.wait_for_function("window.live.state.video", timeout=5000)
    assert await page.get_attribute(button, "aria-pressed") == "true"
    assert await page.is_visible("#preview")
    record = emulator.sessions[0]

    async def first_frame():
        return record.video_frames >= 1

    await wait_until(first_frame, 5, "the first frame to reach the model")
    t0, audio0 = time.monotonic(), len(record.audio)
    await anyio.sleep(seconds)
    t1, audio1 = time.monotonic(), len(record.audio)
    await audio_all_arrived(page, record)
    return record, (audio1 - audio0) / (t1 - t0)


async def audio_all_arrived(page, record) -> None:
    """Every byte of microphone audio the page sent reached the model: video frames crowd nothing out."""
    sent = (await page.evaluate("window.live.stats()"))["bytesSent"]

    async def arrived():
        return len(record.audio) >= sent

    await wait_until(arrived, 5, f"the {sent} bytes of audio the page sent to reach the model")


def flowing(audio_rate: float) -> bool:
    """Audio kept coming while frames flowed (16 kHz PCM16 is 32000 B/s).

    The bound is loose on purpose: Chromium's fake microphone runs slower than
    real time on a loaded machine, and what is checked exactly is that nothing
    the page sent was lost (`audio_all_arrived`).
    """
    return 0.5 * 32000 < audio_rate < 1.5 * 32000


def check_frames(record, seconds: float) -> list[float]:
    """Every frame a complete JPEG at most 768 px on its long side; returns the gaps between them."""
    assert record.close is None  # the emulator closes 1007 on any frame that is not a complete JPEG
    for frame in record.video:
        assert frame.mime_type == "image/jpeg"
        assert max(frame.width, frame.height) <= 768
    last = PILImage.open(io.BytesIO(record.last_video))
    last.load()  # decodes every pixel: a valid JPEG, not just a valid header
    assert last.format == "JPEG"
    assert last.size == (record.video[-1].width, record.video[-1].height)
    return [b.t - a.t for a, b in zip(record.video, record.video[1:])]


@pytest.fixture
def microphone(tmp_path):
    path = tmp_path / "silence.wav"
    path.write_bytes(wav_bytes(silence(30.0)))
    return path


async def test_the_camera_reaches_the_model_as_a_jpeg_a_second_while_audio_flows_in_real_time(
    live_emulator: Emulator, microphone
):
    agent = Agent(name="eyes", model=MODEL)
    async with running(agent, gemini_for(live_emulator)) as (_, url), chromium_page(microphone) as page:
        record, audio_rate = await show_the_agent(page, url, "#camera", 4.0, live_emulator)
        gaps = check_frames(record, 4.0)
        print(f"camera: {record.video_frames} frames, gaps {[round(g, 2) for g in gaps]}, "
              f"sizes {[f.size for f in record.video]}, audio {audio_rate:.0f} B/s")
        # About one frame a second, as configured: never faster than the server allows
        # (a loaded machine may make them later, never sooner).
        assert 3 <= record.video_frames <= 7
        assert all(0.7 < gap < 3.0 for gap in gaps), gaps
        # Audio kept flowing meanwhile, and all of it arrived.
        assert flowing(audio_rate), audio_rate
        frame = record.video[-1]
        assert (frame.width, frame.height) == (768, 432)  # the fake camera is 16:9
        stats = await page.evaluate("window.live.stats()")
        assert stats["video"]["imagesSent"] == record.video_frames
        # The model can say what it sees; the page shows it.
        await page.fill("#text", "What do you see?")
        await page.click("#typed button")
        agent_says = page.locator("#log li[data-side=agent][data-final] .text")
        await agent_says.first.wait_for(timeout=5000)
        assert (await agent_says.first.text_content()).startswith("I see a 768x432 JPEG image of ")
        # Stopping the camera stops the frames.
        await page.click("#camera")
        await page.wait_for_function("!window.live.state.video", timeout=2000)
        assert await page.get_attribute("#camera", "aria-pressed") == "false"
        assert not await page.is_visible("#preview")
        count = record.video_frames
        await anyio.sleep(1.5)
        assert record.video_frames == count
        assert page.errors == []
        assert await page.locator("#log li.error").count() == 0  # no error event reached the page


async def test_frames_are_made_to_fit_the_size_the_server_announces(live_emulator: Emulator, microphone):
    agent = Agent(name="eyes", model=MODEL)
    limit = 3000  # the fake camera's 768 px frames are 5-6 KB at the first quality tried
    async with running(agent, gemini_for(live_emulator), max_image_bytes=limit) as (_, url), chromium_page(
        microphone
    ) as page:
        record, _ = await show_the_agent(page, url, "#camera", 2.0, live_emulator)
        check_frames(record, 2.0)
        stats = await page.evaluate("window.live.stats()")
        print(f"fitted: sizes {[f.size for f in record.video]}, last {stats['video']['lastImage']}")
        assert record.video_frames >= 2
        assert all(f.size <= limit for f in record.video)
        assert stats["video"]["lastImage"]["quality"] < 0.7 or stats["video"]["lastImage"]["width"] < 768
        assert await page.locator("#log li.error").count() == 0


async def test_a_shared_screen_reaches_the_model_as_jpeg_frames(live_emulator: Emulator, microphone):
    agent = Agent(name="eyes", model=MODEL)
    async with running(agent, gemini_for(live_emulator)) as (_, url), chromium_page(microphone, SCREEN_FLAGS) as page:
        record, audio_rate = await show_the_agent(page, url, "#screen", 3.0, live_emulator)
        gaps = check_frames(record, 3.0)
        print(f"screen: {record.video_frames} frames, gaps {[round(g, 2) for g in gaps]}, "
              f"sizes {[f.size for f in record.video]}, {record.video[-1].width}x{record.video[-1].height}")
        assert 2 <= record.video_frames <= 6
        assert all(0.7 < gap < 3.0 for gap in gaps), gaps
        assert flowing(audio_rate), audio_rate
        assert await page.evaluate("window.live.state.video") == "screen"
        assert page.errors == []
