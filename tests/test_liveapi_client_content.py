"""Conformance rows D (clientContent) and the history rows C35 and L of the
Live API endpoint (docs/gemini-endpoint.md, "Conformance"), driven by the
unmodified google-genai client with only its base URL changed, and by
Pipecat's GeminiLiveLLMService seeding its context on Gemini 3."""

from __future__ import annotations

import io
import json
import os

import anyio
import pytest
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
from test_gemini_pipecat import PYTHON, TESTS

from connections.emulator import ReplyContext, Script
from connections.emulator.wire import text_of
from live.liveapi import INVALID

pytestmark = pytest.mark.anyio

G31 = "gemini-3.1-flash-live-preview"
G38 = "gemini-3.8-live"


def remembers(ctx: ReplyContext) -> str:
    """The model's answer from what the conversation holds (its history, as the emulator keeps it)."""
    said_before = " ".join(text_of(turn) for turn in ctx.history)
    if "capital of Germany" in ctx.user_text:
        return "Berlin, as Paris is France's." if "Paris" in said_before else "Berlin."
    if "my name" in ctx.user_text.lower():
        return "Your name is Ada." if "Ada" in said_before else "I do not know your name."
    if "picture" in ctx.user_text:
        pictures = [p for turn in ctx.history for p in turn.get("parts", []) if "inlineData" in p or "inline_data" in p]
        return f"I see {len(pictures)} picture."
    return f"You said: {ctx.user_text}."


def picture() -> bytes:
    out = io.BytesIO()
    PILImage.new("RGB", (32, 24), (10, 200, 10)).save(out, "JPEG")
    return out.getvalue()


async def test_D2_D4_the_guides_incremental_updates_with_the_models_turn(trusted, cert_files):
    """The guide's "Incremental content updates": a user and a model turn with
    turn_complete=False (appended, no reply), then the question."""
    script = Script(speed=20, replies=remembers)
    async with serving(script, **cert_files) as (emu, _, url):
        async with app_client(url, token()).aio.live.connect(model=MODEL, config=CONFIG) as session:
            await session.send_client_content(
                turns=[
                    types.Content(role="user", parts=[types.Part(text="What is the capital of France?")]),
                    types.Content(role="model", parts=[types.Part(text="Paris")]),
                ],
                turn_complete=False,
            )
            await session.send_client_content(
                turns=types.Content(role="user", parts=[types.Part(text="What is the capital of Germany?")]),
                turn_complete=True,
            )
            messages = await turn(session)
        assert said(messages) == "Berlin, as Paris is France's."
        [upstream] = emu.sessions
        assert [t for t in upstream.user_turns] == ["What is the capital of Germany?"]  # one reply, to the question
        roles = [frame["client_content"]["turns"][i]["role"] for frame in upstream.frames if "client_content" in frame
                 for i in range(len(frame["client_content"].get("turns", [])))]
        assert roles == ["user", "model", "user"]


async def test_D4_content_that_completes_no_turn_is_known_to_the_model_without_a_reply(trusted, cert_files):
    script = Script(speed=20, replies=remembers)
    async with serving(script, **cert_files) as (emu, _, url):
        async with app_client(url, token()).aio.live.connect(model=MODEL, config=CONFIG) as session:
            await session.send_client_content(
                turns=types.Content(role="user", parts=[types.Part(text="My name is Ada.")]), turn_complete=False
            )
            await session.send_realtime_input(text="What is my name?")
            messages = await turn(session)
        assert said(messages) == "Your name is Ada."
        assert emu.sessions[0].model_turns == ["Your name is Ada."]  # nothing answered the name itself


async def test_D5_turn_complete_alone_answers_what_was_appended(trusted, cert_files):
    """JS `sendClientContent({turnComplete: true})`; PROTO: "generation should
    start with the currently accumulated prompt"."""
    script = Script(speed=20, replies=remembers)
    async with serving(script, **cert_files) as (_, _, url):
        async with app_client(url, token()).aio.live.connect(model=MODEL, config=CONFIG) as session:
            await session.send_client_content(
                turns=types.Content(role="user", parts=[types.Part(text="Tell me my name, Ada.")]), turn_complete=False
            )
            await session.send_client_content(turn_complete=True)
            assert said(await turn(session)) == "Your name is Ada."


async def test_D3_an_image_part_in_client_content_reaches_the_model(trusted, cert_files):
    script = Script(speed=20, replies=remembers)
    async with serving(script, **cert_files) as (emu, _, url):
        async with app_client(url, token()).aio.live.connect(model=MODEL, config=CONFIG) as session:
            await session.send_client_content(
                turns=types.Content(
                    role="user",
                    parts=[types.Part(inline_data=types.Blob(data=picture(), mime_type="image/jpeg")),
                           types.Part(text="What is in the picture?")],
                ),
                turn_complete=True,
            )
            assert said(await turn(session)) == "I see 1 picture."


async def test_D7_a_typed_turn_of_70_000_characters_is_carried(trusted, cert_files):
    script = Script(speed=20, replies=lambda ctx: f"{len(ctx.user_text)} characters.")
    long = "word " * 14_000
    async with serving(script, **cert_files) as (_, _, url):
        async with app_client(url, token()).aio.live.connect(model=MODEL, config=CONFIG) as session:
            await session.send_client_content(turns=types.Content(role="user", parts=[types.Part(text=long)]))
            assert said(await turn(session)) == f"{len(long)} characters."


