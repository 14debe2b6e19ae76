"""Conformance row A6 of the Live API endpoint (docs/gemini-endpoint.md,
"Conformance"): an app on Vertex AI's path, driven by the unmodified
google-genai client in Vertex AI mode. Only its base URL is changed; the
access token its credentials hold is one of the server's tokens.

How google-genai dials Vertex AI (`live.py`, `AsyncLive.connect`): with a
project and a location it opens
`wss://BASE/ws/google.cloud.aiplatform.v1beta1.LlmBidiService/BidiGenerateContent`,
sends `Authorization: Bearer <credentials.token>`, names the model
`projects/P/locations/L/publishers/google/models/M`, and asks for AUDIO when
the app's config names no modality. It reads usage under Vertex AI's names
(`_live_converters._UsageMetadata_from_vertex`: `candidatesTokenCount` and
`candidatesTokensDetails` become `response_token_count` and
`response_tokens_details`; the Gemini API's `responseTokenCount` is not read).

What Vertex AI answers a request without valid credentials: UNAUTHENTICATED,
"The request does not have valid authentication credentials for the
operation" (google.rpc.Code), in Google Cloud's words for a missing and for an
invalid or expired token ("Request is missing required authentication
credential. …", "Request had invalid authentication credentials. …"). How its
Live socket says it is not documented; the strictest reading: as its Live
socket says a refused model (1008 with the REST words, cut at 123 bytes,
google/adk-python#3314), and as the Gemini API's says a bad key (1008).
"""

from __future__ import annotations

import json
import ssl
import time
from typing import Any

import anyio
import pytest
import trustme
from audio_fixtures import silence, tone
from emulated import MODEL
from gemini_serving import (
    AGENT,
    CONFIG,
    SECRET,
    reply_audio,
    said,
    serving,
    token,
    turn,
)
from google import genai
from google.genai import errors, types
from google.oauth2.credentials import Credentials
from websockets.asyncio.client import connect as ws_connect

from connections.emulator import ReplyContext, Script
from live.access.auth import mint_token
from live.liveapi import BAD_KEY, VERTEX_BAD_CREDENTIAL, VERTEX_NO_CREDENTIAL, vertex_not_found

pytestmark = pytest.mark.anyio

PROJECT, LOCATION = "shop-project", "us-central1"
PATH = "/ws/google.cloud.aiplatform.v1beta1.LlmBidiService/BidiGenerateContent"


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


def vertex_app(url: str, access_token: str) -> genai.Client:
    """google-genai as a Vertex AI app builds it: a project, a location and
    Google Cloud credentials (an access token), with only its base URL changed."""
    return genai.Client(
        vertexai=True,
        project=PROJECT,
        location=LOCATION,
        credentials=Credentials(token=access_token),
        http_options={"base_url": f"https://127.0.0.1:{port_of(url)}"},
    )


def close_words(text: str) -> str:
    """A reason as a close frame carries it: 123 bytes at most."""
    return text.encode()[:123].decode("utf-8", "ignore")


async def refusal(client: genai.Client, model: str = MODEL) -> tuple[int, str]:
    with pytest.raises(errors.APIError) as caught:
        with anyio.fail_after(10):
            async with client.aio.live.connect(model=model, config=CONFIG) as session:
                await session.send_realtime_input(text="hello")
                await turn(session)
    return caught.value.code, caught.value.details


