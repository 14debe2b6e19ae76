"""The real GeminiLlmConnection, driven through the in-process double (and once over TLS)."""

from __future__ import annotations

import contextlib
import json
import ssl
from collections.abc import AsyncIterator

import anyio
import pytest
import trustme
import websockets
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from connections import double
from connections.gemini import Gemini, GeminiLlmConnection, VertexConfig
from live import (
    AUDIO_STREAM_END,
    ConfigurationError,
    ConnectionClosedError,
    InvalidArgumentError,
    LiveError,
    LlmRequest,
    LlmResponse,
    QuotaExhaustedError,
    RecoverableConnectionError,
)

pytestmark = pytest.mark.anyio

MODEL = "gemini-2.5-flash-native-audio-preview-09-2025"
MODEL_3 = "gemini-3.1-flash-live-preview"
PCM = b"\x10\x00" * 960
MIC = types.Blob(data=b"\x00\x01" * 320, mime_type="audio/pcm;rate=16000")
ENV_VARS = (
    "GOOGLE_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_GENAI_USE_VERTEXAI",
    "GOOGLE_GENAI_USE_ENTERPRISE",
    "GOOGLE_GEMINI_BASE_URL",
    "GOOGLE_GENAI_API_VERSION",
    "GOOGLE_CLOUD_PROJECT",
    "GOOGLE_CLOUD_LOCATION",
    "SSL_CERT_FILE",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


def gemini(*sessions: double.ScriptedSession, model: str = MODEL) -> tuple[Gemini, double.DoubleTransport]:
    transport = double.DoubleTransport(*sessions)
    return Gemini(model, transport=transport), transport


async def collect(connection: GeminiLlmConnection, until: int | None = None) -> list[LlmResponse]:
    """Responses until the iteration ends (or `until` of them were received)."""
    out: list[LlmResponse] = []
    async with contextlib.aclosing(connection.receive()) as responses:
        async for response in responses:
            out.append(response)
            if until is not None and len(out) >= until:
                break
    return out


MANUAL = LlmRequest(
    live_connect_config=types.LiveConnectConfig(
        realtime_input_config=types.RealtimeInputConfig(
            automatic_activity_detection=types.AutomaticActivityDetection(disabled=True)
        )
    )
)
"""A request for a connection whose turns the client marks with activity signals."""


def user_text(text: str) -> types.Content:
    return types.Content(role="user", parts=[types.Part(text=text)])


def answer(*calls: types.FunctionCall, **results: object) -> types.Content:
    return types.Content(
        role="user",
        parts=[
            types.Part(
                function_response=types.FunctionResponse(
                    id=call.id, name=call.name, response={"result": results[call.name]}
                )
            )
            for call in calls
        ],
    )


# -- tool calls -----------------------------------------------------------------


async def test_worked_example_tool_call_id_round_trips_exactly() -> None:
    session = double.ScriptedSession(
        double.tool_call("lookupInvoice", {"invoiceId": "4411"}, id="call_7f2")
    )
    session.on_tool_response(
        double.output_transcript("Invoice 4411 is paid."),
        double.audio(PCM),
        double.turn_complete(),
    )
    llm, transport = gemini(session)
    async with llm.connect(LlmRequest()) as connection:
        received: list[LlmResponse] = []
        async for response in connection.receive():
            received.append(response)
            for call in response.function_calls:
                assert call.args == {"invoiceId": "4411"}
                await connection.send_content(answer(call, lookupInvoice={"status": "paid"}))
            if response.turn_complete:
                await connection.close()
    [tool_response] = session.tool_responses
    [sent] = tool_response.function_responses
    assert (sent.id, sent.name) == ("call_7f2", "lookupInvoice")
    assert sent.response == {"result": {"status": "paid"}}
    assert [r.output_transcription.text for r in received if r.output_transcription and r.output_transcription.finished] == ["Invoice 4411 is paid."]
    assert any(r.audio_chunks == [PCM] for r in received)
    assert transport.connects[0].model == MODEL


async def test_generated_id_round_trips_too() -> None:
    session = double.ScriptedSession(double.tool_call("getTime"))
    llm, _ = gemini(session)
    async with llm.connect(LlmRequest()) as connection:
        [response] = await collect(connection, until=1)
        [call] = response.function_calls
        assert call.id and call.id.startswith("live-")
        await connection.send_content(answer(call, getTime="12:00"))
    assert session.tool_responses[0].function_responses[0].id == call.id


async def test_two_parallel_tool_calls_answered_in_one_tool_response() -> None:
    session = double.ScriptedSession(
        double.tool_calls(
            types.FunctionCall(name="getWeather", args={"city": "Oslo"}, id="w-1"),
            types.FunctionCall(name="getTime", args={"tz": "CET"}, id="t-1"),
        )
    )
    session.on_tool_response(double.output_transcript("Cold, noon."), double.turn_complete())
    llm, _ = gemini(session)
    async with llm.connect(LlmRequest()) as connection:
        [calls] = await collect(connection, until=1)
        assert [c.id for c in calls.function_calls] == ["w-1", "t-1"]
        await connection.send_content(answer(*calls.function_calls, getWeather="-3C", getTime="12:00"))
        rest = await collect(connection, until=2)
    assert len(session.tool_responses) == 1
    sent = session.tool_responses[0].function_responses
    assert [(r.id, r.name) for r in sent] == [("w-1", "getWeather"), ("t-1", "getTime")]
    assert rest[-1].turn_complete


async def test_tool_response_without_id_or_mixed_content_is_refused() -> None:
    llm, _ = gemini(double.ScriptedSession())
    async with llm.connect(LlmRequest()) as connection:
        no_id = types.FunctionResponse(name="f", response={})
        with pytest.raises(ValueError, match="id"):
            await connection.send_content(types.Content(role="user", parts=[types.Part(function_response=no_id)]))
        mixed = types.Content(
            role="user",
            parts=[types.Part(function_response=types.FunctionResponse(id="1", name="f", response={})),
                   types.Part(text="and also")],
        )
        with pytest.raises(ValueError, match="only function responses"):
            await connection.send_content(mixed)


async def test_cancelled_tool_calls_surface() -> None:
    session = double.ScriptedSession(
        double.tool_call("slow", id="s-1"), double.tool_call_cancellation("s-1")
    ).close_with(1000)
    llm, _ = gemini(session)
    async with llm.connect(LlmRequest()) as connection:
        out = await collect(connection)
    assert out[1].cancelled_tool_call_ids == ("s-1",)


# -- the receive loop ---------------------------------------------------------------


async def test_receive_spans_turns_and_bundles_surface_every_field() -> None:
    session = double.ScriptedSession(
        double.output_transcript("Hi"),
        double.turn_complete(),
        double.bundle(
            double.audio(PCM),
            double.output_transcript("Bye"),
            double.usage(prompt=5, response=2),
            double.turn_complete(),
        ),
    ).close_with(1000)
    llm, _ = gemini(session)
    async with llm.connect(LlmRequest()) as connection:
        out = await collect(connection)
    finals = [r.output_transcription.text for r in out if r.output_transcription and r.output_transcription.finished]
    assert finals == ["Hi", "Bye"]  # the second turn is received too, and starts afresh
    assert sum(r.turn_complete for r in out) == 2
    bundled = [r for r in out if r.audio_chunks]
    assert bundled[0].output_transcription.text == "Bye" and bundled[0].usage_metadata.total_token_count == 7


async def test_interruption_in_the_middle_of_a_generation() -> None:
    session = double.ScriptedSession(
        double.audio(PCM), double.output_transcript("Once upon"), double.audio(PCM)
    )
    session.on_activity_end(double.interrupted(), double.output_transcript("Yes?"), double.turn_complete())
    llm, _ = gemini(session)
    async with llm.connect(MANUAL) as connection:
        head = await collect(connection, until=3)
        assert all(not r.interrupted for r in head)
        await connection.send_realtime(types.ActivityStart())
        await connection.send_realtime(types.ActivityEnd())
        tail = await collect(connection, until=3)
    assert tail[0].interrupted and not tail[0].turn_complete
    assert tail[0].output_transcription.text == "Once upon" and tail[0].output_transcription.finished
    assert tail[-1].turn_complete and tail[-1].output_transcription.text == "Yes?"


async def test_sessions_keep_their_own_transcripts() -> None:
    a = double.ScriptedSession(double.output_transcript("alpha "))
    b = double.ScriptedSession(double.output_transcript("beta "))
    llm, _ = gemini(a, b)
    async with llm.connect(LlmRequest()) as ca, llm.connect(LlmRequest()) as cb:
        await collect(ca, until=1)
        await collect(cb, until=1)
        a.push(double.output_transcript("one"), double.turn_complete())
        b.push(double.output_transcript("two"), double.turn_complete())
        out_a = await collect(ca, until=2)
        out_b = await collect(cb, until=2)
    assert out_a[-1].output_transcription.text == "alpha one"
    assert out_b[-1].output_transcription.text == "beta two"


async def test_only_one_receiver() -> None:
    llm, _ = gemini(double.ScriptedSession())
    async with llm.connect(LlmRequest()) as connection, anyio.create_task_group() as tg:
        started = anyio.Event()

        async def first() -> None:
            started.set()
            await collect(connection)

        tg.start_soon(first)
        await started.wait()
        await anyio.wait_all_tasks_blocked()
        with pytest.raises(RuntimeError, match="one task"):
            await collect(connection)
        await connection.close()


# -- close codes ------------------------------------------------------------------------


async def test_normal_close_ends_quietly_even_after_go_away() -> None:
    session = double.ScriptedSession(double.audio(PCM), double.go_away("9.5s"), double.Close(1000))
    llm, _ = gemini(session)
    async with llm.connect(LlmRequest()) as connection:
        out = await collect(connection)
        assert out[-1].go_away_time_left == 9.5
        with pytest.raises(ConnectionClosedError):
            await connection.send_realtime(MIC)


@pytest.mark.parametrize(
    ("code", "reason", "error", "hint_words"),
    [
        (1006, "", RecoverableConnectionError, "reconnect"),
        (1011, "Internal error occurred.", RecoverableConnectionError, "resumption"),
        (1011, "RESOURCE_EXHAUSTED: You exceeded your current quota", QuotaExhaustedError, "later"),
        (1007, "Request contains an invalid argument.", InvalidArgumentError, "never replay"),
        (
            1008,
            "models/gemini-2.0-flash is not found for API version v1beta, or is not supported "
            "for bidiGenerateContent. Call ListModels to see the list of available models.",
            ConfigurationError,
            "bidiGenerateContent",
        ),
        (1008, "Unsupported API version v1.", ConfigurationError, "GOOGLE_GENAI_API_VERSION"),
        (1007, "API key not valid. Please pass a valid API key.", ConfigurationError, "GOOGLE_API_KEY"),
        (1008, "Policy violation.", ConfigurationError, "bidiGenerateContent"),
    ],
)
async def test_close_codes_become_typed_errors(
    code: int, reason: str, error: type[LiveError], hint_words: str
) -> None:
    session = double.ScriptedSession(double.audio(PCM)).close_with(code, reason)
    llm, _ = gemini(session)
    async with llm.connect(LlmRequest()) as connection:
        out: list[LlmResponse] = []
        with pytest.raises(error) as info:
            async for response in connection.receive():
                out.append(response)
        assert len(out) == 1  # what came before the close was delivered
        assert info.value.close_code == code
        assert hint_words in (info.value.hint or "")
        assert isinstance(info.value.__cause__, genai_errors.APIError)
        # The socket is gone: sends say so, with the same classification.
        with pytest.raises(ConnectionClosedError):
            await connection.send_realtime(MIC)


async def test_an_unexpected_session_failure_is_still_a_live_error() -> None:
    class Garbled(double.ScriptedSession):
        async def receive(self):  # type: ignore[no-untyped-def, override]
            yield double.audio(PCM)
            raise ValueError("Failed to parse response: b'{'")

    llm, _ = gemini(Garbled())
    async with llm.connect(LlmRequest()) as connection:
        with pytest.raises(LiveError, match="Failed to parse") as info:
            await collect(connection)
    assert type(info.value) is LiveError and not info.value.recoverable
    assert isinstance(info.value.__cause__, ValueError)


async def test_send_on_a_socket_the_server_dropped_is_typed() -> None:
    session = double.ScriptedSession()
    llm, _ = gemini(session)
    async with llm.connect(LlmRequest()) as connection:
        await connection.send_realtime(MIC)
        session.drop(1011, "Internal error")
        # Sends on an ended connection raise ConnectionClosedError (the
        # contract), naming the cause; receive() raises the typed error.
        with pytest.raises(ConnectionClosedError, match="RecoverableConnectionError") as info:
            await connection.send_realtime(MIC)
        assert info.value.close_code == 1011
        assert "reconnect" in (info.value.hint or "")
        assert isinstance(info.value.__cause__, websockets.ConnectionClosed)
        with pytest.raises(RecoverableConnectionError):
            await collect(connection)
        with pytest.raises(ConnectionClosedError):
            await connection.send_realtime(MIC)
    assert session.audio_chunks == 1


async def test_close_is_idempotent_ends_receive_quietly_and_blocks_sends() -> None:
    session = double.ScriptedSession(double.audio(PCM))
    llm, _ = gemini(session)
    async with llm.connect(LlmRequest()) as connection:
        out: list[LlmResponse] = []
        async with anyio.create_task_group() as tg:

            async def receiver() -> None:
                out.extend(await collect(connection))

            tg.start_soon(receiver)
            await anyio.wait_all_tasks_blocked()
            await connection.close()
            await connection.close()
        assert len(out) == 1
        assert connection.closed
        with pytest.raises(ConnectionClosedError):
            await connection.send_content(user_text("anyone?"))
    assert session.closed_by_client


async def test_connect_refused_and_connect_timeout_are_typed() -> None:
    refused = double.ScriptedSession(
        refuse=double.Close(1008, "models/gemini-x is not found for API version v1beta")
    )
    llm, _ = gemini(refused, model="gemini-x")
    with pytest.raises(ConfigurationError, match="not found") as info:
        async with llm.connect(LlmRequest()):
            pass
    assert "gemini-x" in (info.value.hint or "")

    @contextlib.asynccontextmanager
    async def black_hole(model: str, config: types.LiveConnectConfig) -> AsyncIterator[double.ScriptedSession]:
        await anyio.sleep_forever()
        yield double.ScriptedSession()  # pragma: no cover

    slow = Gemini(MODEL, transport=black_hole, connect_timeout=0.05)
    with anyio.fail_after(2), pytest.raises(RecoverableConnectionError, match="longer than"):
        async with slow.connect(LlmRequest()):
            pass


async def test_leaving_the_context_closes_the_session() -> None:
    session = double.ScriptedSession()
    llm, _ = gemini(session)
    with pytest.raises(KeyError):
        async with llm.connect(LlmRequest()):
            raise KeyError("boom")  # the caller's own error passes through untouched
    assert session.closed_by_client


# -- history ------------------------------------------------------------------------------


def _voice(role: str) -> types.Content:
    return types.Content(
        role=role,
        parts=[types.Part(text="(spoken)"), types.Part(inline_data=types.Blob(data=b"\0\0", mime_type="audio/pcm;rate=24000"))],
    )


async def test_history_seed_rules() -> None:
    history = [_voice("user"), types.Content(role="model", parts=[types.Part(text="Hello!")])]
    session = double.ScriptedSession()
    llm, transport = gemini(session)
    async with llm.connect(LlmRequest(contents=history)) as connection:
        await connection.send_history(history)
        with pytest.raises(RuntimeError, match="already sent"):
            await connection.send_history(history)
    [seed] = session.client_contents
    assert seed.turn_complete is False  # the model spoke last: no answer wanted
    assert [t.role for t in seed.turns] == ["user", "model"]
    assert all(p.inline_data is None for t in seed.turns for p in t.parts)  # audio stripped
    assert transport.connects[0].config.history_config is None  # 2.x: no initial-history mode


async def test_gemini3_history_seed_completes_and_triggers_no_reply() -> None:
    history = [user_text("I am Ada."), types.Content(role="model", parts=[types.Part(text="Hi Ada.")])]
    session = double.ScriptedSession()
    session.on_text(double.output_transcript("Hello again, Ada."), double.turn_complete())
    llm, transport = gemini(session, model=MODEL_3)
    async with llm.connect(LlmRequest(contents=history)) as connection:
        await connection.send_history(history)
        await connection.send_content(user_text("Who am I?"))
        out = await collect(connection, until=2)
    assert transport.connects[0].config.history_config.initial_history_in_client_content is True
    # Under the flag the seed must complete, though the model spoke last;
    # otherwise the service would take no realtime input after it.
    assert session.client_contents[0].turn_complete is True
    assert session.ignored == 0
    assert out[-1].output_transcription.text == "Hello again, Ada."


async def test_gemini3_history_ending_with_the_user_is_answered_like_on_2x() -> None:
    history = [user_text("I am Ada."), types.Content(role="model", parts=[types.Part(text="Hi Ada.")]),
               user_text("Who am I?")]
    session = double.ScriptedSession()
    session.on_text(double.output_transcript("You are Ada."), double.turn_complete())
    llm, _ = gemini(session, model=MODEL_3)
    async with llm.connect(LlmRequest(contents=history)) as connection:
        await connection.send_history(history)
        out = await collect(connection, until=2)
    [seed] = session.client_contents
    assert [t.parts[0].text for t in seed.turns] == ["I am Ada.", "Hi Ada."] and seed.turn_complete
    assert session.realtime_inputs[0].text == "Who am I?"  # after the seed: answered
    assert out[-1].output_transcription.text == "You are Ada."


async def test_a_resumed_connection_never_carries_the_history_flag() -> None:
    config = types.LiveConnectConfig(
        history_config=types.HistoryConfig(initial_history_in_client_content=True),
        session_resumption=types.SessionResumptionConfig(handle="h1"),
    )
    session = double.ScriptedSession()
    session.on_text(double.output_transcript("Still here."), double.turn_complete())
    llm, transport = gemini(session, model=MODEL_3)
    async with llm.connect(LlmRequest(live_connect_config=config)) as connection:
        await connection.send_content(user_text("Hello?"))
        out = await collect(connection, until=2)
    assert not transport.connects[0].config.history_config.initial_history_in_client_content
    assert out[-1].output_transcription.text == "Still here."


async def test_history_ending_with_the_user_asks_for_an_answer() -> None:
    history = [types.Content(role="model", parts=[types.Part(text="Hi")]), user_text("What now?")]
    session = double.ScriptedSession()
    session.on_client_content(double.output_transcript("Now this."), double.turn_complete())
    llm, _ = gemini(session)
    async with llm.connect(LlmRequest(contents=history)) as connection:
        await connection.send_history(history)
        out = await collect(connection, until=2)
    assert session.client_contents[0].turn_complete is True
    assert out[-1].output_transcription.text == "Now this."


async def test_empty_history_sends_nothing_and_late_history_is_refused() -> None:
    session = double.ScriptedSession()
    llm, transport = gemini(session)
    async with llm.connect(LlmRequest()) as connection:
        await connection.send_history([types.Content(role="user", parts=[_voice("user").parts[1]])])
        assert session.sent == []
    assert transport.connects[0].config.history_config is None  # 2.x, no history: untouched
    session2 = double.ScriptedSession()
    llm2, _ = gemini(session2)
    async with llm2.connect(LlmRequest()) as connection:
        await connection.send_realtime(MIC)
        with pytest.raises(RuntimeError, match="right after connecting"):
            await connection.send_history([user_text("too late")])


async def test_gemini3_without_history_has_no_history_flag_and_takes_text_as_realtime() -> None:
    session = double.ScriptedSession()
    llm, transport = gemini(session, model=MODEL_3)
    async with llm.connect(LlmRequest()) as connection:
        await connection.send_content(user_text("What's up?"))
    # With the flag and no seed the service would wait for one, deaf to everything.
    assert transport.connects[0].config.history_config is None
    [message] = session.sent
    assert message.realtime_input.text == "What's up?"
    assert message.client_content is None


async def test_user_text_on_2x_is_a_complete_client_turn() -> None:
    session = double.ScriptedSession()
    llm, _ = gemini(session)
    async with llm.connect(LlmRequest()) as connection:
        await connection.send_content(types.Content(parts=[types.Part(text="Hello")]))
    [content] = session.client_contents
    assert content.turn_complete is True
    assert content.turns[0].role == "user" and content.turns[0].parts[0].text == "Hello"


async def test_request_model_overrides_and_config_reaches_the_transport() -> None:
    config = types.LiveConnectConfig(response_modalities=[types.Modality.AUDIO])
    llm, transport = gemini(double.ScriptedSession())
    async with llm.connect(LlmRequest(model="gemini-2.0-flash-live-001", live_connect_config=config)):
        pass
    record = transport.connects[0]
    assert record.model == "gemini-2.0-flash-live-001"
    assert record.config is config


# -- realtime -----------------------------------------------------------------------------


async def test_realtime_routing() -> None:
    session = double.ScriptedSession()
    llm, _ = gemini(session)
    image = types.Blob(data=b"\xff\xd8\xff", mime_type="image/jpeg")
    async with llm.connect(MANUAL) as connection:
        await connection.send_realtime(MIC)
        await connection.send_realtime(image)
        await connection.send_realtime(types.ActivityStart())
        await connection.send_realtime(types.ActivityEnd())
        await connection.send_realtime(AUDIO_STREAM_END)
        with pytest.raises(TypeError, match="mime type"):
            await connection.send_realtime(types.Blob(data=b"x", mime_type="application/pdf"))
        with pytest.raises(TypeError, match="send_realtime takes"):
            await connection.send_realtime(b"raw bytes")  # type: ignore[arg-type]
    inputs = session.realtime_inputs
    assert inputs[0].audio is MIC
    assert inputs[1].video is image and inputs[1].audio is None
    assert inputs[2].activity_start is not None
    assert inputs[3].activity_end is not None
    assert inputs[4].audio_stream_end is True
    assert len(inputs) == 5


# -- backend and configuration ---------------------------------------------------------------


def test_no_key_fails_at_construction_naming_the_variable() -> None:
    with pytest.raises(ConfigurationError, match="GOOGLE_API_KEY"):
        Gemini("gemini-x")


def test_key_from_env_and_explicit_gemini_api_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEMINI_API_KEY", "env-gemini-key")
    monkeypatch.setenv("GOOGLE_GENAI_USE_VERTEXAI", "true")  # must not flip the backend
    llm = Gemini("gemini-x")
    assert llm.backend == "gemini-api"
    assert llm.client is not None and llm.client.vertexai is False
    assert llm.client._api_client.api_key == "env-gemini-key"
    monkeypatch.setenv("GOOGLE_API_KEY", "env-google-key")  # wins over GEMINI_API_KEY
    assert Gemini("gemini-x").client._api_client.api_key == "env-google-key"


def test_http_options_timeout_version_and_base_url(monkeypatch: pytest.MonkeyPatch) -> None:
    options = Gemini("gemini-x", api_key="k").client._api_client._http_options
    assert options.timeout == 60_000  # milliseconds: a request timeout is always set
    assert options.api_version == "v1beta"
    assert options.base_url == "https://generativelanguage.googleapis.com/"
    monkeypatch.setenv("GOOGLE_GENAI_API_VERSION", "v1alpha")
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", "https://127.0.0.1:9443")
    options = Gemini("gemini-x", api_key="k", request_timeout=5).client._api_client._http_options
    assert options.api_version == "v1alpha"
    assert options.base_url.startswith("https://127.0.0.1:9443")
    assert options.timeout == 5_000


def test_ssl_cert_file_is_trusted(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    ca = trustme.CA()
    path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    monkeypatch.setenv("SSL_CERT_FILE", str(path))
    ctx = Gemini("gemini-x", api_key="k").client._api_client._websocket_ssl_ctx["ssl"]
    subjects = [dict(x[0] for x in cert["subject"]) for cert in ctx.get_ca_certs()]
    assert any("trustme" in s.get("organizationName", "") for s in subjects)


def test_explicit_client_wins_over_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOOGLE_API_KEY", "env-key")
    client = genai.Client(vertexai=False, api_key="mine")
    llm = Gemini("gemini-x", client=client, api_key="ignored")
    assert llm.client is client


def test_vertex_is_explicit(monkeypatch: pytest.MonkeyPatch) -> None:
    from google.auth.credentials import AnonymousCredentials

    monkeypatch.setenv("GOOGLE_API_KEY", "env-key")
    monkeypatch.setenv("GOOGLE_GENAI_USE_VERTEXAI", "false")  # must not matter either
    llm = Gemini(
        "gemini-x",
        vertex=VertexConfig(project="p-1", location="us-central1", credentials=AnonymousCredentials()),
    )
    assert llm.backend == "vertex"
    assert llm.client.vertexai is True
    assert (llm.client._api_client.project, llm.client._api_client.location) == ("p-1", "us-central1")
    assert llm.client._api_client.api_key is None  # the env key is not used for Vertex
    assert llm.client._api_client._http_options.timeout == 60_000
    assert llm.client._api_client._http_options.api_version == "v1beta1"  # Vertex's, not v1beta
    with pytest.raises(ConfigurationError, match="not both"):
        Gemini("gemini-x", api_key="k", vertex=VertexConfig(project="p", location="l"))


async def test_key_never_in_repr_or_errors() -> None:
    secret = "AIza-very-secret-key"
    llm = Gemini("gemini-x", api_key=secret)
    assert secret not in repr(llm) and secret not in str(vars(llm).get("_backend"))

    @contextlib.asynccontextmanager
    async def leaky(model: str, config: types.LiveConnectConfig) -> AsyncIterator[double.ScriptedSession]:
        genai_errors.APIError.raise_error(1008, f"API key {secret} not valid", None)
        yield double.ScriptedSession()  # pragma: no cover

    class Leaky(Gemini):
        def open_transport(self, model, config):  # type: ignore[no-untyped-def]
            return leaky(model, config)

    with pytest.raises(ConfigurationError) as info:
        async with Leaky("gemini-x", api_key=secret).connect(LlmRequest()):
            pass
    assert secret not in str(info.value)
    assert "GOOGLE_API_KEY" in (info.value.hint or "")


def test_transport_alone_needs_no_key() -> None:
    llm = Gemini("gemini-x", transport=double.DoubleTransport())
    assert llm.backend == "transport" and llm.client is None
    assert "transport" in repr(llm)


# -- the default transport, over real TLS -----------------------------------------------------


@contextlib.asynccontextmanager
async def tls_live_server(script) -> AsyncIterator[tuple[str, trustme.CA, list[dict]]]:  # type: ignore[no-untyped-def]
    """A tiny Live endpoint: answers setup, then runs `script(ws, received)`."""
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    received: list[dict] = []

    async def handler(ws) -> None:  # type: ignore[no-untyped-def]
        received.append({"path": ws.request.path, "key": ws.request.headers.get("x-goog-api-key")})
        received.append(json.loads(await ws.recv()))
        await ws.send(json.dumps({"setupComplete": {}}))
        await script(ws, received)

    async with websockets.serve(handler, "127.0.0.1", 0, ssl=server_ctx) as server:
        port = server.sockets[0].getsockname()[1]
        yield f"https://127.0.0.1:{port}", ca, received


async def test_default_transport_against_a_tls_endpoint(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    async def script(ws, received) -> None:  # type: ignore[no-untyped-def]
        received.append(json.loads(await ws.recv()))
        await ws.send(json.dumps({"serverContent": {"outputTranscription": {"text": "Hi"}}}))
        await ws.send(json.dumps({"toolCall": {"functionCalls": [{"id": "c-9", "name": "f", "args": {}}]}}))
        await ws.send(json.dumps({"serverContent": {"turnComplete": True}}))
        received.append(json.loads(await ws.recv()))
        await ws.send(json.dumps({"goAway": {"timeLeft": "1.5s"}}))
        await ws.close(1011, "RESOURCE_EXHAUSTED: quota")

    async with tls_live_server(script) as (url, ca, received):
        path = tmp_path / "ca.pem"
        ca.cert_pem.write_to_path(str(path))
        monkeypatch.setenv("SSL_CERT_FILE", str(path))
        monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", url)
        monkeypatch.setenv("GOOGLE_API_KEY", "local-key")
        llm = Gemini(MODEL)
        out: list[LlmResponse] = []
        with anyio.fail_after(10):
            async with llm.connect(LlmRequest()) as connection:
                await connection.send_content(user_text("hello"))
                with pytest.raises(QuotaExhaustedError):
                    async for response in connection.receive():
                        out.append(response)
                        for call in response.function_calls:
                            await connection.send_content(answer(call, f="ok"))
    assert received[0] == {
        "path": "/ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent",
        "key": "local-key",
    }
    assert received[1]["setup"]["model"] == f"models/{MODEL}"
    assert received[2]["client_content"]["turnComplete"] is True
    assert received[3]["tool_response"]["functionResponses"][0]["id"] == "c-9"
    assert out[-1].go_away_time_left == 1.5
    assert any(r.turn_complete and r.output_transcription and r.output_transcription.text == "Hi" for r in out)


async def test_default_transport_normal_close_is_quiet(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    async def script(ws, received) -> None:  # type: ignore[no-untyped-def]
        await ws.send(json.dumps({"goAway": {"timeLeft": "0s"}}))
        await ws.close(1000)

    async with tls_live_server(script) as (url, ca, _):
        path = tmp_path / "ca.pem"
        ca.cert_pem.write_to_path(str(path))
        monkeypatch.setenv("SSL_CERT_FILE", str(path))
        monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", url)
        with anyio.fail_after(10):
            async with Gemini(MODEL, api_key="k").connect(LlmRequest()) as connection:
                out = await collect(connection)
    assert [r.go_away_time_left for r in out] == [0.0]
