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

import contextlib
import dataclasses
import json
import ssl
import warnings

import anyio
import pytest
from audio_fixtures import silence, tone
from emulated import MODEL
from gemini_serving import (
    AGENT,
    CONFIG,
    app_client,
    said,
    serving,
    token,
    turn,
)
from google.genai import types
from test_liveapi_tools import ASYNC_CONFIG, call_and_filler, reports
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from connections.emulator import Script
from live.liveapi import b64decode, get_field

pytestmark = pytest.mark.anyio

NATIVE_AUDIO = "gemini-2.5-flash-native-audio-preview-12-2025"


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


async def answered(model: str, config: types.LiveConnectConfig, url: str, api_version: str | None = None) -> str:
    options = {"api_version": api_version} if api_version else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        async with app_client(url, token(), **options).aio.live.connect(model=model, config=config) as session:
            await session.send_realtime_input(text="hello")
            return said(await turn(session))


async def upstream_setup(cert_files, config: types.LiveConnectConfig, *, api_version: str | None = None, model: str = MODEL):
    """The setup that reached the service for an app's `config`, the app answered."""
    async with serving(Script(speed=20, replies=["Hello."]), model=model, **cert_files) as (emu, _, url):
        assert await answered(model, config, url, api_version) == "Hello."
    [upstream] = emu.sessions
    return upstream.setup


def at(obj, *path):
    """A nested field as the service reads it (either key casing)."""
    for name in path:
        obj = get_field(obj, name)
    return obj


async def test_C23_to_C26_the_rest_of_realtime_input_config_reaches_the_model_as_given(trusted, cert_files):
    asked = types.RealtimeInputConfig(
        automatic_activity_detection=types.AutomaticActivityDetection(
            start_of_speech_sensitivity=types.StartSensitivity.START_SENSITIVITY_LOW,
            end_of_speech_sensitivity=types.EndSensitivity.END_SENSITIVITY_HIGH,
            prefix_padding_ms=40,
            silence_duration_ms=900,
        ),
        activity_handling=types.ActivityHandling.NO_INTERRUPTION,
        turn_coverage=types.TurnCoverage.TURN_INCLUDES_ALL_INPUT,
        interim_transcript_timestamp_enabled=True,
    )
    setup = await upstream_setup(cert_files, CONFIG.model_copy(update={"realtime_input_config": asked}))
    sent = get_field(setup, "realtimeInputConfig")
    assert at(sent, "automaticActivityDetection", "startOfSpeechSensitivity") == "START_SENSITIVITY_LOW"
    assert at(sent, "automaticActivityDetection", "endOfSpeechSensitivity") == "END_SENSITIVITY_HIGH"
    assert at(sent, "automaticActivityDetection", "prefixPaddingMs") == 40
    assert at(sent, "automaticActivityDetection", "silenceDurationMs") == 900
    assert at(sent, "automaticActivityDetection", "disabled") is None  # not said: the service's default
    assert at(sent, "activityHandling") == "NO_INTERRUPTION"
    assert at(sent, "turnCoverage") == "TURN_INCLUDES_ALL_INPUT"
    assert at(sent, "interimTranscriptTimestampEnabled") is True


async def test_C23_an_apps_longer_silence_lets_the_user_pause_without_losing_the_turn(trusted, cert_files):
    """What the user notices of `silenceDurationMs`: with 2 s asked, a 1 s pause
    in mid-sentence does not end the turn (with the service's 500 ms it does)."""
    script = Script(speed=20, user_says=["what time is it in Lisbon"], replies=["Half past nine."])
    config = CONFIG.model_copy(update={"realtime_input_config": detection(silence_duration_ms=2000)})
    async with serving(script, **cert_files) as (emu, _, url):
        async with app_client(url, token()).aio.live.connect(model=MODEL, config=config) as session:
            await speak(session, tone(0.4) + silence(1.0) + tone(0.4) + silence(2.5))
            assert said(await turn(session)) == "Half past nine."
    [upstream] = emu.sessions
    assert len(upstream.user_turns) == 1  # one turn, both halves of it


