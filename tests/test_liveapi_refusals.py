"""Conformance rows of the Live API endpoint (docs/gemini-endpoint.md,
"Conformance") that the service refuses: what an app sends that the service
closes with 1007, closed by the endpoint with the same code and words. Each
message goes to the endpoint and, as it is, to the Live emulator playing the
service (which speaks the service's words where reports quote them, and the
strictest reading where they do not); the two closes must be the same.

The rules, from the Live API's reference and guides: activity signals "can
only be sent if automatic (i.e. server-side) activity detection is disabled"
(BidiGenerateContentRealtimeInput, activityStart / activityEnd); a message is
protobuf JSON, and a field the message does not have is refused as protobuf's
JSON parser refuses it, `Invalid JSON payload received. Unknown name "X" at
'path': Cannot find field.` (field reports quote it, for `setup` among others).
"""

from __future__ import annotations

import contextlib
import json
import ssl
from typing import Any

import anyio
import pytest
import trustme
from emulated import MODEL
from gemini_serving import (
    CONFIG,
    app_client,
    serving,
    token,
    turn,
)
from google.genai import errors, types
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from connections.emulator import Emulator, Script
from connections.emulator.client import emulator_client
from live.liveapi import EXPLICIT_ACTIVITY, INVALID

pytestmark = pytest.mark.anyio

PATH = "/ws/google.ai.generativelanguage.{version}.GenerativeService.BidiGenerateContent"
SETUP = {"model": f"models/{MODEL}"}


async def closed_by(target: str, context: ssl.SSLContext, key: str, frames: list[dict[str, Any]]) -> tuple[int, str]:
    """Send `frames` over a raw socket (each once the one before was read):
    the close that follows."""
    async with ws_connect(target, ssl=context, additional_headers={"x-goog-api-key": key}) as ws:
        with anyio.fail_after(10):
            for frame in frames:
                await ws.send(json.dumps(frame))
            with contextlib.suppress(ConnectionClosed):
                async for _ in ws:
                    pass
    return ws.close_code, ws.close_reason


async def both(emu: Emulator, url: str, ca: trustme.CA, frames: list[dict[str, Any]], version: str = "v1beta"):
    """The close of the endpoint and of the service (the emulator) for the same
    frames, and how many connections the endpoint opened to the service for its own."""
    ours = ssl.create_default_context()
    ca.configure_trust(ours)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    endpoint = await closed_by(f"wss://127.0.0.1:{port}{PATH.format(version=version)}", ours, token(), frames)
    upstream = len(emu.sessions)
    host = emu.base_url.removeprefix("https://")
    service = await closed_by(f"wss://{host}{PATH.format(version=version)}", emu.ssl_context(), emu.api_key, frames)
    return endpoint, service, upstream


async def sdk_close(client, send) -> tuple[int, str]:
    """google-genai's error for a session in which `send(session)` was sent."""
    with pytest.raises(errors.APIError) as caught:
        with anyio.fail_after(10):
            async with client.aio.live.connect(model=MODEL, config=CONFIG) as session:
                await send(session)
                await turn(session)
    return caught.value.code, caught.value.details


@pytest.mark.parametrize("signal", ["activity_start", "activity_end"])
async def test_E8_activity_signals_with_the_models_own_detection_on_are_the_services_1007(trusted, cert_files, signal):
    async def send(session):
        kind = types.ActivityStart() if signal == "activity_start" else types.ActivityEnd()
        await session.send_realtime_input(**{signal: kind})

    async with serving(Script(speed=20), **cert_files) as (emu, _, url):
        endpoint = await sdk_close(app_client(url, token()), send)
        service = await sdk_close(emulator_client(emu), send)
    assert endpoint == service == (1007, EXPLICIT_ACTIVITY)


