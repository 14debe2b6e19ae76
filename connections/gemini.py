"""Gemini Live behind the live contract: `Gemini` opens, `GeminiLlmConnection` talks.

Backend choice is explicit, never an accident of the environment (the ADK
"Vertex trap": a client with a project but no Vertex flag works only where
GOOGLE_GENAI_USE_VERTEXAI happens to be exported). In order of precedence:

1. `client=`: a `genai.Client` you built; used as is.
2. `api_key=` or, failing that, GOOGLE_API_KEY / GEMINI_API_KEY: the Gemini API,
   with `vertexai=False` passed explicitly.
3. `vertex=VertexConfig(project, location, credentials)`: Vertex AI, with
   `vertexai=True` passed explicitly.
4. `transport=` alone: no client at all; every connection goes to the transport.

Anything else is a `ConfigurationError` at construction, so a registry's
`resolve_all` fails at boot, not on the first call. A client we build always
has a request timeout, takes GOOGLE_GEMINI_BASE_URL and
GOOGLE_GENAI_API_VERSION (default `v1beta`, the version the Live docs name),
and trusts SSL_CERT_FILE. One client per `Gemini` instance serves every
session (a client costs about 1.8 MiB and 0.1 s of CPU).

The transport seam (ADK Java's `connectLiveTransport`): `transport=` or an
override of `Gemini.open_transport(model, config)` returns an async context
manager yielding a `LiveSession`, the SDK's `AsyncSession` surface. With one
injected, the real connection code below runs unchanged; `connections.double`
is such a transport, for tests.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import ssl
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, TypeAlias

import anyio
import websockets
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from connections.gemini_wire import LeanSession, lean_session
from connections.live_socket import dialing
from connections.gemini_mapping import (
    ServerMessageMapper,
    function_responses_of,
    history_in_client_content,
    history_plan,
    is_gemini3,
    prepare_connect_config,
    realtime_kwargs,
    text_of,
)
from live.errors import (
    ConfigurationError,
    ConnectionClosedError,
    InvalidArgumentError,
    LiveError,
    ModelUnavailableError,
    QuotaExhaustedError,
    RecoverableConnectionError,
    UnreachableError,
)
from live.families import family_of
from live.llm import BaseLlm, BaseLlmConnection, LlmRequest, LlmResponse, RealtimeInput

if TYPE_CHECKING:
    import google.auth.credentials

    from live.backends import Backend

__all__ = [
    "DEFAULT_API_VERSION",
    "Gemini",
    "GeminiLlmConnection",
    "LiveSession",
    "LiveTransport",
    "VertexConfig",
    "error_for_close",
]

logger = logging.getLogger(__name__)

DEFAULT_API_VERSION: Final = "v1beta"
"""The API version the Live API documentation names (the SDK's own default is v1)."""

DEFAULT_REQUEST_TIMEOUT: Final = 60.0
DEFAULT_CONNECT_TIMEOUT: Final = 15.0
_CLOSE_TIMEOUT: Final = 5.0


class LiveSession(Protocol):
    """What a live connection needs from a session: google-genai's `AsyncSession` surface.

    `receive()` yields server messages up to the end of a turn and then stops,
    like the SDK's; an iteration that yields nothing means the session ended.
    A closed socket surfaces as `google.genai.errors.APIError` from `receive()`
    (whatever the close code, 1000 included) and as `websockets.ConnectionClosed`
    from the sends.
    """

    async def send_realtime_input(
        self,
        *,
        audio: types.Blob | None = None,
        audio_stream_end: bool | None = None,
        video: types.Blob | None = None,
        text: str | None = None,
        activity_start: types.ActivityStart | None = None,
        activity_end: types.ActivityEnd | None = None,
    ) -> None: ...

    async def send_client_content(
        self,
        *,
        turns: types.Content | list[types.Content] | None = None,
        turn_complete: bool = True,
    ) -> None: ...

    async def send_tool_response(
        self,
        *,
        function_responses: types.FunctionResponse | Sequence[types.FunctionResponse],
    ) -> None: ...

    def receive(self) -> AsyncIterator[types.LiveServerMessage]: ...

    async def close(self) -> None: ...

    # Optional: `send_audio_nowait(audio: Blob) -> bool` sends one audio chunk
    # at once when its socket takes it without waiting, and says whether it did
    # (the lean wire path and the transport double have it; the SDK does not).


LiveTransport: TypeAlias = Callable[
    [str, types.LiveConnectConfig], AbstractAsyncContextManager[LiveSession]
]
"""Opens one session: `transport(model, config)` is an async context manager
yielding a `LiveSession`; leaving it closes the session."""


@dataclasses.dataclass(frozen=True, slots=True)
class VertexConfig:
    """Vertex AI, chosen explicitly: project, location and (optionally) credentials.

    `credentials=None` uses Application Default Credentials.
    """

    project: str
    location: str
    credentials: google.auth.credentials.Credentials | None = None


# ---------------------------------------------------------------------------
# Close codes and failures to typed errors
# ---------------------------------------------------------------------------

_QUOTA_MARKERS: Final = ("resource_exhausted", "resource exhausted", "quota", "rate limit")
_KEY_MARKERS: Final = ("api key", "api_key", "unauthenticated", "permission denied")
_RECOVERABLE_CODES: Final = frozenset({1001, 1006, 1011, 1012, 1013, 1014, 408})
# The service's words for a model it does not serve ("models/NAME is not found
# for API version v1beta, or is not supported for bidiGenerateContent. ..."):
# retired, not yet released, or not in this region.
_MODEL_NOT_SERVED: Final = re.compile(r"models/\S+ is not found|is not supported for bidigeneratecontent")


def _policy_hint(reason: str, model: str | None) -> str:
    """The likely cause of a 1008 (or 404), chosen from the reason text."""
    low = reason.lower()
    name = repr(model) if model else "the model"
    if "bidigeneratecontent" in low or "not found" in low or "not supported" in low:
        return (
            f"{name} is not available for the Live API (bidiGenerateContent) on this "
            "API version: choose a model whose supported methods include "
            "bidiGenerateContent, or set GOOGLE_GENAI_API_VERSION "
            f"({DEFAULT_API_VERSION} is the version the Live API documents)"
        )
    if "version" in low:
        return (
            "API version mismatch: set GOOGLE_GENAI_API_VERSION "
            f"({DEFAULT_API_VERSION} is the version the Live API documents)"
        )
    if any(marker in low for marker in _KEY_MARKERS) or "key" in low:
        return "check the API key: GOOGLE_API_KEY must hold a valid Gemini API key"
    return (
        f"policy violation: check that {name} supports the Live API "
        "(bidiGenerateContent), the API version (GOOGLE_GENAI_API_VERSION) "
        "and the API key (GOOGLE_API_KEY)"
    )


def error_for_close(
    code: int | None, reason: str = "", *, model: str | None = None
) -> LiveError | None:
    """The typed error for a close code (or HTTP status) and reason; None for 1000.

    Callers branch on the class: recoverable (1006, 1011, ...), quota (1011
    RESOURCE_EXHAUSTED, 429), invalid argument (1007: never replay the same
    context), configuration (1008, bad key, unknown model) with a hint.
    """
    if code == 1000:
        return None
    text = reason.strip() or "no reason given"
    low = text.lower()
    if code == 429 or any(marker in low for marker in _QUOTA_MARKERS):
        return QuotaExhaustedError(
            f"quota or concurrent-session limit reached: {text}",
            close_code=code,
            hint="too many Live sessions or tokens for this key; retry later, not now",
        )
    if code in (401, 403) or any(marker in low for marker in _KEY_MARKERS):
        return ConfigurationError(
            f"the API key was rejected: {text}",
            close_code=code,
            hint="check the API key: GOOGLE_API_KEY must hold a valid Gemini API key",
        )
    if code == 1007:
        return InvalidArgumentError(
            f"the model rejected the request or context: {text}",
            close_code=code,
            hint="never replay the same context: it fails again; fix the request "
            "(e.g. history on Gemini 3 needs history_config, tool responses need "
            "the ids of their calls)",
        )
    if code in (1008, 404) and _MODEL_NOT_SERVED.search(low):
        return ModelUnavailableError(
            f"the model is not served here: {text}",
            close_code=code,
            hint=_policy_hint(text, model),
        )
    if code in (1008, 404):
        return ConfigurationError(
            f"the model refused the session: {text}",
            close_code=code,
            hint=_policy_hint(text, model),
        )
    if code in _RECOVERABLE_CODES or (code is not None and 500 <= code < 600):
        return RecoverableConnectionError(
            f"the connection to the model dropped: {text}",
            close_code=code,
            hint="reconnect, with a session-resumption handle when you have one",
        )
    if code == 1009:
        return InvalidArgumentError(
            f"a message was too large for the connection: {text}",
            close_code=code,
            hint="send smaller chunks (audio in 20-100 ms frames)",
        )
    if code is not None and 400 <= code < 500:
        return InvalidArgumentError(f"the model rejected the request: {text}", close_code=code)
    return LiveError(f"the connection to the model ended: {text}", close_code=code)


@contextlib.asynccontextmanager
async def _sdk_session(connect: AbstractAsyncContextManager[LiveSession]) -> AsyncIterator[LiveSession]:
    """The SDK's own session and socket, dialed following no redirect (`live_socket`)."""
    async with contextlib.AsyncExitStack() as stack:
        with dialing(picows=False):
            session = await stack.enter_async_context(connect)
        yield session


def _api_error_parts(exc: genai_errors.APIError) -> tuple[int | None, str]:
    """Code and human text of an SDK error (a close reason or an in-band error)."""
    details = exc.details
    if isinstance(details, str):
        reason = details
    else:
        reason = " ".join(str(p) for p in (exc.status, exc.message) if p) or str(details)
    code = exc.code if isinstance(exc.code, int) else None
    return code, reason


def _closed_parts(exc: websockets.ConnectionClosed) -> tuple[int, str]:
    """Code and reason of a closed socket, as the SDK reports them (1006 without a frame)."""
    if exc.rcvd is not None:
        return exc.rcvd.code, exc.rcvd.reason
    return 1006, "no close frame received"


def _redacted(error: LiveError, secret: str | None) -> LiveError:
    """The same error with the secret removed from every text it carries."""
    if not secret or secret not in str(error):
        return error
    message = error.message.replace(secret, "***")
    hint = error.hint.replace(secret, "***") if error.hint else None
    return type(error)(message, close_code=error.close_code, hint=hint)


# ---------------------------------------------------------------------------
# The connection
# ---------------------------------------------------------------------------


class GeminiLlmConnection(BaseLlmConnection):
    """One conversation over one Gemini Live session.

    All per-session state lives here: the transcript accumulators, whether the
    history was sent, whether the connection ended. See `live.llm` for the
    ordering and concurrency guarantees.
    """

    def __init__(
        self,
        session: LiveSession,
        *,
        model: str,
        secret: str | None = None,
        initial_history_mode: bool = False,
    ) -> None:
        self._session = session
        self._model = model
        self._initial_history_mode = initial_history_mode
        self._secret = secret
        self._family = family_of(model)
        self._gemini3 = is_gemini3(model)
        self._mapper = ServerMessageMapper()
        # Bound once, used per audio frame: the lean wire path's own audio
        # writer, and the session's synchronous audio send where it has one
        # (the lean path, the transport double).
        self._lean = session if isinstance(session, LeanSession) else None
        self._send_audio = self._lean.send_audio if self._lean is not None else None
        self._send_audio_nowait: Callable[[types.Blob], bool] | None = getattr(session, "send_audio_nowait", None)
        self._closed = False
        self._ended = False
        self._receiving = False
        self._history_sent = False
        self._sent_anything = False

    @property
    def model(self) -> str:
        return self._model

    @property
    def voice_consent_signature(self) -> str | None:
        """`setupComplete.voiceConsentSignature.signature`, as google-genai kept
        it (`AsyncSession.setup_complete`)."""
        ready = getattr(self._session, "setup_complete", None)
        signature = getattr(ready, "voice_consent_signature", None)
        return getattr(signature, "signature", None)

    @property
    def closed(self) -> bool:
        """True once `close()` was called or the model ended the connection."""
        return self._closed or self._ended

    async def receive(self) -> AsyncIterator[LlmResponse]:
        """Every response of the connection, across turns, until it ends.

        The SDK's `receive()` stops after each turn, so it is re-entered in a
        loop; the lean wire path reads the connection as one stream
        (`LeanSession.frames`). A normal close (1000, also after go-away) or `close()` ends the
        iteration quietly; any other end raises a typed `LiveError`.
        """
        if self._receiving:
            raise RuntimeError("receive() already has a receiver; only one task may iterate it")
        self._receiving = True
        session = self._session
        feed = self._mapper.feed
        error: LiveError | None = None
        cause: BaseException | None = None
        lean = self._lean
        try:
            if lean is not None:
                # The lean wire path reads the whole connection as one stream, a
                # bare audio chunk as its Content (what `feed` makes a response of).
                mapper = self._mapper
                async with contextlib.aclosing(lean.frames()) as frames:
                    async for frame in frames:
                        if type(frame) is types.Content:
                            if mapper.turn_over:
                                mapper.turn_over = False  # output of a new reply, past the mapper
                            yield LlmResponse(content=frame, partial=True)
                        else:
                            for response in feed(frame[0]):
                                yield response
            while lean is None and not self._closed:
                received = False
                stream = session.receive()
                try:
                    async for message in stream:
                        received = True
                        for response in feed(message):
                            yield response
                finally:
                    # Close the turn's iterator now, not at garbage collection:
                    # only one coroutine may be inside the session's receive().
                    aclose = getattr(stream, "aclose", None)
                    if aclose is not None:
                        await aclose()
                if not received:
                    break
        except genai_errors.APIError as exc:
            cause = exc
            if not self._closed:
                error = error_for_close(*_api_error_parts(exc), model=self._model)
        except websockets.ConnectionClosed as exc:
            cause = exc
            if not self._closed:
                error = error_for_close(*_closed_parts(exc), model=self._model)
        except LiveError:
            raise
        except Exception as exc:
            # E.g. the SDK's ValueError for an unparsable frame, or its TypeError
            # for an in-band error without a code: still an end the caller must
            # see as a LiveError, with the original chained.
            cause = exc
            if not self._closed:
                error = LiveError(
                    f"the live session failed: {type(exc).__name__}: {exc}",
                    hint="unexpected failure reading from the model; see the chained exception",
                )
        finally:
            self._receiving = False
        # Reached only when the stream ended, not when the consumer stopped early.
        self._ended = True
        if error is not None:
            raise _redacted(error, self._secret) from cause

    async def _call(self, send: Callable[..., Any], /, *args: Any, **kwargs: Any) -> None:
        """One whole message out, with socket failures turned into typed errors."""
        if self._closed:
            raise ConnectionClosedError("the connection was closed")
        if self._ended:
            raise ConnectionClosedError("the model ended the connection")
        self._sent_anything = True
        try:
            await send(*args, **kwargs)
        except websockets.ConnectionClosed as exc:
            raise self._send_error(*_closed_parts(exc)) from exc
        except genai_errors.APIError as exc:
            raise self._send_error(*_api_error_parts(exc)) from exc

    def _send_error(self, code: int | None, reason: str) -> LiveError:
        """Always a ConnectionClosedError (the contract for sends on an ended
        connection), carrying the close code and, as `cause`, the same typed
        error `receive()` raises for that close."""
        if self._closed:
            return ConnectionClosedError("the connection was closed", close_code=code)
        error = error_for_close(code, reason, model=self._model)
        if error is None:
            return ConnectionClosedError("the model ended the connection", close_code=code)
        error = _redacted(error, self._secret)
        return ConnectionClosedError(
            f"the connection ended ({type(error).__name__}): {error.message}",
            close_code=code,
            hint=error.hint,
            cause=error,
        )

    async def send_history(self, history: Sequence[types.Content]) -> None:
        """Seed the conversation once, before anything else is sent.

        Audio parts and contents left empty are dropped; an empty history sends
        nothing. A history whose last turn is the user's is answered, on every
        model (see `history_plan`); in the initial-history mode (Gemini 3) the
        seed always completes, since the service takes nothing else until it
        does. A second call, or a call after other input was
        sent, is a RuntimeError: the server takes history once, right after setup,
        and history sent again or late corrupts the context (endless 1007s).
        """
        if self._history_sent:
            raise RuntimeError("history was already sent; it is sent once per connection")
        if self._sent_anything:
            raise RuntimeError("history must be sent right after connecting, before other input")
        self._history_sent = True
        plan = history_plan(history, model=self._model)
        if plan.turns:
            turn_complete = plan.turn_complete or self._initial_history_mode
            await self._call(
                self._session.send_client_content, turns=plan.turns, turn_complete=turn_complete
            )
        if plan.then_text is not None:
            await self._call(self._session.send_realtime_input, text=plan.then_text)

    async def send_content(self, content: types.Content) -> None:
        """A user turn, or the answers to tool calls.

        Function responses go out as one `tool_response` with their ids kept
        (a response without an id is a ValueError: the model could not pair it).
        A user text turn goes as `client_content` with turn_complete, except on
        Gemini 3 models, which take mid-session text as `realtime_input.text`.
        """
        # Input the model will answer: what it says next is a new reply, not a
        # late tail of the last one (see gemini_mapping).
        self._mapper.turn_over = False
        responses = function_responses_of(content)
        if responses is not None:
            missing = [r.name or "?" for r in responses if not r.id]
            if missing:
                raise ValueError(
                    f"function responses without an id ({', '.join(missing)}): copy the "
                    "id of the function call each one answers"
                )
            await self._call(self._session.send_tool_response, function_responses=responses)
            return
        if not content.parts:
            raise ValueError("content has no parts to send")
        if self._gemini3:
            text = text_of(content)
            if text is not None:
                await self._call(self._session.send_realtime_input, text=text)
                return
        if content.role is None:
            content = content.model_copy(update={"role": "user"})
        await self._call(self._session.send_client_content, turns=[content], turn_complete=True)

    async def send_turns(self, turns: Sequence[types.Content], *, turn_complete: bool) -> None:
        """Client content as is (`client_content`): turns of either role, any
        parts, and whether they complete the user's turn.

        A family that takes no client content after its initial history (3.1)
        gets a completed content's user text as realtime text, which it answers,
        and nothing of content that completes nothing (it has no way to take it).
        """
        self._mapper.turn_over = False
        seeding = self._initial_history_mode and not self._history_sent
        if not seeding and not self._family.client_content_mid_session:
            text = "\n".join(t for t in (text_of(turn) for turn in turns if (turn.role or "user") == "user") if t)
            if turn_complete and text:
                await self._call(self._session.send_realtime_input, text=text)
            else:
                logger.debug("client content without a turn to answer is not taken mid-session by %s", self._model)
            return
        if seeding and turn_complete:
            self._history_sent = True  # the initial history is complete: the service takes input now
        await self._call(self._session.send_client_content, turns=list(turns) or None, turn_complete=turn_complete)

    async def send_context_update(
        self, *, system_instruction: types.Content | None = None, tools: Sequence[types.Tool] | None = None
    ) -> None:
        """`context_update`: the conversation's instruction or tools from now on."""
        await self._call(
            self._session.send_context_update,
            system_instruction=system_instruction,
            tools=list(tools) if tools is not None else None,
        )

    async def send_realtime_text(self, text: str) -> None:
        """Text in the realtime input stream (`realtime_input.text`), on every family."""
        self._mapper.turn_over = False
        await self._call(self._session.send_realtime_input, text=text)

    async def send_realtime(self, input: RealtimeInput) -> None:
        """Audio as `audio`, images and frames as `video`, activity and stream-end signals."""
        send_audio = self._send_audio
        if send_audio is not None and type(input) is types.Blob and (input.mime_type or "").startswith("audio/"):
            await self._call(send_audio, input)  # the hot path: a microphone frame
            return
        await self._call(self._session.send_realtime_input, **realtime_kwargs(input))

    def send_realtime_nowait(self, input: RealtimeInput) -> bool:
        """An audio frame sent at once, when the session's socket takes it without waiting.

        Only a session with a synchronous audio send offers it (the lean wire
        path on `live.net.websocket`, the transport double); on the SDK's own path
        this is always False.
        """
        send = self._send_audio_nowait
        if (
            send is None
            or self._closed
            or self._ended
            or type(input) is not types.Blob
            or not (input.mime_type or "").startswith("audio/")
            or not send(input)
        ):
            return False
        self._sent_anything = True
        return True

    async def close(self) -> None:
        """Close the session (idempotent); a pending `receive()` ends quietly."""
        if self._closed:
            return
        self._closed = True
        with anyio.move_on_after(_CLOSE_TIMEOUT, shield=True):
            try:
                await self._session.close()
            except Exception:  # noqa: BLE001 - closing a broken socket may fail; it is closed either way
                logger.debug("closing the live session failed", exc_info=True)


# ---------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------


def _alpha_only(config: types.LiveConnectConfig) -> bool:
    """The config holds what only the Gemini API's v1alpha takes."""
    return config.proactivity is not None or config.enable_affective_dialog is not None


def _env_api_key() -> str | None:
    """GOOGLE_API_KEY, else GEMINI_API_KEY (the SDK's precedence); blank counts as unset."""
    for name in ("GOOGLE_API_KEY", "GEMINI_API_KEY"):
        value = (os.environ.get(name) or "").strip()
        if value:
            return value
    return None


def _env_api_version() -> str:
    value = (os.environ.get("GOOGLE_GENAI_API_VERSION") or "").strip()
    if value == "beta":
        return "v1beta"
    return value or DEFAULT_API_VERSION


class Gemini(BaseLlm):
    """Gemini Live models; one instance (and one genai.Client) serves every session.

    `Gemini("gemini-2.5-flash-native-audio-preview-09-2025")` reads the key from
    GOOGLE_API_KEY; see the module docstring for the other backends and the
    transport seam. Raises `ConfigurationError` when no backend is configured.
    """

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        vertex: VertexConfig | None = None,
        client: genai.Client | None = None,
        transport: LiveTransport | None = None,
        base_url: str | None = None,
        api_version: str | None = None,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        ssl_context: ssl.SSLContext | None = None,
        wire: Literal["lean", "sdk"] | None = None,
    ) -> None:
        super().__init__(model)
        wire = wire or (os.environ.get("LIVE_GEMINI_WIRE") or "").strip() or "lean"
        if wire not in ("lean", "sdk"):
            raise ConfigurationError(f"the Gemini wire path must be 'lean' or 'sdk', not {wire!r} (LIVE_GEMINI_WIRE)")
        self._wire = wire
        if request_timeout <= 0 or connect_timeout <= 0:
            raise ValueError("request_timeout and connect_timeout must be positive")
        self._transport = transport
        self._connect_timeout = connect_timeout
        self._secret: str | None = None
        self._backend = "unconfigured"
        self._client: genai.Client | None = None
        if client is not None:
            self._client = client
            self._backend = "vertex" if client.vertexai else "gemini-api"
            return
        if api_key is not None and vertex is not None:
            raise ConfigurationError(
                f"Gemini({model!r}): pass either api_key= (Gemini API) or vertex= "
                "(Vertex AI), not both"
            )
        http_options = types.HttpOptions(
            base_url=base_url,
            # Vertex has its own versions (the SDK picks v1beta1 or the variable).
            api_version=api_version or (None if vertex is not None else _env_api_version()),
            timeout=max(1, round(request_timeout * 1000)),  # milliseconds
            # No permessage-deflate on the Live socket: base64 audio of speech
            # shrinks by a fifth at most, for a zlib pass per frame each way and
            # compressor state per session (the SDK hands "compression" to
            # websockets' connect).
            async_client_args={"compression": None, **({"ssl": ssl_context} if ssl_context is not None else {})},
        )
        if vertex is not None:
            self._backend = "vertex"
            self._client = self._build_client(
                vertexai=True,
                project=vertex.project,
                location=vertex.location,
                credentials=vertex.credentials,
                http_options=http_options,
            )
            return
        key = (api_key or "").strip() or (None if transport is not None else _env_api_key())
        if key:
            self._secret = key
            self._backend = "gemini-api"
            if http_options.base_url is None:
                http_options.base_url = os.environ.get("GOOGLE_GEMINI_BASE_URL") or None
            self._client = self._build_client(
                vertexai=False, api_key=key, http_options=http_options
            )
            return
        if transport is not None:
            self._backend = "transport"
            self._client = None
            return
        raise ConfigurationError(
            f"no API key for Gemini model {model!r}: set GOOGLE_API_KEY (or GEMINI_API_KEY), "
            "or pass api_key=, vertex=VertexConfig(...), client= or transport="
        )

    @classmethod
    def at_backend(cls, model: str, backend: Backend) -> Gemini:
        """`model` on one backend of a pool: its AI Studio key (from the
        environment variable it names), or its Vertex AI project and region;
        its endpoint and API version when it names them. Raises
        `ConfigurationError` when its key is not in the environment."""
        try:
            api_key = backend.api_key()
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
        vertex = VertexConfig(backend.project, backend.location) if backend.project and backend.location else None
        options: dict[str, Any] = {}
        if backend.connect_timeout is not None:
            options["connect_timeout"] = backend.connect_timeout
        return cls(
            model,
            api_key=api_key,
            vertex=vertex,
            base_url=backend.base_url,
            api_version=backend.api_version,
            **options,
        )

    def _build_client(self, **kwargs: Any) -> genai.Client:
        try:
            return genai.Client(**kwargs)
        except ssl.SSLError as exc:  # SSL_CERT_FILE names no certificate
            raise ConfigurationError(
                f"cannot build the Gemini client: the certificates it trusts cannot be loaded ({exc.reason})",
                hint="SSL_CERT_FILE must name a PEM file of CA certificates",
            ) from None
        except (ValueError, TypeError) as exc:
            text = str(exc)
            if self._secret:
                text = text.replace(self._secret, "***")
            raise ConfigurationError(f"cannot build the Gemini client: {text}") from None

    @property
    def client(self) -> genai.Client | None:
        """The shared genai.Client, or None when only a transport was given."""
        return self._client

    @property
    def backend(self) -> str:
        """`gemini-api`, `vertex` or `transport`: where sessions go, decided in code."""
        return self._backend

    def __repr__(self) -> str:
        return f"Gemini(model={self.model!r}, backend={self._backend!r})"

    def open_transport(
        self, model: str, config: types.LiveConnectConfig
    ) -> AbstractAsyncContextManager[LiveSession]:
        """Open one session: the injected transport, else the SDK's live connect.

        Override (or pass `transport=`) to put a double or a proxy in between;
        the connection code does not change. On the SDK's connect, audio frames
        take the lean wire path (`connections.gemini_wire`), on a picows socket
        (`connections.live_socket`), unless `wire="sdk"` was chosen or the
        installed SDK does not allow it.
        """
        if self._transport is not None:
            return self._transport(model, config)
        assert self._client is not None  # guaranteed by __init__
        connect = self._client.aio.live.connect(model=model, config=config)
        return lean_session(connect) if self._wire == "lean" else _sdk_session(connect)

    @property
    def wire(self) -> str:
        """`lean` (audio frames skip the SDK's per-message work when it allows, on a
        picows socket) or `sdk` (the SDK's own path and websockets socket)."""
        return self._wire

    @contextlib.asynccontextmanager
    async def connect(self, request: LlmRequest) -> AsyncIterator[GeminiLlmConnection]:
        """A connection for `request`; closed when the context exits.

        The model is `request.model` or this instance's; the config is the
        request's, plus the history flag `prepare_connect_config` documents.
        Failures while connecting become typed `LiveError`s.
        """
        model = request.model or self.model
        plan = history_plan(request.contents, model=model)
        config = prepare_connect_config(
            request.live_connect_config, model=model, has_history=bool(plan.turns)
        )
        if self._backend == "gemini-api" and _alpha_only(config):
            # Affective dialog and proactivity are fields of the Gemini API's
            # v1alpha only ("set the api version to v1alpha"): this connection dials it.
            options = (config.http_options or types.HttpOptions()).model_copy(update={"api_version": "v1alpha"})
            config = config.model_copy(update={"http_options": options})
        async with contextlib.AsyncExitStack() as stack:
            session = await self._open(stack, model, config)
            connection = GeminiLlmConnection(
                session,
                model=model,
                secret=self._secret,
                initial_history_mode=history_in_client_content(config),
            )
            try:
                yield connection
            finally:
                await connection.close()

    async def _open(
        self,
        stack: contextlib.AsyncExitStack,
        model: str,
        config: types.LiveConnectConfig,
    ) -> LiveSession:
        try:
            with anyio.fail_after(self._connect_timeout):
                return await stack.enter_async_context(self.open_transport(model, config))
        except genai_errors.APIError as exc:
            code, reason = _api_error_parts(exc)
            error = error_for_close(code, reason, model=model) or RecoverableConnectionError(
                f"the model closed the connection during setup: {reason or 'no reason given'}",
                close_code=code,
            )
            raise _redacted(error, self._secret) from exc
        except websockets.ConnectionClosed as exc:
            code, reason = _closed_parts(exc)
            error = error_for_close(code, reason, model=model) or RecoverableConnectionError(
                "the model closed the connection during setup", close_code=code
            )
            raise _redacted(error, self._secret) from exc
        except websockets.InvalidStatus as exc:
            status = exc.response.status_code
            if 300 <= status < 400:
                where = exc.response.headers.get("Location", "nowhere")
                raise ConfigurationError(
                    f"the Live endpoint answered with a redirect (HTTP {status} to {where[:200]}); "
                    "it was not followed, so no credential went there",
                    close_code=status,
                    hint="the Live API never redirects: check GOOGLE_GEMINI_BASE_URL (or base_url=)",
                ) from exc
            error = error_for_close(status, f"HTTP {status} during the handshake", model=model)
            assert error is not None
            raise _redacted(error, self._secret) from exc
        except TimeoutError:
            raise UnreachableError(
                f"connecting to {model!r} took longer than {self._connect_timeout:g} s",
                hint="the endpoint did not answer; check the network and GOOGLE_GEMINI_BASE_URL",
            ) from None
        except ssl.SSLCertVerificationError as exc:
            raise ConfigurationError(
                f"the Live endpoint's certificate was not trusted: {exc.verify_message}",
                hint="point SSL_CERT_FILE at the CA bundle that signed it",
            ) from exc
        except websockets.InvalidURI as exc:
            raise ConfigurationError(
                f"the Live endpoint URL is not valid: {exc.uri}",
                hint="check GOOGLE_GEMINI_BASE_URL (or base_url=)",
            ) from exc
        except (OSError, websockets.InvalidHandshake) as exc:
            raise UnreachableError(
                f"could not reach the Live endpoint: {type(exc).__name__}: {exc}",
                hint="check the network and GOOGLE_GEMINI_BASE_URL",
            ) from exc
