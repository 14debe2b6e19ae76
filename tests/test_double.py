"""The in-process transport double: records, replays, reacts, fails like the SDK."""

from __future__ import annotations

import contextlib
import time

import anyio
import pytest
import websockets
from google.genai import errors as genai_errors
from google.genai import types

from connections import double

pytestmark = pytest.mark.anyio

MIC = types.Blob(data=b"\x00\x01" * 320, mime_type="audio/pcm;rate=16000")
CONFIG = types.LiveConnectConfig(response_modalities=[types.Modality.AUDIO])


async def one(session: double.ScriptedSession) -> types.LiveServerMessage:
    """The next server message, leaving receive() free for the next caller."""
    async with contextlib.aclosing(session.receive()) as receiving:
        return await anext(receiving)


async def turn(session: double.ScriptedSession) -> list[types.LiveServerMessage]:
    """One SDK-style receive(): up to the end of a turn."""
    return [m async for m in session.receive()]


MANUAL = types.LiveConnectConfig(
    response_modalities=[types.Modality.AUDIO],
    realtime_input_config=types.RealtimeInputConfig(
        automatic_activity_detection=types.AutomaticActivityDetection(disabled=True)
    ),
)


async def test_records_every_message_typed_and_in_order_with_each_connect() -> None:
    first = double.ScriptedSession(double.tool_call("f", {}, id="c1"))
    second = double.ScriptedSession()
    transport = double.DoubleTransport(first, second)
    async with transport("gemini-a", MANUAL) as session:
        assert session is first
        assert (await one(session)).tool_call.function_calls[0].id == "c1"
        await session.send_realtime_input(audio=MIC)
        await session.send_client_content(
            turns=types.Content(role="user", parts=[types.Part(text="hi")]), turn_complete=True
        )
        await session.send_tool_response(
            function_responses=[types.FunctionResponse(id="c1", name="f", response={"ok": 1})]
        )
        await session.send_realtime_input(activity_end=types.ActivityEnd())
        await session.send_realtime_input(text="typed")
    async with transport("gemini-b", types.LiveConnectConfig()) as session:
        assert session is second
    assert all(isinstance(m, types.LiveClientMessage) for m in first.sent)
    kinds = [
        next(k for k in ("realtime_input", "client_content", "tool_response") if getattr(m, k))
        for m in first.sent
    ]
    assert kinds == ["realtime_input", "client_content", "tool_response", "realtime_input", "realtime_input"]
    assert first.sent[0].realtime_input.audio is MIC
    assert first.client_contents[0].turns[0].parts[0].text == "hi"
    assert first.tool_responses[0].function_responses[0].id == "c1"
    assert first.realtime_inputs[-1].text == "typed"
    assert [(c.model, c.config) for c in transport.connects] == [
        ("gemini-a", MANUAL),
        ("gemini-b", types.LiveConnectConfig()),
    ]
    assert first.closed_by_client  # leaving the context closes, like the SDK


async def test_receive_stops_after_each_turn_like_the_sdk() -> None:
    session = double.ScriptedSession(
        double.audio(b"\0\0"), double.turn_complete(), double.text("next"), double.turn_complete()
    )
    async with double.DoubleTransport(session)("m", CONFIG) as s:
        assert len(await turn(s)) == 2
        second = await turn(s)
        assert second[0].server_content.model_turn.parts[0].text == "next"


