"""The two bounded queues of a session, and the pacing of audio to the client.

`UpstreamQueue` carries what the client sends toward the model, in order
(audio, images, control; images are dropped first when the model falls behind).
`ClientOutbox` carries events and audio toward the client. Each bound says what
happens when it is reached, and both are event-driven (no polling).
"""

from __future__ import annotations

import collections
import json
import time
from typing import Generic, TypeVar

import anyio
from google.genai import types

from live.llm import ClientTurns, RealtimeInput, RealtimeText

__all__ = ["AudioPacer", "ClientOutbox", "OutboxOverflow", "UpstreamQueue", "control_size"]

T = TypeVar("T")
BYTES_PER_SECOND_OUT = 24_000 * 2  # PCM16 mono at 24 kHz
# Events that belong to the reply being spoken (as `live.protocol.encode` writes them).
_REPLY_EVENTS = ('{"type":"transcript.output"', '{"type":"text"')


# Item kinds: content (typed turns, tool results), audio, images, and realtime
# signals (activity start and end, audio stream end).
_CONTROL, _AUDIO, _IMAGE, _SIGNAL = 0, 1, 2, 3


class UpstreamQueue(Generic[T]):
    """Client input on its way to the model: audio, images and control, one order.

    At most `max_audio` audio items, and `max_audio_bytes` of them, wait (100
    frames of 20 ms: two seconds, enough to hold what the user says while the
    model connection is being replaced; the byte bound keeps a client sending
    large frames to the same memory). When one more arrives, the *oldest*
    waiting audio is dropped and counted: a live conversation is better served by
    the newest audio than by a growing delay. Control items (text, activity, tool
    results) are never dropped; when `max_control` of them, or `max_control_bytes`,
    wait, `put_control` waits, which stops reading from the client until the
    model side catches up (so one item may take the bytes past the bound).

    Images (camera and screen frames) are the first thing dropped when the model
    falls behind: at most `max_images` wait (one by default), and a new image
    replaces the oldest waiting one, since the model wants what the user sees
    now. Images come at most a few a second, so an old image is dropped long
    before any audio is; and when audio reaches its own bound, a waiting image
    is dropped too. Every drop is counted (`dropped_audio`, `dropped_images`).

    The consumer `peek_run`s the head, sends it, and only then `commit`s it, so an
    item whose send failed because the connection dropped is sent again on the
    next one. A run of audio items at the head is taken at once: when the model
    side falls behind, the frames waiting go out as one larger chunk, so the cost
    per message (the SDK's encoding above all) is paid once for the run.

    While the consumer waits on an empty queue, `waiting_consumer` is what it
    waits as: nothing is queued or being sent, so a producer may send an item
    itself (skipping a task switch per audio frame) and keep its place in line.

    `hold(True)` holds realtime input (audio, images, signals) where it is:
    only content (a tool result, a typed turn) goes out, ahead of what is held,
    until `hold(False)`. Some models close the connection on realtime input
    while a function call is unanswered; the user keeps talking meanwhile, and
    what they say waits here, within the same bounds (the oldest audio dropped
    first, counted in `dropped_while_held` as well).
    """

    def __init__(
        self,
        *,
        max_audio: int = 100,
        max_control: int = 64,
        max_audio_bytes: int | None = None,
        max_control_bytes: int | None = None,
        max_images: int = 1,
    ) -> None:
        # (kind, item, size in bytes)
        self._items: collections.deque[tuple[int, T, int]] = collections.deque()
        self._audio = 0
        self._control = 0
        self._images = 0
        self._max_audio = max_audio
        self._max_control = max_control
        self._max_images = max(1, max_images)
        self._audio_bytes = 0
        self._control_bytes = 0
        self._signals = 0  # realtime signals among the control items
        self._signal_bytes = 0
        self._image_bytes = 0
        self._max_audio_bytes = max_audio_bytes
        self._max_control_bytes = max_control_bytes
        self._ready = anyio.Event()
        self._space = anyio.Event()
        # anyio.Event() looks the async backend up on every call (about 2 us, and
        # the consumer waits once per audio frame); the concrete class of the
        # first event makes the same events without the lookup.
        self._new_event = type(self._ready)
        self._in_flight = 0
        self._waiting_as: object | None = None
        self.holding = False
        self.dropped_audio = 0
        self.dropped_images = 0
        self.dropped_while_held = 0

    @property
    def waiting_consumer(self) -> object | None:
        """The `waiting_as` of a consumer waiting in `peek_run` with nothing queued,
        else None (also while realtime input is held: it must wait its turn)."""
        return self._waiting_as

    def hold(self, on: bool) -> None:
        """Hold realtime input (see the class docstring), or let it go."""
        if on == self.holding:
            return
        self.holding = on
        if on:
            self._waiting_as = None
            self._space.set()  # held signals no longer count: content may have room
        else:
            self._ready.set()

    @property
    def held_bytes(self) -> int:
        """Bytes of audio, images and control waiting (as their producers counted them)."""
        return self._audio_bytes + self._control_bytes + self._image_bytes

    def _drop_oldest_image(self) -> bool:
        items = self._items
        for index in range(self._in_flight, len(items)):  # never one being sent
            if items[index][0] == _IMAGE:
                self._image_bytes -= items[index][2]
                del items[index]
                self._images -= 1
                self.dropped_images += 1
                return True
        return False

    def put_audio(self, item: T, nbytes: int = 0) -> bool:
        """Queue audio of `nbytes`; returns True when older audio was dropped for it."""
        dropped = False
        index = self._in_flight  # never an item being sent: commit() removes those
        while self._audio and (
            self._audio >= self._max_audio
            or (
                self._max_audio_bytes is not None
                and self._audio_bytes + nbytes > self._max_audio_bytes
            )
        ):
            if self._images and self._drop_oldest_image():
                index = self._in_flight  # positions moved; the stale view goes first
            while index < len(self._items) and self._items[index][0] != _AUDIO:
                index += 1
            if index >= len(self._items):
                break
            self._audio_bytes -= self._items[index][2]
            del self._items[index]
            self._audio -= 1
            self.dropped_audio += 1
            if self.holding:
                self.dropped_while_held += 1
            dropped = True
        self._items.append((_AUDIO, item, nbytes))
        self._audio += 1
        self._audio_bytes += nbytes
        self._waiting_as = None
        self._ready.set()
        return dropped

    def put_image(self, item: T, nbytes: int = 0) -> bool:
        """Queue an image; returns True when an older waiting image was dropped for it."""
        dropped = self._images >= self._max_images and self._drop_oldest_image()
        self._items.append((_IMAGE, item, nbytes))
        self._images += 1
        self._image_bytes += nbytes
        self._waiting_as = None
        self._ready.set()
        return dropped

    async def put_control(self, item: T, nbytes: int = 0, *, realtime: bool = False) -> None:
        """Queue content, or a realtime signal (`realtime`: held with the audio).

        While input is held, held signals count against a bound of their own
        (`max_control` of them; beyond it the oldest is dropped and counted in
        `dropped_while_held`) and never make a producer wait: the content that
        ends the hold (a tool's result) may come from the same producer.
        """
        if realtime and self.holding:
            if self._signals >= self._max_control:
                self._drop_oldest_signal()
        else:
            while self._over_control_bound():
                if self._space.is_set():
                    self._space = self._new_event()  # several producers may share one wait
                await self._space.wait()
        self._items.append((_SIGNAL if realtime else _CONTROL, item, nbytes))
        self._control += 1
        self._control_bytes += nbytes
        if realtime:
            self._signals += 1
            self._signal_bytes += nbytes
        self._waiting_as = None
        self._ready.set()

    def put_signal(self, item: T, *, first: bool = False) -> None:
        """Queue a realtime signal of the server's own (an activity start or
        end) without waiting: a turn makes two at most, so they need no bound
        of their own and never make the audio path wait. `first`: ahead of
        everything waiting (but an item being sent), for the activity that
        the audio waiting for a new connection belongs to."""
        entry = (_SIGNAL, item, 0)
        if first:
            self._items.insert(self._in_flight, entry)
        else:
            self._items.append(entry)
        self._control += 1
        self._signals += 1
        self._waiting_as = None
        self._ready.set()

    async def peek_run(self, max_audio: int, *, waiting_as: object = None) -> tuple[bool, list[T]]:
        """The head, or the run of up to `max_audio` audio items starting there.

        Returns whether the items are audio, and the items; all stay in place
        until `commit`. Waits for at least one item, meanwhile showing
        `waiting_as` as `waiting_consumer`.
        """
        while not self._items or (self.holding and not self._content_first()):
            self._ready = self._new_event()
            self._waiting_as = waiting_as if not self._items and not self.holding else None
            try:
                await self._ready.wait()
            finally:
                self._waiting_as = None
        items = self._items
        kind, head, _ = items[0]
        if kind != _AUDIO or len(items) == 1 or items[1][0] != _AUDIO:
            self._in_flight = 1
            return kind == _AUDIO, [head]
        run: list[T] = []
        for kind, item, _ in items:
            if kind != _AUDIO or len(run) == max_audio:
                break
            run.append(item)
        self._in_flight = len(run)
        return True, run

    def _over_control_bound(self) -> bool:
        """Whether content must wait: held signals do not count (see `put_control`)."""
        count, size = self._control, self._control_bytes
        if self.holding:
            count -= self._signals
            size -= self._signal_bytes
        return count >= self._max_control or (
            self._max_control_bytes is not None and count > 0 and size >= self._max_control_bytes
        )

    def _drop_oldest_signal(self) -> None:
        items = self._items
        for index in range(self._in_flight, len(items)):  # never one being sent
            kind, _, nbytes = items[index]
            if kind == _SIGNAL:
                del items[index]
                self._control -= 1
                self._control_bytes -= nbytes
                self._signals -= 1
                self._signal_bytes -= nbytes
                self.dropped_while_held += 1
                return

    def _content_first(self) -> bool:
        """While holding: put the first content item at the head; False when there is none."""
        items = self._items
        if items[0][0] == _CONTROL:
            return True
        for index in range(1, len(items)):
            if items[index][0] == _CONTROL:
                entry = items[index]
                del items[index]
                items.appendleft(entry)
                return True
        return False

    def commit(self) -> None:
        """What was peeked was sent: remove it."""
        for _ in range(self._in_flight):
            kind, _, nbytes = self._items.popleft()
            if kind == _AUDIO:
                self._audio -= 1
                self._audio_bytes -= nbytes
            elif kind == _IMAGE:
                self._images -= 1
                self._image_bytes -= nbytes
            else:
                self._control -= 1
                self._control_bytes -= nbytes
                if kind == _SIGNAL:
                    self._signals -= 1
                    self._signal_bytes -= nbytes
                self._space.set()
        self._in_flight = 0

    def release(self) -> None:
        """What was peeked was not sent (the connection dropped); it stays first in line."""
        self._in_flight = 0