async def test_A6_a_vertex_ai_app_with_bearer_credentials_is_answered_and_reads_its_usage(trusted, cert_files):
    script = Script(speed=20, replies=["Hello from the shop."])
    async with serving(script, **cert_files) as (emu, _, url):
        client = vertex_app(url, token())
        assert client._api_client._http_options.api_version == "v1beta1"  # Vertex AI's default
        async with client.aio.live.connect(model=MODEL, config=CONFIG) as session:
            await session.send_client_content(
                turns=types.Content(role="user", parts=[types.Part(text="hello")]), turn_complete=True
            )
            messages = await turn(session)
        assert said(messages) == "Hello from the shop."
        assert len(reply_audio(messages)) > 24_000  # more than half a second of speech
        # Usage under Vertex AI's names, which is all google-genai reads on Vertex AI.
        [usage] = [m.usage_metadata for m in messages if m.usage_metadata]
        assert messages[-1].server_content.turn_complete and messages[-1].usage_metadata is usage
        assert usage.response_token_count > 0
        assert usage.response_tokens_details and usage.response_tokens_details[0].modality == types.MediaModality.AUDIO
        assert usage.total_token_count >= usage.response_token_count
        # The server talked to Google on the Gemini API with its own key and model.
        [upstream] = emu.sessions
        assert upstream.setup["model"] == f"models/{MODEL}"


async def test_A6_a_model_the_server_does_not_allow_is_vertex_ais_not_found_for_the_apps_path(trusted, cert_files):
    async with serving(Script(speed=20), **cert_files) as (emu, _, url):
        code, reason = await refusal(vertex_app(url, token()), model="gemini-2.0-flash-exp")
        assert emu.sessions == []
    full = f"projects/{PROJECT}/locations/{LOCATION}/publishers/google/models/gemini-2.0-flash-exp"
    assert (code, reason) == (1008, close_words(vertex_not_found(full)))
    assert reason.startswith(f"Publisher Model `{full}` was not found")


async def test_A6_a_wrong_or_expired_bearer_token_is_vertex_ais_unauthenticated(trusted, cert_files):
    forged = mint_token("another-secret-that-is-long-enough-for-hs256", agent=AGENT.name, ttl=600)
    expired = mint_token(SECRET, agent=AGENT.name, ttl=60, now=time.time() - 3600)
    async with serving(Script(speed=20), **cert_files) as (emu, _, url):
        for bad in ("not-a-token", forged, expired):
            assert await refusal(vertex_app(url, bad)) == (1008, close_words(VERTEX_BAD_CREDENTIAL)), bad
            # A stranger hears it before anything about the models served.
            assert await refusal(vertex_app(url, bad), model="gemini-2.0-flash-exp") == (
                1008, close_words(VERTEX_BAD_CREDENTIAL)
            )
        assert emu.sessions == []  # nothing reached Google
        # The server goes on: the next app with a good token is answered.
        async with vertex_app(url, token()).aio.live.connect(model=MODEL, config=CONFIG) as session:
            await session.send_realtime_input(text="still there")
            assert said(await turn(session)) == "You said: still there."


async def test_A6_no_credentials_at_all_is_vertex_ais_missing_credential(ca: trustme.CA, cert_files):
    """google-genai always sends a bearer token on Vertex AI (it refreshes
    credentials without one before it dials), so this app is the WebSocket
    tutorial's (docs.cloud.google.com/vertex-ai/generative-ai/docs/live-api/
    get-started-websocket): a plain client on the same URL with the setup it
    sends, here without its `Authorization` header."""
    setup: dict[str, Any] = {
        "setup": {
            "model": f"projects/{PROJECT}/locations/{LOCATION}/publishers/google/models/{MODEL}",
            "generationConfig": {"responseModalities": ["AUDIO"]},
        }
    }
    context = ssl.create_default_context()
    ca.configure_trust(context)
    async with serving(Script(speed=20), **cert_files) as (emu, _, url):
        async with ws_connect(f"wss://127.0.0.1:{port_of(url)}{PATH}", ssl=context,
                              additional_headers={"Content-Type": "application/json"}) as ws:
            await ws.send(json.dumps(setup))
            with anyio.fail_after(10):
                await ws.wait_closed()
        assert emu.sessions == []
    assert (ws.close_code, ws.close_reason) == (1008, close_words(VERTEX_NO_CREDENTIAL))


