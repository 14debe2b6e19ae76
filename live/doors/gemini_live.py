"""The Live API's own WebSocket protocol, so existing Gemini Live apps connect unchanged.

A client written against google-genai or @google/genai dials
`/ws/google.ai.generativelanguage.{v1beta,v1alpha}.GenerativeService.BidiGenerateContent`
(or `...Constrained`, where ephemeral tokens go) with its key where the SDK puts
one. Here that key is one of this server's session tokens; the server talks to
Google with its own key, which never leaves it.

What the door speaks, as the service does:

- the first frame is `setup`; its model must be one the server allows; the
  answer is `setupComplete` (with the session's id) once the model's connection
  is open;
- `realtimeInput` (audio, text, activityStart/End, audioStreamEnd),
  `clientContent` (text turns) and `toolResponse` become session inputs;
- the session's events go out as `serverContent` (audio and text parts,
  transcriptions, interrupted, generationComplete, turnComplete), `toolCall`,
  `toolCallCancellation` and `usageMetadata`;
- what the service would refuse ends the socket with the service's close code
  and words (1008 for a bad key or an unknown model, 1007 for a frame it cannot
  read).

The server's own recovery stays invisible: a go-away or a drop upstream is
handled by the session, and this client never hears of it.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar
from urllib.parse import parse_qs

import numpy as np
import soxr
from google.genai import types

from live.liveapi import (
    BAD_KEY,
    BAD_TOKEN,
    INVALID,
    INVALID_HANDLE,
    TOP_LEVEL,
    UNREGISTERED,
    b64decode,
    get_field,
    not_found,
    rate_of,
)
from live.access.auth import Grant
from live.protocol.closes import CLOSE_INTERNAL, CLOSE_NORMAL, CLOSE_POLICY
from live.doors.base import Capabilities, FrontDoor, Input, Opening
from live.doors.gemini_policy import GeminiPolicy
from live.doors.gemini_setup import client_config, invalid, manual_turns, repeated
from live.doors.gemini_tokens import camel_name, constrained_setup
from live.images import IMAGE_TYPES, InvalidImage, inspect_image
from live.protocol import (
    DEFAULT_INPUT_RATE,
    MAX_INPUT_RATE,
    MAX_TEXT_CHARS,
    MIN_INPUT_RATE,
    OUTPUT_RATE,
    ActivityEnd,
    ActivityStart,
    AudioEnd,
    ErrorEvent,
    GenerationComplete,
    Image,
    ProtocolError,
    ServerEvent,
    SessionReattached,
    SessionResume,
    SessionStart,
    SessionStarted,
    Text,
    TextEvent,
    ToolCallEvent,
    ToolCancelled,
    ToolResult,
    TranscriptInput,
    TranscriptOutput,
    TurnComplete,
    TurnInterrupted,
    Usage,
)
from live.observe.record import redact

__all__ = ["CLOSE_INVALID", "EPHEMERAL_PREFIX", "GEMINI_PATHS", "GeminiLiveDoor", "gemini_doors"]

CLOSE_INVALID = 1007  # the service's close for a frame it cannot read

_SERVICE = "/ws/google.ai.generativelanguage.{version}.GenerativeService.{method}"
# The paths google-genai and @google/genai dial for the Gemini API's Live sessions.
GEMINI_PATHS = (
    _SERVICE.format(version="v1beta", method="BidiGenerateContent"),
    _SERVICE.format(version="v1alpha", method="BidiGenerateContent"),
    _SERVICE.format(version="v1alpha", method="BidiGenerateContentConstrained"),
    _SERVICE.format(version="v1beta", method="BidiGenerateContentConstrained"),
)
# How an ephemeral token's name starts: google-genai sends a key with this
# prefix as an ephemeral token (on the Constrained method). A backend hands an
# app one of our tokens as "auth_tokens/TOKEN" to use that path.
EPHEMERAL_PREFIX = "auth_tokens/"

_TURN_COMPLETE_REASONS = frozenset(reason.value for reason in types.TurnCompleteReason)
_DUMPS = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode

# Our usage kinds, as the service names its per-modality details.
_USAGE_DETAILS = {
    "prompt": "promptTokensDetails",
    "response": "responseTokensDetails",
    "cached": "cacheTokensDetails",
    "tool_use_prompt": "toolUsePromptTokensDetails",
}


class GeminiLiveDoor(FrontDoor):
    """One Live API client's socket (see the module's docstring)."""

    name = "gemini"
    # The Live API's client runs the tools it is called for; it cannot come
    # back to a session after a drop (the SDKs open a new one). Its app runs
    # its own conversation: the agent's conversation policies do not apply.
    capabilities = Capabilities(client_tools=True, images=True, usage_with_turn_end=True, policies=False)
    # What the operator lets an app ask (its `models`: fnmatch patterns of the
    # model names a client may give in `setup`, without "models/"); set per
    # server by `gemini_doors`.
    policy: ClassVar[GeminiPolicy] = GeminiPolicy()
    allowed_models: ClassVar[tuple[str, ...]] = ()

    def __init__(self, request: Any = None) -> None:
        super().__init__(request)
        path = request.path.partition("?")[0] if request is not None else ""
        self.constrained = path.endswith("Constrained")
        self.version = "v1alpha" if ".v1alpha." in path else "v1beta"
        self.model: str | None = None  # as the client named it in setup
        # Audio at another rate than the session's, resampled as it comes:
        # the rate and its stream (soxr keeps a little of each chunk for the next).
        self._resampler: tuple[int, soxr.ResampleStream] | None = None
        # The user's typed turns of clientContent not yet ended by turnComplete
        # (bounded: MAX_TEXT_CHARS in all).
        self._typed: list[str] = []
        self._setup: Mapping[str, Any] = {}  # as the app sent it
        self._effective_setup: dict[str, Any] = {}  # as the session runs with it
        # The app asked for session resumption: it gets handles, and may come
        # back with one on a new socket (`_resuming`: this socket did).
        self._resumption = False
        self._resuming = False
        # Which transcriptions the app asked for: it gets those only.
        self._transcribe_input = False
        self._transcribe_output = False

    # ------------------------------------------------------------------ opening

    def credential(self) -> str | None:
        """The client's token, where the SDKs put a key or an ephemeral token."""
        request = self.request
        if request is None:
            return None
        headers = request.headers
        query = parse_qs(request.path.partition("?")[2])
        auth = _one(headers.get_all("Authorization")) or ""
        scheme, _, value = auth.partition(" ")
        candidates = (
            _one(headers.get_all("x-goog-api-key")),
            _one(query.get("key", [])),
            _one(query.get("access_token", [])),
            value.strip() if scheme.lower() in ("token", "bearer") else None,
        )
        found = next((c.strip() for c in candidates if c and c.strip()), None)
        return found.removeprefix(EPHEMERAL_PREFIX) if found else None

    def opening(self, frame: str | bytes) -> Opening | ErrorEvent | None:
        message = _message(frame)
        if "setup" not in message:
            raise invalid(INVALID)
        setup = message["setup"]
        if not isinstance(setup, Mapping):
            raise invalid(INVALID)
        self._setup = setup
        if self.constrained:
            # On the ephemeral tokens' path, what the session runs with (its
            # model too) depends on what the token locks: read once the token
            # is known (`admitted`).
            start = SessionStart(token=self.credential())
        else:
            start = self._start(setup)
        resumption = get_field(setup, "sessionResumption")
        if resumption is None:
            return start
        if not isinstance(resumption, Mapping):
            raise invalid(INVALID)
        self._resumption = True
        handle = get_field(resumption, "handle")
        if handle is None or handle == "":
            return start
        session_id, _, resume_token = handle.partition(".") if isinstance(handle, str) else ("", "", "")
        if not session_id or not resume_token:
            raise invalid(INVALID_HANDLE)
        self._resuming = True
        # The session goes on as it was set up; this setup only finds it.
        return SessionResume(session_id=session_id, resume_token=resume_token, token=start.token)

    def resumable(self) -> bool:
        return self._resumption

    def record_header(self) -> dict[str, Any]:
        # The setup the session runs with (a token's locks applied), for a
        # replay to open it the same way; no resumption handle in it.
        setup = {k: v for k, v in self._effective_setup.items() if camel_name(k) != "sessionResumption"}
        return {"client_setup": redact(setup)}

    def may_return_after_close(self) -> bool:
        # The service keeps a resumable session past its socket, however it
        # closed: an app closes its socket on a goAway, then resumes.
        return self._resumption

    def going_away(self, time_left: float) -> str | None:
        """The service's goAway, for an app that can come back with its handle;
        the others learn of it from the close."""
        if not self._resumption:
            return None
        return _DUMPS({"goAway": {"timeLeft": f"{max(0.0, time_left):.3f}s"}})

    def admitted(self, start: SessionStart, grant: Grant | None) -> SessionStart:
        """A token minted on `auth_tokens` with a locked setup: the session runs
        with the token's fields where it locks them (see `gemini_tokens`)."""
        live = grant.live if grant is not None else None
        if not live:
            return self._start(self._setup) if self.constrained else start
        token_setup = live.get("setup")
        lock = live.get("lock")
        if not isinstance(token_setup, Mapping) or not (lock is None or isinstance(lock, list)):
            raise invalid(INVALID)
        return self._start(constrained_setup(self._setup, token_setup, lock))

    def _start(self, setup: Mapping[str, Any]) -> SessionStart:
        model = get_field(setup, "model")
        if not isinstance(model, str) or not model.startswith("models/"):
            raise ProtocolError("model_not_found", not_found(str(model or "models/"), self.version), fatal=True)
        name = model.removeprefix("models/")
        if not self.policy.allows_model(name):
            raise ProtocolError("model_not_found", not_found(model, self.version), fatal=True)
        self.model = model
        self._effective_setup = dict(setup)
        self._transcribe_input = get_field(setup, "inputAudioTranscription") is not None
        self._transcribe_output = get_field(setup, "outputAudioTranscription") is not None
        return SessionStart(
            token=self.credential(),
            input_rate=DEFAULT_INPUT_RATE,
            turn_taking="manual" if manual_turns(setup) else "auto",
            config=client_config(setup, self.policy),
        )

    # ------------------------------------------------------------------ inputs

    def inputs(self, frame: str | bytes) -> Iterable[Input]:
        message = _message(frame)
        if len(message) != 1:
            raise invalid(INVALID)
        ((key, body),) = message.items()
        kind = TOP_LEVEL.get(key)
        if kind is None:
            raise invalid(f'Invalid JSON payload received. Unknown name "{key[:60]}": Cannot find field.')
        if not isinstance(body, Mapping):
            raise invalid(INVALID)
        if kind == "realtimeInput":
            return self._realtime(body)
        if kind == "clientContent":
            return self._client_content(body)
        if kind == "toolResponse":
            return self._tool_response(body)
        if kind == "setup":
            raise invalid(INVALID)  # setup comes once, first
        return ()  # contextUpdate: not carried to the session yet

    def _realtime(self, body: Mapping[str, Any]) -> list[Input]:
        out: list[Input] = []
        chunks = repeated(get_field(body, "mediaChunks"))
        audio = get_field(body, "audio")
        if audio is not None:
            chunks.append(audio)
        for chunk in chunks:
            mime = get_field(chunk, "mimeType")
            # mediaChunks carried video frames too, before `video` had a field of its own.
            out.append(_image(chunk) if isinstance(mime, str) and mime.startswith("image/") else self._audio(chunk))
        video = get_field(body, "video")
        if video is not None:
            out.append(_image(video))
        text = get_field(body, "text")
        if text is not None:
            out.append(Text(_text(text)))
        if get_field(body, "activityStart") is not None:
            out.append(ActivityStart())
        if get_field(body, "activityEnd") is not None:
            out.append(ActivityEnd())
        if get_field(body, "audioStreamEnd"):
            if self._resampler is not None:  # what the resampler still holds, first
                _, stream = self._resampler
                out.append(stream.resample_chunk(np.zeros(0, "<i2"), last=True).astype("<i2").tobytes())
                self._resampler = None
            out.append(AudioEnd())
        return out

    def _client_content(self, body: Mapping[str, Any]) -> list[Input]:
        # The user's typed turns go to the session as one typed turn once
        # turnComplete says the content is whole (the model answers then, as
        # the service's does); the model's turns and other parts cannot be
        # seeded mid-session yet.
        texts = self._typed
        for turn in repeated(get_field(body, "turns")):
            if not isinstance(turn, Mapping):
                raise invalid(INVALID)
            if (get_field(turn, "role") or "user") != "user":
                raise invalid("Only the user's turns are accepted in clientContent by this endpoint.")
            parts = []
            for part in repeated(get_field(turn, "parts")):
                text = get_field(part, "text")
                if not isinstance(text, str):
                    raise invalid("Only text parts are accepted in clientContent by this endpoint.")
                parts.append(text)
            texts.append("".join(parts))
        if sum(map(len, texts)) > MAX_TEXT_CHARS:
            self._typed = []
            raise invalid(INVALID)
        if not get_field(body, "turnComplete"):
            return []
        self._typed = []
        whole = "\n".join(t for t in texts if t)
        return [Text(whole)] if whole else []

    def _tool_response(self, body: Mapping[str, Any]) -> list[Input]:
        out: list[Input] = []
        for response in repeated(get_field(body, "functionResponses")):
            call_id = get_field(response, "id")
            name = get_field(response, "name")
            result = get_field(response, "response")
            if not isinstance(call_id, str) or not call_id:
                raise invalid("Function response is missing its call id.")
            if result is None:
                result = {}
            if not isinstance(result, Mapping) or not isinstance(name, (str, type(None))):
                raise invalid(INVALID)
            out.append(ToolResult(id=call_id, name=name or "", response=dict(result)))
        return out

    def _audio(self, chunk: Any) -> bytes:
        """A chunk's audio at the session's rate (16 kHz), whatever rate it declares."""
        pcm, rate = _pcm(chunk)
        if rate == DEFAULT_INPUT_RATE:
            return pcm
        if self._resampler is None or self._resampler[0] != rate:
            self._resampler = (rate, soxr.ResampleStream(rate, DEFAULT_INPUT_RATE, 1, dtype="int16"))
        samples = np.frombuffer(pcm, "<i2")
        return self._resampler[1].resample_chunk(samples).astype("<i2").tobytes()

    # ------------------------------------------------------------------ events

    def event(self, event: ServerEvent) -> str | tuple[str, ...] | None:
        if isinstance(event, TurnComplete):
            # A reply cut short by a drop upstream is answered again on the new
            # connection: to the app it was interrupted (stop playing it), and
            # the answer follows as the model's next turn.
            body: dict[str, Any] = {"interrupted": True} if event.reason == "connection_lost" else {"turnComplete": True}
            if event.reason in _TURN_COMPLETE_REASONS:
                body["turnCompleteReason"] = event.reason  # the service's; never one of ours
            message: dict[str, Any] = {"serverContent": body}
            if event.usage is not None:
                # In the turn's own message, as the service sends it (Pipecat reads it there).
                message["usageMetadata"] = _usage(event.usage)
            return _DUMPS(message)
        if isinstance(event, Usage):
            return _DUMPS({"usageMetadata": _usage(event)})
        if isinstance(event, (SessionStarted, SessionReattached)):
            if isinstance(event, SessionReattached):
                self._resuming = False  # found: what ends it from now on ends a session
            ready = _DUMPS({"setupComplete": {"sessionId": event.session_id}})
            if event.resume_token is None or not self._resumption:
                return ready
            handle = f"{event.session_id}.{event.resume_token}"
            return ready, _DUMPS({"sessionResumptionUpdate": {"newHandle": handle, "resumable": True}})
        if isinstance(event, TextEvent):
            return _content({"modelTurn": {"parts": [{"text": event.text}]}})
        # Transcripts go out as the service sends them: fragments. The whole
        # text the session puts together at a turn's end (final) and its
        # estimate of what was heard of a cut reply are ours, not the
        # service's: a client that joins the fragments would get them twice.
        if isinstance(event, TranscriptOutput):
            if event.final or event.heard or not self._transcribe_output:
                return None
            return _content({"outputTranscription": {"text": event.text}})
        if isinstance(event, TranscriptInput):
            if event.final or not self._transcribe_input:
                return None
            return _content({"inputTranscription": {"text": event.text}})
        if isinstance(event, TurnInterrupted):
            return _content({"interrupted": True})
        if isinstance(event, GenerationComplete):
            return _content({"generationComplete": True})
        if isinstance(event, ToolCallEvent):
            if event.runs_on != "client":
                return None  # the server runs it: the client has nothing to answer
            call = {"id": event.id, "name": event.name, "args": event.args}
            return _DUMPS({"toolCall": {"functionCalls": [call]}})
        if isinstance(event, ToolCancelled):
            return _DUMPS({"toolCallCancellation": {"ids": list(event.ids)}})
        # Our own recovery (session.reconnecting, session.resumed, go-aways),
        # errors the session goes on after, the session's end (the close says
        # it) and what the Live API has no message for: this client hears none.
        return None

    def audio(self, pcm: bytes) -> Sequence[str]:
        data = base64.b64encode(pcm).decode("ascii")
        part = {"inlineData": {"mimeType": f"audio/pcm;rate={OUTPUT_RATE}", "data": data}}
        return (_content({"modelTurn": {"parts": [part]}}),)

    # ------------------------------------------------------------------ the end

    def closing(self, code: int, reason: str, error: ErrorEvent | None) -> tuple[int, str]:
        """The service's close for how the session ended."""
        if error is None:
            return code, reason if code == CLOSE_NORMAL else ""
        if self._resuming and (
            error.code == "session_expired" or (error.code == "unauthorized" and error.message.startswith("session.resume:"))
        ):
            return CLOSE_INVALID, INVALID_HANDLE  # no session for that handle (any more)
        if error.code == "unauthorized":
            if self.credential() is None:
                return CLOSE_POLICY, UNREGISTERED
            return CLOSE_POLICY, BAD_TOKEN if self.constrained else BAD_KEY
        if error.code == "model_not_found":
            return CLOSE_POLICY, error.message
        if error.code == "invalid_argument":
            return CLOSE_INVALID, error.message
        if error.code == "session_expired":
            return CLOSE_NORMAL, error.message
        if code == CLOSE_INTERNAL:
            return CLOSE_INTERNAL, "Internal error encountered."
        return code, error.message


