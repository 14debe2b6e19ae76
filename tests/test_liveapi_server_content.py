"""Conformance rows H (server messages) of the Live API endpoint
(docs/gemini-endpoint.md, "Conformance"): what the model sends besides its
speech reaches the app as the service writes it, read with the unmodified
google-genai client (only its base URL changed).

The Live emulator plays the model; what it sends is written as the Live API
reference describes each message (BidiGenerateContentServerContent:
`modelTurn` parts, `groundingMetadata`, `urlContextMetadata`,
`waitingForInput`; BidiGenerateContentServerMessage: `voiceActivity`), with
the tools that make the service send them declared by the app (Search, code
execution, URL context: ai.google.dev/gemini-api/docs/live-tools).
"""

from __future__ import annotations

import base64
import io

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
from google.genai import types
from PIL import Image as PILImage

from connections.emulator import Fault, Script
from live.liveapi import get_field

pytestmark = pytest.mark.anyio


def chart() -> bytes:
    out = io.BytesIO()
    PILImage.new("RGB", (20, 10), (250, 200, 0)).save(out, "PNG")
    return out.getvalue()


def parts_of(messages: list[types.LiveServerMessage]) -> list[types.Part]:
    return [
        part
        for m in messages
        if m.server_content and m.server_content.model_turn
        for part in m.server_content.model_turn.parts or []
    ]


async def test_H5_H6_H7_H11_H16_thoughts_code_files_grounding_and_url_context_reach_the_app(trusted, cert_files):
    png = chart()
    grounding = {
        "webSearchQueries": ["weather in Paris"],
        "groundingChunks": [{"web": {"uri": "https://example.com/paris", "title": "Paris weather"}}],
        "groundingSupports": [{"segment": {"endIndex": 12, "text": "Sunny, 21 C."}, "groundingChunkIndices": [0]}],
    }
    url_context = {
        "urlMetadata": [{"retrievedUrl": "https://example.com/menu", "urlRetrievalStatus": "URL_RETRIEVAL_STATUS_SUCCESS"}]
    }
    extras = [
        {"serverContent": {"modelTurn": {"parts": [{"text": "The user wants the weather.", "thought": True}]}}},
        {"serverContent": {"modelTurn": {"parts": [{"executableCode": {"language": "PYTHON", "code": "print(6 * 7)"}}]}}},
        {"serverContent": {"modelTurn": {"parts": [{"codeExecutionResult": {"outcome": "OUTCOME_OK", "output": "42\n"}}]}}},
        {"serverContent": {"modelTurn": {"parts": [{"inlineData": {"mimeType": "image/png", "data": base64.b64encode(png).decode()}}]}}},
        {"serverContent": {"groundingMetadata": grounding}},
        {"serverContent": {"urlContextMetadata": url_context}},
    ]
    script = Script(speed=20, replies=["Sunny, 21 C."], extras=extras)
    config = CONFIG.model_copy(
        update={
            "thinking_config": types.ThinkingConfig(include_thoughts=True),  # the thoughts are asked for
            "tools": [
                types.Tool(google_search=types.GoogleSearch()),
                types.Tool(code_execution=types.ToolCodeExecution()),
                types.Tool(url_context=types.UrlContext()),
            ]
        }
    )
    async with serving(script, **cert_files) as (_, _, url):
        async with app_client(url, token()).aio.live.connect(model=MODEL, config=config) as session:
            await session.send_realtime_input(text="what is the weather in Paris?")
            messages = await turn(session)
    assert said(messages) == "Sunny, 21 C."
    parts = parts_of(messages)
    thoughts = [p.text for p in parts if p.thought]
    assert thoughts == ["The user wants the weather."]
    [code] = [p.executable_code for p in parts if p.executable_code]
    assert (code.language, code.code) == (types.Language.PYTHON, "print(6 * 7)")
    [result] = [p.code_execution_result for p in parts if p.code_execution_result]
    assert (result.outcome, result.output) == (types.Outcome.OUTCOME_OK, "42\n")
    [image] = [p.inline_data for p in parts if p.inline_data and p.inline_data.mime_type == "image/png"]
    assert image.data == png
    [searched] = [m.server_content.grounding_metadata for m in messages if m.server_content and m.server_content.grounding_metadata]
    assert searched.web_search_queries == ["weather in Paris"]
    assert searched.grounding_chunks[0].web.uri == "https://example.com/paris"
    assert searched.grounding_supports[0].grounding_chunk_indices == [0]
    [fetched] = [m.server_content.url_context_metadata for m in messages if m.server_content and m.server_content.url_context_metadata]
    assert fetched.url_metadata[0].retrieved_url == "https://example.com/menu"
    assert fetched.url_metadata[0].url_retrieval_status == types.UrlRetrievalStatus.URL_RETRIEVAL_STATUS_SUCCESS
    # The reply's own text is its speech's, never a thought: google-genai's `text` joins non-thought parts only.
    assert "".join(m.text or "" for m in messages) == ""