async def test_C30_context_window_compression_reaches_the_model_as_given(trusted, cert_files):
    asked = types.ContextWindowCompressionConfig(
        trigger_tokens=20_000, sliding_window=types.SlidingWindow(target_tokens=8_000)
    )
    setup = await upstream_setup(cert_files, CONFIG.model_copy(update={"context_window_compression": asked}))
    sent = get_field(setup, "contextWindowCompression")
    assert int(at(sent, "triggerTokens")) == 20_000
    assert int(at(sent, "slidingWindow", "targetTokens")) == 8_000


async def test_C38_the_transcriptions_other_options_reach_the_model_as_given(trusted, cert_files):
    heard = types.AudioTranscriptionConfig(
        language_auto=types.LanguageAuto(),
        language_hints=types.LanguageHints(language_codes=["pt-PT", "en-GB"]),
        adaptation_phrases=["Zorblax"],
        word_timestamp=True,
        diarization=True,
        mode=types.AudioTranscriptionConfigMode.VERBATIM,
    )
    spoken = types.AudioTranscriptionConfig(source_text="Olá.", mode=types.AudioTranscriptionConfigMode.SMART)
    config = CONFIG.model_copy(update={"input_audio_transcription": heard, "output_audio_transcription": spoken})
    setup = await upstream_setup(cert_files, config)
    sent_in, sent_out = get_field(setup, "inputAudioTranscription"), get_field(setup, "outputAudioTranscription")
    assert at(sent_in, "languageAuto") == {}
    assert at(sent_in, "languageHints", "languageCodes") == ["pt-PT", "en-GB"]
    assert at(sent_in, "adaptationPhrases") == ["Zorblax"]
    assert at(sent_in, "wordTimestamp") is True and at(sent_in, "diarization") is True
    assert at(sent_in, "mode") == "VERBATIM"
    assert at(sent_out, "sourceText") == "Olá." and at(sent_out, "mode") == "SMART"


VOICE_SAMPLE = bytes(range(256)) * 4  # what google-genai sends URL-safe: '-' and '_' among it
CONSENT = bytes(reversed(range(256)))


async def test_C39_a_cloned_voice_reaches_the_model_with_its_sample_and_consent(trusted, cert_files):
    """A replicated voice (the Gemini API's `consentAudio` and
    `voiceConsentSignature` with it): the audio reaches the model byte for byte."""
    speech = types.SpeechConfig(
        voice_config=types.VoiceConfig(
            replicated_voice_config=types.ReplicatedVoiceConfig(
                mime_type="audio/pcm;rate=24000",
                voice_sample_audio=VOICE_SAMPLE,
                consent_audio=CONSENT,
                voice_consent_signature=types.VoiceConsentSignature(signature="sig-from-before"),
            )
        )
    )
    setup = await upstream_setup(cert_files, CONFIG.model_copy(update={"speech_config": speech}))
    voice = at(setup, "generationConfig", "speechConfig", "voiceConfig", "replicatedVoiceConfig")
    assert at(voice, "mimeType") == "audio/pcm;rate=24000"
    assert b64decode(at(voice, "voiceSampleAudio")) == VOICE_SAMPLE
    assert b64decode(at(voice, "consentAudio")) == CONSENT
    assert at(voice, "voiceConsentSignature", "signature") == "sig-from-before"


async def test_C39_a_voice_named_by_its_speaker_id_reaches_the_model(trusted, cert_files):
    speech = types.SpeechConfig(voice_config=types.VoiceConfig(voice="speaker-7"))
    setup = await upstream_setup(cert_files, CONFIG.model_copy(update={"speech_config": speech}))
    assert at(setup, "generationConfig", "speechConfig", "voiceConfig", "voice") == "speaker-7"
    assert at(setup, "generationConfig", "speechConfig", "voiceConfig", "prebuiltVoiceConfig") is None


def cloned_voice(**consent) -> types.LiveConnectConfig:
    voice = types.ReplicatedVoiceConfig(mime_type="audio/pcm;rate=24000", voice_sample_audio=VOICE_SAMPLE, **consent)
    return CONFIG.model_copy(
        update={"speech_config": types.SpeechConfig(voice_config=types.VoiceConfig(replicated_voice_config=voice))}
    )


