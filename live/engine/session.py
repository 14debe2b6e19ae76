"""The state of one client conversation, as a plain state machine (no I/O).

`SessionCore` is fed what happens — a client frame, a model response, a tool that
finished — and returns the actions that follow: events and audio for the client,
input for the model, tool tasks to start or cancel, the end of the session. The
I/O layer (`live.server.runner`) carries the actions (`live.engine.actions`) out. Every rule about turns, tools
and interruptions lives here, where a test can drive it without sockets.

Turn state: `LISTENING -> RESPONDING -> (INTERRUPTED | LISTENING)`. After the model
reports `interrupted`, audio of the interrupted generation is dropped — both what
is still queued for the client (`FlushAudio`) and what arrives late — until that
generation is over: its turn is closed by `turn_complete`, the model calls a tool,
the model shows it is hearing the user's new turn (input transcription or voice
activity after the interruption), or the client starts a turn of its own (text,
activity end, tool result). The drop is keyed to the generation, never to a clock,
so a quick answer to a short barge-in keeps its start.

Tool calls: `PENDING -> (ANSWERED | CANCELLED | TIMED_OUT)`. Every call the model
makes gets exactly one response, unless the model cancels it first.

Model connections come and go under one session (go-away, drops). Each has an
`epoch`; a tool call belongs to the epoch that issued it. A resumed connection
continues from the state behind its resumption handle, and a handle is never
issued while a call is unanswered, so a connection that did not issue a call
never gets its function response (the service rejects one whose call it never
made). Instead, the result goes to the new connection as context the model
reads: a short user-role note saying which tool ran, with what, and what it
returned. The same holds for results that reached the old connection but that
no handle since covers. A typed turn the model has not finished answering, and
that no handle covers, is sent again on the new connection; unless the model
called tools for it and results are told with it: then it is told as what was
said, not asked (asked, the model would call them again), and the results ask
for the answer. Results the model already answered from are told as context
that asks nothing (on families that take client content mid-session). Such
context is told on each new connection until a handle holds it: a resumable
handle that came after it, when it was sent while the model had nothing going
whose end the service could mark with a handle taken before it arrived.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import weakref
from typing import Any

from google.genai import types

from live.engine.actions import (
    Action,
    AwaitClientTool,
    CancelTool,
    CloseSession,
    FlushAudio,
    ImageUpstream,
    PlaybackReported,
    RunTool,
    SendAudio,
    SendEvent,
    ToUpstream,
)
from live.families import DEFAULT, ModelFamily
from live.engine.handover import Handover
from live.engine.session_state import ToolCall, ToolState, TurnState
from live.engine.tools import ToolRules
from live.engine.transcript import Transcript
from live.llm import AUDIO_STREAM_END, ClientTurns, ContextChange, LlmResponse, RealtimeText
from live.protocol import (
    Playback,
    CodeEvent,
    CodeResultEvent,
    DataEvent,
    Grounding,
    ModelSignal,
    ActivityEnd,
    ActivityStart,
    AudioEnd,
    ClientContent,
    ClientMessage,
    ContextUpdate,
    ErrorEvent,
    GenerationComplete,
    Image,
    ProtocolError,
    SessionClose,
    SessionGoAway,
    SessionStart,
    Text,
    TextEvent,
    ToolResult,
    TranscriptInput,
    TranscriptOutput,
    TurnComplete,
    TurnInterrupted,
    Usage,
    parse_client_message,
)
from live.unchecked import unchecked

# The actions are defined in live.engine.actions; they are named here too, where the
# rules that make them are.
__all__ = [
    "Action",
    "AwaitClientTool",
    "CancelTool",
    "CloseSession",
    "PlaybackReported",
    "FlushAudio",
    "ImageUpstream",
    "RunTool",
    "SendAudio",
    "SendEvent",
    "SessionCore",
    "ToUpstream",
    "ToolState",
    "TurnState",
]


_USAGE_DETAILS = (
    ("prompt", "prompt_tokens_details"),
    ("response", "response_tokens_details"),
    ("cached", "cache_tokens_details"),
    ("tool_use_prompt", "tool_use_prompt_tokens_details"),
)


def _usage_event(usage: types.UsageMetadata) -> Usage:
    by_modality: dict[str, dict[str, int]] = {}
    for kind, field in _USAGE_DETAILS:
        details = getattr(usage, field, None) or []
        counts: dict[str, int] = {}
        for item in details:
            modality = item.modality.value if item.modality is not None else "UNSPECIFIED"
            counts[modality] = counts.get(modality, 0) + (item.token_count or 0)
        if counts:
            by_modality[kind] = counts
    return Usage(
        prompt_tokens=usage.prompt_token_count,
        response_tokens=usage.response_token_count,
        total_tokens=usage.total_token_count,
        cached_tokens=usage.cached_content_token_count,
        thoughts_tokens=usage.thoughts_token_count,
        tool_use_prompt_tokens=usage.tool_use_prompt_token_count,
        by_modality=by_modality or None,
        service_tier=usage.service_tier.value if usage.service_tier is not None else None,
    )


_TEXT_AND_FINISHED = frozenset({"text", "finished"})


def _other_fields(t: types.Transcription) -> dict[str, Any] | None:
    """A transcription fragment's fields besides its text and `finished`
    (`languageCode`, `speakerLabel`, `words`, offsets), as the model wrote
    them; None when it wrote none (nearly every fragment: no dump then)."""
    if t.model_fields_set <= _TEXT_AND_FINISHED:
        return None
    other = t.model_dump(mode="json", by_alias=True, exclude_none=True, exclude=set(_TEXT_AND_FINISHED))
    return other or None


def _signal_of(response: LlmResponse) -> dict[str, Any]:
    """What of a model response the session passes on as it came (`ModelSignal`)."""
    signal: dict[str, Any] = {}
    if response.voice_activity is not None:
        signal["voice_activity"] = response.voice_activity
    if response.waiting_for_input:
        signal["waiting_for_input"] = True
    if response.url_context_metadata is not None:
        signal["url_context_metadata"] = response.url_context_metadata
    if response.interim_input_transcription is not None:
        signal["interim_input_transcription"] = response.interim_input_transcription
    return signal


class SessionCore(Handover, ToolRules):
    """Turn, tool and interruption bookkeeping for one started session.

    `server_tools` names the tools the server runs; calls for any other name go to
    the client. `client_tool_timeout` bounds how long a client-run call may take
    (None: as long as the client takes); `results_by_id`: a client's result is
    paired with its call by id alone (`live.engine.tools`).
    `manual_activity` says the client marks the user's turns itself
    (`activity.start` / `activity.end`); otherwise those messages are refused
    with an error, since the model rejects them while its own detection is on.
    `server_turns` says the server marks them (`turn_started`, `turn_ended`):
    the client's are refused then too.

    Images: at most `max_image_bytes` each and `max_image_rate` a second (in any
    window of n / rate seconds, at most n = round(rate) frames); beyond either,
    the frame is dropped with a non-fatal error. `video_capped` says the model
    connection runs without context compression, where the service ends a
    session with video after two minutes: the first image then brings a warning.
    """

    def __init__(
        self,
        *,
        input_rate: int,
        server_tools: frozenset[str] = frozenset(),
        client_tool_timeout: float | None = 30.0,
        results_by_id: bool = False,
        cut_replies_repeated: bool = True,
        manual_activity: bool = False,
        server_turns: bool = False,
        max_image_bytes: int = 512 * 1024,
        max_image_rate: float = 2.0,
        video_capped: bool = False,
        family: ModelFamily = DEFAULT,
        usage_with_turn_end: bool = False,
    ) -> None:
        self.input_mime = f"audio/pcm;rate={input_rate}"
        # Copied per frame: half the cost of model_construct, the same Blob.
        self._audio_blob = types.Blob.model_construct(data=b"", mime_type=self.input_mime)
        # What `model_copy(update={"data": ...})` of it reports as set.
        self._audio_fields = frozenset(self._audio_blob.model_fields_set | {"data"})
        self.server_tools = server_tools
        self.client_tool_timeout = client_tool_timeout
        self.results_by_id = results_by_id
        self.manual_activity = manual_activity and not server_turns
        self.server_turns = server_turns
        self.turn = TurnState.LISTENING
        self.tools: dict[str, ToolCall] = {}
        self.resumption_handle: str | None = None
        self.late_audio_dropped = 0
        self.tokens_used = 0  # the model's usage reports, summed (total_token_count)
        # Usage the model sends with a turn's end rides on its TurnComplete
        # (a door whose clients expect the two in one message); otherwise it is
        # its own event, after the turn's end.
        self.usage_with_turn_end = usage_with_turn_end
        self.awaiting_reply_since: float | None = None
        self.epoch = 0
        self.user_speaking = False
        self._hearing_user = False  # input transcription fragments not yet finalized
        self._heard: list[str] = []  # those fragments: the user's words no turn has ended yet
        # Typed turns sent that no handle holds yet and the model has not answered.
        self._owed: list[types.Content] = []
        self._answerable = 0  # how many of them the reply in progress answers
        self._answering_calls: list[str] = []  # the results it follows (their calls)
        self._generated: list[types.Content] = []  # answered by a generation whose turn is open
        # Content went to the model and it has not acted since (no reply or call
        # began): a handle now may predate that content.
        self._sent_unseen = False
        # Contents on their way that tell of calls, by id: those calls, and the
        # typed turns joined to them (owed once sent). Each entry holds a weak
        # reference to its content and goes when the content does: an id is an
        # address, and CPython gives a dead note's address to later objects.
        self._notes: dict[int, tuple[weakref.ref[types.Content], list[str], list[types.Content]]] = {}
        self._replay: list[types.Content | ClientTurns] = []
        # Client content that completed no turn (appended to the conversation)
        # and that no handle holds yet: told again to a new connection.
        self._appended: list[ClientTurns] = []
        self._held_by_next: list[ClientTurns] = []  # of those, what the next handle holds
        self._retold: list[ClientTurns] = []
        # A turn of the connection ended (or a call of it was cancelled) and no
        # resumable handle came since: one may be on its way.
        self._handle_due = False
        self.max_image_bytes = max_image_bytes
        self.max_image_rate = max_image_rate
        self._image_burst = max(1, round(max_image_rate))
        self._image_window = self._image_burst / max_image_rate
        self._image_times: collections.deque[float] = collections.deque(maxlen=self._image_burst)
        self._video_capped = video_capped
        self.family = family
        self.holds_realtime = False
        # The interaction goes on past a completed turn (3.8 extended thinking:
        # interactionStatus IN_PROGRESS until IDLE): not a safe point meanwhile.
        self.interaction_busy = False
        # Tools whose results carry a scheduling (live.agent.tool), by name.
        self.scheduling: dict[str, types.FunctionResponseScheduling] = {}
        # The conversation as heard, to seed a fresh connection (live.engine.transcript).
        self.transcript = Transcript()
        self._reply_texts: list[str] = []  # text parts of the reply in progress
        self._reply_said: list[str] = []  # its output transcript fragments
        self.cut_replies_repeated = cut_replies_repeated
        self._reply_transcribed = False  # its final transcript is in the transcript
        self.images_accepted = 0
        self.images_refused = 0
        self._rate_refused = 0  # since the last rate error reported
        self._rate_reported_at: float | None = None

    # -------------------------------------------------------------- client side

    def client_audio(self, data: bytes) -> types.Blob:
        """Validate one binary frame of PCM16 audio; the hot path, kept minimal.

        Raises `ProtocolError` (not fatal) for an odd number of bytes.
        """
        if len(data) & 1:
            raise ProtocolError(
                "invalid_audio",
                f"audio frames are PCM16: an even number of bytes, got {len(data)}; "
                "the frame was dropped",
            )
        return unchecked(self._audio_blob, self._audio_fields, {"data": data})

    def joined_audio(self, blobs: list[types.Blob]) -> types.Blob:
        """Consecutive client frames as one chunk (they share the session's rate)."""
        return unchecked(self._audio_blob, self._audio_fields, {"data": b"".join(b.data or b"" for b in blobs)})

    def client_text(self, raw: str, now: float) -> list[Action]:
        """Handle one client text frame; bad input becomes an `error` event."""
        try:
            message = parse_client_message(raw)
        except ProtocolError as exc:
            return [SendEvent(ErrorEvent(exc.code, exc.message, exc.fatal))]
        return self.client_message(message, now)

    def client_message(self, message: ClientMessage, now: float) -> list[Action]:
        if isinstance(message, SessionStart):
            return [
                SendEvent(
                    ErrorEvent(
                        "already_started",
                        "session.start was already received; this one was ignored",
                    )
                )
            ]
        if isinstance(message, SessionClose):
            return [CloseSession("client closed the session")]
        if isinstance(message, AudioEnd):
            return [ToUpstream(AUDIO_STREAM_END)]
        if isinstance(message, Image):
            return self.client_image(message, now)
        if isinstance(message, Playback):
            return [PlaybackReported(message.played)]
        if isinstance(message, ContextUpdate):
            return [ToUpstream(ContextChange(message.config))]
        if isinstance(message, (ActivityStart, ActivityEnd)) and self.server_turns:
            return [
                SendEvent(
                    ErrorEvent(
                        "activity_not_enabled",
                        f"{message.type} was ignored: in this session the server's voice detection "
                        "decides when the user's turn ends (\"turn_taking\": \"server\"); to mark "
                        "turns yourself, start the session with \"turn_taking\": \"manual\"",
                    )
                )
            ]
        if isinstance(message, (ActivityStart, ActivityEnd)) and not self.manual_activity:
            return [
                SendEvent(
                    ErrorEvent(
                        "activity_not_enabled",
                        f"{message.type} was ignored: in this session the model's own voice "
                        "detection decides when the user's turn ends; to mark turns "
                        "yourself, start the session with \"turn_taking\": \"manual\"",
                    )
                )
            ]
        if isinstance(message, ActivityStart):
            self.user_speaking = True
            return [ToUpstream(types.ActivityStart())]
        # What follows starts a new user turn of the client's own: late audio of an
        # interrupted reply can no longer be on its way, and the model owes a reply.
        self._end_interruption()
        if isinstance(message, ToolResult):
            return self._client_tool_result(message, now)
        if isinstance(message, ClientContent):
            turns = ClientTurns(message.turns, message.turn_complete, message.initial)
            if message.turn_complete and not message.initial:
                self.awaiting_reply_since = now
            return [ToUpstream(turns)]
        self.awaiting_reply_since = now
        if isinstance(message, ActivityEnd):
            self.user_speaking = False
            return [ToUpstream(types.ActivityEnd())]
        assert isinstance(message, Text)
        if message.realtime:
            return [ToUpstream(RealtimeText(message.text))]
        content = types.Content(role="user", parts=[types.Part(text=message.text)])
        return [ToUpstream(content)]

    def turn_started(self) -> types.ActivityStart:
        """The server heard the user's turn begin (`server_turns`): the signal for the model."""
        self.user_speaking = True
        return types.ActivityStart()

    def turn_ended(self, now: float) -> types.ActivityEnd:
        """The server decided the user's turn is over (`server_turns`): the
        signal for the model, which owes a reply from now."""
        self._end_interruption()
        self.awaiting_reply_since = now
        self.user_speaking = False
        return types.ActivityEnd()

    def client_image(self, image: Image, now: float) -> list[Action]:
        """An image frame, checked against the size and rate limits.

        An image is context, not a turn: the model owes no reply for it. A frame
        refused for its rate is reported at most once a second (with a count),
        so a client sending too fast is told without being flooded.
        """
        size = len(image.data)
        if size > self.max_image_bytes:
            self.images_refused += 1
            return [
                SendEvent(
                    ErrorEvent(
                        "image_too_large",
                        f"image of {size} bytes exceeds the {self.max_image_bytes}-byte limit; "
                        "the frame was dropped (send a smaller or more compressed image, "
                        "e.g. 768 px on the long side)",
                    )
                )
            ]
        times = self._image_times
        if len(times) == self._image_burst and now - times[0] < self._image_window:
            self.images_refused += 1
            self._rate_refused += 1
            if self._rate_reported_at is not None and now - self._rate_reported_at < 1.0:
                return []
            count, self._rate_refused = self._rate_refused, 0
            self._rate_reported_at = now
            return [
                SendEvent(
                    ErrorEvent(
                        "image_rate_limited",
                        f"images are limited to {self.max_image_rate:g} a second; "
                        f"{count} frame(s) dropped (the model samples about one a second)",
                    )
                )
            ]
        times.append(now)
        self.images_accepted += 1
        actions: list[Action] = []
        if self._video_capped and self.images_accepted == 1:
            actions.append(
                SendEvent(
                    ErrorEvent(
                        "video_time_limit",
                        "this agent runs without context compression: the model ends a "
                        "session with video after about two minutes",
                    )
                )
            )
        blob = types.Blob(data=image.data, mime_type=image.mime_type, display_name=image.display_name)
        actions.append(ImageUpstream(blob))
        return actions

    # -------------------------------------------------------------- model side

    def model_response(self, response: LlmResponse, now: float) -> list[Action]:
        """Map one model response to actions, looking at every field."""
        actions: list[Action] = []
        if response.interrupted:
            # First: audio bundled with the interruption belongs to the old reply,
            # and so does audio until that turn ends (see the module docstring).
            self.turn = TurnState.INTERRUPTED
            actions.append(FlushAudio())
            actions.append(SendEvent(TurnInterrupted()))
            # The cut reply's final transcript would follow turn.interrupted:
            # the client has its fragments (and, from the server, what was heard).
            if response.output_transcription is not None and response.output_transcription.finished:
                response = dataclasses.replace(response, output_transcription=None)
        tail = None
        if response.late_transcription:
            # The tail of the reply that ended, told after what else came in its
            # message (the turn's end, usage, a handle), which is read as usual.
            tail = response.output_transcription
            response = dataclasses.replace(response, output_transcription=None, late_transcription=False)
        if (
            response.content is not None
            or response.output_transcription is not None
            or response.turn_complete
            or response.generation_complete
        ):
            self.awaiting_reply_since = None  # the model is answering
        if not response.interrupted and self.turn is TurnState.INTERRUPTED and (
            response.voice_activity is not None
            or (response.input_transcription is not None and response.input_transcription.text)
        ):
            # The model is hearing the user's new turn: the interrupted generation
            # is over, and what follows answers the new turn.
            self._end_interruption()

        content = response.content
        if content is not None and content.parts:
            for part in content.parts:
                self._map_part(part, response.partial, actions)
        if response.output_transcription is not None and self.turn is TurnState.LISTENING:
            self._responding()  # a reply has begun, audio or not

        if response.grounding_metadata is not None:
            actions.append(
                SendEvent(
                    Grounding(response.grounding_metadata.model_dump(mode="json", exclude_none=True))
                )
            )
        if response.voice_activity is not None:
            kind = response.voice_activity.voice_activity_type
            if kind is types.VoiceActivityType.ACTIVITY_START:
                self.user_speaking = True
            elif kind is types.VoiceActivityType.ACTIVITY_END:
                self.user_speaking = False
        signal = _signal_of(response)
        if signal:
            actions.append(SendEvent(ModelSignal(signal)))
        if response.input_transcription is not None:
            t = response.input_transcription
            if t.text or t.finished:
                sent = response.input_transcription_sent if t.finished else None
                fragment = None if sent is None else sent.text or ""
                fields = _other_fields(t if sent is None else sent)
                actions.append(SendEvent(TranscriptInput(t.text or "", bool(t.finished), fragment, fields)))
            if t.finished:
                self._heard = []
                if t.text:
                    self.transcript.user(t.text)
            elif t.text:
                self._heard.append(t.text)
            self._hearing_user = not t.finished and bool(t.text or self._hearing_user)
        if response.output_transcription is not None:
            t = response.output_transcription
            if t.text or t.finished:
                sent = response.output_transcription_sent if t.finished else None
                fragment = None if sent is None else sent.text or ""
                fields = _other_fields(t if sent is None else sent)
                actions.append(
                    SendEvent(TranscriptOutput(t.text or "", bool(t.finished), fragment=fragment, fields=fields))
                )
            if t.text and not t.finished:
                self._reply_said.append(t.text)  # what the client heard of the reply so far
            if t.finished and t.text:
                self.transcript.model(t.text)
                self._reply_transcribed = True
        if response.cancelled_tool_call_ids:
            actions.extend(self._cancel_tools(response.cancelled_tool_call_ids))
            self._handle_due = True
        if response.generation_complete:
            actions.append(SendEvent(GenerationComplete()))
        if response.turn_complete or response.interrupted:
            self._reply_ended()
            self._handle_due = True
        if response.waiting_for_input:
            # The model waits for more of the user's words: it owes no reply yet,
            # and nothing is to be sent again (not a stall).
            self.awaiting_reply_since = None
        status = response.interaction_status
        if status is not None and status is not types.InteractionStatus.INTERACTION_STATUS_UNSPECIFIED:
            # IN_PROGRESS: a turn (a filler) completed and the answer is still to
            # come, after thinking that may take longer than a stall: not a safe
            # point, and not timed as an owed reply.
            self.interaction_busy = status is not types.InteractionStatus.IDLE
        if response.generation_complete and self.turn is TurnState.RESPONDING and not self.interaction_busy:
            # The reply is whole: the turns sent before it are answered, even if
            # the connection drops before turnComplete (sent again, they would
            # be answered twice).
            self._generated = self._owed[: self._answerable]
            del self._owed[: self._answerable]
            self._answerable = 0
            self._results_answered()
        usage = response.usage_metadata
        if usage is not None:
            self.tokens_used += usage.total_token_count or 0
        if response.turn_complete:
            if self.interaction_busy:
                # A filler completed and the answer is still to come: the turns
                # it followed are owed that answer.
                self._owed[:0] = self._generated
            elif self.turn is TurnState.RESPONDING:
                del self._owed[: self._answerable]  # answered: the turns sent before the reply
                self._results_answered()
            self._generated = []
            self._answerable = 0
            self.turn = TurnState.LISTENING
            reason = response.turn_complete_reason.value if response.turn_complete_reason else None
            interaction = status.value if status is not None else None
            if usage is not None and self.usage_with_turn_end:
                actions.append(SendEvent(TurnComplete(reason, usage=_usage_event(usage), interaction=interaction)))
                usage = None
            else:
                actions.append(SendEvent(TurnComplete(reason, interaction=interaction)))
        if usage is not None:
            actions.append(SendEvent(_usage_event(usage)))
        if response.go_away_time_left is not None:
            actions.append(SendEvent(SessionGoAway(response.go_away_time_left)))
        update = response.session_resumption_update
        if update is not None and update.resumable and update.new_handle:
            self._handle_issued(update.new_handle)
        if response.error_code or response.error_message:
            actions.append(
                SendEvent(
                    ErrorEvent(
                        "model_error",
                        f"{response.error_code or 'error'}: {response.error_message or ''}".strip(),
                    )
                )
            )
        if tail is not None and tail.text:
            self._late_tail(tail.text, actions, _other_fields(tail))
        return actions

    def _handle_issued(self, handle: str) -> None:
        """A resumable handle: the state behind it holds everything sent so far,
        once the model has acted on the last of it (a reply or a call began
        after it was sent). Before that, the handle may have been taken as
        that content was on its way: it is kept to resume from, and what was
        sent stays owed. Context that asks nothing, sent while the model was
        quiet, is held by the next handle (see `_client_turns_sent`)."""
        self.resumption_handle = handle
        self._handle_due = False
        held, self._held_by_next = self._held_by_next, []
        if self._sent_unseen:
            # Context sent to a quiet model arrived before this handle was taken.
            self._appended = [c for c in self._appended if not any(c is h for h in held)]
            return
        self._owed.clear()
        self._appended.clear()
        self._answerable = 0
        for call in self.tools.values():
            if call.sent_epoch == self.epoch or call.state is ToolState.CANCELLED:
                call.covered = True

    def _map_part(self, part: types.Part, partial: bool, actions: list[Action]) -> None:
        blob = part.inline_data
        if blob is not None and blob.data:
            mime = blob.mime_type or "audio/"
            if mime.startswith("audio/"):
                if self.turn is TurnState.INTERRUPTED:
                    self.late_audio_dropped += 1
                    return
                if self.turn is not TurnState.RESPONDING:
                    self._responding()
                actions.append(SendAudio(blob.data))
            elif self.turn is not TurnState.INTERRUPTED:
                data = base64.b64encode(blob.data).decode("ascii")
                actions.append(SendEvent(DataEvent(mime, data)))
            return
        if part.function_call is not None:
            actions.extend(self._tool_call(part.function_call))
            return
        if self.turn is TurnState.INTERRUPTED:
            return  # text or code of the interrupted generation
        if part.executable_code is not None:
            code = part.executable_code
            language = code.language.value if code.language is not None else None
            actions.append(SendEvent(CodeEvent(code.code or "", language)))
            return
        if part.code_execution_result is not None:
            result = part.code_execution_result
            outcome = result.outcome.value if result.outcome is not None else None
            actions.append(SendEvent(CodeResultEvent(result.output or "", outcome)))
            return
        if part.text and not part.thought:
            if self.turn is TurnState.LISTENING:
                self._responding()
            self._reply_texts.append(part.text)
            actions.append(SendEvent(TextEvent(part.text, partial)))
        elif part.text:
            # A summary of the model's thinking (includeThoughts): for a door
            # that passes it on; no part of the reply or the transcript.
            actions.append(SendEvent(TextEvent(part.text, partial, thought=True)))

    def _late_tail(self, text: str, actions: list[Action], fields: dict[str, Any] | None = None) -> None:
        """The tail of a reply's transcript after the reply ended: it belongs to
        that reply (its text and the transcript), and starts no new one."""
        actions.append(SendEvent(TranscriptOutput(text, False, late=True, fields=fields)))
        self.transcript.model_tail(text)

    def _reply_ended(self) -> None:
        """A reply ended: what it wrote goes into the transcript, unless its
        transcript (of what it said) is already there."""
        if self._reply_texts and not self._reply_transcribed:
            self.transcript.model("".join(self._reply_texts))
        self._reply_texts = []
        self._reply_said = []
        self._reply_transcribed = False

    def _responding(self) -> None:
        """A reply begins: it can answer the typed turns sent before it, not later ones."""
        self.turn = TurnState.RESPONDING
        self._answerable = len(self._owed)
        epoch = self.epoch
        self._answering_calls = [
            i for i, c in self.tools.items()
            if c.sent_epoch == epoch and c.response is not None and not c.covered and not c.replied
        ]
        self._sent_unseen = False

    @property
    def at_safe_point(self) -> bool:
        """Nothing in flight: no reply owed or being generated, no call unanswered,
        and the user is not in the middle of saying something.

        The moment to replace the model connection without losing anything.
        """
        return (
            self.turn is TurnState.LISTENING
            and self.awaiting_reply_since is None
            and not self.user_speaking
            and not self._hearing_user
            and not self.interaction_busy
            and not self.pending_tool_calls
        )

    def _quiet(self) -> bool:
        """Nothing on the connection can end with a handle the model takes before
        what is sent now arrives: no turn going, owed or ended with its handle
        still to come, no call of it unanswered, the user not speaking."""
        return self.at_safe_point and not self.call_owed and not self._handle_due

    def stalled(self, now: float, timeout: float) -> bool:
        """The model owes a reply (to a user turn or a tool result) for too long."""
        since = self.awaiting_reply_since
        return since is not None and now - since > timeout

    def _end_interruption(self) -> None:
        if self.turn is TurnState.INTERRUPTED:
            self.turn = TurnState.LISTENING