async def test_H18_the_model_waiting_for_more_words_is_told_to_the_app(trusted, cert_files):
    """google-genai's LiveServerContent.waiting_for_input: "If true, indicates
    that the model is not generating content because it is waiting for more
    input from the user, e.g. because it expects the user to continue talking.\""""
    script = Script(speed=20, replies=["Tea with milk, then."], profile_overrides={"waits_for_more_input": True})
    async with serving(script, **cert_files) as (emu, _, url):
        async with app_client(url, token()).aio.live.connect(model=MODEL, config=CONFIG) as session:
            await session.send_realtime_input(text="I would like tea and")
            waiting = None
            with anyio.fail_after(10):
                async for message in session.receive():
                    if message.server_content and message.server_content.waiting_for_input:
                        waiting = message
                        break
            assert waiting is not None
            await session.send_realtime_input(text="milk, please.")
            messages = await turn(session)
        assert said(messages) == "Tea with milk, then."
        [upstream] = emu.sessions
        assert upstream.model_turns == ["Tea with milk, then."]  # one answer, to the whole of it


async def test_H24_the_models_voice_activity_reaches_the_app(trusted, cert_files):
    """BidiGenerateContentServerMessage.voiceActivity (google-genai
    LiveServerMessage.voice_activity: "Voice activity detection signal"): the
    start and the end of the user's speech as the model heard them."""
    script = Script(speed=20, user_says=["what time is it"], replies=["Half past nine."],
                    profile_overrides={"voice_activity_messages": True})
    async with serving(script, **cert_files) as (_, _, url):
        async with app_client(url, token()).aio.live.connect(model=MODEL, config=CONFIG) as session:
            speech = tone(0.4) + silence(0.8)
            for i in range(0, len(speech), 3200):
                await session.send_realtime_input(audio=types.Blob(data=speech[i : i + 3200], mime_type="audio/pcm;rate=16000"))
                await anyio.sleep(0.01)
            messages = await turn(session)
    assert said(messages) == "Half past nine."
    kinds = [m.voice_activity.voice_activity_type for m in messages if m.voice_activity]
    assert kinds == [types.VoiceActivityType.ACTIVITY_START, types.VoiceActivityType.ACTIVITY_END]


async def test_H27_every_model_turn_says_it_is_the_models_so_an_app_can_keep_it_as_history(trusted, cert_files):
    """google-genai's Content.role: "Optional. The producer of the content. Must
    be either 'user' or 'model'." The reference's modelTurn is "the content that
    the model has generated"; whether the service names its producer is not
    said: the strictest reading, `model` on every one. An app that keeps the
    reply's text as history sends it back as the model's turn, unchanged."""
    script = Script(speed=20, replies=["Half past nine.", "Then it is ten to ten."])
    async with serving(script, **cert_files) as (emu, _, url):
        async with app_client(url, token()).aio.live.connect(model=MODEL, config=CONFIG) as session:
            await session.send_realtime_input(text="what time is it?")
            messages = await turn(session)
            turns = [m.server_content.model_turn for m in messages if m.server_content and m.server_content.model_turn]
            assert turns and all(t.role == "model" for t in turns)
            kept = types.Content(role=turns[0].role, parts=[types.Part(text=said(messages))])
            await session.send_client_content(
                turns=[kept, types.Content(role="user", parts=[types.Part(text="and in twenty minutes?")])]
            )
            assert said(await turn(session)) == "Then it is ten to ten."
    [upstream] = emu.sessions
    [content] = [get_field(f, "clientContent") for f in upstream.frames if get_field(f, "clientContent")]
    assert [get_field(t, "role") for t in get_field(content, "turns")] == ["model", "user"]


