"""The emulator driven by the unmodified google-genai SDK over a real TLS socket."""

from __future__ import annotations

import base64
import json
import ssl

import anyio
import pytest
import websockets
from audio_fixtures import silence, tone
from google import genai
from google.genai import errors, types

from connections.emulator import (
    Emulator,
    Fault,
    Script,
    Settings,
    ToolCall,
    emulator_client,
    running_emulator,
)

pytestmark = pytest.mark.anyio

MODEL = "gemini-live-2.5-flash-preview"
FAST = 20.0


async def send_audio(session, pcm: bytes, chunk: int = 640) -> None:
    for i in range(0, len(pcm), chunk):
        await session.send_realtime_input(
            audio=types.Blob(data=pcm[i : i + chunk], mime_type="audio/pcm;rate=16000")
        )


async def until_turn_complete(session, timeout: float = 10.0) -> list[types.LiveServerMessage]:
    got: list[types.LiveServerMessage] = []
    with anyio.fail_after(timeout):
        async for message in session.receive():
            got.append(message)
    return got


async def with_late(session, messages: list[types.LiveServerMessage], quiet: float = 0.3) -> list[types.LiveServerMessage]:
    """`messages` and what follows the turnComplete until `quiet` seconds pass
    without a message: transcripts may arrive after the turn they belong to."""
    got = list(messages)
    with anyio.move_on_after(quiet):
        while True:
            async for message in session.receive():
                got.append(message)
    return got


async def until(session, predicate, timeout: float = 10.0) -> list[types.LiveServerMessage]:
    got: list[types.LiveServerMessage] = []
    with anyio.fail_after(timeout):
        while True:
            async for message in session.receive():
                got.append(message)
                if predicate(message):
                    return got


def transcript(messages, field: str) -> str:
    out = []
    for m in messages:
        sc = m.server_content
        t = sc and getattr(sc, field)
        if t and t.text:
            out.append(t.text)
    return "".join(out)


def audio_of(messages) -> bytes:
    return b"".join(
        p.inline_data.data
        for m in messages
        if m.server_content and m.server_content.model_turn
        for p in m.server_content.model_turn.parts or []
        if p.inline_data
    )


AUDIO_CONFIG = types.LiveConnectConfig(
    response_modalities=[types.Modality.AUDIO],
    input_audio_transcription=types.AudioTranscriptionConfig(),
    output_audio_transcription=types.AudioTranscriptionConfig(),
)


async def test_spoken_turn_end_to_end(live_emulator: Emulator, live_emulator_client: genai.Client):
    live_emulator.script = Script(speed=FAST, user_says=["what time is it"])
    async with live_emulator_client.aio.live.connect(model=MODEL, config=AUDIO_CONFIG) as session:
        await send_audio(session, tone(0.5) + silence(0.7))
        turn = await until_turn_complete(session)
        messages = await with_late(session, turn)
    assert turn[-1].server_content.turn_complete
    # The last fragment of each transcript comes after turnComplete, as the service sends it.
    assert transcript(turn, "input_transcription") == "what time is"
    assert transcript(turn, "output_transcription") == "You said: what time is"
    assert transcript(messages, "input_transcription") == "what time is it"
    assert transcript(messages, "output_transcription") == "You said: what time is it."
    audio = audio_of(messages)
    chunks = [m for m in messages if m.server_content and m.server_content.model_turn]
    assert len(audio) > 24000  # more than half a second of 24 kHz PCM16
    assert all(len(c.server_content.model_turn.parts[0].inline_data.data) <= 1920 for c in chunks)
    assert chunks[0].server_content.model_turn.parts[0].inline_data.mime_type == "audio/pcm;rate=24000"
    flags = [i for i, m in enumerate(turn) if m.server_content and m.server_content.generation_complete]
    assert flags and flags[0] < len(turn) - 1
    last = turn[-1]
    assert last.server_content.turn_complete and last.usage_metadata.total_token_count > 0
    record = live_emulator.sessions[0]
    assert record.route.api_version == "v1beta" and record.headers["x-goog-api-key"]
    assert len(record.audio) == len(tone(0.5) + silence(0.7))


async def test_text_turn_and_history(live_emulator: Emulator, live_emulator_client: genai.Client):
    async with live_emulator_client.aio.live.connect(model=MODEL, config=AUDIO_CONFIG) as session:
        await session.send_client_content(
            turns=[
                types.Content(role="user", parts=[types.Part(text="my name is Ada")]),
                types.Content(role="model", parts=[types.Part(text="hello Ada")]),
            ],
            turn_complete=False,
        )
        await session.send_realtime_input(text="what is my name")
        messages = await with_late(session, await until_turn_complete(session))
    assert transcript(messages, "output_transcription") == "You said: what is my name."
    assert live_emulator.sessions[0].user_turns == ["what is my name"]


