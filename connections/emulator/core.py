"""The protocol state machine of one emulated Live connection, without I/O.

`EmulatorSession` is fed the handshake, each client frame and the current time,
and answers with actions (`SendMessage`, `CloseConnection`, `DropConnection`).
`next_deadline()` says when it next wants `poll(now)`; between deadlines it does
nothing, so a test can step it with a fake clock and a transport can drive it
with a single wait.

Behaviour follows the Gemini API (not Vertex) BidiGenerateContent service as
observed through google-genai: camelCase output, mixed-case input accepted,
standard or URL-safe base64 accepted, closes with the real codes and reasons.
"""

from __future__ import annotations

import base64
import collections
import copy
import dataclasses
import hashlib
import heapq
import itertools
import json
from collections.abc import Callable, Mapping
from typing import Any

from connections.emulator import synth
from connections.emulator.script import (
    Fault,
    ReplyContext,
    Script,
    ToolCall,
    VideoFrame,
)
from connections.emulator.wire import (
    AUDIO_TOKENS_PER_S,
    BAD_KEY,
    BAD_TOKEN,
    DEFAULT_REASONS,
    INVALID,
    MAX_AUDIO,
    MAX_FRAMES,
    TOP_LEVEL,
    UNREGISTERED,
    Action,
    CloseConnection,
    DropConnection,
    Handshake,
    Route,
    SendMessage,
    SessionRecord,
    Settings,
    Shared,
    b64decode,
    duration_text,
    get_field,
    is_3x,
    not_found,
    rate_of,
    route,
    text_of,
    token_count,
    without_video_data,
)
from live.images import InvalidImage, inspect_image

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
    group: int
    text: str
    turn: int
    spoken: list[str] = dataclasses.field(default_factory=list)
    chunks_sent: int = 0
    audio_seconds: float = 0.0


@dataclasses.dataclass(slots=True)
class _PendingTools:
    group: int
    ids: list[str]
    names: dict[str, str]
    sent: bool = False
    results: list[dict[str, Any]] = dataclasses.field(default_factory=list)


# --- the session ---------------------------------------------------------------