G31 = "gemini-3.1-flash-live-preview"
G38_THINKING = "gemini-3.8-live-extended-thinking"


async def test_H12_a_transcription_the_model_marks_finished_reaches_the_app_as_it_came(trusted, cert_files):
    """google-genai's Transcription.finished: "The bool indicates the end of the
    transcription." gemini-3.1 marks the first input transcription message of
    a turn finished, and more fragments follow (google/adk-python#6045): the
    app gets every fragment, that one with its flag, and nothing twice."""
    question = "I would like to know what time it is in Paris right now, and what the weather is like there"
    script = Script(speed=20, user_says=[question], replies=["Half past nine, and sunny."])
    async with serving(script, model=G31, **cert_files) as (_, _, url):
        async with app_client(url, token()).aio.live.connect(model=G31, config=CONFIG) as session:
            speech = tone(0.4) + silence(1.4)
            for i in range(0, len(speech), 3200):
                await session.send_realtime_input(audio=types.Blob(data=speech[i : i + 3200], mime_type="audio/pcm;rate=16000"))
            messages = await turn(session)
    heard = [m.server_content.input_transcription for m in messages if m.server_content and m.server_content.input_transcription]
    assert "".join(t.text or "" for t in heard) == question
    assert len(heard) > 1 and heard[0].finished is True
    assert not any(t.finished for t in heard[1:])
    assert said(messages) == "Half past nine, and sunny."


@pytest.mark.parametrize("model", [MODEL, "gemini-3.1-flash-live-preview"])  # fragments alone, and bundled with audio
async def test_H36_an_output_transcription_the_model_marks_finished_reaches_the_app_as_it_came(trusted, cert_files, model):
    """google-genai's Transcription.finished ("The bool indicates the end of the
    transcription.") on the model's `outputTranscription`: a model that marks
    the fragment ending a reply's transcript (the emulator's
    `output_transcription_finished`) has it reach the app as it came, every
    fragment once, that one with its flag, none put together here."""
    reply = "It is half past nine in Paris, and the weather there is sunny and warm today."
    script = Script(speed=20, replies=[reply], profile_overrides={"output_transcription_finished": True})
    async with serving(script, model=model, **cert_files) as (_, _, url):
        async with app_client(url, token()).aio.live.connect(model=model, config=CONFIG) as session:
            await session.send_realtime_input(text="what time is it in Paris?")
            messages = await turn(session)
    spoken = [m.server_content.output_transcription for m in messages if m.server_content and m.server_content.output_transcription]
    assert "".join(t.text or "" for t in spoken) == reply
    assert len(spoken) > 1 and spoken[-1].finished is True
    assert not any(t.finished for t in spoken[:-1])


async def test_H13_the_interaction_status_of_each_turn_reaches_the_app(trusted, cert_files):
    """google-genai's LiveServerContent.interaction_status (IN_PROGRESS, IDLE),
    sent with turnComplete by gemini-3.8 extended thinking: a filler turn
    completes while the interaction goes on, and google-genai's `receive()`
    ends only at IDLE (`live.py`), so the app reads the filler and the answer
    in one receive."""
    script = Script(speed=20, replies=["Paris is sunny today."])
    async with serving(script, model=G38_THINKING, **cert_files) as (_, _, url):
        async with app_client(url, token()).aio.live.connect(model=G38_THINKING, config=CONFIG) as session:
            await session.send_realtime_input(text="what is the weather in Paris?")
            messages = await turn(session, timeout=20)
    statuses = [
        m.server_content.interaction_status
        for m in messages
        if m.server_content and m.server_content.turn_complete
    ]
    assert statuses == [types.InteractionStatus.IN_PROGRESS, types.InteractionStatus.IDLE]
    assert said(messages).endswith("Paris is sunny today.")
    assert said(messages) != "Paris is sunny today."  # the filler came first, in the same receive