async def test_H38_the_signature_the_model_returns_for_a_cloned_voices_consent_reaches_the_app(trusted, cert_files):
    """google-genai, `LiveServerSetupComplete.voice_consent_signature`:
    "Signature of the verified consent audio. This is populated when the
    request has a ReplicatedVoiceConfig with consent_audio set, if the consent
    verification was successful. This may be used in a subsequent request
    instead of the consent_audio to verify the same consent." The app reads
    it where google-genai keeps it (`session.setup_complete`): the model's
    own. Its next session sends the signature in place of the audio, which
    reaches the model, and gets no new signature."""
    async with serving(Script(speed=20, replies=["Hello."]), **cert_files) as (emu, _, url):
        async with app_client(url, token()).aio.live.connect(model=MODEL, config=cloned_voice(consent_audio=CONSENT)) as session:
            signature = session.setup_complete.voice_consent_signature
            await session.send_realtime_input(text="hello")
            assert said(await turn(session)) == "Hello."
        again = cloned_voice(voice_consent_signature=signature)
        async with app_client(url, token()).aio.live.connect(model=MODEL, config=again) as session:
            assert session.setup_complete.voice_consent_signature is None
            await session.send_realtime_input(text="hello")
            assert said(await turn(session)) == "Hello."
    first, second = emu.sessions
    [model_ready] = [m["setupComplete"] for m in first.sent if "setupComplete" in m]
    assert signature is not None and signature.signature == at(model_ready, "voiceConsentSignature", "signature")
    voice = at(second.setup, "generationConfig", "speechConfig", "voiceConfig", "replicatedVoiceConfig")
    assert at(voice, "voiceConsentSignature", "signature") == signature.signature
    assert at(voice, "consentAudio") is None


async def test_C40_proactive_video_on_v1alpha_reaches_the_model(trusted, cert_files):
    config = CONFIG.model_copy(update={"proactivity": types.ProactivityConfig(proactive_video=True)})
    setup = await upstream_setup(cert_files, config, api_version="v1alpha", model=NATIVE_AUDIO)
    assert at(setup, "proactivity", "proactiveVideo") is True


AVATAR_IMAGE = bytes(range(255, -1, -1)) * 3


async def test_C42_an_avatar_reaches_the_model_as_given(trusted, cert_files):
    avatar = types.AvatarConfig(
        avatar_name="concierge",
        customized_avatar=types.CustomizedAvatar(image_mime_type="image/png", image_data=AVATAR_IMAGE),
        audio_bitrate_bps=64_000,
        video_bitrate_bps=1_000_000,
    )
    setup = await upstream_setup(cert_files, CONFIG.model_copy(update={"avatar_config": avatar}))
    sent = get_field(setup, "avatarConfig")
    assert at(sent, "avatarName") == "concierge"
    assert at(sent, "customizedAvatar", "imageMimeType") == "image/png"
    assert b64decode(at(sent, "customizedAvatar", "imageData")) == AVATAR_IMAGE
    assert at(sent, "audioBitrateBps") == 64_000 and at(sent, "videoBitrateBps") == 1_000_000


# --- F9: a tool result's other parts ---------------------------------------------------

RESULT_PARTS = [
    types.FunctionResponsePart(
        file_data=types.FunctionResponseFileData(
            file_uri="https://generativelanguage.googleapis.com/v1beta/files/abc123",
            mime_type="video/mp4", display_name="dock camera",
        ),
        video_metadata=types.VideoMetadata(start_offset="1s", end_offset="4s", fps=2.0),
        media_resolution=types.PartMediaResolution(level=types.PartMediaResolutionLevel.MEDIA_RESOLUTION_LOW),
        media_processing=types.MediaProcessing.AGENTIC,
    ),
    types.FunctionResponsePart(
        file_data=types.FunctionResponseFileData(file_uri="https://example.com/invoice.pdf", mime_type="application/pdf"),
        document_metadata=types.DocumentMetadata(start_page=2, end_page=3),
    ),
    types.FunctionResponsePart(
        file_data=types.FunctionResponseFileData(file_uri="https://example.com/stock.xlsx", mime_type="text/csv"),
        spreadsheet_metadata=types.SpreadsheetMetadata(visible_cells="A1:C9", sheet_index=1),
    ),
    types.FunctionResponsePart(
        inline_data=types.FunctionResponseBlob(mime_type="audio/wav", data=b"RIFF....WAVE", display_name="driver's note"),
        audio_metadata=types.AudioMetadata(start_offset="0s", end_offset="2s"),
    ),
]


