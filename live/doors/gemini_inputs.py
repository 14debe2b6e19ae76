"""What a Live API app's messages mean to its session, read as the service reads them.

`LiveApiInputs` reads one app's `realtimeInput`, `clientContent`,
`toolResponse` and `contextUpdate` (after its `setup`) into session inputs,
and refuses what the service refuses, in its words: a field it does not know,
activity signals while the model's own detection is on, what the family of
the model the session runs refuses (client content after the initial
history on 3.1, `mediaChunks` on 3.1, `contextUpdate` before 3.8). While an
app seeds its initial history (`historyConfig`), only its client content is
taken, as the service takes it. It holds one connection's state (the
resampler of its audio, whether its history is seeded); no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pydantic
import soxr
from google.genai import types

from live.doors.base import Input
from live.doors.gemini_policy import GeminiPolicy
from live.doors.gemini_setup import app_tools, invalid, repeated, tool_kinds_refusal
from live.families import ModelFamily
from live.images import IMAGE_TYPES, InvalidImage, inspect_image
from live.liveapi import (
    EXPLICIT_ACTIVITY,
    INVALID,
    Route,
    b64decode,
    get_field,
    rate_of,
    tools_refusal,
    unknown_field,
)
from live.protocol import (
    DEFAULT_INPUT_RATE,
    ActivityEnd,
    ActivityStart,
    AudioEnd,
    ClientContent,
    ContextUpdate,
    Image,
    Text,
    ToolResult,
)

__all__ = ["MAX_AUDIO_RATE", "MIN_AUDIO_RATE", "LiveApiInputs"]

# The rates realtime audio may declare ("the Live API will resample if needed
# so any sample rate can be sent"): below 8 kHz a message would grow past
# twice its size when resampled, so that bound is ours (documented).
MIN_AUDIO_RATE = 8_000
MAX_AUDIO_RATE = 192_000


class LiveApiInputs:
    """One app's messages after its setup, as session inputs (see the module docstring)."""

    def __init__(
        self,
        route: Route,
        family: ModelFamily,
        policy: GeminiPolicy,
        *,
        manual: bool,
        seeding: bool,
    ) -> None:
        self.route = route
        self.family = family
        self.policy = policy
        self.manual = manual  # the app marks its own turns (automatic detection off)
        self.seeding = seeding  # its initial history is still coming (historyConfig)
        # The calls sent to the app and not yet answered, id -> name, oldest
        # first (kept by the door as it writes them).
        self.calls: dict[str, str] = {}
        # Audio at another rate than the session's, resampled as it comes:
        # the rate and its stream (soxr keeps a little of each chunk for the next).
        self._resampler: tuple[int, soxr.ResampleStream] | None = None

    def read(self, kind: str, body: Any) -> list[Input]:
        """The inputs of one message (`kind`: the top-level field, camelCase)."""
        if not isinstance(body, Mapping):
            raise invalid(INVALID)
        wire = {"realtimeInput": "realtime_input", "clientContent": "client_content",
                "toolResponse": "tool_response", "contextUpdate": "context_update"}[kind]
        unknown = unknown_field(wire, body, self.route)
        if unknown is not None:
            raise invalid(unknown)
        if kind == "realtimeInput":
            return self.realtime(body)
        if kind == "clientContent":
            return self.client_content(body)
        if kind == "toolResponse":
            return self.tool_response(body)
        return self.context_update(body)

    # ------------------------------------------------------------------ realtimeInput

    def realtime(self, body: Mapping[str, Any]) -> list[Input]:
        if self.seeding:
            return []  # "the server will wait and at first process client_content messages"
        out: list[Input] = []
        chunks = repeated(get_field(body, "mediaChunks"))
        if chunks and not self.family.media_chunks:
            raise invalid(INVALID)  # 3.1 closes with 1007 on the deprecated field
        # "Multiple `media_chunks` are not supported, all but the first will be
        # ignored" (BidiGenerateContentRealtimeInput): the rest are read as
        # the message's bytes, never heard.
        for i, ignored in enumerate(chunks[1:], 1):
            if not isinstance(ignored, Mapping):
                raise invalid(INVALID)
            try:
                b64decode(get_field(ignored, "data", ""))
            except ValueError:
                raise invalid(
                    f"Invalid value at 'realtime_input.media_chunks[{i}].data' (TYPE_BYTES), Base64 decoding failed."
                ) from None
        chunks = chunks[:1]
        audio = get_field(body, "audio")
        if audio is not None:
            chunks.append(audio)
        for chunk in chunks:
            mime = get_field(chunk, "mimeType")
            # mediaChunks carried video frames too, before `video` had a field of its own.
            out.append(image(chunk) if isinstance(mime, str) and mime.startswith("image/") else self.audio(chunk))
        video = get_field(body, "video")
        if video is not None:
            out.append(image(video))
        text = get_field(body, "text")
        if text is not None:
            if not isinstance(text, str):
                raise invalid(INVALID)
            out.append(Text(text, realtime=True))
        for field, signal in (("activityStart", ActivityStart()), ("activityEnd", ActivityEnd())):
            if get_field(body, field) is not None:
                if not self.manual:
                    raise invalid(EXPLICIT_ACTIVITY)
                out.append(signal)
        if get_field(body, "audioStreamEnd"):
            if self._resampler is not None:  # what the resampler still holds, first
                _, stream = self._resampler
                out.append(stream.resample_chunk(np.zeros(0, "<i2"), last=True).astype("<i2").tobytes())
                self._resampler = None
            out.append(AudioEnd())
        return out

    def audio(self, chunk: Any) -> bytes:
        """A chunk's audio at the session's rate (16 kHz), whatever rate it declares."""
        pcm, rate = _pcm(chunk)
        if rate == DEFAULT_INPUT_RATE:
            return pcm
        if self._resampler is None or self._resampler[0] != rate:
            self._resampler = (rate, soxr.ResampleStream(rate, DEFAULT_INPUT_RATE, 1, dtype="int16"))
        samples = np.frombuffer(pcm, "<i2")
        return self._resampler[1].resample_chunk(samples).astype("<i2").tobytes()

    # ------------------------------------------------------------------ clientContent

    def client_content(self, body: Mapping[str, Any]) -> list[Input]:
        """Turns of either role with any parts, appended to the conversation;
        `turnComplete` true: the model answers what it now has."""
        turns = []
        for turn in repeated(get_field(body, "turns")):
            if not isinstance(turn, Mapping):
                raise invalid(INVALID)
            try:
                content = types.Content.model_validate(dict(turn))
            except pydantic.ValidationError:
                raise invalid(INVALID) from None
            if (content.role or "user") not in ("user", "model"):
                raise invalid(INVALID)
            if content.role is None:
                content = content.model_copy(update={"role": "user"})
            turns.append(content)
        complete = get_field(body, "turnComplete") is True
        if self.seeding:
            if complete:
                self.seeding = False  # the initial history is whole: other input is taken from now
            return [ClientContent(tuple(turns), complete, initial=True)]
        if not self.family.client_content_mid_session:
            # "send_client_content is only supported for seeding initial context
            # history ... After the first model turn, use send_realtime_input"
            raise invalid(INVALID)
        return [ClientContent(tuple(turns), complete)]

    # ------------------------------------------------------------------ toolResponse

    def tool_response(self, body: Mapping[str, Any]) -> list[Input]:
        out: list[Input] = []
        for response in repeated(get_field(body, "functionResponses")):
            if not isinstance(response, Mapping):
                raise invalid(INVALID)
            call_id = get_field(response, "id")
            name = get_field(response, "name")
            result = get_field(response, "response")
            scheduling = get_field(response, "scheduling")
            will_continue = get_field(response, "willContinue")
            if (call_id is None or call_id == "") and self.route.vertex and isinstance(name, str):
                # Vertex AI takes a response without its call's id (google-genai
                # sends one there): the oldest call of that name it answers.
                call_id = next((i for i, n in self.calls.items() if n == name), None)
            if not isinstance(call_id, str) or not call_id:
                raise invalid(INVALID)  # nothing to pair it with
            if result is None:
                result = {}
            if (
                not isinstance(result, Mapping)
                or not isinstance(name, (str, type(None)))
                or not isinstance(will_continue, (bool, type(None)))
                or scheduling not in (None, *(s.value for s in types.FunctionResponseScheduling))
            ):
                raise invalid(INVALID)
            parts = tuple(repeated(get_field(response, "parts")))
            try:
                for part in parts:
                    types.FunctionResponsePart.model_validate(part)
            except pydantic.ValidationError:
                raise invalid(INVALID) from None
            if not will_continue:
                self.calls.pop(call_id, None)
            out.append(
                ToolResult(
                    id=call_id,
                    name=name or "",
                    response=dict(result),
                    scheduling=scheduling,
                    will_continue=will_continue,
                    parts=parts,
                )
            )
        return out

    # ------------------------------------------------------------------ contextUpdate

    def context_update(self, body: Mapping[str, Any]) -> list[Input]:
        """A new system instruction or new tools, on a family that takes them."""
        if not self.family.context_update:
            raise invalid('Invalid JSON payload received. Unknown name "contextUpdate": Cannot find field.')
        tools = get_field(get_field(body, "tools"), "tools")
        refused = (tool_kinds_refusal(tools) if self.route.vertex else None) or tools_refusal(
            tools, self.family.service_tools
        )
        if refused is not None:
            raise invalid(refused)
        fields: dict[str, Any] = {}
        try:
            instruction = get_field(body, "systemInstruction")
            if instruction is not None:
                if isinstance(instruction, str):
                    instruction = {"parts": [{"text": instruction}]}
                own = types.Content.model_validate(instruction)
                said = "".join(part.text or "" for part in own.parts or ())
                joined = "\n\n".join(t for t in (self.policy.instruction, said) if t)
                fields["system_instruction"] = types.Content(role="user", parts=[types.Part(text=joined)])
            tools = get_field(body, "tools")
            if tools is not None:
                fields["tools"] = app_tools(get_field(tools, "tools"), self.policy)
            config = types.LiveConnectConfig(**fields)
        except (pydantic.ValidationError, ValueError, TypeError, AttributeError):
            raise invalid(INVALID) from None
        return [ContextUpdate(config)] if fields else []