async def test_tool_call_round_trip(live_emulator: Emulator, live_emulator_client: genai.Client):
    live_emulator.script = Script(speed=FAST, tool_args={"get_weather": {"city": "Paris"}})
    config = AUDIO_CONFIG.model_copy(
        update={
            "tools": [
                types.Tool(
                    function_declarations=[
                        types.FunctionDeclaration(
                            name="get_weather",
                            parameters=types.Schema(
                                type=types.Type.OBJECT,
                                properties={"city": types.Schema(type=types.Type.STRING)},
                            ),
                        )
                    ]
                )
            ]
        }
    )
    async with live_emulator_client.aio.live.connect(model=MODEL, config=config) as session:
        await session.send_realtime_input(text="please get_weather")
        messages = await until(session, lambda m: m.tool_call is not None)
        (call,) = messages[-1].tool_call.function_calls
        assert call.name == "get_weather" and call.args == {"city": "Paris"} and call.id
        await session.send_tool_response(
            function_responses=[types.FunctionResponse(id=call.id, name=call.name, response={"sky": "clear"})]
        )
        reply = await with_late(session, await until_turn_complete(session))
    assert transcript(reply, "output_transcription") == 'get_weather returned {"sky":"clear"}.'
    assert live_emulator.sessions[0].tool_responses[0]["id"] == call.id


async def test_barge_in_interrupts_and_cancels_tool_calls(live_emulator: Emulator, live_emulator_client: genai.Client):
    live_emulator.script = Script(
        speed=2.0, replies=["this is a rather long answer that takes a while to say"]
    )
    async with live_emulator_client.aio.live.connect(model=MODEL, config=AUDIO_CONFIG) as session:
        await session.send_realtime_input(text="talk to me")
        await until(session, lambda m: bool(m.server_content and m.server_content.model_turn))
        await send_audio(session, tone(0.2))
        got = await until(session, lambda m: bool(m.server_content and m.server_content.interrupted))
        assert got[-1].server_content.interrupted
        # The interrupted turn ends with its own turnComplete, as the service sends it.
        closing = await until_turn_complete(session)
        assert not any(m.server_content and m.server_content.model_turn for m in closing)
        await send_audio(session, silence(0.6))
        after = await with_late(session, await until_turn_complete(session))
        assert transcript(after, "output_transcription") == "You said: user turn 2."
    # a pending tool call is cancelled by speech
    live_emulator.script = Script(speed=FAST, tool_calls={1: [ToolCall("slow_lookup")]})
    async with live_emulator_client.aio.live.connect(model=MODEL, config=AUDIO_CONFIG) as session:
        await session.send_realtime_input(text="look it up")
        (call,) = (await until(session, lambda m: m.tool_call is not None))[-1].tool_call.function_calls
        await send_audio(session, tone(0.2))
        got = await until(session, lambda m: m.tool_call_cancellation is not None)
        assert got[-1].tool_call_cancellation.ids == [call.id]
        assert any(m.server_content and m.server_content.interrupted for m in got)


async def test_resumption_handle_and_resuming(live_emulator: Emulator, live_emulator_client: genai.Client):
    seen = []
    live_emulator.script = Script(speed=FAST, replies=lambda ctx: seen.append(ctx) or f"reply {ctx.turn}")
    config = AUDIO_CONFIG.model_copy(update={"session_resumption": types.SessionResumptionConfig()})
    handle = None
    async with live_emulator_client.aio.live.connect(model=MODEL, config=config) as session:
        await session.send_realtime_input(text="first")
        messages = await until_turn_complete(session)
        updates = [m.session_resumption_update for m in messages if m.session_resumption_update]
        # No handle after setup; while generating, updates say so and carry none.
        assert updates and all(u.resumable is False and not u.new_handle for u in updates)
        more = await until(session, lambda m: bool(m.session_resumption_update and m.session_resumption_update.resumable))
        handle = more[-1].session_resumption_update.new_handle
        assert handle
    resumed = config.model_copy(update={"session_resumption": types.SessionResumptionConfig(handle=handle)})
    async with live_emulator_client.aio.live.connect(model=MODEL, config=resumed) as session:
        await session.send_realtime_input(text="second")
        await until_turn_complete(session)
    assert live_emulator.sessions[1].resumed_from == handle
    assert seen[-1].turn == 2 and [h["parts"][0]["text"] for h in seen[-1].history][:2] == ["first", "reply 1"]
    bad = config.model_copy(update={"session_resumption": types.SessionResumptionConfig(handle="nope")})
    with pytest.raises(errors.APIError) as info:
        async with live_emulator_client.aio.live.connect(model=MODEL, config=bad) as session:
            await until_turn_complete(session)
    assert info.value.code == 1008 and "session not found" in str(info.value)


