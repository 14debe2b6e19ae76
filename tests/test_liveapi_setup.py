"""Conformance rows of the Live API endpoint (docs/gemini-endpoint.md,
"Conformance") for `setup`'s generation settings: what an app sets is carried
to the model, or refused as the service refuses it. An app is google-genai
with only its base URL changed (`app_client`); a refusal is checked by
sending the same setup from the same SDK to the endpoint and to the Live
emulator playing the service, and requiring the same close.

What the Live API's reference and guides say, which the tests hold both to:
- BidiGenerateContentSetup.generationConfig: "The following fields are not
  supported: responseLogprobs, responseMimeType, logprobs, responseSchema,
  stopSequence, routingConfig, audioTimestamp";
- only one response modality per session ("only one response modality can be
  set", googleapis/js-genai#382; the close, 1007 "Request contains an invalid
  argument.", quoted in googleapis/go-genai#490 for gemini-live-2.5-flash-preview);
- a native-audio model speaks only: TEXT is refused (googleapis/python-genai#1780);
- Gemini 3.8 refuses `thinking_config`, removed affective dialog, and has
  proactive audio always on ("`proactive_audio: false` is an error"): the
  Gemini 3.8 Live page and Vertex AI's 3.8 migration guide;
- `proactivity` and `enableAffectiveDialog` are fields of v1alpha ("set the
  api version to v1alpha").
"""

from __future__ import annotations

import warnings
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
from live.liveapi import (
    AFFECTIVE_REFUSED,
    INVALID,
    PROACTIVE_OFF_REFUSED,
    THINKING_REFUSED,
    get_field,
    modalities_refused,
)

pytestmark = pytest.mark.anyio

NATIVE_AUDIO = "gemini-2.5-flash-native-audio-preview-12-2025"
G38 = "gemini-3.8-live"


def with_generation(**fields: Any) -> types.LiveConnectConfig:
    """A config with a `generation_config` of its own, as an app sets the
    fields LiveConnectConfig has no name for (google-genai sends it as the
    setup's generationConfig; it warns that the field is deprecated)."""
    return CONFIG.model_copy(update={"generation_config": types.GenerationConfig(**fields)})


async def connect_close(client, model: str, config: types.LiveConnectConfig) -> tuple[int, str]:
    """The close google-genai raises for a session opened with `config`."""
    with pytest.raises(errors.APIError) as caught, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with anyio.fail_after(10):
            async with client.aio.live.connect(model=model, config=config) as session:
                await session.send_realtime_input(text="hello")
                await turn(session)
    return caught.value.code, caught.value.details


async def both_close(emu, url: str, model: str, config: types.LiveConnectConfig, api_version: str | None = None):
    """The endpoint's close and the service's (the emulator's) for one config."""
    options = {"api_version": api_version} if api_version else {}
    endpoint = await connect_close(app_client(url, token(), **options), model, config)
    service = await connect_close(emulator_client(emu, api_version=api_version or "v1"), model, config)
    return endpoint, service


async def answered(client, model: str, config: types.LiveConnectConfig) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        async with client.aio.live.connect(model=model, config=config) as session:
            await session.send_realtime_input(text="hello")
            return said(await turn(session))


# --- carried ---------------------------------------------------------------------


async def test_C5_C6_candidate_count_and_the_penalties_reach_the_model(trusted, cert_files):
    config = with_generation(candidate_count=1, presence_penalty=0.5, frequency_penalty=0.25)
    async with serving(Script(speed=20, replies=["Hello."]), **cert_files) as (emu, _, url):
        assert await answered(app_client(url, token()), MODEL, config) == "Hello."
    [upstream] = emu.sessions
    generation = get_field(upstream.setup, "generationConfig")
    assert get_field(generation, "candidateCount") == 1
    assert get_field(generation, "presencePenalty") == 0.5
    assert get_field(generation, "frequencyPenalty") == 0.25


