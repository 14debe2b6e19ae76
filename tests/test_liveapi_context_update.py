"""Conformance rows of the Live API endpoint (docs/gemini-endpoint.md,
"Conformance") for `contextUpdate`: an app changes its system instruction and
its tools mid-session with google-genai's `session.send_context_update`, on a
model that takes it, and is refused as the service refuses it on one that
does not. An app is google-genai with only its base URL changed.

What google-genai's `AsyncSession.send_context_update` says of the message:
"Updates to the context of the current session. Only fields that are set will
be updated. Updates are guaranteed to be processed *in order* with the rest of
the inputs", and of its tools: "An updated list of tools the model may use to
generate subsequent responses. Pass an empty list `[]` to clear all tools."
Gemini 3.8 takes it (the Vertex AI 3.8 page, "Update system instructions and
tools during a session"); older models do not know the message.
"""

from __future__ import annotations

import anyio
import pytest
from emulated import MODEL
from gemini_serving import (
    CONFIG,
    app_client,
    serving,
    token,
    turn,
)
from google.genai import errors, types

from connections.emulator import Script
from connections.emulator.client import emulator_client

pytestmark = pytest.mark.anyio

G38 = "gemini-3.8-live"
PRICE = types.FunctionDeclaration(
    name="check_price",
    description="The price of an item.",
    parameters=types.Schema(type="OBJECT", properties={"item": types.Schema(type="STRING")}),
)


def calls_in(messages: list[types.LiveServerMessage]) -> list[str]:
    return [call.name for m in messages if m.tool_call for call in m.tool_call.function_calls or ()]


async def test_G1_G2_on_3_8_a_new_instruction_and_new_tools_reach_the_model_in_order(trusted, cert_files):
    script = Script(speed=20, replies=["Hello.", "Let me look."], tool_args={"check_price": {"item": "tea"}})
    async with serving(script, model=G38, **cert_files) as (emu, _, url):
        session_cm = app_client(url, token()).aio.live.connect(model=G38, config=CONFIG)
        async with session_cm as session:
            # Before the update the model has no such tool: naming it calls nothing.
            await session.send_realtime_input(text="please check_price of tea")
            before = await turn(session)
            await session.send_context_update(
                system_instruction="You are the shop's clerk.", tools=[types.Tool(function_declarations=[PRICE])]
            )
            await session.send_realtime_input(text="please check_price of tea")
            after = []
            with anyio.fail_after(10):
                async for message in session.receive():
                    after.append(message)
                    if message.tool_call:
                        break
    assert calls_in(before) == []
    assert calls_in(after) == ["check_price"]
    [upstream] = emu.sessions
    assert any("You are the shop's clerk." in said for said in upstream.instructions)


async def test_G1_G2_before_3_8_context_update_is_the_services_1007_unknown_name(trusted, cert_files):
    async def update_and_wait(client) -> tuple[int, str]:
        with pytest.raises(errors.APIError) as caught:
            with anyio.fail_after(10):
                async with client.aio.live.connect(model=MODEL, config=CONFIG) as session:
                    await session.send_context_update(system_instruction="You are the shop's clerk.")
                    await turn(session)
        return caught.value.code, caught.value.details

    async with serving(Script(speed=20), **cert_files) as (emu, _, url):
        endpoint = await update_and_wait(app_client(url, token()))
        upstream_frames = list(emu.sessions[0].frames)
        service = await update_and_wait(emulator_client(emu))
    assert endpoint == service == (1007, 'Invalid JSON payload received. Unknown name "contextUpdate": Cannot find field.')
    assert not any("context_update" in frame or "contextUpdate" in frame for frame in upstream_frames)