def _pcm(chunk: Any) -> tuple[bytes, int]:
    """A realtime audio chunk's PCM16 and its rate, as the service reads them."""
    mime = get_field(chunk, "mimeType")
    if not isinstance(mime, str) or not mime.startswith("audio/pcm"):
        raise invalid(f"Unsupported MIME type for realtimeInput.audio: {str(mime)[:60]!r}.")
    rate = rate_of(mime)
    if not MIN_AUDIO_RATE <= rate <= MAX_AUDIO_RATE:
        raise invalid(f"Unsupported sample rate {rate} for realtimeInput.audio ({MIN_AUDIO_RATE} to {MAX_AUDIO_RATE} Hz).")
    try:
        pcm = b64decode(get_field(chunk, "data"))
    except ValueError:
        raise invalid("Invalid value at 'realtime_input.audio.data' (TYPE_BYTES), Base64 decoding failed.") from None
    if len(pcm) % 2:
        raise invalid("Audio data must be whole 16-bit samples.")
    return pcm, rate


def image(blob: Any) -> Image:
    """A camera or screen frame, as the service reads `realtimeInput.video`:
    a JPEG or PNG the session sends the model (within its image limits), with
    its `displayName` (google-genai: the model reads it when server-side tools
    are on)."""
    mime = get_field(blob, "mimeType")
    name = get_field(blob, "displayName")
    if name is not None and not isinstance(name, str):
        raise invalid(INVALID)
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
    return Image(mime_type=mime, data=data, info=info, display_name=name)