async def test_go_away_then_close(live_emulator: Emulator, live_emulator_client: genai.Client):
    live_emulator.script = Script(speed=FAST, go_away_after=2.0, go_away_time_left=5.0)
    async with live_emulator_client.aio.live.connect(model=MODEL, config=AUDIO_CONFIG) as session:
        got = await until(session, lambda m: m.go_away is not None)
        assert got[-1].go_away.time_left == "5s"
        with pytest.raises(errors.APIError) as info:
            await until_turn_complete(session, timeout=5)
    assert info.value.code == 1011 and "Deadline expired" in str(info.value)


async def test_wrong_key_is_rejected_with_1008(monkeypatch: pytest.MonkeyPatch):
    async with running_emulator(Script(speed=FAST), api_key="the-right-key") as emulator:
        client = emulator_client(emulator, api_key="a-wrong-key")
        with pytest.raises(errors.APIError) as info:
            async with client.aio.live.connect(model=MODEL, config=AUDIO_CONFIG):
                pass
        assert info.value.code == 1008 and "API key not valid" in str(info.value)
        async with emulator_client(emulator).aio.live.connect(model=MODEL, config=AUDIO_CONFIG):
            pass


async def test_non_live_model_is_rejected_with_1008(live_emulator_client: genai.Client):
    with pytest.raises(errors.APIError) as info:
        async with live_emulator_client.aio.live.connect(model="gemini-2.5-flash", config=AUDIO_CONFIG):
            pass
    assert info.value.code == 1008 and "bidiGenerateContent" in str(info.value)


@pytest.mark.parametrize("version", ["v1alpha", "v1beta", "v1"])
async def test_each_api_version(live_emulator: Emulator, version: str):
    client = emulator_client(live_emulator, api_version=version)
    async with client.aio.live.connect(model=MODEL, config=AUDIO_CONFIG) as session:
        await session.send_realtime_input(text="hi")
        await until_turn_complete(session)
    assert live_emulator.sessions[0].route.api_version == version


async def test_version_not_serving_live_is_1008():
    async with running_emulator(Script(speed=FAST), settings=Settings(api_versions=frozenset({"v1beta"}))) as emulator:
        with pytest.raises(errors.APIError) as info:
            async with emulator_client(emulator, api_version="v1").aio.live.connect(model=MODEL, config=AUDIO_CONFIG):
                pass
    assert info.value.code == 1008 and "API version v1" in str(info.value)


async def test_ephemeral_token_uses_the_constrained_method(live_emulator: Emulator):
    client = emulator_client(live_emulator, api_version="v1alpha", api_key="auth_tokens/dev-token")
    with pytest.warns(errors.ExperimentalWarning):
        async with client.aio.live.connect(model=MODEL, config=AUDIO_CONFIG) as session:
            await session.send_realtime_input(text="hi")
            await until_turn_complete(session)
    record = live_emulator.sessions[0]
    assert record.route.constrained and record.headers["authorization"] == "Token auth_tokens/dev-token"


async def test_environment_variables_path(live_emulator: Emulator, monkeypatch: pytest.MonkeyPatch):
    """The exported lines the CLI prints are enough for a plain genai.Client."""
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", live_emulator.base_url)
    monkeypatch.setenv("SSL_CERT_FILE", live_emulator.ca_file)
    client = genai.Client(api_key="any-key", http_options=types.HttpOptions(api_version="v1beta"))
    async with client.aio.live.connect(model=MODEL, config=AUDIO_CONFIG) as session:
        await session.send_realtime_input(text="hi")
        await until_turn_complete(session)


