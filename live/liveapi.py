"""The Live API's wire format, shared by the door that serves Live API apps
(`live.doors.gemini_live`) and the emulator that plays the service
(`connections.emulator`): its paths, how it reads fields and bytes, and its own
words when it refuses. No I/O.

The service accepts each field in camelCase or snake_case (`get_field`), bytes
in standard or URL-safe base64 (`b64decode`), and closes with reasons worded as
below; an app that matches on them sees the same text from either.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

from live.images import InvalidImage, inspect_image

__all__ = [
    "AFFECTIVE_REFUSED",
    "BAD_KEY",
    "BAD_TOKEN",
    "DEADLINE_EXPIRED",
    "DEFAULT_REASONS",
    "ENTITY_NOT_FOUND",
    "EXPLICIT_ACTIVITY",
    "INTERNAL",
    "INVALID",
    "INVALID_HANDLE",
    "INVALID_SESSION_HANDLE",
    "NOT_IMPLEMENTED",
    "PROACTIVE_OFF_REFUSED",
    "SESSION_NOT_FOUND",
    "THINKING_REFUSED",
    "TOP_LEVEL",
    "UNAVAILABLE",
    "UNREGISTERED",
    "UNSUPPORTED_GENERATION",
    "VERTEX_BAD_CREDENTIAL",
    "VERTEX_NO_CREDENTIAL",
    "Handshake",
    "Route",
    "b64decode",
    "check_video",
    "duration_text",
    "generation_refusal",
    "get_field",
    "modalities_refused",
    "not_found",
    "rate_of",
    "route",
    "routes",
    "tools_refusal",
    "unknown_field",
    "vertex_not_found",
]


# --- routes ------------------------------------------------------------------

_PATH = re.compile(
    r"^/+ws/google\.ai\.generativelanguage\.(?P<version>v1(?:alpha|beta)?)"
    r"\.GenerativeService\.(?P<method>BidiGenerateContent(?:Constrained)?)$"
)
# Vertex AI's path for the same protocol (google-genai with vertexai=True).
_VERTEX_PATH = re.compile(
    r"^/+ws/google\.cloud\.aiplatform\.(?P<version>v1(?:beta1)?)\.LlmBidiService/(?P<method>BidiGenerateContent)$"
)

GEMINI_VERSIONS = ("v1", "v1beta", "v1alpha")
VERTEX_VERSIONS = ("v1beta1", "v1")


@dataclasses.dataclass(frozen=True, slots=True)
class Route:
    """Which API version and method a request path asked for, and on which
    backend (`vertex`: Vertex AI's `LlmBidiService`)."""

    api_version: str
    method: str
    vertex: bool = False

    @property
    def constrained(self) -> bool:
        return self.method == "BidiGenerateContentConstrained"

    @property
    def path(self) -> str:
        if self.vertex:
            return f"/ws/google.cloud.aiplatform.{self.api_version}.LlmBidiService/{self.method}"
        return f"/ws/google.ai.generativelanguage.{self.api_version}.GenerativeService.{self.method}"


def route(path: str) -> Route | None:
    """The route of a request path (query ignored), or None for a 404."""
    plain = urlsplit(path).path
    match = _PATH.match(plain)
    if match is not None:
        return Route(match["version"], match["method"])
    match = _VERTEX_PATH.match(plain)
    if match is not None:
        return Route(match["version"], match["method"], vertex=True)
    return None


def routes() -> tuple[Route, ...]:
    """Every route the Live API serves: each version and method, both backends."""
    gemini = tuple(
        Route(version, method)
        for version in GEMINI_VERSIONS
        for method in ("BidiGenerateContent", "BidiGenerateContentConstrained")
    )
    return gemini + tuple(Route(version, "BidiGenerateContent", vertex=True) for version in VERTEX_VERSIONS)


@dataclasses.dataclass(frozen=True, slots=True)
class Handshake:
    """The parts of the HTTP upgrade request the service looks at."""

    path: str
    headers: Mapping[str, str]

    def header(self, name: str) -> str | None:
        lowered = name.lower()
        for key, value in self.headers.items():
            if key.lower() == lowered:
                return value
        return None

    def query(self, name: str) -> str | None:
        values = parse_qs(urlsplit(self.path).query).get(name)
        return values[0] if values else None


# --- fields and bytes -------------------------------------------------------

_SNAKE = re.compile(r"([A-Z])")


def get_field(obj: Any, camel: str, default: Any = None) -> Any:
    """`obj[camel]` or `obj[snake_case(camel)]`: the service accepts both."""
    if not isinstance(obj, Mapping):
        return default
    if camel in obj:
        return obj[camel]
    snake = _SNAKE.sub(lambda m: "_" + m.group(1).lower(), camel)
    return obj.get(snake, default)


def b64decode(text: str) -> bytes:
    """Standard or URL-safe base64, padding optional (as the service accepts)."""
    if not isinstance(text, str):
        raise ValueError("not a string")
    cleaned = text.strip().translate(str.maketrans("-_", "+/"))
    cleaned += "=" * (-len(cleaned) % 4)
    try:
        return base64.b64decode(cleaned, validate=True)
    except binascii.Error as exc:
        raise ValueError(str(exc)) from None


def rate_of(mime: str) -> int:
    match = re.search(r"rate\s*=\s*(\d+)", mime or "")
    return int(match.group(1)) if match else 16_000


def duration_text(seconds: float) -> str:
    return f"{seconds:g}s"


# --- the service's own words ------------------------------------------------

INVALID = "Request contains an invalid argument."
UNREGISTERED = (
    "Method doesn't allow unregistered callers (callers without established identity)."
    " Please use API Key or other form of API consumer identity to call this API."
)
BAD_KEY = "API key not valid. Please pass a valid API key."
BAD_TOKEN = "The ephemeral auth token is invalid or has expired."
# Vertex AI takes Google Cloud credentials (an OAuth 2 access token as
# `Authorization: Bearer`): a request without one, or with one that is wrong or
# expired, is UNAUTHENTICATED ("The request does not have valid authentication
# credentials for the operation": google.rpc.Code), in Google Cloud's words for
# each (as its REST APIs, aiplatform's among them, answer them).
_OAUTH_EXPECTED = (
    "Expected OAuth 2 access token, login cookie or other valid authentication credential."
    " See https://developers.google.com/identity/sign-in/web/devconsole-project."
)
VERTEX_NO_CREDENTIAL = "Request is missing required authentication credential. " + _OAUTH_EXPECTED
VERTEX_BAD_CREDENTIAL = "Request had invalid authentication credentials. " + _OAUTH_EXPECTED
TOP_LEVEL = {
    "setup": "setup",
    "clientContent": "clientContent",
    "client_content": "clientContent",
    "realtimeInput": "realtimeInput",
    "realtime_input": "realtimeInput",
    "toolResponse": "toolResponse",
    "tool_response": "toolResponse",
    "contextUpdate": "contextUpdate",
    "context_update": "contextUpdate",
}
NOT_IMPLEMENTED = "Operation is not implemented, or supported, or enabled."
SESSION_NOT_FOUND = "BidiGenerateContent session not found"
INVALID_HANDLE = "Invalid session resumption handle."
# A malformed handle (field reports: "1007 None. Invalid session handle").
INVALID_SESSION_HANDLE = "Invalid session handle"
# What a model family refuses in setup (1007): the service's words are not
# published; these are the emulator's and the endpoint's both.
THINKING_REFUSED = "thinking_config is not supported by this model."
AFFECTIVE_REFUSED = "enable_affective_dialog is not supported by this model."
PROACTIVE_OFF_REFUSED = "proactive_audio cannot be disabled for this model."
EXPLICIT_ACTIVITY = (
    "Explicit activity control is not supported when automatic activity detection is enabled."
)
ENTITY_NOT_FOUND = "Requested entity was not found."
UNAVAILABLE = "The service is currently unavailable."
DEADLINE_EXPIRED = "Deadline expired before operation could complete."
INTERNAL = "Internal error encountered."
DEFAULT_REASONS = {
    1000: "",
    1007: INVALID,
    1008: "Request violates a policy.",
    1011: INTERNAL,
}


def check_video(blob: Any, where: str) -> tuple[bytes, str, int | None, int | None] | str:
    """A realtime video frame as the service checks it: its bytes, MIME type and
    size (None for a type not read), or why it is refused (a 1007 reason)."""
    mime = str(get_field(blob, "mimeType") or "")
    try:
        data = b64decode(get_field(blob, "data"))
    except ValueError:
        return f"Invalid value at '{where}.data' (TYPE_BYTES), Base64 decoding failed."
    if not mime.startswith(("image/", "video/")):
        return f"Unsupported MIME type for {where}: {mime!r}."
    if mime not in ("image/jpeg", "image/png"):
        return data, mime, None, None
    try:
        info = inspect_image(data, mime)
    except InvalidImage as exc:
        return f"Invalid image at '{where}': {exc}."
    return data, mime, info.width, info.height


def not_found(model: str, version: str) -> str:
    return (
        f"{model} is not found for API version {version}, or is not supported for"
        " bidiGenerateContent. Call ListModels to see the list of available models"
        " and their supported methods."
    )


def vertex_not_found(model: str) -> str:
    """Vertex AI's words for a model it does not serve (its Live close 1008
    quotes them, cut at 123 bytes: google/adk-python#3314)."""
    return (
        f"Publisher Model `{model}` was not found or your project does not have access to it."
        " Please ensure you are using a valid model version. For more information, see:"
        " https://cloud.google.com/vertex-ai/generative-ai/docs/learn/model-versions"
    )


# generationConfig's fields the Live API does not support, whatever the model:
# its reference (BidiGenerateContentSetup.generationConfig) says "The following
# fields are not supported: responseLogprobs, responseMimeType, logprobs,
# responseSchema, stopSequence, routingConfig, audioTimestamp" (and
# responseJsonSchema, the alternative to responseSchema, goes with it). What
# the service answers is not quoted anywhere: its generic 1007, the strictest
# reading.
UNSUPPORTED_GENERATION = (
    "responseLogprobs", "responseMimeType", "logprobs", "responseSchema",
    "responseJsonSchema", "stopSequences", "routingConfig", "audioTimestamp",
)


def generation_refusal(generation: Any) -> str | None:
    """The service's 1007 reason for a `generationConfig` the Live API refuses
    on every model, or None: a field it does not support (above), more than
    one response modality ("only one response modality can be set", a
    google-genai maintainer in googleapis/js-genai#382; googleapis/go-genai#490
    quotes the close for AUDIO and TEXT on gemini-live-2.5-flash-preview: 1007
    "Request contains an invalid argument."), or several speakers' voices
    (`speechConfig.multiSpeakerVoiceConfig`: "multi_speaker_voice_config is not
    supported in the live API", google-genai's `t_live_speech_config`, which
    will not send it; the close is not quoted anywhere: the generic 1007, the
    strictest reading)."""
    if not isinstance(generation or {}, Mapping):
        return INVALID
    if any(get_field(generation, name) is not None for name in UNSUPPORTED_GENERATION):
        return INVALID
    speech = get_field(generation, "speechConfig")
    if speech is not None and (
        not isinstance(speech, Mapping) or get_field(speech, "multiSpeakerVoiceConfig") is not None
    ):
        return INVALID
    modalities = get_field(generation, "responseModalities")
    if isinstance(modalities, list) and len(modalities) > 1:
        return INVALID
    return None


def tools_refusal(tools: Any, carried: frozenset[str] | None) -> str | None:
    """The service's 1007 reason for a `tools` list that declares a tool the
    service runs itself (Search, code execution, URL context, Maps, ...) which
    the model's family does not carry (`carried`, snake_case `Tool` field
    names; None: any), or None. Function declarations go to every model. Which
    kinds each family carries is `live.families`'; what the service answers
    for another is not quoted anywhere: its generic 1007, the strictest reading."""
    if carried is None or not isinstance(tools, list):
        return None
    for tool in tools:
        if not isinstance(tool, Mapping):
            continue
        for key, value in tool.items():
            name = _SNAKE.sub(lambda m: "_" + m.group(1).lower(), str(key))
            if name != "function_declarations" and value is not None and name not in carried:
                return INVALID
    return None


def modalities_refused(asked: list[str], model: str, accepted: tuple[str, ...]) -> str:
    """The service's 1007 reason for response modalities its model does not speak
    (field reports: a native-audio model asked for TEXT, a transcription model for AUDIO)."""
    return (
        f"The requested combination of response modalities ({', '.join(asked)}) is not supported"
        f" by the model. {model} accepts the following combination of response modalities:\n"
        + "\n".join(f"* {modality}" for modality in accepted)
    )


# --- the messages' fields ----------------------------------------------------

# What each client message may hold, as google-genai's own types describe it
# (the service's proto JSON: each field in camelCase or snake_case), and where
# the two backends differ. The service refuses a name it does not know with
# 1007 `Invalid JSON payload received. Unknown name "X" at 'path': Cannot find
# field.` (the path in snake_case, as field reports show).
_MESSAGES: dict[str, Any] = {}


def _message_types() -> dict[str, Any]:
    if not _MESSAGES:
        from google.genai import types

        _MESSAGES.update(
            setup=types.LiveClientSetup,
            realtime_input=types.LiveClientRealtimeInput,
            client_content=types.LiveClientContent,
            tool_response=types.LiveClientToolResponse,
            context_update=types.LiveClientContextUpdate,
        )
        # Fields the service's setup has that google-genai's type leaves out,
        # and lists google-genai types loosely (a validator makes the Tools).
        _EXTRA["setup"] = {"realtime_input_config": types.RealtimeInputConfig}
        # Vertex AI's name for google-genai's `model_selection_config` (its
        # converter writes `modelConfig`; pydantic keeps that name for itself).
        _EXTRA["setup.generation_config"] = {"model_config": types.ModelSelectionConfig}
        _OVERRIDES.update({"setup.tools": ("list", types.Tool), "context_update.tools.tools": ("list", types.Tool)})
    return _MESSAGES


_EXTRA: dict[str, dict[str, Any]] = {}
_OVERRIDES: dict[str, tuple[str, Any]] = {}
# Fields only one backend has (google-genai's converters raise for the other):
# on the other, an unknown name. `proactivity` and affective dialog are the
# Gemini API's v1alpha only ("set the api version to v1alpha"; on v1beta the
# service refuses `proactivity` as an unknown name: field reports).
_VERTEX_ONLY = frozenset(
    {
        "setup.explicit_vad_signal",
        "setup.session_resumption.transparent",
        "setup.generation_config.audio_transcription_config",
        # "model_selection_config parameter is only supported in Gemini
        # Enterprise Agent Platform mode" (google-genai's generateContent
        # converter), where it is written `modelConfig`; ResponseFormat: "This
        # data type is not supported in Gemini API"; HarmBlockMethod: "This
        # enum is not supported in Gemini API".
        "setup.generation_config.model_config",
        "setup.generation_config.response_format",
        "setup.safety_settings.method",
        "setup.tools.retrieval",
        "setup.tools.enterprise_web_search",
        "setup.tools.parallel_ai_search",
        "setup.tools.exa_ai_search",
        "context_update.tools.tools.retrieval",
        "context_update.tools.tools.enterprise_web_search",
        "context_update.tools.tools.parallel_ai_search",
        "context_update.tools.tools.exa_ai_search",
    }
)
_GEMINI_ONLY = frozenset(
    {
        "setup.tools.file_search",
        "setup.history_config",
        # A cloned voice's consent, and a result part's media processing.
        "setup.generation_config.speech_config.voice_config.replicated_voice_config.consent_audio",
        "setup.generation_config.speech_config.voice_config.replicated_voice_config.voice_consent_signature",
        "tool_response.function_responses.parts.media_processing",
        # "enable_enhanced_civic_answers parameter is only supported in Gemini
        # Developer API mode" (google-genai's Vertex AI converter).
        "setup.generation_config.enable_enhanced_civic_answers",
    }
)
# google-genai's names that neither backend's wire has: `model_selection_config`
# is `modelConfig` on Vertex AI's and absent from the Gemini API's.
_NOWHERE = frozenset({"setup.generation_config.model_selection_config"})
_ALPHA_ONLY = frozenset({"setup.proactivity", "setup.generation_config.enable_affective_dialog"})


def unknown_field(kind: str, body: Any, route: Route | None = None) -> str | None:
    """The service's 1007 reason for the first field of a client message
    (`kind`: setup, realtime_input, client_content, tool_response,
    context_update) it does not know on this route, or None."""
    model = _message_types().get(kind)
    if model is None or not isinstance(body, Mapping):
        return None
    return _unknown(model, body, kind, kind, route or Route("v1beta", "BidiGenerateContent"))


def _unknown(model: Any, body: Mapping[str, Any], path: str, where: str, route: Route) -> str | None:
    import typing

    fields = dict(model.model_fields)
    names = {**{name: fields[name].annotation for name in fields}, **_EXTRA.get(where, {})}
    for key, value in body.items():
        name = _SNAKE.sub(lambda m: "_" + m.group(1).lower(), key) if isinstance(key, str) else ""
        field = f"{where}.{name}"
        if (
            name not in names
            or field in _NOWHERE
            or (field in _VERTEX_ONLY and not route.vertex)
            or (field in _GEMINI_ONLY and route.vertex)
            or (field in _ALPHA_ONLY and (route.vertex or route.api_version != "v1alpha"))
        ):
            return f'Invalid JSON payload received. Unknown name "{str(key)[:60]}" at \'{path}\': Cannot find field.'
        annotation = names[name]
        override = _OVERRIDES.get(field)
        for arg in (annotation, *typing.get_args(annotation)):
            inner = override or _model_in(arg)
            if inner is None:
                continue
            kind, sub = inner
            if kind == "one" and isinstance(value, Mapping):
                found = _unknown(sub, value, f"{path}.{name}", field, route)
            elif kind == "list" and isinstance(value, list):
                found = next(
                    (
                        reason
                        for i, item in enumerate(value)
                        if isinstance(item, Mapping)
                        and (reason := _unknown(sub, item, f"{path}.{name}[{i}]", field, route))
                    ),
                    None,
                )
            elif kind == "map" and isinstance(value, Mapping):
                found = next(
                    (
                        reason
                        for k, item in value.items()
                        if isinstance(item, Mapping)
                        and (reason := _unknown(sub, item, f"{path}.{name}[{k}]", field, route))
                    ),
                    None,
                )
            else:
                found = None
            if found:
                return found
            break
    return None


def _model_in(annotation: Any) -> tuple[str, Any] | None:
    """A message type an annotation holds: one, a list of them, or a map to them."""
    import typing

    import pydantic

    def is_model(value: Any) -> bool:
        return isinstance(value, type) and issubclass(value, pydantic.BaseModel)

    if is_model(annotation):
        return "one", annotation
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is list and args and is_model(args[0]):
        return "list", args[0]
    if origin is dict and len(args) == 2 and is_model(args[1]):
        return "map", args[1]
    return None
