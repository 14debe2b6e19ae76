"""The protocol state machine of one emulated Live connection, without I/O.

`EmulatorSession` is fed the handshake, each client frame and the current time,
and answers with actions (`SendMessage`, `CloseConnection`, `DropConnection`).
`next_deadline()` says when it next wants `poll(now)`; between deadlines it does
nothing, so a test can step it with a fake clock and a transport can drive it
with a single wait.

Behaviour follows the Gemini API (not Vertex) BidiGenerateContent service as
observed through google-genai: camelCase output, mixed-case input accepted,
standard or URL-safe base64 accepted, closes with the real codes and reasons.
What differs by model family, bad days included, is the session's `profile`
(`connections.emulator.profiles`); random faults come from `faults`.
"""

from __future__ import annotations

import base64
import collections
import copy
import dataclasses
import functools
import heapq
import itertools
import json
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from connections.emulator import synth
from connections.emulator.calls import FunctionCalls, PendingCalls
from connections.emulator.listening import Listening
from connections.emulator.resumption import Resumption
from connections.emulator.faults import EarlyDrop, FaultDice
from connections.emulator.profiles import (
    PROFILES,
    THINKING,
    Profile,
    declared_behaviours,
    looks_unfinished,
    profile_for,
    setup_error,
)
from connections.emulator.script import (
    QUOTA_REASON,
    Fault,
    ReplyContext,
    Script,
    ToolCall,
)
from connections.emulator.wire import (
    AUDIO_TOKENS_PER_S,
    MAX_FRAMES,
    Action,
    CloseConnection,
    DropConnection,
    SendMessage,
    SessionRecord,
    Settings,
    Shared,
    api_key_of,
    credential_error,
    setup_complete,
    text_of,
    token_count,
    usage_metadata,
    without_video_data,
)
from live.liveapi import (
    DEADLINE_EXPIRED,
    DEFAULT_REASONS,
    INTERNAL,
    INVALID,
    INVALID_HANDLE,
    SESSION_NOT_FOUND,
    TOP_LEVEL,
    UNAVAILABLE,
    Handshake,
    Route,
    duration_text,
    get_field,
    not_found,
    route,
    unknown_field,
)

__all__ = [
    "Action",
    "CloseConnection",
    "DropConnection",
    "EmulatorSession",
    "Handshake",
    "Route",
    "SendMessage",
    "SessionRecord",
    "Settings",
    "Shared",
    "route",
]


@dataclasses.dataclass(slots=True)
class _Generation:
    """One model turn being spoken. A `filler` turn ("Let me check.") uses no
    scripted reply; `then` runs `thinking_delay` after it ends (an extended-
    thinking answer); `late` is the output transcription fragment that arrives
    after turnComplete; `fail_at` the chunk after which a drawn 1011 closes."""

    group: int
    text: str
    turn: int
    spoken: list[str] = dataclasses.field(default_factory=list)
    chunks_sent: int = 0
    audio_seconds: float = 0.0
    filler: bool = False
    then: Callable[[], None] | None = None
    late: str = ""
    late_finished: bool = False
    fail_at: int | None = None