async def test_A6_an_express_mode_app_sends_an_api_key_on_vertex_ais_path(trusted, cert_files):
    """Vertex AI's express mode: `Client(vertexai=True, api_key=...)` dials the
    same path with `x-goog-api-key` and names the model
    `publishers/google/models/M`; a wrong key is told as any API key is."""
    script = Script(speed=20, replies=["Express."])
    async with serving(script, **cert_files) as (emu, _, url):
        def express(key: str) -> genai.Client:
            return genai.Client(vertexai=True, api_key=key, http_options={"base_url": f"https://127.0.0.1:{port_of(url)}"})

        async with express(token()).aio.live.connect(model=MODEL, config=CONFIG) as session:
            await session.send_realtime_input(text="hello")
            assert said(await turn(session)) == "Express."
        assert await refusal(express("not-a-token")) == (1008, BAD_KEY)
        assert len(emu.sessions) == 1


async def speak(session: Any, seconds: float = 0.4, pause: float = 0.8) -> None:
    """The user says something, then is silent, as a microphone streams it."""
    speech = tone(seconds) + silence(pause)
    for i in range(0, len(speech), 3200):
        await session.send_realtime_input(audio=types.Blob(data=speech[i : i + 3200], mime_type="audio/pcm;rate=16000"))
        await anyio.sleep(0.01)


async def test_C44_explicit_vad_signal_tells_a_vertex_ai_app_where_the_users_speech_starts_and_ends(trusted, cert_files):
    """Vertex AI's own `explicitVadSignal` (google-genai LiveConnectConfig
    `explicit_vad_signal`, which it sends on Vertex AI only: "explicit_vad_signal
    parameter is only supported in Gemini Enterprise Agent Platform mode"):
    ADK's RunConfig reference says it "Enables explicit voice activity detection
    (VAD) signals from the model"; they come as the server message's
    `voiceActivityDetectionSignal` (google-genai LiveServerMessage
    .voice_activity_detection_signal, "Voice activity detection signal",
    read on Vertex AI by `_LiveServerMessage_from_vertex`), whose
    `vadSignalType` is VAD_SIGNAL_TYPE_SOS ("Start of sentence signal.") or
    VAD_SIGNAL_TYPE_EOS ("End of sentence signal."). Here they say what the
    model's own detection says (its `voiceActivity`); an app that did not ask
    gets none."""
    script = Script(speed=20, user_says=["what time is it"], replies=["Half past nine."],
                    profile_overrides={"voice_activity_messages": True})
    async with serving(script, **cert_files) as (emu, _, url):
        asked = CONFIG.model_copy(update={"explicit_vad_signal": True})
        async with vertex_app(url, token()).aio.live.connect(model=MODEL, config=asked) as session:
            await speak(session)
            messages = await turn(session)
        assert said(messages) == "Half past nine."
        signals = [m.voice_activity_detection_signal.vad_signal_type for m in messages if m.voice_activity_detection_signal]
        assert signals == [types.VadSignalType.VAD_SIGNAL_TYPE_SOS, types.VadSignalType.VAD_SIGNAL_TYPE_EOS]
        # The model's own voice activity reaches the app as it came, as well (row H24).
        kinds = [m.voice_activity.voice_activity_type for m in messages if m.voice_activity]
        assert kinds == [types.VoiceActivityType.ACTIVITY_START, types.VoiceActivityType.ACTIVITY_END]
        # Vertex AI's field never goes to Google: the Gemini API does not know it.
        assert "explicitVadSignal" not in emu.sessions[0].setup

        async with vertex_app(url, token()).aio.live.connect(model=MODEL, config=CONFIG) as session:
            await speak(session)
            messages = await turn(session)
        assert said(messages) == "Half past nine."
        assert not any(m.voice_activity_detection_signal for m in messages)
        assert any(m.voice_activity for m in messages)


def knows_the_name(ctx: ReplyContext) -> str:
    """The model's answer from the conversation it holds (the emulator's history)."""
    said_before = json.dumps(ctx.history)
    if "my name" in ctx.user_text.lower():
        return "Your name is Ada." if "Ada" in said_before else "I do not know your name."
    return f"You said: {ctx.user_text}."