UNKNOWN_SETUPS = {
    "a top-level name": {**SETUP, "responseModalities": ["AUDIO"]},  # belongs in generationConfig
    "a nested name": {**SETUP, "generationConfig": {"voiceName": "Puck"}},  # belongs in speechConfig
    "in a list": {**SETUP, "tools": [{"functionDeclarations": [{"name": "f", "returns": {}}]}]},
    "Vertex AI's only": {**SETUP, "explicitVadSignal": True},
    "Vertex AI's only, nested": {**SETUP, "sessionResumption": {"transparent": True}},
    "v1alpha's only, on v1beta": {**SETUP, "proactivity": {"proactiveAudio": True}},
}


@pytest.mark.parametrize("setup", UNKNOWN_SETUPS.values(), ids=UNKNOWN_SETUPS.keys())
async def test_C36_a_setup_field_the_service_does_not_know_is_its_1007_unknown_name(ca, cert_files, setup):
    async with serving(Script(speed=20), **cert_files) as (emu, _, url):
        endpoint, service, upstream = await both(emu, url, ca, [{"setup": setup}])
    assert upstream == 0  # refused before anything reached Google
    assert endpoint == service
    code, reason = endpoint
    assert code == 1007 and reason.startswith("Invalid JSON payload received. Unknown name ")
    assert reason.endswith(": Cannot find field.")


async def test_C36_what_one_version_knows_is_taken_there(ca, cert_files):
    """`proactivity` is v1alpha's ("set the api version to v1alpha"): there the setup is taken."""
    setup = {**SETUP, "proactivity": {"proactiveAudio": True}}
    async with serving(Script(speed=20), **cert_files) as (_, _, url):
        context = ssl.create_default_context()
        ca.configure_trust(context)
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        async with ws_connect(f"wss://127.0.0.1:{port}{PATH.format(version='v1alpha')}", ssl=context,
                              additional_headers={"x-goog-api-key": token()}) as ws:
            await ws.send(json.dumps({"setup": setup}))
            with anyio.fail_after(10):
                assert "setupComplete" in json.loads(await ws.recv())


UNKNOWN_REALTIME = {
    "a name of its own": {"audioChunk": {"mimeType": "audio/pcm;rate=16000", "data": "AAAA"}},
    "inside a blob": {"audio": {"mimeType": "audio/pcm;rate=16000", "data": "AAAA", "sampleRate": 16000}},
    "beside a known one": {"text": "hello", "language": "en"},
}


@pytest.mark.parametrize("body", UNKNOWN_REALTIME.values(), ids=UNKNOWN_REALTIME.keys())
async def test_E9_a_realtime_input_field_the_service_does_not_know_is_its_1007_unknown_name(ca, cert_files, body):
    async with serving(Script(speed=20, replies=["Hello."]), **cert_files) as (emu, _, url):
        endpoint, service, _ = await both(emu, url, ca, [{"setup": SETUP}, {"realtimeInput": body}])
    assert endpoint == service
    code, reason = endpoint
    assert code == 1007 and reason.startswith("Invalid JSON payload received. Unknown name ")
    assert "'realtime_input" in reason


async def test_C37_several_speakers_voices_are_the_services_1007(ca, cert_files):
    """google-genai will not send them ("multi_speaker_voice_config is not
    supported in the live API", its `t_live_speech_config`), nor does Firebase
    AI Logic ("Multi-speaker configurations are not supported by the Live
    API"); an app that writes its own frames is refused as the service refuses
    a setup it does not support: the generic 1007."""
    voices = [{"speaker": name, "voiceConfig": {"prebuiltVoiceConfig": {"voiceName": voice}}}
              for name, voice in (("Ada", "Kore"), ("Bob", "Puck"))]
    setup = {**SETUP, "generationConfig": {"speechConfig": {"multiSpeakerVoiceConfig": {"speakerVoiceConfigs": voices}}}}
    async with serving(Script(speed=20), **cert_files) as (emu, _, url):
        endpoint, service, upstream = await both(emu, url, ca, [{"setup": setup}])
    assert upstream == 0  # refused before anything reached Google
    assert endpoint == service == (1007, INVALID)
