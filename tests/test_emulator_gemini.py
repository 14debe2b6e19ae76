"""Our `Gemini` connection against the emulator: the real SDK path, end to end."""

from __future__ import annotations

import anyio
import pytest
from audio_fixtures import silence, tone
from google.genai import types

from emulated import gemini_for
from connections.emulator import Emulator, Fault, Script, ToolCall
from connections.gemini import Gemini
from live.errors import (
    ConfigurationError,
    InvalidArgumentError,
    LiveError,
    QuotaExhaustedError,
    RecoverableConnectionError,
)
from live.llm import AUDIO_STREAM_END, LlmRequest, LlmResponse

pytestmark = pytest.mark.anyio

FAST = 20.0
IN_ORDER = {"late_transcripts": False}
"""For tests of the final transcripts: every fragment before its turnComplete
(the service may send the last one after it; see
`test_a_transcript_fragment_after_turn_complete_stays_with_its_turn`)."""


@pytest.fixture(autouse=True, params=["lean", "sdk"])
def wire(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs on both wire paths (`connections.gemini_wire` and the SDK's own)."""
    monkeypatch.setenv("LIVE_GEMINI_WIRE", request.param)
    return request.param


def request(**config) -> LlmRequest:
    base = {
        "response_modalities": [types.Modality.AUDIO],
        "input_audio_transcription": types.AudioTranscriptionConfig(),
        "output_audio_transcription": types.AudioTranscriptionConfig(),
    }
    base.update(config)
    return LlmRequest(live_connect_config=types.LiveConnectConfig(**base))


def user(text: str) -> types.Content:
    return types.Content(role="user", parts=[types.Part(text=text)])


async def send_audio(connection, pcm: bytes, chunk: int = 640) -> None:
    for i in range(0, len(pcm), chunk):
        await connection.send_realtime(types.Blob(data=pcm[i : i + chunk], mime_type="audio/pcm;rate=16000"))


class Receiver:
    """Pulls from the connection's one `receive()` iterator, a turn at a time."""

    def __init__(self, connection) -> None:
        self._stream = connection.receive()

    async def until(self, stop, timeout: float = 10.0) -> list[LlmResponse]:
        got: list[LlmResponse] = []
        with anyio.fail_after(timeout):
            async for response in self._stream:
                got.append(response)
                if stop(response):
                    break
        return got


def final(responses: list[LlmResponse], field: str) -> list[str]:
    out = []
    for r in responses:
        t = getattr(r, field)
        if t is not None and t.finished and t.text:
            out.append(t.text)
    return out


async def test_spoken_turn_transcripts_audio_and_usage(live_emulator: Emulator):
    live_emulator.script = Script(speed=FAST, user_says=["good morning"], profile_overrides=IN_ORDER)
    async with gemini_for(live_emulator).connect(request()) as connection:
        rx = Receiver(connection)
        await send_audio(connection, tone(0.4) + silence(0.2))
        await connection.send_realtime(AUDIO_STREAM_END)
        got = await rx.until(lambda r: r.turn_complete)
    assert final(got, "input_transcription") == ["good morning"]
    assert final(got, "output_transcription") == ["You said: good morning."]
    assert sum(len(c) for r in got for c in r.audio_chunks) > 24000
    assert any(r.generation_complete for r in got)
    assert any(r.usage_metadata and r.usage_metadata.total_token_count for r in got)


async def test_a_transcript_fragment_after_turn_complete_stays_with_its_turn(live_emulator: Emulator):
    live_emulator.script = Script(speed=FAST)  # the service's order: the last fragment after turnComplete
    async with gemini_for(live_emulator).connect(request()) as connection:
        rx = Receiver(connection)
        await connection.send_content(user("good morning"))
        got = await rx.until(lambda r: r.turn_complete)
        got += await rx.until(lambda r: r.late_transcription)  # read before the next turn goes out
        await connection.send_content(user("and then"))
        got += await rx.until(lambda r: r.turn_complete)
    late = [r.output_transcription.text for r in got if r.late_transcription]
    assert late == ["."]  # the tail of "You said: good morning."
    assert final(got, "output_transcription") == ["You said: good morning", "You said: and the"]  # its tail "n." comes late too, unread here


async def test_tool_round_trip(live_emulator: Emulator):
    live_emulator.script = Script(speed=FAST, tool_calls={1: [ToolCall("lookup", {"q": "x"})]}, profile_overrides=IN_ORDER)
    tools = [types.Tool(function_declarations=[types.FunctionDeclaration(name="lookup")])]
    async with gemini_for(live_emulator).connect(request(tools=tools)) as connection:
        rx = Receiver(connection)
        await connection.send_content(user("find x"))
        got = await rx.until(lambda r: bool(r.function_calls))
        (call,) = got[-1].function_calls
        assert call.name == "lookup" and call.args == {"q": "x"}
        answer = types.FunctionResponse(id=call.id, name=call.name, response={"found": 1})
        await connection.send_content(types.Content(role="user", parts=[types.Part(function_response=answer)]))
        got = await rx.until(lambda r: r.turn_complete)
    assert final(got, "output_transcription") == ['lookup returned {"found":1}.']


async def test_interruption(live_emulator: Emulator):
    live_emulator.script = Script(speed=2.0, replies=["a long answer that keeps going for a while"])
    async with gemini_for(live_emulator).connect(request()) as connection:
        rx = Receiver(connection)
        await connection.send_content(user("talk"))
        await rx.until(lambda r: bool(r.audio_chunks))
        await send_audio(connection, tone(0.2))
        got = await rx.until(lambda r: r.interrupted)
        assert got[-1].interrupted
        assert not any(r.turn_complete for r in got)


async def test_history_on_gemini_3(live_emulator: Emulator):
    model = "gemini-3.1-flash-live-preview"
    history = [user("my name is Ada"), types.Content(role="model", parts=[types.Part(text="hi Ada")]), user("who am I")]
    req = request()
    req.contents = history
    live_emulator.script = Script(speed=FAST, profile_overrides=IN_ORDER)
    async with gemini_for(live_emulator, model=model).connect(req) as connection:
        rx = Receiver(connection)
        await connection.send_history(history)
        got = await rx.until(lambda r: r.turn_complete)
        await connection.send_content(user("and now"))
        got += await rx.until(lambda r: r.turn_complete)
    assert final(got, "output_transcription") == ["You said: who am I.", "You said: and now."]
    frames = live_emulator.sessions[0].frames
    assert any("realtime_input" in f and "text" in f["realtime_input"] for f in frames)


async def test_go_away_then_quiet_end(live_emulator: Emulator):
    # The service closes at the deadline with 1011 "Deadline expired"; a 1000 there ends quietly.
    live_emulator.script = Script(
        speed=FAST, go_away_after=2.0, go_away_time_left=10.0, profile_overrides={"deadline_close_1011": False}
    )
    async with gemini_for(live_emulator).connect(request()) as connection:
        got = []
        with anyio.fail_after(5):
            async for response in connection.receive():
                got.append(response)
    assert [r.go_away_time_left for r in got if r.go_away_time_left is not None] == [10.0]


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        (Fault("after_setup", code=1006), RecoverableConnectionError),
        (Fault("mid_generation", code=1011), RecoverableConnectionError),
        (Fault.quota("mid_generation"), QuotaExhaustedError),
        (Fault("after_setup", code=1007), InvalidArgumentError),
        (Fault("after_setup", code=1008), ConfigurationError),
    ],
)
async def test_close_codes_map_to_typed_errors(live_emulator: Emulator, fault: Fault, error: type[LiveError]):
    live_emulator.script = Script(speed=FAST, faults=[fault])
    with pytest.raises(error) as info:
        async with gemini_for(live_emulator).connect(request()) as connection:
            rx = Receiver(connection)
            if fault.when == "mid_generation":
                await connection.send_content(user("go"))
            await rx.until(lambda r: False)
    assert info.value.close_code == fault.code
    if error is RecoverableConnectionError:
        assert not isinstance(info.value, QuotaExhaustedError)