def _transcription(text: str, finished: bool, fields: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A transcription fragment; `finished` on the one that ends its transcript;
    `fields` the script's other fields of the kind (`Script.transcription_fields`)."""
    piece = {"text": text, "finished": True} if finished else {"text": text}
    return {**fields, **piece} if fields else piece


# --- the session ---------------------------------------------------------------


class EmulatorSession(Listening, FunctionCalls, Resumption):
    """One connection's protocol state: frames and time in, actions out.

    A load script subclasses it: `heard_audio` receives each realtime audio
    chunk once it passed the service's checks, `_at(due, fn)` schedules what
    the model sends, `_send(payload)` sends it, and `keep_traffic = False`
    stops keeping frames and sent messages in `record` (their memory grows
    with every session).
    """

    keep_traffic = True

    def __init__(
        self,
        handshake: Handshake,
        *,
        script: Script,
        settings: Settings | None = None,
        shared: Shared | None = None,
        index: int = 0,
        now: float = 0.0,
    ) -> None:
        self.script = script
        self.settings = settings or Settings()
        self.shared = shared or Shared()
        self.index = index
        self.handshake = handshake
        self.route = route(handshake.path)
        self.record = SessionRecord(
            index=index,
            path=handshake.path,
            route=self.route,
            headers={k.lower(): v for k, v in handshake.headers.items()},
        )
        self._now = now
        self._phase = "setup"  # setup | open | stalled | closed
        self._out: list[Action] = []
        self._timeline: list[tuple[float, int, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._groups = itertools.count(1)
        self._live_groups: set[int] = {0}
        self._counted = False
        self._key = next(self.shared.connection_ids)
        # configuration from setup
        self.model = ""
        self.profile: Profile = PROFILES["gemini-2.5"]
        self._dice = FaultDice(script.fault_rates, self.shared.random(script.seed))
        self._early: EarlyDrop | None = None
        self._behaviours: dict[str, str] = {}
        self._modality = "AUDIO"
        self._declared: list[str] = []
        self._input_transcription = False
        self._output_transcription = False
        self._resumption = False
        self._vad_disabled = False
        self._interrupts = True
        self._threshold = 1000.0
        self._prefix_ms = 20.0
        self._silence_ms_needed = 500.0
        self._bundle = False
        self._history_in_client_content = False
        self._awaiting_history = False
        self._cancelled_ids: set[str] = set()
        self._finished_ids: set[str] = set()  # non-blocking calls whose results ended
        # conversation state (restored on resume)
        self._history: list[dict[str, Any]] = []
        self._turn = 0
        self._spoken_turns = 0
        self._model_turns = 0
        self._ctx_tokens: dict[str, int] = {}
        self._started = False
        # live state
        self._gen: _Generation | None = None
        self._tools: PendingCalls | None = None  # blocking calls the model waits for
        self._async_calls: dict[str, str] = {}  # non-blocking calls sent, unanswered: id -> name
        self._answers: list[dict[str, Any]] = []  # results to answer once the model is free
        self._thinking: int | None = None  # the group of an extended-thinking answer to come
        self._in_progress = False  # the last turnComplete said interactionStatus IN_PROGRESS
        self._unfinished: list[str] = []  # the user's words while waitingForInput
        self._late: list[dict[str, Any]] = []  # transcripts due after the next turnComplete
        self._speaking = False
        self._voiced_ms = 0.0
        self._silence_ms = 0.0
        self._turn_audio_ms = 0.0
        self._stream_ms = 0.0  # audio heard on this connection, in audio time
        self._interim_words = 0  # words of the user's turn in interim transcripts so far
        self._manual_active = False
        self._waiting: collections.deque[tuple[str, bool, bool]] = collections.deque()
        self._call_ids = itertools.count(1)
        self._handle_seq = itertools.count(1)

    # -- public interface -----------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._phase == "closed"

    @property
    def stalled(self) -> bool:
        return self._phase == "stalled"

    @property
    def _output_fields(self) -> Mapping[str, Any] | None:
        return self.script.transcription_fields.get("outputTranscription")

    def next_deadline(self) -> float | None:
        """When `poll` has something to do next, or None when only input matters."""
        self._prune()
        return self._timeline[0][0] if self._timeline else None

    def poll(self, now: float) -> list[Action]:
        """Run everything due by `now`."""
        self._now = now
        while self._phase == "open":
            self._prune()
            if not self._timeline or self._timeline[0][0] > now:
                break
            _, _, _, fn = heapq.heappop(self._timeline)
            fn()
        return self._take()

    def receive(self, data: str | bytes, now: float) -> list[Action]:
        """Handle one client frame."""
        self._now = now
        if self._phase in ("closed",):
            return []
        try:
            text = data.decode("utf-8") if isinstance(data, bytes) else data
            message = json.loads(text)
        except (UnicodeDecodeError, json.JSONDecodeError):
            self._keep_frame(data if isinstance(data, str) else repr(data[:200]))
            if self._phase != "stalled":
                self._close(1007, "Invalid JSON payload received. Unexpected token.")
            return self._take()
        self._keep_frame(message)
        if self._phase == "stalled":
            return []
        if not isinstance(message, dict) or len(message) != 1:
            self._close(1007, INVALID)
            return self._take()
        (raw_key, body), = message.items()
        key = TOP_LEVEL.get(raw_key)
        if key is None:
            self._close(1007, f'Invalid JSON payload received. Unknown name "{raw_key}": Cannot find field.')
            return self._take()
        if self._phase == "setup":
            if key != "setup":
                self._close(1007, INVALID)
            else:
                self._on_setup(body)
        elif key == "setup":
            self._close(1007, INVALID)
        elif key == "realtimeInput":
            self._on_realtime(body)
        elif key == "clientContent":
            self._on_client_content(body)
        elif key == "toolResponse":
            self._on_tool_response(body)
        elif key == "contextUpdate":
            self._on_context_update(body)
        return self._take()

    def connection_lost(self, code: int | None = None, reason: str = "") -> None:
        """The transport ended (client close or server stop): release the session."""
        if self._phase != "closed" and code is not None:
            self.record.client_close = (code, reason)
        self._phase = "closed"
        self._timeline.clear()
        self._release()

    # -- plumbing ---------------------------------------------------------------

    def _take(self) -> list[Action]:
        out, self._out = self._out, []
        return out

    def _keep_frame(self, frame: Any) -> None:
        if self.keep_traffic and len(self.record.frames) < MAX_FRAMES:
            self.record.frames.append(without_video_data(frame))

    def _send(self, payload: dict[str, Any]) -> None:
        if self._phase != "open":
            return
        self._out.append(SendMessage(payload))
        if self.keep_traffic and len(self.record.sent) < MAX_FRAMES:
            self.record.sent.append(payload)

    def _close(self, code: int, reason: str | None = None) -> None:
        if self._phase == "closed":
            return
        if reason is None:
            reason = DEFAULT_REASONS.get(code, "")
        # A close frame carries at most 123 bytes of reason; the service truncates too.
        reason = reason.encode("utf-8")[:123].decode("utf-8", "ignore")
        self._out.append(DropConnection() if code == 1006 else CloseConnection(code, reason))
        self.record.close = (code, reason if code != 1006 else "")
        self._phase = "closed"
        self._timeline.clear()
        self._release()

    def _release(self) -> None:
        if self.record.closed_at is None:
            self.record.closed_at = time.monotonic()
        self.shared.open_connections.discard(self._key)
        if self._counted:
            self._counted = False
            self.shared.active -= 1

    def _at(self, due: float, fn: Callable[[], None], group: int = 0) -> None:
        heapq.heappush(self._timeline, (due, next(self._seq), group, fn))

    def _prune(self) -> None:
        while self._timeline and self._timeline[0][2] not in self._live_groups:
            heapq.heappop(self._timeline)

    def _new_group(self) -> int:
        group = next(self._groups)
        self._live_groups.add(group)
        return group

    def _cancel(self, group: int) -> None:
        self._live_groups.discard(group)

    def _fault(self, when: str, count: int = 0) -> bool:
        """Fire the first matching scripted fault; True when the session ended or stalled."""
        for i, fault in enumerate(self.script.faults):
            if fault.when != when:
                continue
            if when in ("after_audio_chunks", "mid_generation", "after_turn") and count != fault.n:
                continue
            if fault.connection is not None and fault.connection != self.index:
                continue
            if fault.times is not None and self.shared.fault_fired[i] >= fault.times:
                continue
            self.shared.fault_fired[i] += 1
            self._apply(fault)
            return True
        return False

    def _apply(self, fault: Fault) -> None:
        if fault.action == "stall":
            self._phase = "stalled"
            self.record.stalled = True
            self._timeline.clear()
        else:
            self._close(fault.code, fault.reason)

    # -- setup --------------------------------------------------------------------

    def _on_setup(self, setup: Any) -> None:
        if self.route is None:  # the transport answers 404 first; kept for direct use
            self._close(1008, "Not found.")
            return
        error = credential_error(self.handshake, self.route, self.settings)
        if error:
            self._close(1008, error)
            return
        if not isinstance(setup, dict):
            self._close(1007, INVALID)
            return
        self.record.setup = setup
        unknown = unknown_field("setup", setup, self.route)
        if unknown is not None:
            self._close(1007, unknown)
            return
        model = get_field(setup, "model")
        version = self.route.api_version
        if not isinstance(model, str) or not model.startswith("models/"):
            self._close(1008, not_found(str(model or "models/"), version))
            return
        if version not in self.settings.api_versions or not self.settings.live_model(model):
            self._close(1008, not_found(model, version))
            return
        outage = self.shared.outage
        if outage.down is not None:  # "refuse" is the sockets' (no listener); here, a setup that got in
            self._close(1011, UNAVAILABLE)
            return
        if not outage.serves(model):  # not in this region
            self._close(1008, not_found(model, version))
            return
        self.model = model
        self.profile = dataclasses.replace(
            profile_for(model, self.script.profile), **self.script.profile_overrides
        )
        self.record.profile = self.profile.family
        refused = setup_error(self.profile, setup)
        if refused:
            self._close(1007, refused)
            return
        self._configure(setup)
        resumption = get_field(setup, "sessionResumption")
        if isinstance(resumption, Mapping):
            self._resumption = True
            handle = get_field(resumption, "handle")
            if handle and self._history_in_client_content:
                self._close(
                    1007, "initialHistoryInClientContent is not accepted when resuming a session."
                )
                return
            if handle and not self._resume(str(handle)):
                return
        limit = self.script.max_sessions
        if limit is not None and self.shared.active >= limit:
            self._phase = "open"
            self._close(1011, "RESOURCE_EXHAUSTED: Too many concurrent sessions for this API key.")
            return
        self.shared.active += 1
        self._counted = True
        self.shared.open_connections.add(self._key)
        self._phase = "open"
        self._send({"setupComplete": setup_complete(setup)})
        self._early = self._dice.early_drop()
        if self._early is not None and self._early.at_setup:
            self._handle()  # the drop drawn for this connection, right after setup
            return
        if self.profile.handle_after_setup:
            self._handle()
        if self.script.go_away_after is not None:
            self._at(self._now + self.script.scaled(self.script.go_away_after), self._go_away)
        self._fault("after_setup")

    def _configure(self, setup: Mapping[str, Any]) -> None:
        gen = get_field(setup, "generationConfig") or {}
        modalities = get_field(gen, "responseModalities") or ["AUDIO"]
        self._modality = "TEXT" if "TEXT" in [str(m).upper() for m in modalities] else "AUDIO"
        self._set_tools(get_field(setup, "tools"))
        self._input_transcription = get_field(setup, "inputAudioTranscription") is not None
        self._output_transcription = get_field(setup, "outputAudioTranscription") is not None
        ric = get_field(setup, "realtimeInputConfig") or {}
        aad = get_field(ric, "automaticActivityDetection") or {}
        self._vad_disabled = bool(get_field(aad, "disabled", False))
        self._interrupts = get_field(ric, "activityHandling") != "NO_INTERRUPTION"
        start = get_field(aad, "startOfSpeechSensitivity")
        self._threshold = {"START_SENSITIVITY_HIGH": 500.0, "START_SENSITIVITY_LOW": 2000.0}.get(
            str(start), 1000.0
        )
        self._prefix_ms = float(get_field(aad, "prefixPaddingMs") or 20)
        self._silence_ms_needed = float(get_field(aad, "silenceDurationMs") or 500)
        history = get_field(setup, "historyConfig") or {}
        self._history_in_client_content = self.profile.history_config and bool(
            get_field(history, "initialHistoryInClientContent")
        )
        self._awaiting_history = self._history_in_client_content
        bundle = self.script.bundle
        self._bundle = bundle if bundle is not None else self.profile.bundled_output

    def _set_tools(self, tools: Any) -> None:
        self._behaviours = declared_behaviours(tools)
        self._declared = list(self._behaviours)

    # -- turns ------------------------------------------------------------------------

    def _busy(self) -> bool:
        """The model is speaking, waiting on a blocking call, or thinking."""
        return self._gen is not None or self._tools is not None or self._thinking is not None

    def _barge_in(self) -> None:
        """The user started talking: cut the current generation and pending blocking calls."""
        if not self._interrupts or not self._busy():
            return
        if self._thinking is not None:
            self._cancel(self._thinking)  # the answer still being thought out is dropped
            self._thinking = None
        if self._gen is not None:
            self._cut()
        elif self._tools is not None:
            self._send({"serverContent": {"interrupted": True}})
        self._cancel_blocking_calls()
        self._idle_point()

    def _cut(self) -> None:
        """Interrupt the current generation: what was said stays, then the turn ends."""
        gen, self._gen = self._gen, None
        assert gen is not None
        self._cancel(gen.group)
        partial = "".join(gen.spoken)
        self._history.append({"role": "model", "parts": [{"text": partial}]})
        self.record.model_turns.append(partial)
        if not gen.filler:
            self._model_turns += 1  # an interrupted turn still used its scripted reply
        self._send({"serverContent": {"interrupted": True}})
        self._turn_complete()  # the interrupted turn's own end, as the service sends it

    def _next(self) -> None:
        """The model is free: take the next queued user turn, else answer queued results."""
        if self._busy() or self._phase != "open":
            return
        if self._waiting:
            text, spoken, add_history = self._waiting.popleft()
            self._user_turn(text, spoken=spoken, add_history=add_history)
        elif self._answers:
            results, self._answers = self._answers, []
            self._start_reply(user_text="", tool_results=tuple(results))

    def _user_turn(self, text: str, *, spoken: bool, add_history: bool = True) -> None:
        if self._tools is not None and self.profile.cancels_blocking_calls_on_input:
            self._cancel_blocking_calls()
        if self._busy():
            # Not interrupting (activityHandling NO_INTERRUPTION): answer after this turn.
            self._waiting.append((text, spoken, add_history))
            return
        self._turn += 1
        self._started = True
        self.record.user_turns.append(text)
        if add_history:
            self._history.append({"role": "user", "parts": [{"text": text}]})
            if not spoken:
                self._ctx_tokens["TEXT"] = self._ctx_tokens.get("TEXT", 0) + token_count(text)
        if self.profile.waits_for_more_input and looks_unfinished(text):
            self._unfinished.append(text)
            self._send({"serverContent": {"waitingForInput": True}})
            return
        if self._unfinished:
            text = " ".join([*self._unfinished, text])
            self._unfinished.clear()
        calls = list(self.script.tool_calls.get(self._turn, ()))
        if not calls and self.script.call_named_functions:
            lowered = text.lower()
            for name in self._declared:
                # Asked for by name; a mention written as a call, `name(...)`, is a
                # report of one that ran (a context note), not a request.
                for form in {name.lower(), name.lower().replace("_", " ")}:
                    if re.search(rf"{re.escape(form)}(?!\s*\()", lowered):
                        calls.append(ToolCall(name, self.script.tool_args.get(name, {})))
                        break
        if calls:
            self._call_tools(calls, text)
        elif self.profile.interaction_status:
            answer = functools.partial(self._start_reply, user_text=text, tool_results=())
            self._start_reply(user_text=text, tool_results=(), filler=THINKING, then=answer)
        else:
            self._start_reply(user_text=text, tool_results=())

    def _start_reply(
        self,
        *,
        user_text: str,
        tool_results: tuple[Mapping[str, Any], ...],
        filler: str | None = None,
        then: Callable[[], None] | None = None,
        prelude: Callable[[], None] | None = None,
    ) -> None:
        """Speak the scripted reply (or `filler`); `prelude` runs just before its first chunk."""
        if self.shared.outage.quota_gone(api_key_of(self.handshake)):
            self._close(1011, QUOTA_REASON)  # the key's quota ran out: nothing more is generated
            return
        if filler is None:
            ctx = ReplyContext(
                turn=self._turn,
                user_text=user_text,
                tool_results=tool_results,
                history=tuple(copy.deepcopy(self._history)),
                connection=self.index,
                video=tuple(self.record.video),
            )
            text = self.script.reply_for(ctx, self._model_turns)
        else:
            text = filler
        group = self._new_group()
        gen = _Generation(group=group, text=text, turn=self._turn, filler=filler is not None, then=then)
        self._gen = gen
        self._not_resumable()
        script = self.script
        chars = script.chars_per_second
        duration = synth.speech_seconds(text, chars)
        gen.audio_seconds = duration
        if self._modality == "AUDIO":
            pcm = synth.speak(text, chars)
            size = synth.OUTPUT_RATE * script.chunk_ms // 1000 * 2
            chunks: list[Any] = [pcm[i : i + size] for i in range(0, len(pcm), size)]
            frags = synth.fragments(text) if self._output_transcription else []
        else:
            chunks = synth.fragments(text, size=12)
            frags = []
        # The fragment that ends the reply's transcript, where the profile marks it.
        mark_last = bool(frags) and self.profile.output_transcription_finished
        if frags and self.profile.late_transcripts:
            gen.late = frags.pop()
        gen.fail_at = self._dice.mid_turn(len(chunks))
        per_chunk: list[list[str]] = [[] for _ in chunks]
        for k, frag in enumerate(frags):
            per_chunk[min(len(chunks) - 1, k * len(chunks) // len(frags))].append(frag)
        t0 = self._now + script.scaled(script.first_response_delay)
        if prelude is not None:
            self._at(t0, prelude, group)
        for extra in script.extras if filler is None else ():
            self._at(t0, functools.partial(self._send, copy.deepcopy(dict(extra))), group)
        burst_s = script.chunk_ms * script.burst_chunks / 1000
        last_due = t0
        # The chunk whose fragments end the transcript (none when the last comes late).
        ending = -1 if gen.late or not mark_last else max(i for i, f in enumerate(per_chunk) if f)
        gen.late_finished = bool(gen.late) and mark_last
        for i, chunk in enumerate(chunks):
            due = t0 + script.scaled((i // max(1, script.burst_chunks)) * burst_s)
            last_due = due
            self._at(due, self._chunk_sender(gen, chunk, per_chunk[i], i == len(chunks) - 1, i == ending), group)
        if not chunks or not self._bundle:
            self._at(last_due, lambda: self._send({"serverContent": {"generationComplete": True}}), group)
        self._at(max(last_due, t0 + script.scaled(duration)), lambda: self._finish(gen), group)

    def _audio_part(self, chunk: bytes) -> dict[str, Any]:
        script = self.script
        encode = base64.urlsafe_b64encode if script.audio_base64 == "urlsafe" else base64.b64encode
        blob, mime = ("inline_data", "mime_type") if script.audio_keys == "snake" else ("inlineData", "mimeType")
        return {blob: {mime: f"audio/pcm;rate={synth.OUTPUT_RATE}", "data": encode(chunk).decode("ascii")}}

    def _chunk_sender(
        self, gen: _Generation, chunk: Any, frags: list[str], last: bool, ends_transcript: bool = False
    ) -> Callable[[], None]:
        """`ends_transcript`: its last fragment ends the reply's transcript and
        is marked `finished` (`Profile.output_transcription_finished`)."""

        def send() -> None:
            if isinstance(chunk, bytes):
                part = self._audio_part(chunk)
            else:
                part = {"text": chunk}
                gen.spoken.append(chunk)
            content: dict[str, Any] = {"modelTurn": {"role": "model", "parts": [part]}}
            gen.spoken.extend(frags)
            if self._bundle:
                if frags:
                    content["outputTranscription"] = _transcription("".join(frags), ends_transcript, self._output_fields)
                if last:
                    content["generationComplete"] = True
                self._send({"serverContent": content})
            else:
                self._send({"serverContent": content})
                for k, frag in enumerate(frags):
                    piece = _transcription(frag, ends_transcript and k == len(frags) - 1, self._output_fields)
                    self._send({"serverContent": {"outputTranscription": piece}})
            gen.chunks_sent += 1
            if gen.chunks_sent == gen.fail_at:
                self._close(1011, INTERNAL)
                return
            self._fault("mid_generation", gen.chunks_sent)

        return send

    def _finish(self, gen: _Generation) -> None:
        if self._gen is not gen:
            return
        self._gen = None
        self._cancel(gen.group)
        response_tokens = max(1, round(gen.audio_seconds * AUDIO_TOKENS_PER_S))
        modality = "AUDIO" if self._modality == "AUDIO" else "TEXT"
        if modality == "TEXT":
            response_tokens = token_count(gen.text)
        usage = usage_metadata(self._ctx_tokens, modality, response_tokens, self.script.usage)
        self._ctx_tokens[modality] = self._ctx_tokens.get(modality, 0) + response_tokens
        self._history.append({"role": "model", "parts": [{"text": gen.text}]})
        self.record.model_turns.append(gen.text)
        if not gen.filler:
            self._model_turns += 1
        if gen.late:
            self._late.insert(0, {"serverContent": {"outputTranscription": _transcription(gen.late, gen.late_finished, self._output_fields)}})
        if gen.then is not None:
            self._think(gen.then)
        reason = None if gen.filler else self.script.turn_complete_reasons.get(self._model_turns)
        self._turn_complete(usage, reason)
        self._idle_point()
        if self._phase != "open" or (not gen.filler and self._fault("after_turn", self._model_turns)):
            return
        self._next()

    def _think(self, answer: Callable[[], None]) -> None:
        """An extended-thinking answer, `thinking_delay` from now unless the user cuts in."""
        group = self._thinking = self._new_group()

        def run() -> None:
            self._thinking = None
            self._cancel(group)
            answer()

        self._at(self._now + self.script.scaled(self.profile.thinking_delay), run, group)

    def _turn_complete(self, usage: dict[str, Any] | None = None, reason: str | None = None) -> None:
        """turnComplete (with interactionStatus where the family sends it, and
        the script's `turnCompleteReason` for the turn), then the transcripts
        that arrive after it (the first in its message, where the family
        bundles)."""
        content: dict[str, Any] = {"turnComplete": True}
        if reason is not None:
            content["turnCompleteReason"] = reason
        if self.profile.interaction_status:
            self._in_progress = self._more_coming()
            content["interactionStatus"] = "IN_PROGRESS" if self._in_progress else "IDLE"
        late, self._late = self._late, []
        if self._bundle and late:
            # Families that bundle put the first straggler in turnComplete's message.
            content.update(late.pop(0)["serverContent"])
        message: dict[str, Any] = {"serverContent": content}
        if usage is not None:
            message["usageMetadata"] = usage
        self._send(message)
        for item in late:
            self._send(item)