async def test_H26_the_session_id_an_app_reads_names_its_session_in_the_servers_logs(trusted, cert_files, caplog):
    """google-genai's LiveServerSetupComplete.session_id ("The session id of
    the live session."), which `connect()` keeps as `AsyncSession.session_id`:
    each session has its own, and it is the id the server's logs name that
    session by, so an app's report of a bad call finds it."""
    caplog.set_level("INFO", "live.server")
    script = Script(speed=20, replies=["First answer.", "Second answer."])
    async with serving(script, **cert_files) as (_, _, url):
        ids = []
        for question in ("one", "two"):
            async with app_client(url, token()).aio.live.connect(model=MODEL, config=CONFIG) as session:
                await session.send_realtime_input(text=question)
                await turn(session)
                ids.append(session.session_id)
    first, second = ids
    assert first and second and first != second
    for session_id in ids:
        assert f"session {session_id} started" in caplog.text


async def test_H28_generation_complete_follows_the_replys_last_audio_and_precedes_its_turn_complete(trusted, cert_files):
    """google-genai's LiveServerContent.generation_complete: "If true,
    indicates that the model is done generating. When model is interrupted
    while generating there will be no generation_complete message in
    interrupted turn, it will go through interrupted > turn_complete.\""""
    script = Script(speed=20, replies=["It is half past nine in Paris."], chars_per_second=30)
    async with serving(script, **cert_files) as (_, _, url):
        async with app_client(url, token()).aio.live.connect(model=MODEL, config=CONFIG) as session:
            await session.send_realtime_input(text="what time is it?")
            whole = await turn(session)
            # A reply cut by the user's barge-in: no generationComplete in it.
            await session.send_realtime_input(text="tell me more")
            with anyio.fail_after(10):
                async for message in session.receive():
                    if reply_audio([message]):
                        break
            await session.send_realtime_input(text="stop, what day is it?")
            cut = await turn(session)
    done = [i for i, m in enumerate(whole) if m.server_content and m.server_content.generation_complete]
    audio = [i for i, m in enumerate(whole) if reply_audio([m])]
    assert len(done) == 1 and audio and audio[-1] < done[0]
    assert whole[-1].server_content.turn_complete and done[0] < len(whole) - 1
    assert said(whole) == "It is half past nine in Paris."
    assert any(m.server_content and m.server_content.interrupted for m in cut)
    assert not any(m.server_content and m.server_content.generation_complete for m in cut)


async def test_H30_the_models_turn_complete_reason_reaches_the_app_and_the_servers_own_never_does(trusted, cert_files):
    """google-genai's LiveServerContent.turn_complete_reason ("Reason for the
    turn is complete.", a TurnCompleteReason such as NEED_MORE_INPUT: "Needs
    more input from the user."): the model's reason comes with the turn it
    ended, and a turn the model gave none has none. A reply the server cut
    itself, when its connection to the model dropped, ends as the service
    ends a cut reply, with no reason of the server's."""
    script = Script(
        speed=20,
        replies=["It is half past nine.", "Which city do you mean?"],
        turn_complete_reasons={2: "NEED_MORE_INPUT"},
    )
    async with serving(script, **cert_files) as (_, _, url):
        async with app_client(url, token()).aio.live.connect(model=MODEL, config=CONFIG) as session:
            await session.send_realtime_input(text="what time is it?")
            first = await turn(session)
            await session.send_realtime_input(text="and the weather there?")
            second = await turn(session)
    assert said(second) == "Which city do you mean?"
    assert first[-1].server_content.turn_complete and first[-1].server_content.turn_complete_reason is None
    assert second[-1].server_content.turn_complete
    assert second[-1].server_content.turn_complete_reason == types.TurnCompleteReason.NEED_MORE_INPUT

    cut = Script(speed=20, replies=["It is half past nine in Paris, and sunny."], faults=[Fault("mid_generation", n=2)])
    async with serving(cut, **cert_files) as (_, _, url):
        async with app_client(url, token()).aio.live.connect(model=MODEL, config=CONFIG) as session:
            await session.send_realtime_input(text="what time is it in Paris?")
            messages = await turn(session)
    ends = [m.server_content for m in messages if m.server_content and (m.server_content.interrupted or m.server_content.turn_complete)]
    assert ends[-2].interrupted and ends[-1].turn_complete
    assert not any(c.turn_complete_reason for c in ends)