async def test_reactions() -> None:
    session = double.ScriptedSession(double.tool_calls(
        types.FunctionCall(id="x-9", name="f", args={}), types.FunctionCall(id="x-10", name="f", args={})
    ))
    session.on_tool_response(
        lambda m: [double.text(f"got {m.tool_response.function_responses[0].id}"), double.turn_complete()]
    )
    session.after_audio_chunks(3, double.text("three"), double.turn_complete())
    session.on(lambda m: m.realtime_input is not None and m.realtime_input.text == "ping",
               double.text("pong"), double.turn_complete(), times=None)
    session.on_activity_end(double.interrupted(), double.turn_complete())
    async with double.DoubleTransport(session)("m", MANUAL) as s:
        await one(s)
        await s.send_tool_response(function_responses=types.FunctionResponse(id="x-9", name="f", response={}))
        assert (await turn(s))[0].server_content.model_turn.parts[0].text == "got x-9"
        for _ in range(5):
            await s.send_realtime_input(audio=MIC)
        [three, _] = await turn(s)
        assert three.server_content.model_turn.parts[0].text == "three"
        for _ in range(2):  # times=None: every time
            await s.send_realtime_input(text="ping")
            assert (await turn(s))[0].server_content.model_turn.parts[0].text == "pong"
        await s.send_realtime_input(activity_end=types.ActivityEnd())
        assert (await turn(s))[0].server_content.interrupted
        # One-shot reactions are spent: nothing more is queued.
        await s.send_tool_response(function_responses=types.FunctionResponse(id="x-10", name="f", response={}))
        await s.send_realtime_input(audio=MIC)
        with anyio.move_on_after(0.05) as idle:
            await turn(s)
        assert idle.cancelled_caught


@pytest.mark.parametrize(
    ("code", "error_type"),
    [(1000, genai_errors.APIError), (1006, genai_errors.APIError), (1007, genai_errors.APIError),
     (1008, genai_errors.APIError), (1011, genai_errors.APIError), (429, genai_errors.ClientError)],
)
async def test_close_raises_what_the_sdk_raises(code: int, error_type: type) -> None:
    session = double.ScriptedSession(double.audio(b"\0\0")).close_with(code, "why")
    async with double.DoubleTransport(session)("m", CONFIG) as s:
        received = []
        with pytest.raises(genai_errors.APIError) as info:
            async for message in s.receive():
                received.append(message)
        assert type(info.value) is error_type
        assert info.value.code == code
        assert len(received) == 1
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await s.send_realtime_input(audio=MIC)
        if code == 1006:
            assert closed.value.rcvd is None  # no close frame, as the SDK sees it
        else:
            assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (code, "why")
        with pytest.raises(genai_errors.APIError):  # and again: the socket stays closed
            await turn(s)


async def test_refused_connect_and_too_many_connects() -> None:
    transport = double.DoubleTransport(double.ScriptedSession(refuse=double.Close(1008, "no such model")))
    with pytest.raises(genai_errors.APIError) as info:
        async with transport("m", CONFIG):
            pass
    assert info.value.code == 1008 and "no such model" in str(info.value)
    assert len(transport.connects) == 1
    with pytest.raises(RuntimeError, match="1 session"):
        async with transport("m", CONFIG):
            pass


async def test_factory_makes_a_session_per_connect() -> None:
    transport = double.DoubleTransport(factory=lambda: double.ScriptedSession(double.turn_complete()))
    for _ in range(3):
        async with transport("m", CONFIG) as s:
            assert len(await turn(s)) == 1
    assert len({id(s) for s in transport.sessions}) == 3


async def test_client_close_and_drop_wake_a_pending_receiver() -> None:
    session = double.ScriptedSession()
    async with double.DoubleTransport(session)("m", CONFIG) as s, anyio.create_task_group() as tg:
        codes: list[int] = []

        async def receiver() -> None:
            with pytest.raises(genai_errors.APIError) as info:
                await turn(s)
            codes.append(info.value.code)

        tg.start_soon(receiver)
        await anyio.wait_all_tasks_blocked()
        await s.close()
    assert codes == [1000]
    with pytest.raises(websockets.ConnectionClosedOK):
        await session.send_realtime_input(audio=MIC)

    dropped = double.ScriptedSession(double.audio(b"\0\0"), double.audio(b"\0\0"))
    async with double.DoubleTransport(dropped)("m", CONFIG) as s:
        s.drop(1011, "boom")  # queued messages are lost, as on a dead socket
        with pytest.raises(genai_errors.APIError) as info:
            await turn(s)
        assert info.value.code == 1011


async def test_sdk_argument_checks() -> None:
    async with double.DoubleTransport(double.ScriptedSession())("m", CONFIG) as s:
        with pytest.raises(ValueError, match="Only one argument"):
            await s.send_realtime_input(audio=MIC, text="both")
        with pytest.raises(ValueError, match="`id`"):
            await s.send_tool_response(function_responses={"name": "f", "response": {}})
        assert s.sent == []


