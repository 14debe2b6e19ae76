"""A session's events as the Live API's service writes them to an app.

`LiveApiEvents` writes one app's server messages: `setupComplete`,
`serverContent` (the reply's audio, text, thoughts, code and its results,
files; transcription fragments; `interrupted`, `generationComplete`,
`turnComplete` with its reason, usage and interaction status; grounding, URL
context, interim transcripts, `waitingForInput`), `toolCall`,
`toolCallCancellation`, `usageMetadata`, `voiceActivity`,
`sessionResumptionUpdate`. What the session says of its own recovery, and
what the Live API has no message for, the app never hears. Vertex AI's apps
read usage under Vertex AI's names, and, when they ask for them
(`explicitVadSignal`), get Vertex AI's `voiceActivityDetectionSignal` as the
model's own detection hears the user start and stop. One connection's state;
no I/O.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from google.genai import types

from live.protocol import (
    OUTPUT_RATE,
    CodeEvent,
    CodeResultEvent,
    DataEvent,
    GenerationComplete,
    Grounding,
    ModelSignal,
    ResumptionPoint,
    ServerEvent,
    SessionReattached,
    SessionStarted,
    TextEvent,
    ToolCallEvent,
    ToolCancelled,
    TranscriptInput,
    TranscriptOutput,
    TurnComplete,
    TurnInterrupted,
    Usage,
)

__all__ = ["LiveApiEvents", "dumps"]

dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode

_TURN_COMPLETE_REASONS = frozenset(reason.value for reason in types.TurnCompleteReason)
_INTERACTION = frozenset(status.value for status in types.InteractionStatus) - {"INTERACTION_STATUS_UNSPECIFIED"}

# The model's voice activity as Vertex AI's VAD signal says it (`explicitVadSignal`).
_VAD_SIGNALS = {"ACTIVITY_START": "VAD_SIGNAL_TYPE_SOS", "ACTIVITY_END": "VAD_SIGNAL_TYPE_EOS"}

# Our usage kinds, as the service names its per-modality details (Gemini API, Vertex AI).
_DETAILS = {
    "prompt": ("promptTokensDetails", "promptTokensDetails"),
    "response": ("responseTokensDetails", "candidatesTokensDetails"),
    "cached": ("cacheTokensDetails", "cacheTokensDetails"),
    "tool_use_prompt": ("toolUsePromptTokensDetails", "toolUsePromptTokensDetails"),
}


class LiveApiEvents:
    """One app's server messages (see the module docstring)."""

    def __init__(self, *, vertex: bool = False, calls: dict[str, str] | None = None) -> None:
        self.vertex = vertex
        # Which transcriptions the app asked for: it gets those only.
        self.transcribe_input = False
        self.transcribe_output = False
        # The app asked for session resumption: it gets handles as the session goes.
        self.resumption = False
        # A Vertex AI app asked for `explicitVadSignal`: the start and the end of
        # the user's speech as `voiceActivityDetectionSignal` too.
        self.vad_signal = False
        self.session_id = ""
        # The calls sent to the app and not yet answered (shared with its reader).
        self.calls: dict[str, str] = {} if calls is None else calls
        self._generated = False  # the reply in progress was generated whole

    def event(self, event: ServerEvent) -> str | tuple[str, ...] | None:
        kind = type(event)
        if kind is TranscriptOutput:
            # Fragments, as the service sends them, and a fragment the model
            # marked finished itself as it came. The whole text the session
            # puts together at a turn's end (final) and its estimate of what
            # was heard of a cut reply are ours: a client that joins the
            # fragments would get them twice.
            if event.heard or not self.transcribe_output:  # type: ignore[union-attr]
                return None
            return _transcription("outputTranscription", event)  # type: ignore[arg-type]
        if kind is TranscriptInput:
            if not self.transcribe_input:
                return None
            return _transcription("inputTranscription", event)  # type: ignore[arg-type]
        if kind is TurnComplete:
            return self._turn_complete(event)  # type: ignore[arg-type]
        if kind is TextEvent:
            part: dict[str, Any] = {"text": event.text}  # type: ignore[union-attr]
            if event.thought:  # type: ignore[union-attr]
                part["thought"] = True
            return _parts(part)
        if kind is GenerationComplete:
            self._generated = True
            return _content({"generationComplete": True})
        if kind is TurnInterrupted:
            return _content({"interrupted": True})
        if kind is Usage:
            return dumps({"usageMetadata": self.usage(event)})  # type: ignore[arg-type]
        if kind is ToolCallEvent:
            if event.runs_on != "client":  # type: ignore[union-attr]
                return None  # the server runs it: the app has nothing to answer
            self.calls[event.id] = event.name  # type: ignore[union-attr]
            call = {"id": event.id, "name": event.name, "args": event.args}  # type: ignore[union-attr]
            return dumps({"toolCall": {"functionCalls": [call]}})
        if kind is ToolCancelled:
            ids = [i for i in event.ids if self.calls.pop(i, None) is not None]  # type: ignore[union-attr]
            return dumps({"toolCallCancellation": {"ids": ids}}) if ids else None
        if kind is ModelSignal:
            return self._signal(event.fields)  # type: ignore[union-attr]
        if kind is ResumptionPoint:
            return self._resumption_update(event.resume_token)  # type: ignore[union-attr]
        if kind is Grounding:
            metadata = types.GroundingMetadata.model_validate(event.metadata)  # type: ignore[union-attr]
            return _content({"groundingMetadata": _wire(metadata)})
        if kind is CodeEvent:
            code: dict[str, Any] = {"code": event.code}  # type: ignore[union-attr]
            if event.language is not None:  # type: ignore[union-attr]
                code["language"] = event.language  # type: ignore[union-attr]
            return _parts({"executableCode": code})
        if kind is CodeResultEvent:
            result: dict[str, Any] = {"output": event.output}  # type: ignore[union-attr]
            if event.outcome is not None:  # type: ignore[union-attr]
                result["outcome"] = event.outcome  # type: ignore[union-attr]
            return _parts({"codeExecutionResult": result})
        if kind is DataEvent:
            return _parts({"inlineData": {"mimeType": event.mime_type, "data": event.data}})  # type: ignore[union-attr]
        if kind is SessionStarted or kind is SessionReattached:
            self.session_id = event.session_id  # type: ignore[union-attr]
            complete: dict[str, Any] = {"sessionId": event.session_id}  # type: ignore[union-attr]
            signature = getattr(event, "voice_consent_signature", None)  # a reattach has none: H38
            if signature is not None:
                complete["voiceConsentSignature"] = {"signature": signature}
            ready = dumps({"setupComplete": complete})
            token = event.resume_token  # type: ignore[union-attr]
            if token is None or not self.resumption:
                return ready
            return ready, self._resumption_update(token)
        # Our own recovery (session.reconnecting, session.resumed, go-aways),
        # errors the session goes on after, the session's end (the close says
        # it) and what the Live API has no message for: this app hears none.
        return None

    def audio(self, pcm: bytes) -> tuple[str, ...]:
        data = base64.b64encode(pcm).decode("ascii")
        return (_parts({"inlineData": {"mimeType": f"audio/pcm;rate={OUTPUT_RATE}", "data": data}}),)

    def _turn_complete(self, event: TurnComplete) -> str | tuple[str, ...]:
        generated, self._generated = self._generated, False
        body: dict[str, Any] = {"turnComplete": True}
        if event.reason in _TURN_COMPLETE_REASONS:
            body["turnCompleteReason"] = event.reason  # the service's; never one of ours
        if event.interaction in _INTERACTION:
            body["interactionStatus"] = event.interaction
        message: dict[str, Any] = {"serverContent": body}
        if event.usage is not None:
            # In the turn's own message, as the service sends it (Pipecat reads it there).
            message["usageMetadata"] = self.usage(event.usage)
        if event.reason == "connection_lost" and not generated:
            # A reply cut short by a drop upstream (the server's, never seen by
            # the app): what the service sends for a cut reply, interrupted and
            # then the turn's end. Nothing of it follows, and it is not asked again.
            return _content({"interrupted": True}), dumps(message)
        return dumps(message)

    def _signal(self, fields: dict[str, Any]) -> str | tuple[str, ...] | None:
        content: dict[str, Any] = {}
        message: dict[str, Any] = {}
        vad: str | None = None
        for name, value in fields.items():
            if name == "voice_activity":
                activity = _wire(value)
                if "voiceActivityType" in activity:  # the wire's name for it is `type`
                    activity["type"] = activity.pop("voiceActivityType")
                message["voiceActivity"] = activity
                kind = _VAD_SIGNALS.get(activity.get("type", ""))
                if self.vad_signal and kind is not None:
                    # Its own message: the server message holds one kind of message.
                    vad = dumps({"voiceActivityDetectionSignal": {"vadSignalType": kind}})
            elif name == "waiting_for_input":
                content["waitingForInput"] = True
            elif name == "url_context_metadata":
                content["urlContextMetadata"] = _wire(value)
            elif name == "interim_input_transcription" and self.transcribe_input:
                # A transcription as the others are: for an app that asked for them.
                content["interimInputTranscription"] = _wire(value)
        if content:
            message["serverContent"] = content
        if vad is not None:
            return dumps(message), vad
        return dumps(message) if message else None

    def _resumption_update(self, token: str | None) -> str | None:
        if not self.resumption:
            return None
        if token is None:
            # Busy (generating, or a call unanswered): no handle now, as the service says it.
            return dumps({"sessionResumptionUpdate": {"resumable": False}})
        handle = f"{self.session_id}.{token}"
        return dumps({"sessionResumptionUpdate": {"newHandle": handle, "resumable": True}})

    def usage(self, usage: Usage) -> dict[str, Any]:
        out: dict[str, Any] = {}
        response = "candidatesTokenCount" if self.vertex else "responseTokenCount"
        for field, value in (
            ("promptTokenCount", usage.prompt_tokens),
            (response, usage.response_tokens),
            ("totalTokenCount", usage.total_tokens),
            ("cachedContentTokenCount", usage.cached_tokens),
            ("thoughtsTokenCount", usage.thoughts_tokens),
            ("toolUsePromptTokenCount", usage.tool_use_prompt_tokens),
        ):
            if value is not None:
                out[field] = value
        for kind, modalities in (usage.by_modality or {}).items():
            names = _DETAILS.get(kind)
            if names is not None:
                out[names[self.vertex]] = [{"modality": m, "tokenCount": n} for m, n in modalities.items()]
        if usage.service_tier is not None and not self.vertex:
            out["serviceTier"] = usage.service_tier  # the Gemini API's field, not Vertex AI's
        return out


def _transcription(field: str, event: TranscriptInput | TranscriptOutput) -> str | None:
    """A transcription fragment as the service sent it: the fragments, and the
    one it marked `finished` (never a final put together here)."""
    other = event.fields or {}
    if not event.final:
        return _content({field: {"text": event.text, **other}})
    if event.fragment is None:
        return None
    return _content({field: {"text": event.fragment, "finished": True, **other}})


def _content(body: dict[str, Any]) -> str:
    return dumps({"serverContent": body})


def _parts(*parts: dict[str, Any]) -> str:
    # The model's content, with its producer named as a Content names it
    # ("Must be either 'user' or 'model'"): an app may append it to a history as is.
    return dumps({"serverContent": {"modelTurn": {"role": "model", "parts": list(parts)}}})


def _wire(value: Any) -> dict[str, Any]:
    """A google-genai object as the service writes it (camelCase, nothing unset)."""
    return value.model_dump(mode="json", by_alias=True, exclude_none=True)