async def test_F9_a_results_other_parts_reach_the_model_as_given(trusted, cert_files):
    script = Script(speed=20, replies=reports, tool_args={"track_order": {"order": "42"}})
    async with serving(script, **cert_files) as (emu, _, url):
        async with app_client(url, token()).aio.live.connect(model=MODEL, config=ASYNC_CONFIG) as session:
            call, _ = await call_and_filler(session)
            await session.send_tool_response(
                function_responses=[types.FunctionResponse(
                    id=call.id, name=call.name, response={"status": "filmed"}, parts=RESULT_PARTS,
                )]
            )
            assert said(await turn(session)) == "The order is filmed; 1 updates so far."
    [upstream] = emu.sessions
    [response] = upstream.tool_responses
    video, document, sheet, note = get_field(response, "parts")
    assert at(video, "fileData", "fileUri") == "https://generativelanguage.googleapis.com/v1beta/files/abc123"
    assert at(video, "fileData", "displayName") == "dock camera"
    assert at(video, "videoMetadata", "startOffset") == "1s" and at(video, "videoMetadata", "fps") == 2.0
    assert at(video, "mediaResolution", "level") == "MEDIA_RESOLUTION_LOW"
    assert at(video, "mediaProcessing") == "AGENTIC"
    assert at(document, "documentMetadata", "startPage") == 2 and at(document, "documentMetadata", "endPage") == 3
    assert at(sheet, "spreadsheetMetadata", "visibleCells") == "A1:C9" and at(sheet, "spreadsheetMetadata", "sheetIndex") == 1
    assert at(note, "inlineData", "displayName") == "driver's note"
    assert b64decode(at(note, "inlineData", "data")) == b"RIFF....WAVE"
    assert at(note, "audioMetadata", "endOffset") == "2s"


# --- what only the Gemini API knows, on Vertex AI's path -------------------------------

VERTEX_PATH = "/ws/google.cloud.aiplatform.v1beta1.LlmBidiService/BidiGenerateContent"
VERTEX_MODEL = f"projects/shop-project/locations/us-central1/publishers/google/models/{MODEL}"


async def closed_by(target: str, context: ssl.SSLContext, headers: dict[str, str], frames: list[dict]) -> tuple[int, str]:
    """Send `frames` over a raw socket, each once the one before was read: the close that follows."""
    async with ws_connect(target, ssl=context, additional_headers=headers) as ws:
        with anyio.fail_after(10):
            for i, frame in enumerate(frames):
                await ws.send(json.dumps(frame))
                if i < len(frames) - 1:
                    assert "setupComplete" in json.loads(await ws.recv())
            with contextlib.suppress(ConnectionClosed):
                async for _ in ws:
                    pass
    return ws.close_code, ws.close_reason


def replicated(**fields) -> dict:
    voice = {"mimeType": "audio/pcm;rate=24000", "voiceSampleAudio": "AAAA", **fields}
    return {"setup": {"model": VERTEX_MODEL, "generationConfig": {"speechConfig": {"voiceConfig": {"replicatedVoiceConfig": voice}}}}}


# google-genai raises "... parameter is only supported in Gemini Developer API
# mode, not in Gemini Enterprise Agent Platform mode." for each on Vertex AI, so
# a Vertex AI app sends them only by hand: the service's unknown name.
GEMINI_ONLY = {
    "consentAudio": replicated(consentAudio="AAAA"),
    "voiceConsentSignature": replicated(voiceConsentSignature={"signature": "s"}),
}


def endpoint_at(url: str, ca) -> tuple[str, ssl.SSLContext, dict[str, str]]:
    ours = ssl.create_default_context()
    ca.configure_trust(ours)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    return f"wss://127.0.0.1:{port}{VERTEX_PATH}", ours, {"Authorization": f"Bearer {token()}"}