def gemini_doors(allowed_models: Iterable[str] = (), policy: GeminiPolicy | None = None) -> dict[str, type[GeminiLiveDoor]]:
    """The Live API's paths, each with a door that allows these model patterns
    (besides the policy's) and keeps the policy's rules."""
    policy = (policy or GeminiPolicy()).with_models(allowed_models)
    door = type("GeminiLiveDoor", (GeminiLiveDoor,), {"policy": policy, "allowed_models": policy.models})
    return dict.fromkeys(GEMINI_PATHS, door)


# ---------------------------------------------------------------------- helpers


def _one(values: Sequence[str]) -> str | None:
    """A field the client may give once, as given; given several times, all of
    them as one value (as HTTP reads a repeated field), which is no key: the
    service's answer to it is its answer to a wrong key."""
    return ", ".join(values) if values else None


def _message(frame: str | bytes) -> dict[str, Any]:
    """A client frame as the service reads it: one JSON object (binary frames too)."""
    try:
        obj = json.loads(frame)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise invalid("Invalid JSON payload received. Unexpected token.") from None
    if not isinstance(obj, dict):
        raise invalid(INVALID)
    return obj


def _pcm(chunk: Any) -> tuple[bytes, int]:
    """A realtime audio chunk's PCM16 and its rate, as the service reads them."""
    mime = get_field(chunk, "mimeType")
    if not isinstance(mime, str) or not mime.startswith("audio/pcm"):
        raise invalid(f"Unsupported MIME type for realtimeInput.audio: {str(mime)[:60]!r}.")
    rate = rate_of(mime)
    if not MIN_INPUT_RATE <= rate <= MAX_INPUT_RATE:
        raise invalid(f"Unsupported sample rate {rate} for realtimeInput.audio ({MIN_INPUT_RATE} to {MAX_INPUT_RATE} Hz).")
    try:
        pcm = b64decode(get_field(chunk, "data"))
    except ValueError:
        raise invalid("Invalid value at 'realtime_input.audio.data' (TYPE_BYTES), Base64 decoding failed.") from None
    if len(pcm) % 2:
        raise invalid("Audio data must be whole 16-bit samples.")
    return pcm, rate