async def test_wrong_key_and_wrong_model_are_configuration_errors(live_emulator: Emulator):
    live_emulator.settings.api_key = "right-key"
    with pytest.raises(ConfigurationError) as info:
        async with gemini_for(live_emulator, api_key="wrong-key").connect(request()):
            pass
    assert info.value.close_code == 1008 and "wrong-key" not in str(info.value)
    with pytest.raises(ConfigurationError) as info:
        async with gemini_for(live_emulator, model="gemini-2.5-flash", api_key="right-key").connect(request()):
            pass
    assert "bidiGenerateContent" in str(info.value)


async def test_resume_with_a_handle(live_emulator: Emulator):
    config = {"session_resumption": types.SessionResumptionConfig()}
    handle = None
    async with gemini_for(live_emulator).connect(request(**config)) as connection:
        rx = Receiver(connection)
        await connection.send_content(user("first"))
        # The handle comes once the turn completed, after its turnComplete.
        got = await rx.until(lambda r: bool(r.session_resumption_update and r.session_resumption_update.resumable))
        handle = got[-1].session_resumption_update.new_handle
    assert handle
    resumed = request(session_resumption=types.SessionResumptionConfig(handle=handle))
    async with gemini_for(live_emulator).connect(resumed) as connection:
        rx = Receiver(connection)
        await connection.send_content(user("second"))
        await rx.until(lambda r: r.turn_complete)
    assert live_emulator.sessions[1].resumed_from == handle