class AudioPacer:
    """Keeps the client at most `lead` seconds of audio ahead of its playback.

    Audio that stays on the server can still be dropped when the user barges in;
    audio already sent sits in the client's playback buffer. A short lead keeps
    playback smooth and makes an interruption discard little. `lead=None`
    disables pacing (send as fast as the socket takes it).
    """

    def __init__(self, lead: float | None, bytes_per_second: int = BYTES_PER_SECOND_OUT) -> None:
        self.lead = lead
        self._bytes_per_second = bytes_per_second
        self._played_until = 0.0  # when the client will have played all it was sent

    def wait_time(self, now: float) -> float:
        """Seconds to wait before the next chunk may be sent (0 means now)."""
        if self.lead is None:
            return 0.0
        return max(0.0, self._played_until - self.lead - now)

    def sent(self, nbytes: int, now: float) -> None:
        self._played_until = max(self._played_until, now) + nbytes / self._bytes_per_second

    def reset(self, now: float) -> None:
        """The client flushed its playback (interruption)."""
        self._played_until = now

    def ahead(self, now: float) -> float:
        """Seconds of audio sent that the client has not played yet (at real-time playback)."""
        return max(0.0, self._played_until - now)


JOIN_AUDIO_BYTES = 16 << 10
"""The most reply audio sent as one frame (about a third of a second at 24 kHz)."""


