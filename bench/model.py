"""The model side of the benchmark: scripted Gemini sessions that talk like a conversation.

Built on `connections.double`: each `Conversation` is a `ScriptedSession` (so the
real `Gemini` connection code, or the baseline bridge, drives it exactly as it
drives any double), and one `Director` per process pushes every session's
server messages at their scheduled times. A message is stamped with the time it
was *due*, not the time it was pushed: a busy event loop that pushes late is
counted as latency, as a socket buffer filling up in front of a busy server
would be.

One conversation cycle (about 3.7 s, repeated; each session starts at a random
phase):

- the user speaks for 1.2 s (the client streams 20 ms frames all the time, like
  an open microphone); three input-transcript fragments arrive meanwhile;
- the model answers with 2.4 s of 24 kHz audio: 40 ms chunks in bursts of 5 or
  6 (200-240 ms) at 1.05x real time, each burst with an output-transcript
  fragment; then `generation_complete` and `turn_complete`;
- the first answer and every third after it is cut short: after half of it,
  `interrupted`, then `turn_complete` 80 ms later.
"""

from __future__ import annotations

import heapq
import random
import time
from typing import Any

import anyio
from google.genai import types

from bench.stats import DOWN_CHUNK_BYTES, MAGIC, UP, UP_FRAME_BYTES, Histogram, down_chunk
from connections import double

__all__ = ["Conversation", "Director", "audio_message"]

OUTPUT_MIME = "audio/pcm;rate=24000"
CHUNK_S = DOWN_CHUNK_BYTES / 48_000  # 40 ms
LISTEN_S = 1.2
INPUT_FRAGMENTS = 3
BURSTS = 10
SPEED = 1.05
INTERRUPT_EVERY = 3
INTERRUPT_AFTER_BURSTS = 5
TURN_COMPLETE_AFTER_INTERRUPT_S = 0.08

# The model side should cost the run as little as possible: its share is the
# same in both modes, but it shares the process (and the cores) with the server.
# Audio messages differ by their stamp, so each is built: from prototypes, the
# way `model_construct` builds a model, without re-applying every default (half
# the cost of `model_copy`, a fifth of validating). The result is an ordinary
# model: equal to `double.audio(pcm)`, with the same fields set.
_BLOB = types.Blob(mime_type=OUTPUT_MIME)
_PART = types.Part()
_CONTENT = types.Content(role="model")
_SERVER_CONTENT = types.LiveServerContent()
_MESSAGE = types.LiveServerMessage()
_setattr = object.__setattr__


def _with(proto: Any, name: str, value: Any) -> Any:
    cls = type(proto)
    model = cls.__new__(cls)
    fields = proto.__dict__.copy()
    fields[name] = value
    _setattr(model, "__dict__", fields)
    _setattr(model, "__pydantic_fields_set__", {*proto.__pydantic_fields_set__, name})
    _setattr(model, "__pydantic_extra__", None)
    _setattr(model, "__pydantic_private__", None)
    return model


def audio_message(pcm: bytes) -> types.LiveServerMessage:
    """A bare model-audio message, equal to `double.audio(pcm)`."""
    content = _with(_CONTENT, "parts", [_with(_PART, "inline_data", _with(_BLOB, "data", pcm))])
    return _with(_MESSAGE, "server_content", _with(_SERVER_CONTENT, "model_turn", content))


# Messages without a stamp are shared: nothing on the way mutates a message.
_WORDS = 16
_INPUT = [double.input_transcript(f"word{i} ") for i in range(_WORDS)]
_OUTPUT = [double.output_transcript(f"reply{i} ") for i in range(_WORDS)]
_INTERRUPTED = double.interrupted()
_GENERATION_COMPLETE = double.generation_complete()
_TURN_COMPLETE = double.turn_complete()


_S = 1_000_000_000  # nanoseconds per second


