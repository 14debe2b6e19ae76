"""Conformance rows E2 (`mediaChunks`) and E6 (realtime `text`) of the Live
API endpoint (docs/gemini-endpoint.md, "Conformance"), driven by the
unmodified google-genai client with only its base URL changed.

What the reference says of each (BidiGenerateContentRealtimeInput, the v1beta
proto):

- `media_chunks`: "Optional. Inlined bytes data for media input. Multiple
  `media_chunks` are not supported, all but the first will be ignored.
  DEPRECATED: Use one of `audio`, `video`, or `text` instead." google-genai
  still sends it from its deprecated `session.send(input=...)` and
  `start_stream`; gemini-3.1 closes with 1007 on it (aicc2025/sip-to-ai#5).
- `text`: "Optional. These form the realtime text input stream.", for every
  model; and of automatic activity detection: "If enabled (the default),
  detected voice and text input count as activity", so text, like speech,
  cuts the reply in progress (`START_OF_ACTIVITY_INTERRUPTS`, the default).

And row E11, a blob's `displayName`, of which google-genai's `Blob` says:
"Optional. The display name of the blob. Used to provide a label or filename
to distinguish blobs. [...] It is used in the Gemini calls only when
server-side tools (`code_execution`, `google_search`, and `url_context`) are
enabled."
"""

from __future__ import annotations

import io
import warnings

import anyio
import pytest
from audio_fixtures import silence, tone
from emulated import MODEL
from gemini_serving import (
    CONFIG,
    app_client,
    reply_audio,
    said,
    serving,
    token,
    turn,
)
from google.genai import errors, types
from PIL import Image as PILImage

from connections.emulator import Script, running_emulator
from connections.emulator.client import emulator_client
from live.liveapi import INVALID, get_field

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore:The `session.send` method is deprecated")]

G31 = "gemini-3.1-flash-live-preview"
NATIVE_AUDIO = "gemini-2.5-flash-native-audio-preview-12-2025"


def photo() -> bytes:
    out = io.BytesIO()
    PILImage.new("RGB", (64, 48), (30, 120, 200)).save(out, "PNG")
    return out.getvalue()


async def test_E2_an_app_on_the_deprecated_media_chunks_is_heard_as_the_service_hears_it(trusted, cert_files):
    """An older app streams its microphone with `session.send(input=blob)`
    (google-genai writes `realtimeInput.mediaChunks`): it is heard and
    answered; of a message with two chunks only the first is heard, as the
    reference says; an image chunk is a camera frame."""
    script = Script(speed=20, user_says=["what time is it"], replies=["Half past nine."])
    speech = tone(0.4) + silence(0.8)
    other = tone(0.1, freq=1000.0)  # a second chunk in the same message: ignored
    async with serving(script, **cert_files) as (emu, _, url):
        async with app_client(url, token()).aio.live.connect(model=MODEL, config=CONFIG) as session:
            await session.send(input={"data": photo(), "mime_type": "image/png"})
            for i in range(0, len(speech), 3200):
                piece = types.Blob(data=speech[i : i + 3200], mime_type="audio/pcm;rate=16000")
                await session.send(input=[piece, types.Blob(data=other, mime_type="audio/pcm;rate=16000")])
            messages = await turn(session)
        assert said(messages) == "Half past nine."
        [upstream] = emu.sessions
        assert bytes(upstream.audio) == speech  # every first chunk, and nothing of the second ones
        assert upstream.video_frames == 1
        assert (upstream.video[0].width, upstream.video[0].height) == (64, 48)


async def test_E2_the_emulated_service_hears_the_first_chunk_only():
    """The emulator plays the service the endpoint is compared with: it hears a
    message's first chunk and parses (never hears) the rest."""
    speech = tone(0.4) + silence(0.8)
    async with running_emulator(Script(speed=20, user_says=["what time is it"], replies=["Half past nine."])) as emu:
        async with emulator_client(emu).aio.live.connect(model=MODEL, config=CONFIG) as session:
            for i in range(0, len(speech), 3200):
                piece = types.Blob(data=speech[i : i + 3200], mime_type="audio/pcm;rate=16000")
                await session.send(input=[piece, types.Blob(data=tone(0.1), mime_type="audio/pcm;rate=16000")])
            messages = await turn(session)
            await session.send(input={"data": photo(), "mime_type": "image/png"})
            await session.send_realtime_input(text="and now?")
            await turn(session)
        [upstream] = emu.sessions
    assert messages[-1].server_content.turn_complete
    assert upstream.user_turns == ["what time is it", "and now?"]
    assert bytes(upstream.audio) == speech
    assert upstream.video_frames == 1