@pytest.mark.parametrize(
    ("fault", "code", "text"),
    [
        (Fault("after_setup", code=1006), 1006, ""),
        (Fault("after_audio_chunks", code=1007, n=3), 1007, "invalid argument"),
        (Fault("mid_generation", code=1008, n=2), 1008, "policy"),
        (Fault("after_tool_call", code=1011), 1011, "Internal error"),
        (Fault.quota("after_tool_response"), 1011, "RESOURCE_EXHAUSTED"),
    ],
)
async def test_scripted_faults(live_emulator: Emulator, live_emulator_client: genai.Client, fault, code, text):
    live_emulator.script = Script(speed=FAST, faults=[fault], tool_calls={1: [ToolCall("f")]})
    with pytest.raises(errors.APIError) as info:
        async with live_emulator_client.aio.live.connect(model=MODEL, config=AUDIO_CONFIG) as session:
            if fault.when == "after_audio_chunks":
                await send_audio(session, silence(0.1))
            elif fault.when == "mid_generation":
                live_emulator.script.tool_calls = {}
            if fault.when != "after_audio_chunks":
                await session.send_realtime_input(text="go")
            with anyio.fail_after(10):
                while True:
                    async for m in session.receive():
                        if not m.tool_call or fault.when != "after_tool_response":
                            continue
                        await session.send_tool_response(
                            function_responses=[
                                types.FunctionResponse(id=c.id, name=c.name, response={})
                                for c in m.tool_call.function_calls
                            ]
                        )
    assert info.value.code == code and text in str(info.value)


async def test_stall_stops_answering(live_emulator: Emulator, live_emulator_client: genai.Client):
    live_emulator.script = Script(speed=FAST, faults=[Fault.stall("after_setup")])
    async with live_emulator_client.aio.live.connect(model=MODEL, config=AUDIO_CONFIG) as session:
        await session.send_realtime_input(text="hello?")
        with anyio.move_on_after(0.5) as scope:
            await until_turn_complete(session, timeout=5)
        assert scope.cancelled_caught
    assert live_emulator.sessions[0].stalled


async def test_raw_websocket_casings_and_alphabets(live_emulator: Emulator):
    pcm = bytes(range(256)) * 8  # encodes to + / in one alphabet, - _ in the other
    ctx = live_emulator.ssl_context()
    headers = {"x-goog-api-key": "k"}
    async with websockets.connect(live_emulator.ws_url(), ssl=ctx, additional_headers=headers) as ws:
        await ws.send(json.dumps({"setup": {"model": f"models/{MODEL}", "generation_config": {"response_modalities": ["AUDIO"]}}}))
        assert json.loads(await ws.recv()) == {"setupComplete": {}}
        await ws.send(json.dumps({"realtimeInput": {"audio": {"data": base64.b64encode(pcm).decode(), "mimeType": "audio/pcm;rate=16000"}}}))
        await ws.send(json.dumps({"realtime_input": {"audio": {"data": base64.urlsafe_b64encode(pcm).decode().rstrip("="), "mime_type": "audio/pcm;rate=16000"}}}))
        await ws.send(json.dumps({"client_content": {"turns": [{"role": "user", "parts": [{"text": "hi"}]}], "turn_complete": True}}))
        keys = set()
        while True:
            message = json.loads(await ws.recv())
            for value in message.values():
                keys |= set(value)
            if message.get("serverContent", {}).get("turnComplete"):
                break
    assert bytes(live_emulator.sessions[0].audio) == pcm + pcm
    assert all("_" not in k for k in keys)  # camelCase out
    assert "usageMetadata" in message


async def test_raw_access_token_query_and_unknown_path(live_emulator: Emulator):
    ctx = live_emulator.ssl_context()
    url = live_emulator.ws_url("v1alpha", constrained=True) + "?access_token=auth_tokens/x"
    async with websockets.connect(url, ssl=ctx) as ws:
        await ws.send(json.dumps({"setup": {"model": f"models/{MODEL}"}}))
        assert json.loads(await ws.recv()) == {"setupComplete": {}}
    bad = live_emulator.base_url.replace("https", "wss") + "/ws/elsewhere"
    with pytest.raises(websockets.InvalidStatus) as info:
        async with websockets.connect(bad, ssl=ctx):
            pass
    assert info.value.response.status_code == 404


async def test_server_stops_cleanly_with_open_sessions():
    async with running_emulator(Script(speed=FAST)) as emulator:
        client = emulator_client(emulator)
        async with client.aio.live.connect(model=MODEL, config=AUDIO_CONFIG):
            pass
        ctx = emulator.ssl_context()
        ws = await websockets.connect(emulator.ws_url(), ssl=ctx, additional_headers={"x-goog-api-key": "k"})
        await ws.send(json.dumps({"setup": {"model": f"models/{MODEL}"}}))
        await ws.recv()
    with anyio.fail_after(2):
        with pytest.raises(websockets.ConnectionClosed):
            while True:
                await ws.recv()
    assert ws.close_code == 1001


def test_ssl_context_trusts_only_this_emulator():
    emulator = Emulator()
    assert isinstance(emulator.ssl_context(), ssl.SSLContext)