async def test_C45_transparent_resumption_needs_no_resending_and_updates_carry_no_index(trusted, cert_files):
    """Vertex AI's `sessionResumption.transparent` (google-genai
    SessionResumptionConfig.transparent: "If set the server will send
    `last_consumed_client_message_index` in the `session_resumption_update`
    messages to allow for transparent reconnections"; the index is "Index of
    last message sent by client that is included in state represented by this
    SessionResumptionToken", so that an app "can do it without losing state by
    buffering messages sent since last `SessionResumptionTokenUpdate`").

    Here a handle stands for the session, not for a moment of it: what the
    server read of the app's socket before it ended is in the session it
    resumes, including what came after the last update. An index sent with an
    update would be short of that, and an app resending after it would say it
    twice; so the updates carry none (a documented difference), the app is
    taken with the field, and finds after resuming what it sent before."""
    script = Script(speed=20, replies=knows_the_name)
    transparent = CONFIG.model_copy(update={"session_resumption": types.SessionResumptionConfig(transparent=True)})
    async with serving(script, **cert_files) as (emu, _, url):
        client = vertex_app(url, token())
        async with client.aio.live.connect(model=MODEL, config=transparent) as session:
            await session.send_realtime_input(text="hello")
            messages = await turn(session)
            updates = [m.session_resumption_update for m in messages if m.session_resumption_update]
            # Sent after the last update: no reply, so no update follows it.
            await session.send_client_content(
                turns=types.Content(role="user", parts=[types.Part(text="My name is Ada.")]), turn_complete=False
            )
        assert said(messages) == "You said: hello."
        [handle] = {u.new_handle for u in updates if u.resumable}
        assert all(u.last_consumed_client_message_index is None for u in updates)
        # Back with its handle, resending nothing: the name it gave is known, once.
        again = CONFIG.model_copy(
            update={"session_resumption": types.SessionResumptionConfig(handle=handle, transparent=True)}
        )
        async with client.aio.live.connect(model=MODEL, config=again) as session:
            await session.send_realtime_input(text="What is my name?")
            messages = await turn(session)
        assert said(messages) == "Your name is Ada."
        assert all(
            m.session_resumption_update.last_consumed_client_message_index is None
            for m in messages
            if m.session_resumption_update
        )
        [upstream] = emu.sessions  # the same conversation, on the same connection to Google
        assert json.dumps(upstream.frames).count("My name is Ada.") == 1


# --- C41, C43: Vertex AI's own settings, which the Gemini API does not have ------------
# google-genai raises "... parameter is only supported in Gemini Enterprise
# Agent Platform mode, not in Gemini Developer API mode" for each on the Gemini
# API; on Vertex AI it sends them. The server's own connection to the model is
# the Gemini API's: what that does alike is carried, the rest refused in words
# that say why, before anything reaches Google.


async def answered_on_vertex(url: str, config: types.LiveConnectConfig) -> str:
    async with vertex_app(url, token()).aio.live.connect(model=MODEL, config=config) as session:
        await session.send_realtime_input(text="hello")
        return said(await turn(session))


