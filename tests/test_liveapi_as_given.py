"""Conformance rows of the Live API endpoint (docs/gemini-endpoint.md,
"Conformance") for what an app's setup and messages pass to the model as
given: how the model hears the app (`realtimeInputConfig`), its context
window, the transcriptions' options, a cloned voice, proactive video, an
avatar, and a tool result's other parts. An app is google-genai with only its
base URL changed (`app_client`); what it set is read where the service would
read it, in the setup (or message) that reached the Live emulator playing
Google. Where the service refuses a field (one backend's only, google-genai
says), the same SDK sends the same setup to the endpoint and to the emulator,
and both must close alike.

The app's session follows the app's setup: what it did not say is the
service's default for it, never the server's own settings. The Live API
reference (BidiGenerateContentSetup.realtimeInputConfig): "Configures the
handling of realtime input"; AutomaticActivityDetection.disabled: "If enabled
(the default), detected voice and text input count as activity. If disabled,
the client must send activity signals."
"""

from __future__ import annotations

import dataclasses
import warnings

import anyio
import pytest
from audio_fixtures import silence, tone
from emulated import MODEL
from gemini_serving import (
    AGENT,
    CONFIG,
    app_client,
    ca_fixture,  # noqa: F401 (a fixture)
    cert_files_fixture,  # noqa: F401 (a fixture)
    said,
    serving,
    token,
    trusted_fixture,  # noqa: F401 (a fixture)
    turn,
)
from google.genai import types

from connections.emulator import Script
from live.liveapi import get_field

pytestmark = pytest.mark.anyio


def detection(**fields) -> types.RealtimeInputConfig:
    return types.RealtimeInputConfig(automatic_activity_detection=types.AutomaticActivityDetection(**fields))


async def speak(session, speech: bytes) -> None:
    """Speech as a microphone sends it: 100 ms chunks."""
    for i in range(0, len(speech), 3200):
        await session.send_realtime_input(audio=types.Blob(data=speech[i : i + 3200], mime_type="audio/pcm;rate=16000"))
        await anyio.sleep(0.01)


# --- C22-C26: realtimeInputConfig ---------------------------------------------------

# The server's own config turns the model's voice detection off (it marks turns
# itself for its own clients) and tunes what it would use.
SERVER_MARKS_TURNS = dataclasses.replace(
    AGENT,
    config=types.LiveConnectConfig(
        realtime_input_config=types.RealtimeInputConfig(
            automatic_activity_detection=types.AutomaticActivityDetection(disabled=True, silence_duration_ms=3000),
            activity_handling=types.ActivityHandling.NO_INTERRUPTION,
        )
    ),
)

APP_DETECTION = {
    "nothing said": None,
    "only silenceDurationMs": detection(silence_duration_ms=700),
}


@pytest.mark.parametrize("asked", APP_DETECTION.values(), ids=APP_DETECTION.keys())
async def test_C22_C23_an_app_that_leaves_detection_on_is_heard_by_the_models_detection_whatever_the_servers(
    trusted, cert_files, asked
):
    """An app that did not turn the model's detection off speaks and is
    answered, though the server's own config turns it off: the app's setup, not
    the server's, says how the model hears it."""
    config = CONFIG if asked is None else CONFIG.model_copy(update={"realtime_input_config": asked})
    script = Script(speed=20, user_says=["what time is it"], replies=["Half past nine."])
    async with serving(script, agent=SERVER_MARKS_TURNS, **cert_files) as (emu, _, url):
        async with app_client(url, token()).aio.live.connect(model=MODEL, config=config) as session:
            await speak(session, tone(0.4) + silence(1.0))
            assert said(await turn(session)) == "Half past nine."
    [upstream] = emu.sessions
    sent = get_field(upstream.setup, "realtimeInputConfig") or {}
    aad = get_field(sent, "automaticActivityDetection") or {}
    assert get_field(aad, "disabled") in (None, False)
    assert get_field(sent, "activityHandling") is None  # the server's own is not the app's
    assert get_field(aad, "silenceDurationMs") == (None if asked is None else 700)


async def test_C22_an_app_that_marks_its_turns_gets_nothing_else_of_the_servers_detection(trusted, cert_files):
    """The reverse: an app that turns detection off and says nothing else gets
    the service's defaults for the rest, not the server's tuning."""
    script = Script(speed=20, user_says=["what time is it"], replies=["Half past nine."])
    config = CONFIG.model_copy(update={"realtime_input_config": detection(disabled=True)})
    async with serving(script, agent=SERVER_MARKS_TURNS, **cert_files) as (emu, _, url):
        async with app_client(url, token()).aio.live.connect(model=MODEL, config=config) as session:
            await session.send_realtime_input(activity_start=types.ActivityStart())
            await speak(session, tone(0.4))
            await session.send_realtime_input(activity_end=types.ActivityEnd())
            assert said(await turn(session)) == "Half past nine."
    [upstream] = emu.sessions
    sent = get_field(upstream.setup, "realtimeInputConfig")
    assert list(sent) in (["automaticActivityDetection"], ["automatic_activity_detection"])
    assert get_field(sent, "automaticActivityDetection") == {"disabled": True}