async def test_C7_thinking_settings_reach_a_model_that_thinks(trusted, cert_files):
    config = CONFIG.model_copy(update={"thinking_config": types.ThinkingConfig(thinking_budget=512, include_thoughts=True)})
    async with serving(Script(speed=20, replies=["Hello."]), **cert_files) as (emu, _, url):
        assert await answered(app_client(url, token()), MODEL, config) == "Hello."
    [upstream] = emu.sessions
    thinking = get_field(get_field(upstream.setup, "generationConfig"), "thinkingConfig")
    assert get_field(thinking, "thinkingBudget") == 512 and get_field(thinking, "includeThoughts") is True


async def test_C10_translation_settings_reach_the_model(trusted, cert_files):
    config = CONFIG.model_copy(
        update={"translation_config": types.TranslationConfig(target_language_code="fr", echo_target_language=False)}
    )
    async with serving(Script(speed=20, replies=["Bonjour."]), **cert_files) as (emu, _, url):
        assert await answered(app_client(url, token()), MODEL, config) == "Bonjour."
    [upstream] = emu.sessions
    translation = get_field(get_field(upstream.setup, "generationConfig"), "translationConfig")
    assert get_field(translation, "targetLanguageCode") == "fr"
    assert get_field(translation, "echoTargetLanguage") is False


# --- refused as the service --------------------------------------------------------

UNSUPPORTED = {
    "responseLogprobs": {"response_logprobs": True},
    "responseMimeType": {"response_mime_type": "application/json"},
    "logprobs": {"logprobs": 3},
    "responseSchema": {"response_schema": types.Schema(type="OBJECT")},
    "stopSequences": {"stop_sequences": ["Goodbye"]},
    "routingConfig": {"routing_config": types.GenerationConfigRoutingConfig(
        auto_mode=types.GenerationConfigRoutingConfigAutoRoutingMode(model_routing_preference="BALANCED"))},
    "audioTimestamp": {"audio_timestamp": True},
}


@pytest.mark.parametrize("fields", UNSUPPORTED.values(), ids=UNSUPPORTED.keys())
async def test_C11_a_generation_field_the_live_api_does_not_support_is_the_services_1007(trusted, cert_files, fields):
    async with serving(Script(speed=20, replies=["Hello."]), **cert_files) as (emu, _, url):
        endpoint, service = await both_close(emu, url, MODEL, with_generation(**fields))
        upstream = len(emu.sessions) - 1  # the service's own connection above is the one
    assert endpoint == service == (1007, INVALID)
    assert upstream == 0  # refused before anything reached Google


async def test_C3_audio_and_text_together_is_the_services_1007(trusted, cert_files):
    config = CONFIG.model_copy(update={"response_modalities": [types.Modality.AUDIO, types.Modality.TEXT]})
    async with serving(Script(speed=20, replies=["Hello."]), **cert_files) as (emu, _, url):
        endpoint, service = await both_close(emu, url, MODEL, config)
    assert endpoint == service == (1007, INVALID)


async def test_C3_text_from_a_native_audio_model_is_refused_as_its_family_refuses_it(trusted, cert_files):
    config = types.LiveConnectConfig(response_modalities=[types.Modality.TEXT])
    async with serving(Script(speed=20, replies=["Hello."]), model=NATIVE_AUDIO, **cert_files) as (emu, _, url):
        endpoint, service = await both_close(emu, url, NATIVE_AUDIO, config)
        # The same app asking for audio is answered.
        assert await answered(app_client(url, token()), NATIVE_AUDIO, CONFIG) == "Hello."
    # A close frame holds 123 bytes of reason: the service's words, cut there.
    reason = modalities_refused(["TEXT"], f"models/{NATIVE_AUDIO}", ("AUDIO",)).encode()[:123].decode()
    assert endpoint == service == (1007, reason)


