"""Conformance rows C14–C21 of the Live API endpoint (docs/gemini-endpoint.md,
"Conformance"): the tools the service runs itself (Search, code execution,
URL context, Maps, ...) that an app declares in its setup's `tools`, carried
to a model whose family carries them and refused as the service refuses them
on one that does not. An app is google-genai with only its base URL changed;
a refusal is checked by sending the same setup from the same SDK to the
endpoint and to the Live emulator playing the service, and requiring the same
close.

What the Live API's tool guide (ai.google.dev/gemini-api/docs/live-tools)
says, for Gemini 3.1 Flash Live and 2.5 Flash Live (native audio): "Search:
Supported; Function calling: Supported; Google Maps: Not supported; Code
execution: Not supported; URL context: Not supported". Its older versions
marked code execution and URL context "Yes" for the half-cascade 2.5 models
(gemini-live-2.5-flash-preview). The tools it does not list for Live
(`googleSearchRetrieval`, `computerUse`, `fileSearch`, `mcpServers`) are
taken as carried by no Live model. What the service answers for a tool a
model does not carry is not quoted anywhere: its generic 1007 "Request
contains an invalid argument.", the strictest reading.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from emulated import MODEL
from gemini_serving import (
    CONFIG,
    app_client,
    said,
    serving,
    token,
    turn,
)
from google.genai import errors, types

from connections.emulator import Script
from connections.emulator.client import emulator_client
from live.liveapi import INVALID, get_field

pytestmark = pytest.mark.anyio

NATIVE_AUDIO = "gemini-2.5-flash-native-audio-preview-12-2025"
G31 = "gemini-3.1-flash-live-preview"
G38 = "gemini-3.8-live"


def with_tools(*tools: types.Tool) -> types.LiveConnectConfig:
    return CONFIG.model_copy(update={"tools": list(tools)})


async def answered(url: str, model: str, config: types.LiveConnectConfig) -> str:
    async with app_client(url, token()).aio.live.connect(model=model, config=config) as session:
        await session.send_realtime_input(text="hello")
        return said(await turn(session))


async def connect_close(client, model: str, config: types.LiveConnectConfig) -> tuple[int, str]:
    with pytest.raises(errors.APIError) as caught:
        with anyio.fail_after(10):
            async with client.aio.live.connect(model=model, config=config) as session:
                await session.send_realtime_input(text="hello")
                await turn(session)
    return caught.value.code, caught.value.details


def upstream_tools(emu) -> list[str]:
    """The service's own tools in the setup that reached the model (the
    server's functions are declared there too)."""
    [upstream] = emu.sessions
    return sorted(key for tool in get_field(upstream.setup, "tools") or [] for key in tool if key != "functionDeclarations")


# --- carried -----------------------------------------------------------------------


async def test_C14_C15_C16_code_execution_url_context_and_search_reach_a_half_cascade_model(trusted, cert_files):
    config = with_tools(
        types.Tool(google_search=types.GoogleSearch()),
        types.Tool(code_execution=types.ToolCodeExecution()),
        types.Tool(url_context=types.UrlContext()),
    )
    async with serving(Script(speed=20, replies=["Hello."]), **cert_files) as (emu, _, url):
        assert await answered(url, MODEL, config) == "Hello."
    assert upstream_tools(emu) == ["codeExecution", "googleSearch", "urlContext"]


@pytest.mark.parametrize("model", [NATIVE_AUDIO, G31, G38])
async def test_C15_search_reaches_every_live_model(trusted, cert_files, model):
    async with serving(Script(speed=20, replies=["Hello."]), model=model, **cert_files) as (emu, _, url):
        assert await answered(url, model, with_tools(types.Tool(google_search=types.GoogleSearch()))) == "Hello."
    assert upstream_tools(emu) == ["googleSearch"]


# --- refused as the service --------------------------------------------------------

NOT_ON_NEWER = {
    "codeExecution": types.Tool(code_execution=types.ToolCodeExecution()),
    "urlContext": types.Tool(url_context=types.UrlContext()),
}


@pytest.mark.parametrize("model", [NATIVE_AUDIO, G31, G38])
@pytest.mark.parametrize("tool", NOT_ON_NEWER.values(), ids=NOT_ON_NEWER.keys())
async def test_C14_C16_code_execution_and_url_context_on_native_audio_and_3_x_are_the_services_1007(
    trusted, cert_files, model, tool
):
    config = with_tools(types.Tool(google_search=types.GoogleSearch()), tool)
    async with serving(Script(speed=20, replies=["Hello."]), model=model, **cert_files) as (emu, _, url):
        endpoint = await connect_close(app_client(url, token()), model, config)
        reached = len(emu.sessions)
        service = await connect_close(emulator_client(emu, api_version="v1"), model, config)
        # The server goes on: the same app with Search alone is answered.
        assert await answered(url, model, with_tools(types.Tool(google_search=types.GoogleSearch()))) == "Hello."
    assert endpoint == service == (1007, INVALID)
    assert reached == 0  # refused before anything reached Google


NOT_ON_LIVE: dict[str, types.Tool] = {
    "googleSearchRetrieval": types.Tool(google_search_retrieval=types.GoogleSearchRetrieval()),
    "googleMaps": types.Tool(google_maps=types.GoogleMaps()),
    "computerUse": types.Tool(computer_use=types.ComputerUse(environment=types.Environment.ENVIRONMENT_BROWSER)),
    "fileSearch": types.Tool(file_search=types.FileSearch(file_search_store_names=["fileSearchStores/menu"])),
    "mcpServers": types.Tool(mcp_servers=[types.McpServer(name="weather")]),
}


@pytest.mark.parametrize("tool", NOT_ON_LIVE.values(), ids=NOT_ON_LIVE.keys())
async def test_C17_to_C21_a_tool_no_live_model_carries_is_the_services_1007(trusted, cert_files, tool):
    """Refused on the half-cascade model too, the one that carries the most."""
    config: Any = with_tools(tool)
    async with serving(Script(speed=20, replies=["Hello."]), **cert_files) as (emu, _, url):
        endpoint = await connect_close(app_client(url, token()), MODEL, config)
        reached = len(emu.sessions)
        service = await connect_close(emulator_client(emu, api_version="v1"), MODEL, config)
    assert endpoint == service == (1007, INVALID)
    assert reached == 0


async def test_G2_on_3_8_new_tools_its_models_do_not_carry_are_the_services_1007(trusted, cert_files):
    """`contextUpdate.tools` holds the same `Tool`s as setup: a kind the
    family does not carry is refused mid-session as it is at setup."""

    async def updated(client) -> tuple[int, str]:
        with pytest.raises(errors.APIError) as caught:
            with anyio.fail_after(10):
                async with client.aio.live.connect(model=G38, config=CONFIG) as session:
                    await session.send_context_update(tools=[types.Tool(code_execution=types.ToolCodeExecution())])
                    await session.send_realtime_input(text="hello")
                    while True:
                        await turn(session)
        return caught.value.code, caught.value.details

    async with serving(Script(speed=20, replies=["Hello."]), model=G38, **cert_files) as (emu, _, url):
        endpoint = await updated(app_client(url, token()))
        service = await updated(emulator_client(emu, api_version="v1"))
    assert endpoint == service == (1007, INVALID)