class EmulatorSession:
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
        # configuration from setup
        self.model = ""
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
        # conversation state (restored on resume)
        self._history: list[dict[str, Any]] = []
        self._turn = 0
        self._spoken_turns = 0
        self._model_turns = 0
        self._ctx_tokens: dict[str, int] = {}
        self._started = False
        # live state
        self._gen: _Generation | None = None
        self._tools: _PendingTools | None = None
        self._speaking = False
        self._voiced_ms = 0.0
        self._silence_ms = 0.0
        self._turn_audio_ms = 0.0
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

    def _credential_error(self) -> str | None:
        hs = self.handshake
        key = hs.header("x-goog-api-key") or hs.query("key")
        auth = hs.header("authorization") or ""
        token = auth[6:].strip() if auth[:6].lower() == "token " else hs.query("access_token")
        assert self.route is not None
        if self.route.constrained:
            if not token:
                return UNREGISTERED
            tokens = self.settings.tokens
            if not token.startswith("auth_tokens/") or (tokens is not None and token not in tokens):
                return BAD_TOKEN
            return None
        if not key:
            return UNREGISTERED
        if self.settings.api_key is not None and key.strip() != self.settings.api_key:
            return BAD_KEY
        return None

    def _on_setup(self, setup: Any) -> None:
        if self.route is None:  # the transport answers 404 first; kept for direct use
            self._close(1008, "Not found.")
            return
        error = self._credential_error()
        if error:
            self._close(1008, error)
            return
        if not isinstance(setup, dict):
            self._close(1007, INVALID)
            return
        self.record.setup = setup
        model = get_field(setup, "model")
        version = self.route.api_version
        if not isinstance(model, str) or not model.startswith("models/"):
            self._close(1008, not_found(str(model or "models/"), version))
            return
        if version not in self.settings.api_versions or not self.settings.live_model(model):
            self._close(1008, not_found(model, version))
            return
        self.model = model
        self._configure(setup)
        resumption = get_field(setup, "sessionResumption")
        if isinstance(resumption, Mapping):
            if get_field(resumption, "transparent"):
                self._close(1007, "transparent parameter is not supported in Gemini API.")
                return
            self._resumption = True
            handle = get_field(resumption, "handle")
            if handle and self._history_in_client_content:
                self._close(
                    1007, "initialHistoryInClientContent is not accepted when resuming a session."
                )
                return
            if handle:
                snapshot = self.shared.store.get(str(handle))
                if snapshot is None:
                    self._close(1007, "Invalid session resumption handle.")
                    return
                self._restore(snapshot)
                self.record.resumed_from = str(handle)
        limit = self.script.max_sessions
        if limit is not None and self.shared.active >= limit:
            self._phase = "open"
            self._close(1011, "RESOURCE_EXHAUSTED: Too many concurrent sessions for this API key.")
            return
        self.shared.active += 1
        self._counted = True
        self._phase = "open"
        self._send({"setupComplete": {}})
        self._resumption_update(resumable=True)
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
        self._history_in_client_content = bool(get_field(history, "initialHistoryInClientContent"))
        self._awaiting_history = self._history_in_client_content
        self._bundle = self.script.bundle if self.script.bundle is not None else is_3x(self.model)

    def _set_tools(self, tools: Any) -> None:
        names: list[str] = []
        for tool in tools or []:
            for decl in get_field(tool, "functionDeclarations") or []:
                name = get_field(decl, "name")
                if isinstance(name, str):
                    names.append(name)
        self._declared = names

    # -- resumption -----------------------------------------------------------------

    def _snapshot(self) -> dict[str, Any]:
        return {
            "history": copy.deepcopy(self._history),
            "turn": self._turn,
            "spoken_turns": self._spoken_turns,
            "model_turns": self._model_turns,
            "ctx_tokens": dict(self._ctx_tokens),
            "started": self._started,
        }

    def _restore(self, snap: Mapping[str, Any]) -> None:
        self._history = list(snap["history"])
        self._turn = snap["turn"]
        self._spoken_turns = snap["spoken_turns"]
        self._model_turns = snap["model_turns"]
        self._ctx_tokens = dict(snap["ctx_tokens"])
        self._started = snap["started"]

    def _resumption_update(self, *, resumable: bool) -> None:
        """A new handle; only handles sent with resumable=true can be resumed."""
        if not self._resumption:
            return
        handle = f"emulator-handle-{self.index}-{next(self._handle_seq)}"
        if resumable:
            self.shared.store.put(handle, self._snapshot())
            self.record.handles.append(handle)
        self._send({"sessionResumptionUpdate": {"newHandle": handle, "resumable": resumable}})

    def _go_away(self) -> None:
        left = self.script.go_away_time_left
        self._send({"goAway": {"timeLeft": duration_text(left)}})
        self._at(self._now + self.script.scaled(left), lambda: self._close(1000, ""))

    # -- input ------------------------------------------------------------------------

    def _on_realtime(self, body: Any) -> None:
        if not isinstance(body, Mapping):
            self._close(1007, INVALID)
            return
        if self._awaiting_history:
            # historyConfig.initialHistoryInClientContent: only client_content is
            # processed until one arrives with turnComplete=true.
            self.record.ignored_realtime += 1
            return
        for key, value in body.items():
            name = _SNAKE_TO_CAMEL.get(key, key)
            if self._phase != "open":
                return
            if name == "audio":
                self._on_blob(value, "realtime_input.audio")
            elif name == "mediaChunks":
                for blob in value or []:
                    self._on_blob(blob, "realtime_input.media_chunks")
            elif name == "video":
                self._on_video(value, "realtime_input.video")
            elif name == "text":
                self._barge_in()
                self._user_turn(str(value), spoken=False)
            elif name in ("activityStart", "activityEnd"):
                if not self._vad_disabled:
                    self._close(
                        1007,
                        "Explicit activity control is not supported when automatic"
                        " activity detection is enabled.",
                    )
                    return
                if name == "activityStart":
                    self._manual_active = True
                    self._turn_audio_ms = 0.0
                    self._barge_in()
                elif self._manual_active:
                    self._manual_active = False
                    self._end_spoken_turn()
            elif name == "audioStreamEnd":
                if value and not self._vad_disabled and self._speaking:
                    self._speaking = False
                    self._end_spoken_turn()
            else:
                self._close(1007, f'Invalid JSON payload received. Unknown name "{key}" at \'realtime_input\': Cannot find field.')

    def _on_video(self, blob: Any, where: str) -> None:
        """An image frame: checked as strictly as the service could, then counted."""
        data_text = get_field(blob, "data")
        mime = str(get_field(blob, "mimeType") or "")
        try:
            data = b64decode(data_text)
        except ValueError:
            self._close(1007, f"Invalid value at '{where}.data' (TYPE_BYTES), Base64 decoding failed.")
            return
        if not mime.startswith(("image/", "video/")):
            self._close(1007, f"Unsupported MIME type for {where}: {mime!r}.")
            return
        width = height = None
        if mime in ("image/jpeg", "image/png"):
            try:
                info = inspect_image(data, mime)
            except InvalidImage as exc:
                self._close(1007, f"Invalid image at '{where}': {exc}.")
                return
            width, height = info.width, info.height
        self._started = True
        record = self.record
        record.video_frames += 1
        record.last_video = data
        if len(record.video) < MAX_FRAMES:
            frame = VideoFrame(self._now, mime, len(data), width, height, hashlib.sha256(data).hexdigest())
            record.video.append(frame)

    def _on_blob(self, blob: Any, where: str) -> None:
        data_text = get_field(blob, "data")
        mime = str(get_field(blob, "mimeType") or "")
        try:
            data = b64decode(data_text)
        except ValueError:
            self._close(
                1007,
                f"Invalid value at '{where}.data' (TYPE_BYTES), Base64 decoding failed.",
            )
            return
        self._started = True
        if not mime.startswith("audio/"):
            return
        self.record.audio_chunks += 1
        self.heard_audio(data, rate_of(mime))
        if self._phase == "open":
            self._fault("after_audio_chunks", self.record.audio_chunks)

    def heard_audio(self, data: bytes, rate: int) -> None:
        """One realtime audio chunk, checked: kept in `record`, and heard by the
        activity detector (or counted toward a manual activity)."""
        room = MAX_AUDIO - len(self.record.audio)
        if room > 0:
            self.record.audio.extend(data[:room])
        if self._vad_disabled:
            if self._manual_active:
                self._turn_audio_ms += len(data) / 2 / rate * 1000
        else:
            self._detect(data, rate)

    def _detect(self, pcm: bytes, rate: int) -> None:
        """Energy-based activity detection, measured in audio time (deterministic)."""
        for rms, ms in synth.frame_rms(pcm, rate):
            loud = rms >= self._threshold
            if not self._speaking:
                if loud:
                    self._voiced_ms += ms
                    if self._voiced_ms >= self._prefix_ms:
                        self._speaking = True
                        self._silence_ms = 0.0
                        self._turn_audio_ms = self._voiced_ms
                        self._barge_in()
                else:
                    self._voiced_ms = 0.0
                continue
            self._turn_audio_ms += ms
            self._silence_ms = 0.0 if loud else self._silence_ms + ms
            if self._silence_ms >= self._silence_ms_needed:
                self._speaking = False
                self._voiced_ms = 0.0
                self._end_spoken_turn()
                if self._phase != "open":
                    return

    def _end_spoken_turn(self) -> None:
        text = self.script.transcript_for(self._turn + 1, self._spoken_turns)
        self._spoken_turns += 1
        if self._input_transcription:
            for piece in synth.fragments(text, size=64):
                self._send({"serverContent": {"inputTranscription": {"text": piece}}})
        seconds = self._turn_audio_ms / 1000
        self._ctx_tokens["AUDIO"] = self._ctx_tokens.get("AUDIO", 0) + max(
            1, round(seconds * AUDIO_TOKENS_PER_S)
        )
        self._user_turn(text, spoken=True)

    def _on_client_content(self, body: Any) -> None:
        if not isinstance(body, Mapping):
            self._close(1007, INVALID)
            return
        if is_3x(self.model) and not self._awaiting_history:
            self._close(1007, INVALID)
            return
        seeding = self._awaiting_history
        turns = get_field(body, "turns") or []
        if not isinstance(turns, list):
            self._close(1007, INVALID)
            return
        for turn in turns:
            if not isinstance(turn, Mapping):
                self._close(1007, INVALID)
                return
            role = get_field(turn, "role") or "user"
            self._history.append({"role": role, "parts": list(get_field(turn, "parts") or [])})
            self._ctx_tokens["TEXT"] = self._ctx_tokens.get("TEXT", 0) + token_count(text_of(turn))
        if seeding:
            # The initial history: it may end with the model's turn and triggers no reply.
            if get_field(body, "turnComplete"):
                self._awaiting_history = False
                self._started = True
                self._resumption_update(resumable=True)
            return
        if get_field(body, "turnComplete"):
            self._barge_in()
            last_user = next(
                (t for t in reversed(turns) if (get_field(t, "role") or "user") == "user"), None
            )
            self._user_turn(text_of(last_user) if last_user else "", spoken=False, add_history=False)

    def _on_tool_response(self, body: Any) -> None:
        responses = get_field(body, "functionResponses") or []
        if not isinstance(responses, list):
            self._close(1007, INVALID)
            return
        if not all(isinstance(r, Mapping) for r in responses):
            self._close(1007, INVALID)
            return
        self.record.tool_responses.extend(dict(r) for r in responses)
        if self._fault("after_tool_response"):
            return
        pending = self._tools
        for response in responses:
            call_id = get_field(response, "id")
            if call_id in self._cancelled_ids:
                continue  # it crossed the cancellation on the wire
            if pending is None or call_id not in pending.ids:
                # A response to a call this session never issued, or answered
                # already: the strictest reading of the service.
                self._close(1007, f"Function response for unknown call id {call_id!r}.")
                return
            pending.ids.remove(call_id)
            name = get_field(response, "name") or pending.names.get(call_id, "")
            result = {"id": call_id, "name": name, "response": get_field(response, "response")}
            pending.results.append(result)
            self._history.append({"role": "user", "parts": [{"functionResponse": result}]})
            self._ctx_tokens["TEXT"] = self._ctx_tokens.get("TEXT", 0) + token_count(json.dumps(result))
        if pending is not None and not pending.ids:
            self._tools = None
            self._cancel(pending.group)
            self._start_reply(user_text="", tool_results=tuple(pending.results))

    def _on_context_update(self, body: Any) -> None:
        tools = get_field(body, "tools")
        if isinstance(tools, Mapping):
            self._set_tools(get_field(tools, "tools"))

    # -- turns ------------------------------------------------------------------------

    def _barge_in(self) -> None:
        """The user started talking: cut the current generation and pending tool calls."""
        if not self._interrupts or (self._gen is None and self._tools is None):
            return
        interrupted_generation = self._gen is not None
        if self._gen is not None:
            gen, self._gen = self._gen, None
            self._cancel(gen.group)
            partial = "".join(gen.spoken)
            self._history.append({"role": "model", "parts": [{"text": partial}]})
            self.record.model_turns.append(partial)
            self._model_turns += 1  # an interrupted turn still used its scripted reply
        self._send({"serverContent": {"interrupted": True}})
        if self._gen is None and interrupted_generation:
            # The interrupted turn's own end, as the service sends it.
            self._send({"serverContent": {"turnComplete": True}})
        if self._tools is not None:
            tools, self._tools = self._tools, None
            self._cancel(tools.group)
            if tools.sent and tools.ids:
                self._cancelled_ids.update(tools.ids)
                self._send({"toolCallCancellation": {"ids": list(tools.ids)}})
        self._resumption_update(resumable=True)

    def _user_turn(self, text: str, *, spoken: bool, add_history: bool = True) -> None:
        if self._gen is not None or self._tools is not None:
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
        calls = list(self.script.tool_calls.get(self._turn, ()))
        if not calls and self.script.call_named_functions:
            lowered = text.lower()
            for name in self._declared:
                if name.lower() in lowered or name.lower().replace("_", " ") in lowered:
                    calls.append(ToolCall(name, self.script.tool_args.get(name, {})))
        if calls:
            self._call_tools(calls)
        else:
            self._start_reply(user_text=text, tool_results=())

    def _call_tools(self, calls: list[ToolCall]) -> None:
        group = self._new_group()
        ids = [f"function-call-{self.index}-{next(self._call_ids)}" for _ in calls]
        pending = _PendingTools(group, list(ids), {i: c.name for i, c in zip(ids, calls, strict=True)})
        self._tools = pending
        self._resumption_update(resumable=False)
        function_calls = [
            {"id": i, "name": c.name, "args": dict(c.args)} for i, c in zip(ids, calls, strict=True)
        ]

        def send() -> None:
            pending.sent = True
            self.record.tool_calls.extend(function_calls)
            self._history.append(
                {"role": "model", "parts": [{"functionCall": fc} for fc in function_calls]}
            )
            self._send({"toolCall": {"functionCalls": function_calls}})
            self._fault("after_tool_call")

        self._at(self._now + self.script.scaled(self.script.first_response_delay), send, group)

    def _start_reply(self, *, user_text: str, tool_results: tuple[Mapping[str, Any], ...]) -> None:
        ctx = ReplyContext(
            turn=self._turn,
            user_text=user_text,
            tool_results=tool_results,
            history=tuple(copy.deepcopy(self._history)),
            connection=self.index,
            video=tuple(self.record.video),
        )
        text = self.script.reply_for(ctx, self._model_turns)
        group = self._new_group()
        gen = _Generation(group=group, text=text, turn=self._turn)
        self._gen = gen
        self._resumption_update(resumable=False)
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
        per_chunk: list[list[str]] = [[] for _ in chunks]
        for k, frag in enumerate(frags):
            per_chunk[min(len(chunks) - 1, k * len(chunks) // len(frags))].append(frag)
        t0 = self._now + script.scaled(script.first_response_delay)
        burst_s = script.chunk_ms * script.burst_chunks / 1000
        last_due = t0
        for i, chunk in enumerate(chunks):
            due = t0 + script.scaled((i // max(1, script.burst_chunks)) * burst_s)
            last_due = due
            self._at(due, self._chunk_sender(gen, chunk, per_chunk[i], i == len(chunks) - 1), group)
        if not chunks or not self._bundle:
            self._at(last_due, lambda: self._send({"serverContent": {"generationComplete": True}}), group)
        self._at(max(last_due, t0 + script.scaled(duration)), lambda: self._finish(gen), group)

    def _audio_part(self, chunk: bytes) -> dict[str, Any]:
        script = self.script
        encode = base64.urlsafe_b64encode if script.audio_base64 == "urlsafe" else base64.b64encode
        blob, mime = ("inline_data", "mime_type") if script.audio_keys == "snake" else ("inlineData", "mimeType")
        return {blob: {mime: f"audio/pcm;rate={synth.OUTPUT_RATE}", "data": encode(chunk).decode("ascii")}}

    def _chunk_sender(
        self, gen: _Generation, chunk: Any, frags: list[str], last: bool
    ) -> Callable[[], None]:
        def send() -> None:
            if isinstance(chunk, bytes):
                part = self._audio_part(chunk)
            else:
                part = {"text": chunk}
                gen.spoken.append(chunk)
            content: dict[str, Any] = {"modelTurn": {"parts": [part]}}
            gen.spoken.extend(frags)
            if self._bundle:
                if frags:
                    content["outputTranscription"] = {"text": "".join(frags)}
                if last:
                    content["generationComplete"] = True
                self._send({"serverContent": content})
            else:
                self._send({"serverContent": content})
                for frag in frags:
                    self._send({"serverContent": {"outputTranscription": {"text": frag}}})
            gen.chunks_sent += 1
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
        prompt = sum(self._ctx_tokens.values())
        usage = {
            "promptTokenCount": prompt,
            "responseTokenCount": response_tokens,
            "totalTokenCount": prompt + response_tokens,
            "promptTokensDetails": [
                {"modality": m, "tokenCount": c} for m, c in sorted(self._ctx_tokens.items())
            ],
            "responseTokensDetails": [{"modality": modality, "tokenCount": response_tokens}],
        }
        self._send({"serverContent": {"turnComplete": True}, "usageMetadata": usage})
        self._ctx_tokens[modality] = self._ctx_tokens.get(modality, 0) + response_tokens
        self._history.append({"role": "model", "parts": [{"text": gen.text}]})
        self.record.model_turns.append(gen.text)
        self._model_turns += 1
        self._resumption_update(resumable=True)
        if self._fault("after_turn", self._model_turns):
            return
        if self._waiting:
            text, spoken, add_history = self._waiting.popleft()
            self._user_turn(text, spoken=spoken, add_history=add_history)


_SNAKE_TO_CAMEL = {
    "media_chunks": "mediaChunks",
    "activity_start": "activityStart",
    "activity_end": "activityEnd",
    "audio_stream_end": "audioStreamEnd",
}