@pytest.mark.parametrize(("name", "setup"), GEMINI_ONLY.items(), ids=GEMINI_ONLY.keys())
async def test_C39_a_cloned_voices_consent_on_vertex_ais_path_is_its_1007_unknown_name(ca, cert_files, name, setup):
    async with serving(Script(speed=20, replies=["Hello."]), **cert_files) as (emu, _, url):
        endpoint = await closed_by(*endpoint_at(url, ca), [setup])
        host = emu.base_url.removeprefix("https://")
        service = await closed_by(f"wss://{host}{VERTEX_PATH}", emu.ssl_context(), {"x-goog-api-key": emu.api_key}, [setup])
        assert len(emu.sessions) == 1  # the service's own: nothing of the endpoint's reached Google
    assert endpoint == service
    code, reason = endpoint
    where = "setup.generation_config.speech_config.voice_config.replicated_voice_config"
    words = f"Invalid JSON payload received. Unknown name \"{name}\" at '{where}': Cannot find field."
    assert (code, reason) == (1007, words.encode()[:123].decode())  # a close frame's 123 bytes


async def test_F9_media_processing_on_vertex_ais_path_is_its_1007_unknown_name(ca, cert_files):
    """The emulator serves no model on Vertex AI's path, so the endpoint's close
    is checked against the words of the unknown name alone."""
    frames = [
        {"setup": {"model": VERTEX_MODEL}},
        {"toolResponse": {"functionResponses": [{"id": "c1", "name": "f", "response": {},
                                                 "parts": [{"mediaProcessing": "AGENTIC"}]}]}},
    ]
    async with serving(Script(speed=20, replies=["Hello."]), **cert_files) as (_, _, url):
        code, reason = await closed_by(*endpoint_at(url, ca), frames)
    assert code == 1007
    words = (
        'Invalid JSON payload received. Unknown name "mediaProcessing" at '
        "'tool_response.function_responses[0].parts[0]': Cannot find field."
    )
    assert reason == words.encode()[:123].decode()  # a close frame's 123 bytes


# What google-genai sends on one backend only, sent by hand on the other's path:
# the service's unknown name there, the endpoint's and the emulator's alike.
# enable_enhanced_civic_answers: "This field is not supported in Vertex AI";
# model_selection_config is written `modelConfig` on Vertex AI's wire (its
# converter), so google-genai's own name is Vertex AI's unknown name too;
# HarmBlockMethod: "This enum is not supported in Gemini API".
GEMINI_PATH = "/ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent"
OTHER_BACKENDS = {
    "enableEnhancedCivicAnswers": (
        VERTEX_PATH,
        {"setup": {"model": VERTEX_MODEL, "generationConfig": {"enableEnhancedCivicAnswers": True}}},
        "setup.generation_config",
    ),
    "modelSelectionConfig": (
        VERTEX_PATH,
        {"setup": {"model": VERTEX_MODEL, "generationConfig": {"modelSelectionConfig": {"featureSelectionPreference": "BALANCED"}}}},
        "setup.generation_config",
    ),
    "method": (
        GEMINI_PATH,
        {"setup": {"model": f"models/{MODEL}", "safetySettings": [
            {"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_ONLY_HIGH", "method": "SEVERITY"}]}},
        "setup.safety_settings[0]",
    ),
}


@pytest.mark.parametrize(("name", "case"), OTHER_BACKENDS.items(), ids=OTHER_BACKENDS.keys())
async def test_C41_C43_one_backends_field_on_the_others_path_is_its_1007_unknown_name(ca, cert_files, name, case):
    path, setup, where = case
    async with serving(Script(speed=20, replies=["Hello."]), **cert_files) as (emu, _, url):
        target, ours, headers = endpoint_at(url, ca)
        if path == GEMINI_PATH:
            target, headers = target.replace(VERTEX_PATH, GEMINI_PATH), {"x-goog-api-key": token()}
        endpoint = await closed_by(target, ours, headers, [setup])
        host = emu.base_url.removeprefix("https://")
        service = await closed_by(f"wss://{host}{path}", emu.ssl_context(), {"x-goog-api-key": emu.api_key}, [setup])
        assert len(emu.sessions) == 1  # the service's own: nothing of the endpoint's reached Google
    assert endpoint == service
    words = f"Invalid JSON payload received. Unknown name \"{name}\" at '{where}': Cannot find field."
    assert endpoint == (1007, words.encode()[:123].decode())  # a close frame's 123 bytes