def _image(blob: Any) -> Image:
    """A camera or screen frame, as the service reads `realtimeInput.video`:
    a JPEG or PNG the session sends the model (within its image limits)."""
    mime = get_field(blob, "mimeType")
    if mime not in IMAGE_TYPES:
        raise invalid(f"Unsupported MIME type for realtimeInput.video: {str(mime)[:60]!r} (send {' or '.join(IMAGE_TYPES)}).")
    try:
        data = b64decode(get_field(blob, "data"))
    except ValueError:
        raise invalid("Invalid value at 'realtime_input.video.data' (TYPE_BYTES), Base64 decoding failed.") from None
    try:
        info = inspect_image(data, mime)
    except InvalidImage as exc:
        raise invalid(f"Invalid image in realtimeInput.video: {exc}.") from None
    return Image(mime_type=mime, data=data, info=info)


def _text(value: Any) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT_CHARS:
        raise invalid(INVALID)
    return value


def _content(body: dict[str, Any]) -> str:
    return _DUMPS({"serverContent": body})


def _usage(usage: Usage) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field, value in (
        ("promptTokenCount", usage.prompt_tokens),
        ("responseTokenCount", usage.response_tokens),
        ("totalTokenCount", usage.total_tokens),
        ("cachedContentTokenCount", usage.cached_tokens),
        ("thoughtsTokenCount", usage.thoughts_tokens),
        ("toolUsePromptTokenCount", usage.tool_use_prompt_tokens),
    ):
        if value is not None:
            out[field] = value
    for kind, modalities in (usage.by_modality or {}).items():
        name = _USAGE_DETAILS.get(kind)
        if name is not None:
            out[name] = [{"modality": m, "tokenCount": n} for m, n in modalities.items()]
    return out
