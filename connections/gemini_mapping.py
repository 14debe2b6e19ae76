"""Gemini Live messages to and from the live contract, with no I/O at all.

The server direction is a small state machine, `ServerMessageMapper`: it is fed
one `types.LiveServerMessage` at a time and returns the `LlmResponse`s it means.
Its only state is the per-turn transcript accumulators, so one mapper belongs
to one connection. The client direction is a handful of pure functions.

Rules, each with the reason it exists:

- Every field of every message is read, and every part of a model turn is kept:
  Gemini 3.x bundles audio, transcript fragments and turn-complete in one message.
- One response per message on the hot path (an audio chunk every 40 ms): the
  model's `Content` is passed through as is, never copied.
- Transcripts arrive as sub-word fragments. Each one is surfaced at once with
  `partial=True` and `Transcription(finished=False)`; the first turn boundary
  (`generationComplete`, `interrupted` or `turnComplete`) adds one final
  transcript per direction with the whole text and `finished=True`, then the
  accumulator starts over. A final the server sends itself is used instead of a
  synthesized one, never in addition to it.
- When a message carries both fragments and a boundary, the fragments come
  first (partial) and the boundary flags travel with the finals in a second
  response, so `partial` never describes a final transcript.
- Transcripts are not ordered with the model turn (google-genai's types,
  livekit agents-js#2165, pipecat#1788): the tail of a turn's output transcript
  may arrive after its `turnComplete`. Such a fragment, before any output of a
  new reply or any input from the user (a new reply answers input), is
  surfaced on its own with `late_transcription=True` and kept out of the next
  turn's transcript. (Input transcripts after a turn are taken as
  the user's next turn: new speech and a late tail cannot be told apart.)
  The tail of a transcript finalized at `generationComplete` that arrives
  before `turnComplete` is late in the same way.
- Tool calls are surfaced at once (holding them deadlocks 3.1) as model content
  of `function_call` parts with their ids kept exactly; a missing id is
  replaced by one of ours (`live-` + hex) so the answer can be paired.

`interimInputTranscription` (unstable text the server revises) is surfaced as
it came, never accumulated into a transcript (that would duplicate words), and
`urlContextMetadata` as it came. Not surfaced: `setupComplete` (the SDK
consumes it while connecting). The legacy `voiceActivityDetectionSignal` is
surfaced as `voice_activity`.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Sequence
from typing import Any, Final

from google.genai import types

from live.families import family_of
from live.llm import AudioStreamEnd, LlmResponse, RealtimeInput

__all__ = [
    "GENERATED_ID_PREFIX",
    "ServerMessageMapper",
    "function_responses_of",
    "HistoryPlan",
    "history_in_client_content",
    "history_plan",
    "history_turns",
    "is_gemini3",
    "parse_duration",
    "prepare_connect_config",
    "realtime_kwargs",
    "text_of",
]

GENERATED_ID_PREFIX: Final = "live-"
"""Prefix of tool-call ids we generate when the server sends none."""

_DURATION = re.compile(r"\s*(-?\d+(?:\.\d*)?|-?\.\d+)\s*s?\s*")

_ONLY_SERVER_CONTENT: Final = frozenset({"server_content"})
_ONLY_MODEL_TURN: Final = frozenset({"model_turn"})

_VAD_TO_ACTIVITY: Final = {
    types.VadSignalType.VAD_SIGNAL_TYPE_SOS: types.VoiceActivityType.ACTIVITY_START,
    types.VadSignalType.VAD_SIGNAL_TYPE_EOS: types.VoiceActivityType.ACTIVITY_END,
}


def parse_duration(value: str | None) -> float | None:
    """Seconds in a protobuf JSON duration such as `"9.5s"` or `"1.000000001s"`.

    None for None or text that is not a duration (the caller decides what an
    unreadable go-away means).
    """
    if value is None:
        return None
    match = _DURATION.fullmatch(value)
    return float(match.group(1)) if match else None


def new_call_id() -> str:
    """A tool-call id of our own, recognisable by its prefix."""
    return GENERATED_ID_PREFIX + uuid.uuid4().hex


_WORD = re.compile(r"\w+")


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def _covers(final: str, so_far: str) -> bool:
    """Whether a server final is a whole (possibly revised) text of `so_far`.

    True when nothing was accumulated, when the final starts with it, or when
    most of the accumulated words (compared without case or punctuation) are
    in the final at least as many times: a revision of the same sentence. A
    final that is only the last words of the sentence is a fragment.
    """
    if not so_far or final.startswith(so_far):
        return True
    had = _words(so_far)
    if not had:
        return True
    counts: dict[str, int] = {}
    for word in _words(final):
        counts[word] = counts.get(word, 0) + 1
    kept = 0
    for word in had:
        if counts.get(word, 0) > 0:
            counts[word] -= 1
            kept += 1
    return kept * 2 > len(had)


class _Accumulator:
    """The transcript of one direction for the current turn."""

    __slots__ = ("pieces",)

    def __init__(self) -> None:
        self.pieces: list[str] = []

    def add(self, fragment: types.Transcription) -> types.Transcription | None:
        """Record a server transcription; returns the server's own final, if it is one.

        A server final carries either the last fragment or the whole text, and
        the whole text may be revised (case, punctuation, a word corrected). It
        is taken as the whole text when it covers what was accumulated (see
        `_covers`), otherwise appended as the last fragment: words are neither
        lost nor doubled.
        """
        text = fragment.text or ""
        if not fragment.finished:
            if text:
                self.pieces.append(text)
            return None
        so_far = "".join(self.pieces)
        full = text if _covers(text, so_far) else so_far + text
        self.pieces.clear()
        if not full:
            return None
        return types.Transcription(
            text=full,
            finished=True,
            language_code=fragment.language_code,
            speaker_label=fragment.speaker_label,
        )

    def finish(self) -> types.Transcription | None:
        """The synthesized final for the turn, or None when nothing was said."""
        if not self.pieces:
            return None
        text = "".join(self.pieces)
        self.pieces.clear()
        return types.Transcription(text=text, finished=True)


class ServerMessageMapper:
    """Turns server messages into responses; one instance per connection.

    `feed()` returns a list (usually of one response, sometimes two, empty for
    messages that mean nothing to a caller such as `setupComplete`).
    """

    __slots__ = ("_input", "_output", "_new_id", "turn_over")

    def __init__(self, *, new_id: Any = new_call_id) -> None:
        self._input = _Accumulator()
        self._output = _Accumulator()
        self._new_id = new_id
        # A turn's generation completed, and since then neither output of a new
        # reply nor input from the user (speech heard, a turn or tool result
        # sent: the connection clears it) came: an output transcript fragment
        # now is that turn's late tail. Whoever passes model output around the
        # mapper (the lean wire's bare chunks) clears it too.
        self.turn_over = False

    @property
    def pending_input_transcript(self) -> str:
        """Input transcript accumulated in the current turn and not yet finalized."""
        return "".join(self._input.pieces)

    @property
    def pending_output_transcript(self) -> str:
        """Output transcript accumulated in the current turn and not yet finalized."""
        return "".join(self._output.pieces)

    def feed(self, message: types.LiveServerMessage) -> list[LlmResponse]:
        # The hot path (one message per 40 ms of audio): a bare model-turn chunk.
        # Every field defaults to None, so the set of fields given decides it.
        if message.model_fields_set == _ONLY_SERVER_CONTENT:
            sc = message.server_content
            if (
                sc is not None
                and sc.model_turn is not None
                and sc.model_fields_set == _ONLY_MODEL_TURN
            ):
                self.turn_over = False
                return [LlmResponse(content=sc.model_turn, partial=True)]
            return self._feed_general(message, sc)
        return self._feed_general(message, message.server_content)

    def _feed_general(
        self,
        message: types.LiveServerMessage,
        sc: types.LiveServerContent | None,
    ) -> list[LlmResponse]:
        body = LlmResponse()
        has_body = False
        fragments = False

        if message.tool_call is not None and message.tool_call.function_calls:
            self.turn_over = False
            body.content = types.Content(
                role="model",
                parts=[
                    types.Part(function_call=self._with_id(fc))
                    for fc in message.tool_call.function_calls
                ],
            )
            has_body = True

        input_final = output_final = None
        turn_end = False
        if sc is not None:
            if sc.model_turn is not None:
                self.turn_over = False
                if body.content is None:
                    body.content = sc.model_turn
                    body.partial = True
                else:
                    # A tool call and model output in one message: keep both.
                    body.content.parts = [
                        *(sc.model_turn.parts or ()),
                        *(body.content.parts or ()),
                    ]
                has_body = True
            if sc.input_transcription is not None:
                self.turn_over = False  # the user speaks: what the model says next is a new reply
                input_final = self._input.add(sc.input_transcription)
                if not sc.input_transcription.finished and sc.input_transcription.text:
                    body.input_transcription = sc.input_transcription
                    fragments = True
            if sc.output_transcription is not None:
                if self.turn_over and sc.model_turn is None:
                    late = sc.output_transcription
                    if late.text:
                        # The tail of the turn that completed: on its own, out of the next one.
                        body.output_transcription = late.model_copy(update={"finished": False})
                        body.late_transcription = True
                        has_body = True
                else:
                    output_final = self._output.add(sc.output_transcription)
                    if not sc.output_transcription.finished and sc.output_transcription.text:
                        body.output_transcription = sc.output_transcription
                        fragments = True
            if sc.grounding_metadata is not None:
                body.grounding_metadata = sc.grounding_metadata
                has_body = True
            if sc.url_context_metadata is not None:
                body.url_context_metadata = sc.url_context_metadata
                has_body = True
            if sc.interim_input_transcription is not None:
                body.interim_input_transcription = sc.interim_input_transcription
                has_body = True
            turn_end = bool(sc.turn_complete or sc.interrupted or sc.generation_complete)
            if turn_end:
                input_final = input_final or self._input.finish()
                output_final = output_final or self._output.finish()
            if sc.turn_complete or sc.generation_complete:
                self.turn_over = True  # the turn's transcript was finalized: what follows is its tail

        if fragments:
            body.partial = True
            has_body = True
        if message.usage_metadata is not None:
            body.usage_metadata = message.usage_metadata
            has_body = True
        if message.go_away is not None:
            left = parse_duration(message.go_away.time_left)
            body.go_away_time_left = 0.0 if left is None else left
            has_body = True
        if message.session_resumption_update is not None:
            body.session_resumption_update = message.session_resumption_update
            has_body = True
        if message.tool_call_cancellation is not None and message.tool_call_cancellation.ids:
            body.cancelled_tool_call_ids = tuple(message.tool_call_cancellation.ids)
            has_body = True
        if message.voice_activity is not None:
            self.turn_over = False
            body.voice_activity = message.voice_activity
            has_body = True
        elif message.voice_activity_detection_signal is not None:
            kind = _VAD_TO_ACTIVITY.get(message.voice_activity_detection_signal.vad_signal_type)
            if kind is not None:
                body.voice_activity = types.VoiceActivity(voice_activity_type=kind)
                has_body = True

        flags = sc is not None and bool(
            turn_end
            or sc.turn_complete_reason is not None
            or sc.waiting_for_input
            or sc.interaction_status is not None
        )
        finals = input_final is not None or output_final is not None
        if not flags and not finals:
            return [body] if has_body else []

        # Boundary flags and finals: on the body when it holds nothing partial,
        # otherwise in a response of their own right after it.
        if has_body and (body.partial and finals):
            tail = LlmResponse()
            out = [body, tail]
        else:
            tail = body
            out = [body]
        if sc is not None:
            tail.turn_complete = bool(sc.turn_complete)
            tail.interrupted = bool(sc.interrupted)
            tail.generation_complete = bool(sc.generation_complete)
            tail.turn_complete_reason = sc.turn_complete_reason
            tail.waiting_for_input = bool(sc.waiting_for_input)
            tail.interaction_status = sc.interaction_status
        if input_final is not None:
            tail.input_transcription = input_final
            if sc is not None and sc.input_transcription is not None and sc.input_transcription.finished:
                tail.input_transcription_sent = sc.input_transcription  # the model's own final, as it came
        if output_final is not None:
            tail.output_transcription = output_final
            if sc is not None and sc.output_transcription is not None and sc.output_transcription.finished:
                tail.output_transcription_sent = sc.output_transcription
        return out

    def _with_id(self, call: types.FunctionCall) -> types.FunctionCall:
        """The call itself when it has an id; else a copy carrying a new id.

        Copying (never assigning) keeps a message object shared by several
        sessions, as a scripted test may do, free of our ids.
        """
        if call.id:
            return call
        return call.model_copy(update={"id": self._new_id()})


# ---------------------------------------------------------------------------
# Client direction
# ---------------------------------------------------------------------------


def is_gemini3(model: str) -> bool:
    """Whether `model` is a Gemini 3 (or later) model, with or without `models/`.

    Those models take mid-session text through `realtime_input.text` and need
    `historyConfig.initialHistoryInClientContent` to accept seeded history
    (`live.families`).
    """
    return family_of(model).history_flag


def prepare_connect_config(
    config: types.LiveConnectConfig, *, model: str, has_history: bool
) -> types.LiveConnectConfig:
    """The config to connect with: the caller's, with the history flag decided.

    `history_config.initial_history_in_client_content` makes the service take
    only `client_content` until one arrives with `turn_complete=true`
    (google-genai's `HistoryConfig`): realtime input before that is not
    processed. So it is set only on a fresh Gemini 3 connection that seeds
    history (3.x closes with 1007 on history sent without it), and taken off a
    connection that resumes (resumed state never takes history again). A value
    the caller set explicitly on a fresh connection is left alone. The caller's
    config is never modified: a copy carries the change.
    """
    current = config.history_config
    flag = current.initial_history_in_client_content if current is not None else None
    resuming = config.session_resumption is not None and bool(config.session_resumption.handle)
    if resuming:
        if not flag:
            return config
        assert current is not None
        return config.model_copy(
            update={
                "history_config": current.model_copy(
                    update={"initial_history_in_client_content": None}
                )
            }
        )
    if flag is not None or not (has_history and is_gemini3(model)):
        return config
    history = (
        current.model_copy(update={"initial_history_in_client_content": True})
        if current is not None
        else types.HistoryConfig(initial_history_in_client_content=True)
    )
    return config.model_copy(update={"history_config": history})


def history_in_client_content(config: types.LiveConnectConfig) -> bool:
    """Whether `config` puts the connection in the initial-history mode."""
    current = config.history_config
    return bool(current is not None and current.initial_history_in_client_content)


def function_responses_of(content: types.Content) -> list[types.FunctionResponse] | None:
    """The function responses when `content` is made only of them, else None.

    Raises ValueError for a content that mixes function responses with other
    parts: the wire has no message that carries both.
    """
    parts = content.parts or []
    responses = [p.function_response for p in parts if p.function_response is not None]
    if not responses:
        return None
    if len(responses) != len(parts):
        raise ValueError(
            "a content with function responses must contain only function responses; "
            "send the other parts in a content of their own"
        )
    return responses


def text_of(content: types.Content) -> str | None:
    """The joined text when every part of `content` is plain text, else None."""
    parts = content.parts or []
    if not parts:
        return None
    texts: list[str] = []
    for part in parts:
        if (
            part.text is None
            or part.thought
            or part.inline_data is not None
            or part.file_data is not None
            or part.function_call is not None
            or part.function_response is not None
            or part.executable_code is not None
            or part.code_execution_result is not None
        ):
            return None
        texts.append(part.text)
    return "".join(texts)


def _is_audio(part: types.Part) -> bool:
    blob = part.inline_data
    if blob is not None and (blob.mime_type or "").startswith("audio/"):
        return True
    ref = part.file_data
    return ref is not None and (ref.mime_type or "").startswith("audio/")


def history_turns(
    history: Sequence[types.Content], *, initial_history_mode: bool = False
) -> tuple[list[types.Content], bool]:
    """The turns to seed, and the seed's `turn_complete`.

    Audio parts are dropped (recorded audio cannot be history), contents left
    empty are dropped. In the initial-history mode (see
    `prepare_connect_config`) the seed always completes: the service takes no
    other input until it does, and the seed triggers no reply. Otherwise the
    seed completes a turn, so the model answers, only when its last turn is the
    user's (a missing role counts as the user's). The caller's contents are not
    modified.
    """
    turns: list[types.Content] = []
    for content in history:
        parts = content.parts or []
        kept = [p for p in parts if not _is_audio(p)]
        if not kept:
            continue
        turns.append(
            content if len(kept) == len(parts) else content.model_copy(update={"parts": kept})
        )
    if initial_history_mode:
        return turns, True
    turn_complete = bool(turns) and (turns[-1].role or "user") == "user"
    return turns, turn_complete


@dataclasses.dataclass(frozen=True, slots=True)
class HistoryPlan:
    """How a history goes out on a fresh connection.

    `turns` are seeded with one `client_content` whose `turn_complete` is
    `turn_complete`; then `then_text`, when given, goes as realtime text so the
    model answers it.
    """

    turns: list[types.Content]
    turn_complete: bool
    then_text: str | None = None


def history_plan(history: Sequence[types.Content], *, model: str) -> HistoryPlan:
    """The seed for `model`, keeping one meaning on every model: a history whose
    last turn is the user's is answered, otherwise it is context only.

    On 2.x the seed itself completes a turn (and is answered) when the user
    spoke last. On Gemini 3 the seed goes in the initial-history mode, which
    never answers it; so a last user turn of plain text is held back from the
    seed and sent after it as realtime text, the way 3.x takes mid-session text.
    """
    turns, turn_complete = history_turns(history)
    if not is_gemini3(model) or not turns:
        return HistoryPlan(turns, turn_complete)
    last = turns[-1]
    text = text_of(last) if (last.role or "user") == "user" else None
    if text is not None:
        return HistoryPlan(turns[:-1], True, text)
    return HistoryPlan(turns, True)


def realtime_kwargs(item: RealtimeInput) -> dict[str, Any]:
    """The one keyword of `send_realtime_input` that carries `item`.

    Audio blobs go as `audio`, images and video frames as `video`; anything
    else is a TypeError naming what is accepted.
    """
    if isinstance(item, types.Blob):
        mime = item.mime_type or ""
        if mime.startswith("audio/"):
            return {"audio": item}
        if mime.startswith(("image/", "video/")):
            return {"video": item}
        raise TypeError(
            f"send_realtime cannot route a Blob with mime type {mime!r}: "
            "use audio/* (e.g. 'audio/pcm;rate=16000'), image/* or video/*"
        )
    if isinstance(item, types.ActivityStart):
        return {"activity_start": item}
    if isinstance(item, types.ActivityEnd):
        return {"activity_end": item}
    if isinstance(item, AudioStreamEnd):
        return {"audio_stream_end": True}
    raise TypeError(
        f"send_realtime takes a types.Blob, types.ActivityStart, types.ActivityEnd "
        f"or live.AUDIO_STREAM_END, not {type(item).__name__}"
    )