async def test_C43_safety_by_probability_reaches_the_model_as_the_gemini_apis_threshold(trusted, cert_files):
    """HarmBlockMethod.PROBABILITY: "The harm block method uses the probability
    score" (and unset: "the default behavior is to use the probability score");
    the Gemini API's HarmBlockThreshold: "Block at and beyond a specified harm
    probability". The same setting, so the model gets the threshold alone."""
    safety = types.SafetySetting(
        category=types.HarmCategory.HARM_CATEGORY_HARASSMENT,
        threshold=types.HarmBlockThreshold.BLOCK_ONLY_HIGH,
        method=types.HarmBlockMethod.PROBABILITY,
    )
    async with serving(Script(speed=20, replies=["Hello."]), **cert_files) as (emu, _, url):
        assert await answered_on_vertex(url, CONFIG.model_copy(update={"safety_settings": [safety]})) == "Hello."
    [upstream] = emu.sessions
    assert upstream.setup["safetySettings"] == [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_ONLY_HIGH"}]


async def test_C41_a_vertex_ai_apps_model_selection_is_taken_and_the_servers_model_answers(trusted, cert_files):
    """ModelSelectionConfig (on Vertex AI's wire `generationConfig.modelConfig`,
    google-genai's converter) chooses among models: the session runs on the
    server's model whatever the app asks (C2), so it is taken and not sent on."""
    preference = types.ModelSelectionConfig(feature_selection_preference=types.FeatureSelectionPreference.PRIORITIZE_COST)
    config = CONFIG.model_copy(update={"generation_config": types.GenerationConfig(model_selection_config=preference)})
    async with serving(Script(speed=20, replies=["Hello."]), **cert_files) as (emu, _, url):
        assert await answered_on_vertex(url, config) == "Hello."
    [upstream] = emu.sessions
    assert upstream.setup["model"] == f"models/{MODEL}"
    assert set(upstream.setup["generationConfig"]) == {"responseModalities"}


NOT_HERE = {
    "responseFormat": {
        "generation_config": types.GenerationConfig(
            response_format=[types.ResponseFormat(audio=types.AudioResponseFormat(mime_type="audio/mpeg", bit_rate=64_000))]
        )
    },
    "audioTranscriptionConfig": {
        "generation_config": types.GenerationConfig(audio_transcription_config=types.AudioTranscriptionConfig())
    },
    "SEVERITY": {
        "safety_settings": [
            types.SafetySetting(
                category=types.HarmCategory.HARM_CATEGORY_HARASSMENT,
                threshold=types.HarmBlockThreshold.BLOCK_ONLY_HIGH,
                method=types.HarmBlockMethod.SEVERITY,
            )
        ]
    },
    "retrieval": {
        "tools": [
            types.Tool(
                retrieval=types.Retrieval(
                    vertex_ai_search=types.VertexAISearch(datastore="projects/p/locations/global/collections/c/dataStores/d")
                )
            )
        ]
    },
    "enterpriseWebSearch": {"tools": [types.Tool(enterprise_web_search=types.EnterpriseWebSearch())]},
}


@pytest.mark.parametrize(("named", "fields"), NOT_HERE.items(), ids=NOT_HERE.keys())
async def test_C41_C43_what_the_gemini_api_cannot_do_for_a_vertex_ai_app_is_refused_saying_why(
    trusted, cert_files, named, fields
):
    """An app that asked for MP3 replies, severity-based blocking or its own
    data store would otherwise get what it did not ask for without a word."""
    async with serving(Script(speed=20, replies=["Hello."]), **cert_files) as (emu, _, url):
        client = vertex_app(url, token())
        with pytest.raises(errors.APIError) as caught:
            with anyio.fail_after(10):
                async with client.aio.live.connect(model=MODEL, config=CONFIG.model_copy(update=fields)) as session:
                    await session.send_realtime_input(text="hello")
                    await turn(session)
        assert emu.sessions == []  # nothing of it reached Google
    assert caught.value.code == 1007
    assert named in caught.value.details and "not supported by this server" in caught.value.details
    assert "Gemini API" in caught.value.details


async def test_C43_a_vertex_ai_tool_kind_in_a_context_update_is_refused_saying_why(trusted, cert_files):
    """On 3.8, which takes `contextUpdate` (G1, G2), Vertex AI's own tool kind
    mid-session is refused as in setup, and never reaches Google."""
    g38 = "gemini-3.8-live"
    async with serving(Script(speed=20, replies=["Hello."]), model=g38, **cert_files) as (emu, _, url):
        with pytest.raises(errors.APIError) as caught:
            with anyio.fail_after(10):
                async with vertex_app(url, token()).aio.live.connect(model=g38, config=CONFIG) as session:
                    await session.send_context_update(tools=[types.Tool(exa_ai_search=types.ToolExaAiSearch())])
                    await turn(session)
        [upstream] = emu.sessions
    assert caught.value.code == 1007 and "The exaAiSearch tool is not supported by this server" in caught.value.details
    assert not any("context_update" in frame or "contextUpdate" in frame for frame in upstream.frames)