async def speak(session, speech: bytes) -> None:
    for i in range(0, len(speech), 3200):
        await session.send_realtime_input(audio=types.Blob(data=speech[i : i + 3200], mime_type="audio/pcm;rate=16000"))


@pytest.mark.parametrize("asked", [True, False])
async def test_H31_interim_transcripts_reach_an_app_that_asked_for_input_transcription(trusted, cert_files, asked):
    """google-genai's LiveServerContent.interim_input_transcription: "Low
    latency transcription updated while the user is speaking." The model's
    (the emulator's `interim_input_transcription`) reach the app as they came,
    before the turn's `inputTranscription`, and only an app that asked for
    input transcription gets either."""
    question = "I would like to know what time it is"
    script = Script(speed=20, user_says=[question], replies=["Half past nine."],
                    profile_overrides={"interim_input_transcription": True})
    config = CONFIG if asked else CONFIG.model_copy(update={"input_audio_transcription": None})
    async with serving(script, **cert_files) as (_, _, url):
        async with app_client(url, token()).aio.live.connect(model=MODEL, config=config) as session:
            await speak(session, tone(1.0) + silence(1.2))
            messages = await turn(session)
    assert said(messages) == "Half past nine."
    contents = [m.server_content for m in messages if m.server_content]
    interim = [c.interim_input_transcription.text for c in contents if c.interim_input_transcription]
    heard = [c.input_transcription.text for c in contents if c.input_transcription]
    if not asked:
        assert interim == [] and heard == []
        return
    assert len(interim) > 2 and interim[-1] == question
    assert all(question.startswith(t) for t in interim)
    assert "".join(heard) == question  # the turn's own transcript, as before: the interim ones are not in it
    first_interim = next(i for i, c in enumerate(contents) if c.interim_input_transcription)
    first_heard = next(i for i, c in enumerate(contents) if c.input_transcription)
    assert first_interim < first_heard


HEARD_FIELDS = {
    "languageCode": "en-US",
    "speakerLabel": "spk_1",
    "words": [{"word": "what", "startOffset": "0.100s", "endOffset": "0.300s"}],
    "startOffset": "0.100s",
    "endOffset": "0.900s",
}
SAID_FIELDS = {**HEARD_FIELDS, "languageCode": "en-GB", "speakerLabel": "spk_0", "startOffset": "0s"}


@pytest.mark.parametrize("bundle", [False, True], ids=["alone", "with-audio"])
async def test_H29_each_transcription_fragment_reaches_the_app_with_its_language_speaker_words_and_offsets(
    trusted, cert_files, bundle
):
    """google-genai's Transcription: `language_code` ("The BCP-47 language code
    of the transcription"), `speaker_label` ("the speaker of the
    transcription"), `words` ("Word-level timing information") and the
    fragment's `start_offset` / `end_offset`. Each fragment the model sends
    (the emulator's `transcription_fields`) reaches the app with them as it
    came, the one it marked `finished` too, fragments alone or with audio."""
    question = "I would like to know what time it is"
    script = Script(speed=20, user_says=[question], replies=["Half past nine, and a little more."], bundle=bundle,
                    transcription_fields={"inputTranscription": HEARD_FIELDS, "outputTranscription": SAID_FIELDS},
                    profile_overrides={"output_transcription_finished": True})
    async with serving(script, **cert_files) as (_, _, url):
        async with app_client(url, token()).aio.live.connect(model=MODEL, config=CONFIG) as session:
            await speak(session, tone(1.0) + silence(1.2))
            messages = await turn(session)
    assert said(messages) == "Half past nine, and a little more."
    contents = [m.server_content for m in messages if m.server_content]
    heard = [c.input_transcription for c in contents if c.input_transcription]
    spoken = [c.output_transcription for c in contents if c.output_transcription]
    assert "".join(t.text or "" for t in heard) == question
    assert "".join(t.text or "" for t in spoken) == "Half past nine, and a little more."
    assert [t.finished for t in spoken][-1]  # the fragment the model marked finished, with its fields too
    for fragments, fields in ((heard, HEARD_FIELDS), (spoken, SAID_FIELDS)):
        for t in fragments:
            extra = t.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"text", "finished"})
            assert extra == fields, t