async def test_C7_thinking_settings_on_3_8_are_the_services_1007(trusted, cert_files):
    config = CONFIG.model_copy(update={"thinking_config": types.ThinkingConfig(thinking_budget=0)})
    async with serving(Script(speed=20, replies=["Hello."]), model=G38, **cert_files) as (emu, _, url):
        endpoint, service = await both_close(emu, url, G38, config)
    assert endpoint == service == (1007, THINKING_REFUSED)


V1ALPHA_ON_38 = {
    "enable_affective_dialog": ({"enable_affective_dialog": True}, AFFECTIVE_REFUSED),
    "proactive_audio off": ({"proactivity": types.ProactivityConfig(proactive_audio=False)}, PROACTIVE_OFF_REFUSED),
}


@pytest.mark.parametrize(("fields", "reason"), V1ALPHA_ON_38.values(), ids=V1ALPHA_ON_38.keys())
async def test_C8_C9_what_3_8_removed_from_v1alpha_is_the_services_1007(trusted, cert_files, fields, reason):
    config = CONFIG.model_copy(update=fields)
    async with serving(Script(speed=20, replies=["Hello."]), model=G38, **cert_files) as (emu, _, url):
        endpoint, service = await both_close(emu, url, G38, config, api_version="v1alpha")
    assert endpoint == service == (1007, reason)


async def test_C8_C9_proactivity_and_affective_dialog_on_v1alpha_reach_the_model(trusted, cert_files):
    config = CONFIG.model_copy(
        update={"proactivity": types.ProactivityConfig(proactive_audio=True), "enable_affective_dialog": True}
    )
    async with serving(Script(speed=20, replies=["Hello."]), model=NATIVE_AUDIO, **cert_files) as (emu, _, url):
        client = app_client(url, token(), api_version="v1alpha")
        assert await answered(client, NATIVE_AUDIO, config) == "Hello."
    [upstream] = emu.sessions
    assert get_field(get_field(upstream.setup, "proactivity"), "proactiveAudio") is True
    assert get_field(get_field(upstream.setup, "generationConfig"), "enableAffectiveDialog") is True


async def test_C32_the_transcriptions_options_reach_the_model(trusted, cert_files):
    heard = types.AudioTranscriptionConfig(language_codes=["en-US"], custom_vocabulary=["Zorblax"])
    spoken = types.AudioTranscriptionConfig(language_codes=["fr-FR"])
    config = CONFIG.model_copy(update={"input_audio_transcription": heard, "output_audio_transcription": spoken})
    async with serving(Script(speed=20, replies=["Hello."]), **cert_files) as (emu, _, url):
        assert await answered(app_client(url, token()), MODEL, config) == "Hello."
    [upstream] = emu.sessions
    assert get_field(get_field(upstream.setup, "inputAudioTranscription"), "languageCodes") == ["en-US"]
    assert get_field(get_field(upstream.setup, "inputAudioTranscription"), "customVocabulary") == ["Zorblax"]
    assert get_field(get_field(upstream.setup, "outputAudioTranscription"), "languageCodes") == ["fr-FR"]


async def test_C33_safety_settings_reach_the_model(trusted, cert_files):
    safety = types.SafetySetting(
        category=types.HarmCategory.HARM_CATEGORY_HARASSMENT, threshold=types.HarmBlockThreshold.BLOCK_ONLY_HIGH
    )
    config = CONFIG.model_copy(update={"safety_settings": [safety]})
    async with serving(Script(speed=20, replies=["Hello."]), **cert_files) as (emu, _, url):
        assert await answered(app_client(url, token()), MODEL, config) == "Hello."
    [upstream] = emu.sessions
    [setting] = get_field(upstream.setup, "safetySettings")
    assert get_field(setting, "category") == "HARM_CATEGORY_HARASSMENT"
    assert get_field(setting, "threshold") == "BLOCK_ONLY_HIGH"


