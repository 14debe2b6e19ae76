"""The session's bounded queues: what is dropped, what is kept, and in which order."""

from __future__ import annotations

import anyio
import pytest

from live.server.queues import AudioPacer, ClientOutbox, OutboxOverflow, UpstreamQueue

pytestmark = pytest.mark.anyio


async def test_a_full_upstream_queue_drops_the_oldest_audio_and_counts_it():
    queue: UpstreamQueue[str] = UpstreamQueue(max_audio=3)
    assert [queue.put_audio(f"a{n}") for n in range(5)] == [False, False, False, True, True]
    assert queue.dropped_audio == 2
    assert await queue.peek_run(10) == (True, ["a2", "a3", "a4"])  # the newest survive


async def test_control_is_never_dropped_and_keeps_its_place_among_audio():
    queue: UpstreamQueue[str] = UpstreamQueue(max_audio=2)
    queue.put_audio("a0")
    await queue.put_control("text")
    queue.put_audio("a1")
    queue.put_audio("a2")  # full: the oldest audio (a0) goes, the text stays
    sent = []
    for _ in range(2):
        sent.append(await queue.peek_run(10))
        queue.commit()
    assert sent == [(False, ["text"]), (True, ["a1", "a2"])]
    assert queue.dropped_audio == 1


async def test_audio_runs_stop_at_control_and_at_the_limit():
    queue: UpstreamQueue[str] = UpstreamQueue()
    for n in range(7):
        queue.put_audio(f"a{n}")
    await queue.put_control("tool result")
    queue.put_audio("a7")
    assert await queue.peek_run(5) == (True, ["a0", "a1", "a2", "a3", "a4"])
    queue.commit()
    assert await queue.peek_run(5) == (True, ["a5", "a6"])
    queue.commit()
    assert await queue.peek_run(5) == (False, ["tool result"])
    queue.commit()
    assert await queue.peek_run(5) == (True, ["a7"])


async def test_what_was_not_sent_stays_first_and_is_never_dropped_while_in_flight():
    queue: UpstreamQueue[str] = UpstreamQueue(max_audio=2)
    queue.put_audio("a0")
    queue.put_audio("a1")
    assert await queue.peek_run(5) == (True, ["a0", "a1"])
    queue.put_audio("a2")  # over the bound, but a0 and a1 are being sent: a2 stays too
    assert queue.dropped_audio == 0
    queue.release()  # the connection dropped before the send completed
    assert await queue.peek_run(5) == (True, ["a0", "a1", "a2"])


async def test_a_consumer_shows_itself_only_while_it_waits_on_an_empty_queue():
    """A producer may send past the queue only when nothing is queued or in flight."""
    queue: UpstreamQueue[str] = UpstreamQueue()
    got: list[tuple[bool, list[str]]] = []
    token = object()

    async def consume() -> None:
        got.append(await queue.peek_run(5, waiting_as=token))
        queue.commit()

    async def put_audio() -> None:
        queue.put_audio("audio")

    async def put_image() -> None:
        queue.put_image("image")

    async def put_control() -> None:
        await queue.put_control("text")

    assert queue.waiting_consumer is None
    for put in (put_audio, put_image, put_control):
        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await anyio.wait_all_tasks_blocked()
            assert queue.waiting_consumer is token
            await put()  # queued: the consumer is busy from now on, before it even runs
            assert queue.waiting_consumer is None
    assert got == [(True, ["audio"]), (False, ["image"]), (False, ["text"])]

    queue.put_audio("waiting")
    async with anyio.create_task_group() as tg:  # items waiting: it never shows itself
        tg.start_soon(consume)
        assert queue.waiting_consumer is None

    with anyio.CancelScope() as scope:  # cancelled while it waits: gone
        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await anyio.wait_all_tasks_blocked()
            assert queue.waiting_consumer is token
            scope.cancel()
    assert queue.waiting_consumer is None


async def test_control_waits_when_its_bound_is_reached():
    queue: UpstreamQueue[str] = UpstreamQueue(max_control=1)
    await queue.put_control("first")
    with anyio.move_on_after(0.1) as waited:
        await queue.put_control("second")
    assert waited.cancel_called  # the reader of the client socket would pause here
    await queue.peek_run(1)
    queue.commit()
    with anyio.fail_after(1):
        await queue.put_control("second")


def test_the_pacer_keeps_the_client_at_most_lead_ahead_of_real_time():
    pacer = AudioPacer(lead=0.5, bytes_per_second=1000)
    assert pacer.wait_time(now=10.0) == 0
    pacer.sent(1000, now=10.0)  # one second of audio, played until 11.0
    assert pacer.wait_time(now=10.0) == pytest.approx(0.5)
    assert pacer.wait_time(now=10.6) == 0
    pacer.reset(now=10.6)  # the client flushed its playback
    assert pacer.wait_time(now=10.6) == 0
    assert AudioPacer(lead=None).wait_time(now=0.0) == 0