async def test_H35_voice_activity_says_where_in_the_apps_audio_the_speech_started_and_ended(trusted, cert_files):
    """google-genai's VoiceActivity.audio_offset: "The time voice activity
    detected in audio time, relative to the start of the audio stream." The
    app's audio reaches the model as it was sent, so the model's offsets (the
    emulator's `voice_activity_audio_offset`) are the app's own audio time."""
    script = Script(speed=20, user_says=["what time is it"], replies=["Half past nine."],
                    profile_overrides={"voice_activity_messages": True, "voice_activity_audio_offset": True})
    async with serving(script, **cert_files) as (_, _, url):
        async with app_client(url, token()).aio.live.connect(model=MODEL, config=CONFIG) as session:
            await speak(session, silence(0.6) + tone(0.4) + silence(1.0))
            messages = await turn(session)
    assert said(messages) == "Half past nine."
    [start, end] = [m.voice_activity for m in messages if m.voice_activity]
    assert start.voice_activity_type == types.VoiceActivityType.ACTIVITY_START
    assert end.voice_activity_type == types.VoiceActivityType.ACTIVITY_END
    # The tone starts 0.6 s into the app's audio and ends at 1.0 s: duration strings, as on the wire.
    assert abs(float(start.audio_offset.removesuffix("s")) - 0.6) <= 0.05
    assert abs(float(end.audio_offset.removesuffix("s")) - 1.0) <= 0.05


USAGE_EXTRA = {
    "cachedContentTokenCount": 40,
    "cacheTokensDetails": [{"modality": "TEXT", "tokenCount": 40}],
    "thoughtsTokenCount": 12,
    "toolUsePromptTokenCount": 9,
    "toolUsePromptTokensDetails": [{"modality": "TEXT", "tokenCount": 9}],
    "serviceTier": "priority",
}


async def test_H33_an_app_reads_the_whole_usage_the_model_reported_for_its_turn(trusted, cert_files):
    """google-genai's UsageMetadata: `prompt_token_count`, `cached_content_token_count`,
    `tool_use_prompt_token_count`, `thoughts_token_count`, their per-modality
    details, and `service_tier` ("Service tier of the request. This field is
    not supported in Vertex AI."): what the model reported for the turn (the
    emulator's `Script.usage`) is what the app reads with the turn's end."""
    script = Script(speed=20, replies=["Half past nine."], usage=USAGE_EXTRA)
    async with serving(script, **cert_files) as (emu, _, url):
        async with app_client(url, token()).aio.live.connect(model=MODEL, config=CONFIG) as session:
            await session.send_realtime_input(text="what time is it?")
            messages = await turn(session)
        [upstream] = emu.sessions
    [sent] = [m["usageMetadata"] for m in upstream.sent if "usageMetadata" in m]
    [usage] = [m.usage_metadata for m in messages if m.usage_metadata]
    assert messages[-1].usage_metadata is usage
    assert usage == types.UsageMetadata.model_validate(sent)  # every field, as the model reported it
    assert usage.prompt_token_count > 0 and usage.prompt_tokens_details
    assert usage.cached_content_token_count == 40 and usage.thoughts_token_count == 12
    assert usage.tool_use_prompt_tokens_details[0].token_count == 9
    assert usage.service_tier == types.ServiceTier.PRIORITY