async def test_C37_the_voice_and_its_language_reach_the_model(trusted, cert_files):
    """`speechConfig.languageCode` (BCP-47) with a prebuilt voice: a half-cascade
    model speaks the language set (native audio "automatically chooses the
    appropriate language", the Live guide: the field reaches it all the same)."""
    speech = types.SpeechConfig(
        voice_config=types.VoiceConfig(prebuilt_voice_config=types.PrebuiltVoiceConfig(voice_name="Kore")),
        language_code="fr-FR",
    )
    async with serving(Script(speed=20, replies=["Bonjour."]), **cert_files) as (emu, _, url):
        assert await answered(app_client(url, token()), MODEL, CONFIG.model_copy(update={"speech_config": speech})) == "Bonjour."
    [upstream] = emu.sessions
    sent = get_field(get_field(upstream.setup, "generationConfig"), "speechConfig")
    assert get_field(sent, "languageCode") == "fr-FR"
    assert get_field(get_field(get_field(sent, "voiceConfig"), "prebuiltVoiceConfig"), "voiceName") == "Kore"


async def test_C34_labels_reach_the_model(trusted, cert_files):
    """google-genai sends `labels` in the setup on the Gemini API (on Vertex AI
    it refuses to: "labels parameter is only supported in Gemini Developer API
    mode"), and the service bills the session under them."""
    config = CONFIG.model_copy(update={"labels": {"team": "support", "app": "kiosk"}})
    async with serving(Script(speed=20, replies=["Hello."]), **cert_files) as (emu, _, url):
        assert await answered(app_client(url, token()), MODEL, config) == "Hello."
    [upstream] = emu.sessions
    assert get_field(upstream.setup, "labels") == {"team": "support", "app": "kiosk"}


# --- C41: generationConfig's fields of one backend -----------------------------------
# google-genai's GenerationConfig.enable_enhanced_civic_answers: "This field is
# not supported in Vertex AI" (the Gemini API's, and the Live reference's list
# of unsupported fields does not name it: carried). model_selection_config: its
# generateContent converter raises "model_selection_config parameter is only
# supported in Gemini Enterprise Agent Platform mode, not in Gemini Developer
# API mode"; ResponseFormat: "This data type is not supported in Gemini API".
# Its Live converter sends the app's GenerationConfig to the Gemini API as
# given, so an app there sends both: the service's unknown name (strictest).


async def test_C41_enhanced_civic_answers_reach_the_model(trusted, cert_files):
    config = with_generation(enable_enhanced_civic_answers=True)
    async with serving(Script(speed=20, replies=["Hello."]), **cert_files) as (emu, _, url):
        assert await answered(app_client(url, token()), MODEL, config) == "Hello."
    [upstream] = emu.sessions
    assert get_field(get_field(upstream.setup, "generationConfig"), "enableEnhancedCivicAnswers") is True


VERTEX_ONLY_GENERATION = {
    "model_selection_config": {
        "model_selection_config": types.ModelSelectionConfig(
            feature_selection_preference=types.FeatureSelectionPreference.PRIORITIZE_QUALITY
        )
    },
    "response_format": {
        "response_format": [types.ResponseFormat(audio=types.AudioResponseFormat(mime_type="audio/mpeg"))]
    },
}


@pytest.mark.parametrize(("name", "fields"), VERTEX_ONLY_GENERATION.items(), ids=VERTEX_ONLY_GENERATION.keys())
async def test_C41_vertex_ais_generation_fields_on_the_gemini_api_are_the_services_1007_unknown_name(
    trusted, cert_files, name, fields
):
    async with serving(Script(speed=20, replies=["Hello."]), **cert_files) as (emu, _, url):
        endpoint, service = await both_close(emu, url, MODEL, with_generation(**fields))
        upstream = len(emu.sessions) - 1  # the service's own connection above is the one
    words = f"Invalid JSON payload received. Unknown name \"{name}\" at 'setup.generation_config': Cannot find field."
    assert endpoint == service == (1007, words)
    assert upstream == 0  # refused before anything reached Google