async def test_D8_client_content_interrupts_the_reply_in_progress(trusted, cert_files):
    script = Script(speed=2, replies=["A long answer that goes on and on for quite a while.", "Short."])
    async with serving(script, **cert_files) as (_, _, url):
        async with app_client(url, token()).aio.live.connect(model=MODEL, config=CONFIG) as session:
            await session.send_realtime_input(text="talk")
            seen = []
            with anyio.fail_after(10):
                async for message in session.receive():
                    seen.append(message)
                    if reply_audio([message]):
                        break
                await session.send_client_content(
                    turns=types.Content(role="user", parts=[types.Part(text="stop")]), turn_complete=True
                )
                async for message in session.receive():
                    seen.append(message)
                    if message.server_content and message.server_content.interrupted:
                        break
        assert seen[-1].server_content.interrupted


async def test_D6_L_on_3_1_client_content_after_the_initial_history_is_the_services_1007(trusted, cert_files):
    """3.1: "send_client_content is only supported for seeding initial context
    history ... After the first model turn, use send_realtime_input with the
    text field instead" (the capabilities page, quoted in sonichi/sutando#181)."""
    async with serving(Script(speed=20), model=G31, **cert_files) as (emu, _, url):
        with pytest.raises(errors.APIError) as caught:
            with anyio.fail_after(10):
                async with app_client(url, token()).aio.live.connect(model=G31, config=CONFIG) as session:
                    await session.send_client_content(turns=types.Content(role="user", parts=[types.Part(text="hi")]))
                    await turn(session)
        assert (caught.value.code, caught.value.details) == (1007, INVALID)
        assert emu.sessions[0].frames[1:] == []  # refused here, as the service would: Google never saw it


async def test_D6_L_on_3_8_client_content_is_taken_all_session(trusted, cert_files):
    async with serving(Script(speed=20, replies=remembers), model=G38, **cert_files) as (emu, _, url):
        async with app_client(url, token()).aio.live.connect(model=G38, config=CONFIG) as session:
            for text in ("My name is Ada.", "What is my name?"):
                await session.send_client_content(turns=types.Content(role="user", parts=[types.Part(text=text)]))
                await turn(session)
            await session.send_client_content(turns=types.Content(role="user", parts=[types.Part(text="And my name?")]))
            assert said(await turn(session)) == "Your name is Ada."
        assert any("client_content" in frame for frame in emu.sessions[0].frames)


async def test_C35_L_on_3_1_the_initial_history_seeds_without_a_reply_and_may_end_with_the_model(trusted, cert_files):
    """HistoryConfig: "the server will wait and at first process client_content
    messages until turn_complete is true. This initial history will not
    trigger a model call and may end with model content." Realtime input
    meanwhile is not processed."""
    config = CONFIG.model_copy(update={"history_config": types.HistoryConfig(initial_history_in_client_content=True)})
    async with serving(Script(speed=20, replies=remembers), model=G31, **cert_files) as (emu, _, url):
        async with app_client(url, token()).aio.live.connect(model=G31, config=config) as session:
            await session.send_realtime_input(text="ignored while the history is seeded")
            await session.send_client_content(
                turns=[types.Content(role="user", parts=[types.Part(text="My name is Ada.")]),
                       types.Content(role="model", parts=[types.Part(text="Hello Ada.")])],
                turn_complete=True,
            )
            await session.send_realtime_input(text="What is my name?")
            messages = await turn(session)
        assert said(messages) == "Your name is Ada."
        [upstream] = emu.sessions
        assert upstream.model_turns == ["Your name is Ada."]  # the seed itself had no reply
        assert upstream.user_turns == ["What is my name?"]


async def pipecat_seeded(url: str, ca_file, key: str, model: str, messages: list[dict]) -> dict:
    if not PYTHON.exists():
        pytest.skip("Pipecat is not installed (./test makes tests/.pipecat-venv)")
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost"}
    with anyio.fail_after(60):
        done = await anyio.run_process(
            [str(PYTHON), str(TESTS / "peers" / "pipecat_gemini_live.py"), f"https://127.0.0.1:{port}", key, model,
             json.dumps(messages), str(ca_file)],
            env=env,
        )
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


@pytest.mark.parametrize("model", [G31, MODEL])
async def test_C35_D2_pipecat_seeds_its_context_with_both_roles_and_is_answered(trusted, cert_files, model):
    """Pipecat's GeminiLiveLLMService, unmodified: it sets
    initial_history_in_client_content on every model and seeds its context
    (user and assistant turns); on Gemini 3 it then nudges with realtime text,
    on 2.5 the seed's turn_complete asks for the answer."""
    messages = [
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "Hello Ada."},
        {"role": "user", "content": "What is my name?"},
    ]
    async with serving(Script(speed=20, replies=remembers), model=model, **cert_files) as (emu, _, url):
        result = await pipecat_seeded(url, trusted, token(), model, messages)
    assert result["errors"] == [], result
    assert result["said"] == "Your name is Ada."
    roles = [t.get("role") for frame in emu.sessions[0].frames if "client_content" in frame
             for t in frame["client_content"].get("turns", [])]
    assert roles == ["user", "model", "user"]