async def test_wait_for_is_event_driven() -> None:
    session = double.ScriptedSession(double.tool_call("f", {}, id="1"))
    async with double.DoubleTransport(session)("m", CONFIG) as s, anyio.create_task_group() as tg:
        await one(s)
        found: list[types.LiveClientMessage] = []

        async def waiter() -> None:
            found.append(await s.wait_for(lambda m: m.tool_response is not None))

        tg.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        await s.send_realtime_input(audio=MIC)
        await anyio.wait_all_tasks_blocked()
        assert found == []
        await s.send_tool_response(function_responses=types.FunctionResponse(id="1", name="f", response={}))
    assert found[0].tool_response.function_responses[0].id == "1"
    # Already recorded: returns at once.
    with anyio.fail_after(1):
        assert (await session.wait_for(lambda m: m.realtime_input is not None)).realtime_input.audio is MIC


async def test_pause_delays_the_next_event() -> None:
    session = double.ScriptedSession(double.Pause(0.05), double.turn_complete())
    async with double.DoubleTransport(session)("m", CONFIG) as s:
        started = time.perf_counter()
        await turn(s)
        assert time.perf_counter() - started >= 0.045


async def test_record_audio_false_counts_without_keeping() -> None:
    session = double.ScriptedSession(record_audio=False)
    async with double.DoubleTransport(session)("m", CONFIG) as s:
        for _ in range(10):
            await s.send_realtime_input(audio=MIC)
        await s.send_realtime_input(text="done")
    assert session.audio_chunks == 10 and session.audio_bytes == 10 * len(MIC.data)
    assert len(session.sent) == 1  # only the non-audio message


async def test_audio_path_is_cheap() -> None:
    """Tens of thousands of chunks a second per core, so benchmarks measure the relay."""
    session = double.ScriptedSession(record_audio=False)
    chunks = 20_000
    async with double.DoubleTransport(session)("m", CONFIG) as s:
        started = time.perf_counter()
        for _ in range(chunks):
            await s.send_realtime_input(audio=MIC)
        elapsed = time.perf_counter() - started
    assert session.audio_chunks == chunks
    assert elapsed < 1.0, f"{elapsed / chunks * 1e6:.1f} us per chunk"


def test_builders() -> None:
    chunk = double.audio(b"\x01\x00" * 4)
    blob = chunk.server_content.model_turn.parts[0].inline_data
    assert (blob.mime_type, blob.data) == ("audio/pcm;rate=24000", b"\x01\x00" * 4)
    assert double.go_away(9.5).go_away.time_left == "9.5s"
    assert double.go_away("1.000000001s").go_away.time_left == "1.000000001s"
    call = double.tool_call("f", {"a": 1}, id="c").tool_call.function_calls[0]
    assert (call.name, call.args, call.id) == ("f", {"a": 1}, "c")
    assert double.tool_call("f").tool_call.function_calls[0].id is None
    assert double.usage(prompt=2, response=3).usage_metadata.total_token_count == 5
    update = double.resumption_update("h", resumable=False).session_resumption_update
    assert (update.new_handle, update.resumable) == ("h", False)
    merged = double.bundle(
        double.audio(b"\x01\x00"), double.audio(b"\x02\x00"),
        double.output_transcript("hi"), double.turn_complete(),
    )
    sc = merged.server_content
    assert [p.inline_data.data for p in sc.model_turn.parts] == [b"\x01\x00", b"\x02\x00"]
    assert sc.output_transcription.text == "hi" and sc.turn_complete


async def test_plugs_into_the_gemini_seam() -> None:
    """The documented usage: the real connection runs against the double."""
    from connections.gemini import Gemini
    from live import LlmRequest

    session = double.ScriptedSession(double.output_transcript("Hi"), double.turn_complete())
    llm = Gemini("gemini-2.5-flash", transport=double.DoubleTransport(session))
    async with llm.connect(LlmRequest()) as connection:
        async with contextlib.aclosing(connection.receive()) as responses:
            async for response in responses:
                if response.turn_complete:
                    break
        await connection.send_realtime(MIC)
    assert response.output_transcription.text == "Hi" and response.output_transcription.finished
    assert session.realtime_inputs[0].audio is MIC