async def test_E2_on_3_1_media_chunks_are_the_services_1007(trusted, cert_files):
    """gemini-3.1 refuses the deprecated field: "newer Live API models reject
    with WebSocket close 1007" (aicc2025/sip-to-ai#5). The endpoint closes as
    the service does, for the same message from the same client."""

    async def close_of(client) -> tuple[int, str]:
        with pytest.raises(errors.APIError) as caught:
            with anyio.fail_after(10):
                async with client.aio.live.connect(model=G31, config=CONFIG) as session:
                    await session.send(input={"data": silence(0.1), "mime_type": "audio/pcm;rate=16000"})
                    await turn(session)
        return caught.value.code, caught.value.details

    async with serving(Script(speed=20), model=G31, **cert_files) as (emu, _, url):
        endpoint = await close_of(app_client(url, token()))
        service = await close_of(emulator_client(emu))
    assert endpoint == service == (1007, INVALID)


def realtime_texts(frames: list) -> list[str]:
    """The realtime `text` of the frames the model received, in order."""
    out = []
    for frame in frames:
        body = get_field(frame, "realtimeInput") if isinstance(frame, dict) else None
        text = get_field(body, "text")
        if isinstance(text, str):
            out.append(text)
    return out


@pytest.mark.parametrize("model", [MODEL, NATIVE_AUDIO])
async def test_E6_realtime_text_on_2_5_is_answered_and_cuts_the_reply_in_progress(trusted, cert_files, model):
    script = Script(speed=2, replies=["A long answer that goes on and on for quite a while.", "Half past nine."])
    async with serving(script, model=model, **cert_files) as (emu, _, url):
        async with app_client(url, token()).aio.live.connect(model=model, config=CONFIG) as session:
            await session.send_realtime_input(text="tell me a story")
            seen = []
            with anyio.fail_after(10):
                async for message in session.receive():
                    seen.append(message)
                    if reply_audio([message]):
                        break
                await session.send_realtime_input(text="what time is it?")
                async for message in session.receive():
                    seen.append(message)
                    if message.server_content and message.server_content.interrupted:
                        break
            assert seen[-1].server_content.interrupted  # text counts as activity: the story is cut
            answer = await turn(session)
            while not said(answer) and not any(m.server_content and m.server_content.interrupted for m in answer):
                answer = await turn(session)  # the cut story's own turnComplete, then the answer's turn
        assert said(answer) == "Half past nine."
        [upstream] = emu.sessions
        # As realtime text, as the app sent it: not made into client content.
        assert realtime_texts(upstream.frames) == ["tell me a story", "what time is it?"]


def video_names(frames: list) -> list[str | None]:
    """The `displayName` of each realtime video frame the model received, in order."""
    out = []
    for frame in frames:
        body = get_field(frame, "realtimeInput") if isinstance(frame, dict) else None
        video = get_field(body, "video") if isinstance(body, dict) else None
        if isinstance(video, dict):
            out.append(get_field(video, "displayName"))
    return out


async def test_E11_a_frames_display_name_reaches_the_model(trusted, cert_files):
    """An app with search on labels what its camera and its screen show: each
    frame reaches the model with its label, sent as `video` or as a deprecated
    image chunk, and a frame without one has none. A labelled microphone
    chunk is heard as any other. (One frame a turn, and the server's own frame
    rate raised: a newer frame replaces one still waiting, and that is not
    what is asked here.)"""
    config = CONFIG.model_copy(update={"tools": [types.Tool(google_search=types.GoogleSearch())]})
    script = Script(speed=20, replies=["A blue square."] * 3 + ["Half past nine."], user_says=["what time is it"])
    frames = [
        {"video": types.Blob(data=photo(), mime_type="image/png", display_name="front camera")},
        {"input": {"data": photo(), "mime_type": "image/png", "display_name": "shared screen"}},
        {"video": types.Blob(data=photo(), mime_type="image/png")},
    ]
    speech = tone(0.4) + silence(0.8)
    async with serving(script, max_image_rate=10.0, **cert_files) as (emu, _, url):
        async with app_client(url, token()).aio.live.connect(model=MODEL, config=config) as session:
            for frame in frames:
                if "input" in frame:
                    await session.send(**frame)
                else:
                    await session.send_realtime_input(**frame)
                await session.send_realtime_input(text="what do you see?")
                assert said(await turn(session)) == "A blue square."
            for i in range(0, len(speech), 3200):
                mic = types.Blob(data=speech[i : i + 3200], mime_type="audio/pcm;rate=16000", display_name="microphone")
                await session.send_realtime_input(audio=mic)
            assert said(await turn(session)) == "Half past nine."
        [upstream] = emu.sessions
        assert video_names(upstream.frames) == ["front camera", "shared screen", None]
        assert bytes(upstream.audio) == speech