async def test_the_outbox_keeps_events_behind_their_audio_but_interruptions_jump_ahead():
    outbox = ClientOutbox(lead=None)
    await outbox.put_audio(b"\x01\x00" * 10)
    outbox.put_event('{"type":"transcript.output","text":"cut"}')
    outbox.put_event('{"type":"usage"}')
    await outbox.put_audio(b"\x02\x00" * 10)
    assert await outbox.get() == b"\x01\x00" * 10
    outbox.put_urgent('{"type":"turn.interrupted"}')
    assert await outbox.get() == '{"type":"turn.interrupted"}'
    # Nothing of the cut reply follows turn.interrupted; other events survive.
    assert await outbox.get() == '{"type":"usage"}'
    assert outbox.flushed_bytes == 20  # the audio still waiting was dropped
    with anyio.move_on_after(0.05) as empty:
        await outbox.get()
    assert empty.cancel_called


async def test_an_outbox_nobody_reads_overflows_instead_of_growing():
    outbox = ClientOutbox(max_events=2)
    outbox.put_event("a")
    outbox.put_event("b")
    with pytest.raises(OutboxOverflow):
        outbox.put_event("c")


async def test_audio_is_also_bounded_in_bytes_so_large_frames_cannot_pile_up():
    queue: UpstreamQueue[str] = UpstreamQueue(max_audio=100, max_audio_bytes=1000)
    assert [queue.put_audio(f"a{n}", 400) for n in range(4)] == [False, False, True, True]
    assert queue.dropped_audio == 2 and queue.held_bytes == 800
    assert await queue.peek_run(10) == (True, ["a2", "a3"])
    queue.commit()
    assert queue.held_bytes == 0


async def test_control_waits_when_its_bytes_reach_the_bound():
    queue: UpstreamQueue[str] = UpstreamQueue(max_control_bytes=100)
    await queue.put_control("turn 1", 60)
    await queue.put_control("turn 2", 60)  # under the bound when it came: taken
    with anyio.move_on_after(0.1) as waited:
        await queue.put_control("turn 3", 10)
    assert waited.cancelled_caught  # 120 bytes waiting: the reader stops here
    assert await queue.peek_run(5) == (False, ["turn 1"])
    queue.commit()
    with anyio.fail_after(1):
        await queue.put_control("turn 3", 10)  # 60 bytes now: taken at once
    assert queue.held_bytes == 70


async def test_a_burst_the_client_may_have_now_goes_as_one_frame_and_never_past_the_pacer_or_an_event():
    now = [100.0]
    outbox = ClientOutbox(lead=0.5, clock=lambda: now[0])
    chunk = 1920  # 40 ms at 24 kHz
    burst = [bytes([n]) * chunk for n in range(6)]
    for data in burst:
        await outbox.put_audio(data)
    assert await outbox.get() == b"".join(burst)  # a 240 ms burst: one frame, in order
    # 0.24 s ahead now; a second burst may only fill up to the lead (0.5 s): seven chunks more.
    more = [bytes([10 + n]) * chunk for n in range(10)]
    for data in more:
        await outbox.put_audio(data)
    assert await outbox.get() == b"".join(more[:7])
    with anyio.move_on_after(0.05) as held:
        await outbox.get()
    assert held.cancel_called  # the rest waits for the client to play
    now[0] += 0.12
    assert await outbox.get() == b"".join(more[7:])
    # An event in the middle of a burst keeps its place.
    now[0] += 10
    await outbox.put_audio(b"\x01" * chunk)
    outbox.put_event('{"type":"transcript.output","text":"x"}')
    await outbox.put_audio(b"\x02" * chunk)
    assert await outbox.get() == b"\x01" * chunk
    assert await outbox.get() == '{"type":"transcript.output","text":"x"}'
    assert await outbox.get() == b"\x02" * chunk


async def test_a_joined_frame_stays_under_its_size_cap():
    from live.server.queues import JOIN_AUDIO_BYTES

    outbox = ClientOutbox(lead=None)
    for n in range(30):
        await outbox.put_audio(bytes([n]) * 1920)
    sizes = []
    while sum(sizes) < 30 * 1920:
        sizes.append(len(await outbox.get()))
    assert max(sizes) <= JOIN_AUDIO_BYTES and len(sizes) < 10


async def test_signals_held_during_a_call_never_block_the_result_that_ends_the_hold():
    """While input is held (a call owed, on a model that closes on realtime
    input), a client pressing push-to-talk again and again must not fill the
    bound the tool's result needs: held signals beyond it drop the oldest."""
    queue: UpstreamQueue[str] = UpstreamQueue(max_control=4)
    queue.hold(True)
    with anyio.fail_after(1):
        for n in range(6):
            await queue.put_control(f"s{n}", realtime=True)
        await queue.put_control("result")
    assert queue.dropped_while_held == 2
    assert await queue.peek_run(10) == (False, ["result"])  # it goes first
    queue.commit()
    queue.hold(False)
    sent = []
    for _ in range(4):
        sent.append((await queue.peek_run(10))[1][0])
        queue.commit()
    assert sent == ["s2", "s3", "s4", "s5"]  # the newest, in order