# -- as strict as the service ----------------------------------------------------


async def test_a_function_response_for_a_call_never_issued_closes_with_1007() -> None:
    session = double.ScriptedSession(double.tool_call("f", {}, id="c1"))
    async with double.DoubleTransport(session)("gemini-a", CONFIG) as s:
        await one(s)
        await s.send_tool_response(function_responses=[types.FunctionResponse(id="c1", name="f", response={})])
        # The same id again, and an id never issued: the service rejects both.
        await s.send_tool_response(function_responses=[types.FunctionResponse(id="c1", name="f", response={})])
        with pytest.raises(genai_errors.APIError) as info:
            await turn(s)
    assert info.value.code == 1007


async def test_activity_signals_with_automatic_detection_on_close_with_1007() -> None:
    session = double.ScriptedSession()
    async with double.DoubleTransport(session)("gemini-a", CONFIG) as s:
        await s.send_realtime_input(activity_start=types.ActivityStart())
        with pytest.raises(websockets.ConnectionClosed):
            await s.send_realtime_input(audio=MIC)
    assert session.server_close.code == 1007


async def test_initial_history_mode_ignores_realtime_input_until_the_seed_completes() -> None:
    config = types.LiveConnectConfig(
        history_config=types.HistoryConfig(initial_history_in_client_content=True)
    )
    session = double.ScriptedSession()
    session.on_client_content(double.output_transcript("never"), times=None)
    session.on_text(double.output_transcript("heard"), double.turn_complete())
    async with double.DoubleTransport(session)("gemini-3.1-flash-live", config) as s:
        await s.send_realtime_input(text="too early")
        await s.send_client_content(turns=[types.Content(role="model", parts=[types.Part(text="Hi")])], turn_complete=True)
        await s.send_realtime_input(text="now")
        messages = await turn(s)
    assert session.ignored == 1
    assert [m.server_content.output_transcription.text for m in messages if m.server_content.output_transcription] == ["heard"]


async def test_the_history_flag_on_a_resumed_session_closes_with_1007() -> None:
    config = types.LiveConnectConfig(
        history_config=types.HistoryConfig(initial_history_in_client_content=True),
        session_resumption=types.SessionResumptionConfig(handle="h1"),
    )
    session = double.ScriptedSession()
    async with double.DoubleTransport(session)("gemini-3.1-flash-live", config) as s:
        with pytest.raises(genai_errors.APIError) as info:
            await turn(s)
    assert info.value.code == 1007


async def test_no_resumable_handle_while_a_call_is_unanswered_or_a_reply_is_generated() -> None:
    session = double.ScriptedSession(double.tool_call("f", {}, id="c1"), double.resumption_update("h1"))
    async with double.DoubleTransport(session)("gemini-a", CONFIG) as s:
        await one(s)
        assert (await one(s)).session_resumption_update.resumable is False  # c1 unanswered
        await s.send_tool_response(function_responses=[types.FunctionResponse(id="c1", name="f", response={})])
        s.push(double.audio(b"\0\0"), double.resumption_update("h2"), double.turn_complete(),
               double.resumption_update("h3"))
        await one(s)
        assert (await one(s)).session_resumption_update.resumable is False  # generating
        assert (await one(s)).server_content.turn_complete
        assert (await one(s)).session_resumption_update.resumable is True  # idle


async def test_a_close_the_sender_sees_first() -> None:
    session = double.ScriptedSession()
    async with double.DoubleTransport(session)("gemini-a", CONFIG) as s:
        session.drop(1011, "Internal error", seen_by="sender")
        with pytest.raises(websockets.ConnectionClosed) as sent:
            await s.send_realtime_input(audio=MIC)
        assert sent.value.rcvd.code == 1011
        with anyio.move_on_after(0.2) as waited:
            await turn(s)  # the receiver has not noticed yet
        assert waited.cancelled_caught
