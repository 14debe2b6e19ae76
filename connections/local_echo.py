"""`local/echo`: a model that needs no key and no network, for trying the server anywhere.

It listens like Gemini Live (voice activity on the incoming audio, or manual
activity start/end) and, when the user's turn ends, answers with the user's own
utterance at 24 kHz, paced like speech, so barge-in, pacing and playback can be
exercised end to end. What it cannot do it does not pretend to:

- no transcription: it emits no input or output transcripts at all;
- no tools: it declares none and never calls one; function responses are
  accepted and ignored;
- no memory: `send_history` accepts and ignores the history (a seeded user turn
  is not answered);
- no vision: image blobs are rejected like any non-PCM mime type;
- a typed user turn (`send_content`) is echoed back as text.

Model output is marked `partial=True`, as the Gemini mapping marks model-turn
content; the turn's boundaries are the separate `generation_complete`,
`turn_complete` and `interrupted` responses.

The speech logic lives in `connections.vad` (sans I/O); this module only adds
the pacing task and the contract's concurrency rules.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import anyio
import anyio.abc
from google.genai import types

from connections.audio import OUTPUT_RATE, parse_pcm_mime
from connections.vad import TurnEnded, TurnEvent, TurnStarted, TurnTracker, VadConfig
from live.errors import ConnectionClosedError
from live.llm import (
    AudioStreamEnd,
    BaseLlm,
    BaseLlmConnection,
    LlmRequest,
    LlmResponse,
    RealtimeInput,
)

__all__ = ["EchoConfig", "LocalEcho", "LocalEchoConnection"]

OUTPUT_MIME = f"audio/pcm;rate={OUTPUT_RATE}"

_JOB_QUEUE_SIZE = 8
"""Replies waiting for the pacing task. Each new turn interrupts the previous
reply, so stale replies drain instantly; the queue fills only when the receiver
stops reading, and then senders wait (back-pressure, nothing is dropped)."""


@dataclasses.dataclass(frozen=True, slots=True)
class EchoConfig:
    """Settings shared by every session of a `LocalEcho`."""

    speed: float = 1.0
    """Pacing factor: 1.0 plays replies in real time; tests use more to go faster."""
    chunk_ms: int = 40
    vad: VadConfig = dataclasses.field(default_factory=VadConfig)
    max_turn_s: float = 30.0
    """Utterance kept per turn; speech beyond it is dropped (the start is echoed)."""
    output_queue: int = 16
    """Responses buffered for the receiver. When full the reply pauses until the
    receiver catches up: audio is delayed, never dropped."""

    def __post_init__(self) -> None:
        if self.speed <= 0:
            raise ValueError("speed must be positive")
        if self.chunk_ms <= 0:
            raise ValueError("chunk_ms must be positive")


@dataclasses.dataclass(frozen=True, slots=True)
class _Reply:
    generation: int
    audio: bytes | None = None
    text: str | None = None


class LocalEcho(BaseLlm):
    """The built-in echo model (`local/echo`); holds only its shared configuration."""

    def __init__(self, model: str = "local/echo", *, config: EchoConfig | None = None) -> None:
        super().__init__(model)
        self._config = config or EchoConfig()

    @property
    def config(self) -> EchoConfig:
        return self._config

    def connect(self, request: LlmRequest) -> AbstractAsyncContextManager[LocalEchoConnection]:
        """Open a session. Automatic activity detection follows the request's
        `realtime_input_config`; when it is disabled only activity start/end
        make turns."""
        return self._session(request)

    @asynccontextmanager
    async def _session(self, request: LlmRequest) -> AsyncIterator[LocalEchoConnection]:
        conn = LocalEchoConnection(self._config, automatic=_automatic_vad(request))
        error: BaseException | None = None
        async with anyio.create_task_group() as tg:
            await tg.start(conn._run)
            try:
                yield conn
            except GeneratorExit:
                raise
            except BaseException as exc:  # re-raised below, outside the task group
                error = exc
            finally:
                await conn.close()
        if error is not None:
            # Raised bare rather than wrapped in the task group's ExceptionGroup.
            raise error


def _automatic_vad(request: LlmRequest) -> bool:
    ric = request.live_connect_config.realtime_input_config
    aad = ric.automatic_activity_detection if ric else None
    return not (aad is not None and aad.disabled)


class LocalEchoConnection(BaseLlmConnection):
    """One echo session. Created by `LocalEcho.connect`, which owns its pacing task.

    Senders run the turn logic synchronously (it is pure numpy, no awaits), so
    concurrent senders cannot interleave inside it. A barge-in bumps the
    generation and cancels the reply being played at once; the pacing task,
    the only writer of responses, then emits `interrupted`. Each reply ends in
    exactly one of `turn_complete` or `interrupted`.
    """

    def __init__(self, config: EchoConfig, *, automatic: bool = True) -> None:
        self._config = config
        self._turns = TurnTracker(config.vad, automatic=automatic, max_turn_s=config.max_turn_s)
        self._out_send, self._out_recv = anyio.create_memory_object_stream[LlmResponse](
            config.output_queue
        )
        self._jobs_send, self._jobs_recv = anyio.create_memory_object_stream[_Reply](
            _JOB_QUEUE_SIZE
        )
        self._generation = 0
        self._closed = False
        self._run_scope: anyio.CancelScope | None = None
        self._reply_scope: anyio.CancelScope | None = None

    # -- senders -----------------------------------------------------------

    async def send_history(self, history: Sequence[types.Content]) -> None:
        """Accepted and ignored: the echo keeps no conversation memory."""
        self._check_open()

    async def send_content(self, content: types.Content) -> None:
        """Echo a typed user turn as text; function responses are accepted and ignored."""
        self._check_open()
        parts = content.parts or []
        responses = [p for p in parts if p.function_response is not None]
        if responses and len(responses) != len(parts):
            raise ValueError("a content cannot mix function responses with other parts")
        if responses:
            return  # the echo declares no tools, so nothing waits on these
        text = "".join(p.text for p in parts if p.text and not p.thought)
        self._barge_in()  # a new user turn interrupts the current reply, as on Gemini
        await self._queue(_Reply(self._generation, text=text))

    async def send_realtime(self, input: RealtimeInput) -> None:
        """PCM audio (`audio/pcm;rate=N`, 16 kHz when absent), activity start/end, stream end.

        Images and video frames are accepted and ignored: an echo has nothing to see.
        """
        self._check_open()
        if isinstance(input, types.Blob) and (input.mime_type or "").startswith(("image/", "video/")):
            return
        if isinstance(input, types.Blob):
            rate = parse_pcm_mime(input.mime_type)
            data = input.data or b""
            if len(data) % 2:
                raise ValueError("PCM16 audio must have an even number of bytes")
            events = self._turns.feed(data, rate)
        elif isinstance(input, types.ActivityStart):
            events = self._turns.activity_start()
        elif isinstance(input, types.ActivityEnd):
            events = self._turns.activity_end()
        elif isinstance(input, AudioStreamEnd):
            events = self._turns.audio_stream_end()
        else:
            raise TypeError(f"unsupported realtime input: {type(input).__name__}")
        await self._handle(events)

    async def _handle(self, events: list[TurnEvent]) -> None:
        # Stamp every reply before the first await, so a barge-in from another
        # sender during the wait makes it stale rather than racing it.
        replies = []
        for event in events:
            if isinstance(event, TurnStarted):
                self._barge_in()
            elif isinstance(event, TurnEnded):
                replies.append(_Reply(self._generation, audio=event.audio))
        for reply in replies:
            await self._queue(reply)

    def _barge_in(self) -> None:
        self._generation += 1
        if self._reply_scope is not None:
            self._reply_scope.cancel()

    async def _queue(self, reply: _Reply) -> None:
        try:
            await self._jobs_send.send(reply)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            raise ConnectionClosedError("the local echo connection is closed") from None

    def _check_open(self) -> None:
        if self._closed:
            raise ConnectionClosedError("the local echo connection is closed")

    # -- receiver ------------------------------------------------------------

    async def receive(self) -> AsyncIterator[LlmResponse]:
        """Every response until the connection closes; then ends quietly."""
        async for response in self._out_recv:
            yield response

    async def close(self) -> None:
        """Idempotent. Stops the reply at once; `receive()` ends after what it already holds."""
        if self._closed:
            return
        self._closed = True
        self._generation += 1
        if self._run_scope is not None:
            self._run_scope.cancel()

    # -- pacing task -----------------------------------------------------------

    async def _run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Plays replies one at a time; the only writer of responses."""
        try:
            with anyio.CancelScope() as self._run_scope:
                task_status.started()
                async for reply in self._jobs_recv:
                    await self._play(reply)
        finally:
            self._jobs_recv.close()  # wakes senders blocked on a full queue
            self._out_send.close()  # ends receive()

    async def _play(self, reply: _Reply) -> None:
        if reply.generation != self._generation:
            # Interrupted before it began (another turn started meanwhile).
            await self._out_send.send(LlmResponse(interrupted=True))
            return
        with anyio.CancelScope() as scope:
            self._reply_scope = scope
            try:
                if reply.audio is not None:
                    await self._play_audio(reply.audio)
                else:
                    if reply.text:
                        await self._out_send.send(
                            LlmResponse(
                                content=types.Content(role="model", parts=[types.Part(text=reply.text)]),
                                partial=True,
                            )
                        )
                    await self._out_send.send(LlmResponse(generation_complete=True))
                await self._out_send.send(LlmResponse(turn_complete=True))
            finally:
                self._reply_scope = None
        if scope.cancelled_caught:
            await self._out_send.send(LlmResponse(interrupted=True))

    async def _play_audio(self, audio: bytes) -> None:
        """Chunks at real time / speed; generation completes after the last chunk,
        and the turn completes when a real-time listener would have heard it all."""
        step = OUTPUT_RATE * self._config.chunk_ms // 1000 * 2
        seconds_per_byte = 1 / (2 * OUTPUT_RATE * self._config.speed)
        deadline = anyio.current_time()
        for offset in range(0, len(audio), step):
            chunk = audio[offset : offset + step]
            blob = types.Blob(data=chunk, mime_type=OUTPUT_MIME)
            await self._out_send.send(
                LlmResponse(
                    content=types.Content(role="model", parts=[types.Part(inline_data=blob)]),
                    partial=True,
                )
            )
            period = len(chunk) * seconds_per_byte
            # After a stall (slow receiver) resume pacing from now rather than burst.
            deadline = max(deadline + period, anyio.current_time() - period)
            if offset + step < len(audio):
                await anyio.sleep_until(deadline)
        await self._out_send.send(LlmResponse(generation_complete=True))
        await anyio.sleep_until(deadline)