class OutboxOverflow(Exception):
    """The client stopped reading: its event queue is full."""


class ClientOutbox:
    """Frames waiting for one client socket, in the order the model produced them.

    Audio is paced (see `AudioPacer`); an event queued behind audio waits for it,
    so a transcript or `turn.complete` never overtakes the audio it belongs to.
    The one exception is `put_urgent` (`turn.interrupted`): it drops the queued
    audio and goes first. At most `max_events` events wait; beyond that the client
    is not reading and `put_event` raises `OutboxOverflow` (the session ends).
    Audio waits up to `max_audio_seconds`; `put_audio` then waits, which stops
    reading from the model until the client catches up, so memory per session
    stays bounded.
    """

    def __init__(
        self,
        *,
        max_events: int = 1024,
        max_audio_seconds: float = 10.0,
        lead: float | None = 0.5,
        clock=time.monotonic,
    ) -> None:
        self._frames: collections.deque[str | bytes | object] = collections.deque()
        self._events = 0
        self._audio_bytes = 0
        self._max_events = max_events
        self._max_audio_bytes = int(max_audio_seconds * BYTES_PER_SECOND_OUT)
        self._pacer = AudioPacer(lead)
        self._clock = clock
        self._wake = anyio.Event()
        self._space = anyio.Event()
        self._new_event = type(self._wake)  # see UpstreamQueue
        self.flushed_bytes = 0
        self.flushed_frames = 0

    def put_event(self, frame: str | object) -> None:
        """An event's frame; or the event itself, for the writer to turn into
        frames when its turn comes (it belongs to the reply: a barge-in drops it)."""
        if self._events >= self._max_events:
            raise OutboxOverflow(f"{self._max_events} events waiting for a client that is not reading")
        self._frames.append(frame)
        self._events += 1
        self._wake.set()

    def put_urgent(self, frame: str) -> None:
        """Drop queued audio and send `frame` before anything else."""
        self.flush_audio()
        self._frames.appendleft(frame)
        self._events += 1
        self._wake.set()

    async def put_audio(self, data: bytes) -> None:
        while self._audio_bytes >= self._max_audio_bytes:
            if self._space.is_set():
                self._space = self._new_event()
            await self._space.wait()
        self._frames.append(data)
        self._audio_bytes += len(data)
        self._wake.set()

    def audio_waiting_seconds(self) -> float:
        """Reply audio queued here and not yet sent, in seconds."""
        return self._audio_bytes / BYTES_PER_SECOND_OUT

    @property
    def empty(self) -> bool:
        """Nothing waits to be sent: every frame queued so far has left."""
        return not self._frames

    def unplayed_seconds(self) -> float:
        """Audio sent to the client and not yet played, as far as the pacing knows."""
        return self._pacer.ahead(self._clock())

    def flush_audio(self) -> int:
        """Drop all queued reply audio, and the reply's transcript and text events
        still waiting with it (the user barged in); returns the bytes dropped.

        Nothing of the cut reply may follow `turn.interrupted`."""
        dropped = self._audio_bytes
        if dropped or any(type(f) is not bytes and not (type(f) is str and not f.startswith(_REPLY_EVENTS)) for f in self._frames):
            kept = collections.deque(
                f for f in self._frames if type(f) is str and not f.startswith(_REPLY_EVENTS)
            )
            self.flushed_frames += len(self._frames) - len(kept)
            self._events = len(kept)
            self._frames = kept
            self._audio_bytes = 0
            self.flushed_bytes += dropped
            self._space.set()
        self._pacer.reset(self._clock())
        return dropped

    def _join_audio(self, first: bytes, now: float) -> bytes:
        """`first` and the audio right behind it that the pacer lets go now, as one frame.

        The model's audio comes in bursts (200-240 ms as five or six chunks);
        a burst the client may have at once goes in one frame, one socket
        write instead of six. Never past an event, never past the pacer, at
        most `JOIN_AUDIO_BYTES`.
        """
        frames = self._frames
        pacer = self._pacer
        parts = [first]
        size = len(first)
        while frames:
            nxt = frames[0]
            if type(nxt) is not bytes or size + len(nxt) > JOIN_AUDIO_BYTES or pacer.wait_time(now) > 0:
                break
            frames.popleft()
            pacer.sent(len(nxt), now)
            parts.append(nxt)
            size += len(nxt)
        return b"".join(parts) if len(parts) > 1 else first

    async def get(self) -> str | bytes | object:
        """The next frame to send; waits for one, and for the pacer before audio."""
        while True:
            frames = self._frames
            if frames:
                head = frames[0]
                if type(head) is not bytes:
                    self._events -= 1
                    return frames.popleft()
                now = self._clock()
                pacer = self._pacer
                delay = pacer.wait_time(now)
                if delay <= 0:
                    frames.popleft()
                    pacer.sent(len(head), now)
                    if frames and type(frames[0]) is bytes and pacer.wait_time(now) <= 0:
                        head = self._join_audio(head, now)
                    self._audio_bytes -= len(head)
                    self._space.set()
                    return head
                self._wake = self._new_event()
                with anyio.move_on_after(delay):
                    await self._wake.wait()
                continue
            self._wake = self._new_event()
            await self._wake.wait()


def control_size(item: types.Content | ClientTurns | RealtimeText | RealtimeInput) -> int:
    """About what a control item holds in memory: its text, media and tool-result payloads."""
    if isinstance(item, RealtimeText):
        return len(item.text)
    if isinstance(item, ClientTurns):
        return sum(control_size(turn) for turn in item.turns)
    if not isinstance(item, types.Content):
        return 0
    size = 0
    for part in item.parts or ():
        if part.inline_data is not None:
            size += len(part.inline_data.data or b"")
        if part.text:
            size += len(part.text)
        if part.function_response is not None and part.function_response.response:
            size += len(json.dumps(part.function_response.response, default=str))
    return size
