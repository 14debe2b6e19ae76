"""`local/echo` through the live contract: turns, echo, pacing, barge-in, closing."""

from __future__ import annotations

import anyio
import numpy as np
import pytest
from audio_fixtures import best_correlation, chunked, reference_24k, silence, speak
from google.genai import types

import live
from connections.local_echo import EchoConfig, LocalEcho
from live import LlmRequest, LlmResponse

pytestmark = pytest.mark.anyio

SPEED = 16.0  # replies and fed audio run this much faster than real time
HELLO = "Hello, can you hear me?"


def pcm_blob(data: bytes, rate: int = 16000) -> types.Blob:
    return types.Blob(data=data, mime_type=f"audio/pcm;rate={rate}")


class Received:
    """Collects everything `receive()` yields, with arrival times."""

    def __init__(self, conn: live.BaseLlmConnection) -> None:
        self.conn = conn
        self.items: list[tuple[float, LlmResponse]] = []
        self.ended = False

    async def run(self) -> None:
        async for response in self.conn.receive():
            self.items.append((anyio.current_time(), response))
        self.ended = True

    @property
    def responses(self) -> list[LlmResponse]:
        return [r for _, r in self.items]

    async def wait_for(self, predicate, timeout: float = 5.0) -> None:
        with anyio.fail_after(timeout):
            while not predicate(self.responses):
                await anyio.sleep(0.005)

    async def wait_turn_complete(self, count: int = 1, timeout: float = 5.0) -> None:
        await self.wait_for(lambda rs: sum(r.turn_complete for r in rs) >= count, timeout)


def kinds(responses: list[LlmResponse]) -> list[str]:
    """A readable outline: runs of audio collapse to one "audio"."""
    out: list[str] = []
    for r in responses:
        for name in ("audio", "text", "generation_complete", "turn_complete", "interrupted"):
            hit = bool(r.audio_chunks) if name == "audio" else bool(r.text) if name == "text" else getattr(r, name)
            if hit and not (name == "audio" and out and out[-1] == "audio"):
                out.append(name)
    return out


async def feed(conn, pcm: bytes, rate: int = 16000, speed: float = SPEED) -> None:
    """Send `pcm` in 20 ms chunks, paced at `speed` times real time."""
    start = anyio.current_time()
    for i, chunk in enumerate(chunked(pcm, rate, 20)):
        await conn.send_realtime(pcm_blob(chunk, rate))
        await anyio.sleep_until(start + (i + 1) * 0.02 / speed)


def reply_audio(responses: list[LlmResponse]) -> bytes:
    return b"".join(c for r in responses for c in r.audio_chunks)


@pytest.fixture
def echo() -> LocalEcho:
    return LocalEcho(config=EchoConfig(speed=SPEED))


async def test_default_registry_serves_local_echo():
    model = live.default_registry().resolve("local/echo")
    assert isinstance(model, LocalEcho) and model.model == "local/echo"


async def test_spoken_turn_is_answered_with_the_same_speech_at_24k(echo):
    speech = speak(HELLO)
    async with echo.connect(LlmRequest()) as conn, anyio.create_task_group() as tg:
        got = Received(conn)
        tg.start_soon(got.run)
        await feed(conn, silence(0.5) + speech + silence(1.0))
        await got.wait_turn_complete()
        await conn.close()

    responses = got.responses
    assert kinds(responses) == ["audio", "generation_complete", "turn_complete"]
    mimes = {p.inline_data.mime_type for r in responses if r.content for p in r.content.parts}
    assert mimes == {"audio/pcm;rate=24000"}
    sizes = [len(c) for r in responses for c in r.audio_chunks]
    assert max(sizes) == 24000 * 40 // 1000 * 2  # 40 ms chunks
    audio = reply_audio(responses)
    assert len(audio) / 48000 == pytest.approx(len(speech) / 32000, abs=0.4)
    echoed = np.frombuffer(audio, "<i2").astype(np.float64)
    assert best_correlation(echoed, reference_24k(speech)) > 0.9
    # Honest: no transcription and no invented text.
    assert all(r.input_transcription is None and r.output_transcription is None for r in responses)
    assert all(r.text is None for r in responses)


async def test_reply_is_paced_not_dumped(echo):
    speech = speak(HELLO)
    async with echo.connect(LlmRequest()) as conn, anyio.create_task_group() as tg:
        got = Received(conn)
        tg.start_soon(got.run)
        await feed(conn, silence(0.3) + speech + silence(1.0))
        await got.wait_turn_complete()
        await conn.close()
    audio_times = [t for t, r in got.items if r.audio_chunks]
    played = len(reply_audio(got.responses)) / 48000
    turn_done = next(t for t, r in got.items if r.turn_complete)
    # Spread over (duration / speed), like a real-time stream at that speed.
    assert audio_times[-1] - audio_times[0] >= 0.8 * (played - 0.04) / SPEED
    assert turn_done - audio_times[0] >= 0.9 * played / SPEED


