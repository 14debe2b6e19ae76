"""Images from a client through the server to a Live model: the emulator over the real SDK path."""

from __future__ import annotations

import base64
import hashlib
import io

import anyio
import pytest
from PIL import Image as PILImage

from audio_fixtures import silence, speak
from clients.client import LiveClient
from emulated import gemini_for
from connections.emulator import Emulator, Script
from connections.local_echo import EchoConfig, LocalEcho
from live import protocol as p
from live.agent import Agent
from serving import collect, late_tail, replies, running

pytestmark = pytest.mark.anyio

MODEL = "gemini-live-2.5-flash-preview"
FRAME = 640  # 20 ms of PCM16 at 16 kHz


def jpeg(width: int, height: int, color: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    PILImage.new("RGB", (width, height), color).save(out, "JPEG", quality=80)
    return out.getvalue()


def noise_jpeg(width: int, height: int, seed: int = 1) -> bytes:
    """A JPEG that does not compress: random pixels (about 0.7 byte per pixel)."""
    import random

    out = io.BytesIO()
    PILImage.frombytes("RGB", (width, height), random.Random(seed).randbytes(width * height * 3)).save(
        out, "JPEG", quality=80
    )
    return out.getvalue()


def audio_before_each_video_frame(frames: list) -> list[int]:
    """For each video frame the emulator received, the audio bytes it had received before it."""
    audio = 0
    out = []
    for frame in frames:
        body = frame.get("realtimeInput") or frame.get("realtime_input") if isinstance(frame, dict) else None
        if not body:
            continue
        if "audio" in body:
            audio += len(base64.urlsafe_b64decode(body["audio"]["data"] + "=="))
        if "video" in body:
            out.append(audio)
    return out


async def test_frames_reach_the_model_intact_in_order_with_real_time_audio(live_emulator: Emulator):
    agent = Agent(name="eyes", model=MODEL)
    pictures = [jpeg(640, 360, (200, 0, 0)), jpeg(360, 640, (0, 200, 0)), jpeg(768, 432, (0, 0, 200))]
    audio = silence(3.2)
    sent_before: list[int] = []
    async with running(agent, gemini_for(live_emulator)) as (_, url), LiveClient.connect(url) as client:
        # Audio in real time, an image a second in between, as a camera would.
        for i in range(0, len(audio), FRAME):
            if i % 32000 == 0 and len(sent_before) < len(pictures):
                sent_before.append(i)
                await client.send_image(pictures[len(sent_before) - 1], "image/jpeg")
            await client.send_audio(audio[i : i + FRAME])
            await anyio.sleep(0.02)
        await client.send_text("What do you see on my screen?")
        events = await collect(client, lambda e: isinstance(e, p.TurnComplete), timeout=10)
        events += await late_tail(client)
    errors = [e for e in events if isinstance(e, p.ErrorEvent)]
    assert errors == []
    record = live_emulator.sessions[0]
    assert record.video_frames == 3
    assert [(f.mime_type, f.width, f.height, f.size) for f in record.video] == [
        ("image/jpeg", 640, 360, len(pictures[0])),
        ("image/jpeg", 360, 640, len(pictures[1])),
        ("image/jpeg", 768, 432, len(pictures[2])),
    ]
    assert [f.sha256 for f in record.video] == [hashlib.sha256(x).hexdigest() for x in pictures]
    assert record.last_video == pictures[-1]
    # In order: each image went after exactly the audio sent before it.
    assert audio_before_each_video_frame(record.frames) == sent_before
    assert bytes(record.audio) == audio
    # About one a second, as sent.
    gaps = [b.t - a.t for a, b in zip(record.video, record.video[1:])]
    assert all(0.8 < gap < 1.5 for gap in gaps), gaps
    # And the model can say what it saw.
    assert replies(events) == [f"I see a 768x432 JPEG image of {len(pictures[2])} bytes, frame 3."]
    assert "3 video frame(s)" in record.describe_video()


async def test_bad_frames_get_their_errors_and_the_session_goes_on(live_emulator: Emulator):
    agent = Agent(name="eyes", model=MODEL)
    good = jpeg(320, 240, (10, 10, 10))
    gif = io.BytesIO()
    PILImage.new("RGB", (8, 8)).save(gif, "GIF")
    other = jpeg(64, 64, (1, 2, 3))
    async with running(
        agent, gemini_for(live_emulator), max_image_bytes=len(good) + 10, max_image_rate=1.0
    ) as (_, url), LiveClient.connect(url) as client:
        bad = [
            ("image/gif", gif.getvalue(), "unsupported_image_type"),
            ("image/jpeg", gif.getvalue(), "invalid_image"),
            ("image/jpeg", good[:-100], "invalid_image"),  # cut short
            ("image/jpeg", noise_jpeg(100, 100), "image_too_large"),
        ]
        codes = []
        for mime, data, _ in bad:
            await client.send_image(data, mime)
            [error] = await collect(client, lambda e: isinstance(e, p.ErrorEvent), timeout=5)
            assert not error.fatal
            codes.append(error.code)
        assert codes == [code for _, _, code in bad]
        # Too frequent: the first goes, the second within the second is refused.
        await client.send_image(good, "image/jpeg")
        await client.send_image(good, "image/jpeg")
        [error] = await collect(client, lambda e: isinstance(e, p.ErrorEvent), timeout=5)
        assert error.code == "image_rate_limited" and not error.fatal
        assert "1 a second" in error.message
        # The session goes on: speech and a typed turn are answered, the next image goes.
        await client.send_audio(silence(0.2))
        await anyio.sleep(1.0)
        await client.send_image(other, "image/jpeg")
        await client.send_text("hello")
        events = await collect(client, lambda e: isinstance(e, p.TurnComplete), timeout=10)
        events += await late_tail(client)
        assert not [e for e in events if isinstance(e, p.ErrorEvent)]
        assert replies(events) == ["You said: hello."]
    record = live_emulator.sessions[0]
    assert [f.sha256 for f in record.video] == [hashlib.sha256(good).hexdigest(), hashlib.sha256(other).hexdigest()]
    assert record.close is None  # the model never saw anything it would refuse


async def test_an_image_message_over_the_frame_limit_is_refused_without_closing_the_socket(live_emulator: Emulator):
    agent = Agent(name="eyes", model=MODEL)
    async with running(agent, gemini_for(live_emulator)) as (server, url), LiveClient.connect(url) as client:
        # The server tells the client how large an image may be: what fits in a frame.
        limit = client.session.max_image_bytes
        assert limit == server.config.image_limit
        assert 40_000 < limit < server.config.max_frame_bytes
        assert client.session.max_image_rate == 2.0
        too_big = noise_jpeg(300, 300)  # about 60 KB: 80 KB as base64, over the 64 KiB frame limit
        assert limit < len(too_big) and len(too_big) * 4 / 3 < 2 * server.config.max_frame_bytes
        await client.send_image(too_big, "image/jpeg")
        [error] = await collect(client, lambda e: isinstance(e, p.ErrorEvent), timeout=5)
        assert error.code == "image_too_large" and not error.fatal
        fits = noise_jpeg(240, 240)
        assert len(fits) <= limit
        await client.send_image(fits, "image/jpeg")
        await client.send_text("hello")
        events = await collect(client, lambda e: isinstance(e, p.TurnComplete), timeout=10)
        assert not [e for e in events if isinstance(e, p.ErrorEvent)]
    assert [f.size for f in live_emulator.sessions[0].video] == [len(fits)]


async def test_an_agent_without_context_compression_warns_of_the_two_minute_cap(live_emulator: Emulator):
    agent = Agent(name="eyes", model=MODEL, context_compression=False)
    async with running(agent, gemini_for(live_emulator)) as (_, url), LiveClient.connect(url) as client:
        await client.send_image(jpeg(32, 32, (0, 0, 0)), "image/jpeg")
        [warning] = await collect(client, lambda e: isinstance(e, p.ErrorEvent), timeout=5)
        assert warning.code == "video_time_limit" and not warning.fatal
        await client.send_text("hello")
        await collect(client, lambda e: isinstance(e, p.TurnComplete), timeout=10)
    assert live_emulator.sessions[0].video_frames == 1


async def test_local_echo_accepts_images_and_ignores_them():
    llm = LocalEcho(config=EchoConfig(speed=4.0))
    speech = speak("Hello there.", rate=16_000)
    async with running(Agent(name="echo", model="local/echo"), llm) as (_, url), LiveClient.connect(url) as client:
        await client.send_image(jpeg(64, 64, (9, 9, 9)), "image/jpeg")
        for start in range(0, len(speech + silence(1.0)), FRAME):
            await client.send_audio((speech + silence(1.0))[start : start + FRAME])
            await anyio.sleep(0.005)
        events = await collect(client, lambda e: isinstance(e, p.TurnComplete), timeout=15)
    assert not [e for e in events if isinstance(e, p.ErrorEvent)]
    assert any(hasattr(e, "data") and isinstance(e.data, bytes) for e in events)  # it still echoes


async def test_local_voice_accepts_images_and_ignores_them():
    from connections.local_voice import LocalVoice, VoiceConfig

    llm = LocalVoice(config=VoiceConfig(speed=4.0))
    speech = speak("I like green apples.", rate=16_000, voice="en-us", wpm=140) + silence(1.0)
    async with running(Agent(name="voice", model="local/voice"), llm) as (_, url), LiveClient.connect(url) as client:
        await client.send_image(jpeg(64, 64, (9, 9, 9)), "image/jpeg")
        for start in range(0, len(speech), FRAME):
            await client.send_audio(speech[start : start + FRAME])
            await anyio.sleep(0.005)
        events = await collect(client, lambda e: isinstance(e, p.TurnComplete), timeout=30)
    assert not [e for e in events if isinstance(e, p.ErrorEvent)]
    assert [e for e in events if isinstance(e, p.TranscriptInput) and e.final]  # it still listens


async def test_a_record_keeps_the_size_of_each_image_not_the_picture(live_emulator: Emulator, tmp_path):
    from live.observe.record import Recorder, load, timeline

    picture = jpeg(320, 180, (50, 60, 70))
    encoded = base64.b64encode(picture).decode()
    agent = Agent(name="eyes", model=MODEL)
    async with running(agent, gemini_for(live_emulator), recorder=Recorder(tmp_path)) as (_, url):
        async with LiveClient.connect(url) as client:
            await client.send_image(picture, "image/jpeg")
            await client.send_text("hello")
            await collect(client, lambda e: isinstance(e, p.TurnComplete), timeout=10)
    [folder] = list(tmp_path.iterdir())
    record = load(folder)
    [shown] = [e["event"] for e in record.of("client") if e["event"]["type"] == "image"]
    assert shown == {"type": "image", "mime_type": "image/jpeg", "data": f"<{len(encoded)} base64 characters>"}
    [sent] = [e for e in record.of("model.send") if e.get("mime_type") == "image/jpeg"]
    assert sent["blob"] == len(picture)
    assert encoded[:100] not in (folder / "events.jsonl").read_text()
    assert any("showed an image: image/jpeg" in line for line in timeline(record))