class Conversation(double.ScriptedSession):
    """One simulated Gemini session; learns its client's id from the first audio frame."""

    def __init__(self, director: Director) -> None:
        super().__init__(record_audio=False)
        self.director = director
        self.client: int | None = None
        self.last_seq = -1
        self.turn = 0
        self._state = "listen"
        self._step = 0
        self._burst_sizes: list[int] = []
        self._chunk_seq = 0

    async def send_realtime_input(self, **kwargs: Any) -> None:
        audio = kwargs.get("audio")
        if audio is not None:
            self._arrived(audio.data if isinstance(audio, types.Blob) else audio["data"])
        await super().send_realtime_input(**kwargs)

    def send_audio_nowait(self, audio: types.Blob) -> bool:
        if not super().send_audio_nowait(audio):
            return False
        self._arrived(audio.data or b"")
        return True

    def _arrived(self, data: bytes) -> None:
        # Frames that waited are sent as one chunk: every frame keeps its stamp.
        for offset in range(0, len(data) - UP.size + 1, UP_FRAME_BYTES):
            magic, client, seq, sent_ns = UP.unpack_from(data, offset)
            if magic == MAGIC:
                self.director.upstream(self, client, seq, sent_ns)

    # -- the script, one step at a time ------------------------------------------

    def step(self, due: int) -> int | None:
        """Push what is due at `due` (ns); returns when the next step is due."""
        if self.closed:
            return None
        director = self.director
        if self._state == "listen":
            self._step += 1
            self.push(_INPUT[self._step % _WORDS])
            if self._step < INPUT_FRAGMENTS:
                return due + int(LISTEN_S / INPUT_FRAGMENTS * _S)
            self._state, self._step = "speak", 0
            self.turn += 1
            self._chunk_seq = 0
            rng = director.rng
            self._burst_sizes = [rng.choice((5, 6)) for _ in range(BURSTS)]
            return due + int(LISTEN_S / INPUT_FRAGMENTS * _S)
        if self._state == "speak":
            interrupt = self.turn % INTERRUPT_EVERY == 1
            if interrupt and self._step == INTERRUPT_AFTER_BURSTS:
                self.push(_INTERRUPTED)
                director.interrupted(self, due)
                self._state = "after_interrupt"
                return due + int(TURN_COMPLETE_AFTER_INTERRUPT_S * _S)
            if self._step == BURSTS:
                self.push(_GENERATION_COMPLETE, _TURN_COMPLETE)
                self._state, self._step = "listen", 0
                return due
            size = self._burst_sizes[self._step]
            self._step += 1
            client = self.client or 0
            first = self._chunk_seq
            self._chunk_seq += size
            self.push(
                *[
                    audio_message(down_chunk(client, self.turn, seq, due))
                    for seq in range(first, first + size)
                ],
                _OUTPUT[self._step % _WORDS],
            )
            director.pushed_chunks(size)
            return due + int(size * CHUNK_S / SPEED * _S)
        # after_interrupt
        self.push(_TURN_COMPLETE)
        self._state, self._step = "listen", 0
        return due


class Director:
    """Schedules every conversation of a process and keeps the model-side figures."""

    def __init__(self, seed: int = 1) -> None:
        self.rng = random.Random(seed)
        self.measuring = False
        self.up_latency = Histogram()
        self.up_frames = 0
        self.up_gaps = 0
        self.down_chunks = 0
        self.interrupts: list[tuple[int, int, int]] = []  # client, turn, due (ns)
        self.conversations: list[Conversation] = []
        self._heap: list[tuple[int, int, Conversation]] = []
        self._order = 0
        self._added = anyio.Event()

    def make(self) -> Conversation:
        """A new session (the `DoubleTransport` factory)."""
        conversation = Conversation(self)
        self.conversations.append(conversation)
        return conversation

    def reset(self) -> None:
        self.measuring = True
        self.up_latency = Histogram()
        self.up_frames = self.up_gaps = self.down_chunks = 0
        self.interrupts = []

    def upstream(self, conversation: Conversation, client: int, seq: int, sent_ns: int) -> None:
        if self.measuring:
            self.up_latency.add(time.monotonic_ns() - sent_ns)
            self.up_frames += 1
        if conversation.client is None:
            conversation.client = client
            # Start at a random point of the listening phase: sessions spread out.
            offset = int(self.rng.uniform(0, LISTEN_S) * _S)
            self._schedule(time.monotonic_ns() + offset, conversation)
        elif seq > conversation.last_seq + 1 and self.measuring:
            self.up_gaps += seq - conversation.last_seq - 1
        conversation.last_seq = max(conversation.last_seq, seq)

    def interrupted(self, conversation: Conversation, due: int) -> None:
        if self.measuring:
            self.interrupts.append((conversation.client or 0, conversation.turn, due))

    def pushed_chunks(self, count: int) -> None:
        if self.measuring:
            self.down_chunks += count

    def _schedule(self, due: int, conversation: Conversation) -> None:
        self._order += 1
        heapq.heappush(self._heap, (due, self._order, conversation))
        self._added.set()

    async def run(self) -> None:
        """Push every session's messages when due; runs until cancelled."""
        heap = self._heap
        while True:
            if not heap:
                self._added = anyio.Event()
                await self._added.wait()
                continue
            wait = (heap[0][0] - time.monotonic_ns()) / _S
            if wait > 0:
                self._added = anyio.Event()
                with anyio.move_on_after(wait):
                    await self._added.wait()
                continue
            now = time.monotonic_ns()
            # Everything due now, bounded so a late loop still yields to the server.
            for _ in range(256):
                if not heap or heap[0][0] > now:
                    break
                due, _, conversation = heapq.heappop(heap)
                following = conversation.step(due)
                if following is not None:
                    self._order += 1
                    heapq.heappush(heap, (following, self._order, conversation))
            await anyio.sleep(0)