async def test_default_pace_is_real_time():
    async with LocalEcho().connect(LlmRequest()) as conn, anyio.create_task_group() as tg:
        got = Received(conn)
        tg.start_soon(got.run)
        await conn.send_realtime(types.ActivityStart())
        await conn.send_realtime(pcm_blob(silence(0.4)))
        await conn.send_realtime(types.ActivityEnd())
        start = anyio.current_time()
        await got.wait_turn_complete()
        elapsed = anyio.current_time() - start
        await conn.close()
    assert abs(len(reply_audio(got.responses)) - 0.4 * 48000) <= 2  # within a sample
    assert 0.38 <= elapsed < 0.8


async def test_speaking_over_the_reply_interrupts_it():
    # Replies at a quarter of the feeding speed leave a wide window to barge into.
    echo = LocalEcho(config=EchoConfig(speed=SPEED / 4))
    first, second = speak(HELLO), speak("Wait, stop please.")
    async with echo.connect(LlmRequest()) as conn, anyio.create_task_group() as tg:
        got = Received(conn)
        tg.start_soon(got.run)
        await feed(conn, silence(0.3) + first + silence(0.7))
        await got.wait_for(lambda rs: len(reply_audio(rs)) >= 0.3 * 48000)
        await feed(conn, second[: 16000 * 2 // 2])  # the first half second of speech
        await got.wait_for(lambda rs: any(r.interrupted for r in rs), timeout=1.0)
        at_interrupt = len(got.responses)
        await anyio.sleep(0.1)  # long enough for more of the reply, had it gone on
        after = got.responses[at_interrupt:]
        await feed(conn, second[16000:] + silence(1.0))
        await got.wait_turn_complete()
        await conn.close()

    outline = kinds(got.responses)
    assert outline == ["audio", "interrupted", "audio", "generation_complete", "turn_complete"]
    assert after == []  # nothing more of the interrupted reply
    first_reply = reply_audio(got.responses[: at_interrupt])
    assert len(first_reply) < 0.8 * len(first) * 1.5  # cut short, not played out


async def test_typed_text_during_a_reply_interrupts_it_and_is_echoed(echo):
    async with echo.connect(LlmRequest()) as conn, anyio.create_task_group() as tg:
        got = Received(conn)
        tg.start_soon(got.run)
        await conn.send_realtime(types.ActivityStart())
        await conn.send_realtime(pcm_blob(speak(HELLO)))
        await conn.send_realtime(types.ActivityEnd())
        await got.wait_for(lambda rs: bool(reply_audio(rs)))
        await conn.send_content(types.Content(role="user", parts=[types.Part(text="ping")]))
        await got.wait_turn_complete()
        await conn.close()
    assert kinds(got.responses) == ["audio", "interrupted", "text", "generation_complete", "turn_complete"]
    assert [r.text for r in got.responses if r.text] == ["ping"]


async def test_manual_activity_makes_one_turn_across_pauses(echo):
    before, a, b = speak("Ignore this."), speak("Hello there."), speak("Goodbye now.")
    async with echo.connect(LlmRequest()) as conn, anyio.create_task_group() as tg:
        got = Received(conn)
        tg.start_soon(got.run)
        await feed(conn, before[: len(before) // 2])  # cut off mid-speech: no turn yet
        await conn.send_realtime(types.ActivityStart())
        inside = a + silence(1.0) + b
        await feed(conn, inside)
        assert got.responses == []  # the 1 s pause did not end the turn
        await conn.send_realtime(types.ActivityEnd())
        await got.wait_turn_complete()
        await conn.close()
    assert kinds(got.responses) == ["audio", "generation_complete", "turn_complete"]
    audio = reply_audio(got.responses)
    assert abs(len(audio) / 48000 - len(inside) / 32000) < 0.01  # exactly the manual span
    echoed = np.frombuffer(audio, "<i2").astype(np.float64)
    assert best_correlation(echoed, reference_24k(inside)) > 0.9


async def test_disabled_automatic_detection_waits_for_activity_signals(echo):
    config = types.LiveConnectConfig(
        realtime_input_config=types.RealtimeInputConfig(
            automatic_activity_detection=types.AutomaticActivityDetection(disabled=True)
        )
    )
    async with echo.connect(LlmRequest(live_connect_config=config)) as conn, anyio.create_task_group() as tg:
        got = Received(conn)
        tg.start_soon(got.run)
        await feed(conn, silence(0.3) + speak(HELLO) + silence(1.0))
        await anyio.sleep(0.05)
        assert got.responses == []
        await conn.send_realtime(types.ActivityStart())
        await feed(conn, speak(HELLO))
        await conn.send_realtime(types.ActivityEnd())
        await got.wait_turn_complete()
        await conn.close()
    assert kinds(got.responses) == ["audio", "generation_complete", "turn_complete"]


async def test_audio_stream_end_ends_the_turn(echo):
    speech = speak(HELLO)
    async with echo.connect(LlmRequest()) as conn, anyio.create_task_group() as tg:
        got = Received(conn)
        tg.start_soon(got.run)
        await feed(conn, silence(0.3) + speech)  # no trailing silence: the turn is open
        await anyio.sleep(0.05)
        assert got.responses == []
        await conn.send_realtime(live.AUDIO_STREAM_END)
        await got.wait_turn_complete()
        await conn.close()
    assert kinds(got.responses) == ["audio", "generation_complete", "turn_complete"]
    assert len(reply_audio(got.responses)) / 48000 > 0.5 * len(speech) / 32000


async def test_bad_input_is_rejected_and_the_session_goes_on(echo):
    async with echo.connect(LlmRequest()) as conn, anyio.create_task_group() as tg:
        got = Received(conn)
        tg.start_soon(got.run)
        # Camera and screen frames are accepted and ignored: an echo has nothing to see.
        await conn.send_realtime(types.Blob(data=b"\xff\xd8", mime_type="image/jpeg"))
        with pytest.raises(ValueError, match="audio/pcm"):
            await conn.send_realtime(types.Blob(data=b"\x00\x01", mime_type="audio/opus"))
        with pytest.raises(ValueError, match="even"):
            await conn.send_realtime(pcm_blob(b"\x00\x01\x02"))
        mixed = types.Content(
            role="user",
            parts=[
                types.Part(text="hi"),
                types.Part(function_response=types.FunctionResponse(id="1", name="f", response={})),
            ],
        )
        with pytest.raises(ValueError):
            await conn.send_content(mixed)
        # Still working: a turn without a rate in the mime type (16 kHz) is answered.
        await conn.send_realtime(types.ActivityStart())
        await conn.send_realtime(types.Blob(data=silence(0.2), mime_type="audio/pcm"))
        await conn.send_realtime(types.ActivityEnd())
        await got.wait_turn_complete()
        await conn.close()
    assert abs(len(reply_audio(got.responses)) - 0.2 * 48000) <= 2  # within a sample


async def test_history_and_function_responses_are_accepted_and_ignored(echo):
    async with echo.connect(LlmRequest()) as conn, anyio.create_task_group() as tg:
        got = Received(conn)
        tg.start_soon(got.run)
        await conn.send_history([types.Content(role="user", parts=[types.Part(text="earlier")])])
        await conn.send_content(
            types.Content(
                role="user",
                parts=[types.Part(function_response=types.FunctionResponse(id="1", name="f", response={}))],
            )
        )
        await anyio.sleep(0.05)
        assert got.responses == []
        await conn.close()


async def test_close_ends_receive_and_later_sends_fail(echo):
    async with echo.connect(LlmRequest()) as conn:
        got = Received(conn)
        async with anyio.create_task_group() as tg:
            tg.start_soon(got.run)
            await conn.send_realtime(types.ActivityStart())
            await conn.send_realtime(pcm_blob(speak(HELLO)))
            await conn.send_realtime(types.ActivityEnd())
            await got.wait_for(lambda rs: bool(reply_audio(rs)))
            with anyio.fail_after(1.0):
                await conn.close()
                await conn.close()  # idempotent
                while not got.ended:
                    await anyio.sleep(0.005)
        assert not any(r.turn_complete for r in got.responses)  # the reply stopped
        with pytest.raises(live.ConnectionClosedError):
            await conn.send_realtime(pcm_blob(silence(0.02)))
        with pytest.raises(live.ConnectionClosedError):
            await conn.send_content(types.Content(role="user", parts=[types.Part(text="hi")]))
        with pytest.raises(live.ConnectionClosedError):
            await conn.send_history([])


async def test_leaving_the_context_closes_and_errors_pass_through_unwrapped(echo):
    with pytest.raises(KeyError):
        async with echo.connect(LlmRequest()) as conn:
            raise KeyError("boom")
    with pytest.raises(live.ConnectionClosedError):
        await conn.send_realtime(types.ActivityStart())
    async for _ in conn.receive():
        pytest.fail("a closed connection yields nothing")
