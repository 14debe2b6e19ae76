"""The Live API's own WebSocket protocol, so existing Gemini Live apps connect unchanged.

A client written against google-genai or @google/genai dials
`/ws/google.ai.generativelanguage.{v1,v1beta,v1alpha}.GenerativeService.BidiGenerateContent`
(or `...Constrained`, where ephemeral tokens go), or in Vertex AI mode
`/ws/google.cloud.aiplatform.{v1beta1,v1}.LlmBidiService/BidiGenerateContent`,
with its key where the SDK puts one. Here that key is one of this server's
session tokens; the server talks to Google with its own key, which never
leaves it.

What the door speaks, as the service does (docs/gemini-endpoint.md has the
conformance table, message by message and field by field):

- the first frame is `setup`; a field the service does not know on the app's
  path is its 1007; its model must be one the server allows; what the family
  of the model the session runs refuses is refused as that family refuses it;
  the answer is `setupComplete` (with the session's id) once the model's
  connection is open;
- `realtimeInput`, `clientContent`, `toolResponse` and `contextUpdate` become
  session inputs (`live.doors.gemini_inputs`);
- the session's events go out as the service's server messages
  (`live.doors.gemini_events`);
- what the service would refuse ends the socket with the service's close code
  and words (1008 for a bad key or an unknown model, 1007 for a frame it
  cannot read); on Vertex AI's path, in Vertex AI's words (Google Cloud's for
  a missing or bad access token, its own for a model it does not serve).

The server's own recovery stays invisible: a go-away or a drop upstream is
handled by the session, and this client never hears of it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar
from urllib.parse import parse_qs

from google.genai import types

from live.access.auth import Grant
from live.doors.base import Capabilities, FrontDoor, Input, Opening
from live.doors.gemini_events import LiveApiEvents, dumps
from live.doors.gemini_inputs import LiveApiInputs
from live.doors.gemini_policy import GeminiPolicy
from live.doors.gemini_setup import (
    client_config,
    initial_history,
    invalid,
    manual_turns,
    setup_refusal,
    vertex_refusal,
)
from live.doors.gemini_tokens import camel_name, constrained_setup
from live.families import DEFAULT, ModelFamily, family_of
from live.liveapi import (
    BAD_KEY,
    BAD_TOKEN,
    DEADLINE_EXPIRED,
    INVALID,
    INVALID_SESSION_HANDLE,
    SESSION_NOT_FOUND,
    TOP_LEVEL,
    UNREGISTERED,
    VERTEX_BAD_CREDENTIAL,
    VERTEX_NO_CREDENTIAL,
    Route,
    get_field,
    not_found,
    route,
    routes,
    unknown_field,
    vertex_not_found,
)
from live.observe.record import redact
from live.protocol import (
    DEFAULT_INPUT_RATE,
    ErrorEvent,
    ProtocolError,
    ServerEvent,
    SessionReattached,
    SessionResume,
    SessionStart,
)
from live.protocol.closes import CLOSE_INTERNAL, CLOSE_NORMAL, CLOSE_POLICY

__all__ = [
    "CLOSE_INVALID",
    "EPHEMERAL_PREFIX",
    "GEMINI_PATHS",
    "MAX_MESSAGE_BYTES",
    "GeminiLiveDoor",
    "gemini_doors",
]

CLOSE_INVALID = 1007  # the service's close for a frame it cannot read
CLOSE_DEADLINE = 1011  # the service's close when a deadline passed

# The paths google-genai and @google/genai dial for Live sessions: the Gemini
# API's (every version, each method), and Vertex AI's.
GEMINI_PATHS = tuple(r.path for r in routes())
# How an ephemeral token's name starts: google-genai sends a key with this
# prefix as an ephemeral token (on the Constrained method). A backend hands an
# app one of our tokens as "auth_tokens/TOKEN" to use that path.
EPHEMERAL_PREFIX = "auth_tokens/"
# The largest message an app may send (the service's own limit is not
# published): a whole spoken question of 24 s of 16 kHz audio in one message as
# the guide's sample sends a file, a 768-px camera frame several times over, a
# long typed turn, a large tool result or setup. See docs/gemini-endpoint.md
# ("Limits") for what it costs a session in memory.
MAX_MESSAGE_BYTES = 1 << 20
# How long a resumable session is kept after its app left: the service's
# "valid for 2 hours after the last session termination".
KEPT_SECONDS = 7200.0


class GeminiLiveDoor(FrontDoor):
    """One Live API client's socket (see the module's docstring)."""

    name = "gemini"
    # The Live API's client runs the tools it is called for, as long as they
    # take, and pairs results by id; it cannot come back to a session after a
    # drop unless it asked for resumption (the SDKs open a new one). Its app
    # runs its own conversation: the agent's conversation policies do not apply.
    capabilities = Capabilities(
        client_tools=True,
        policies=False,
        images=True,
        usage_with_turn_end=True,
        client_tool_deadline=False,
        results_by_id=True,
        cut_replies_repeated=False,
    )
    max_message_bytes: ClassVar[int | None] = MAX_MESSAGE_BYTES
    # The service keeps a resumable session two hours after its app left.
    kept_after_leaving: ClassVar[float | None] = KEPT_SECONDS
    # The service sends goAway before it closes any connection.
    tells_going_away: ClassVar[bool] = True
    # What the operator lets an app ask (its `models`: fnmatch patterns of the
    # model names a client may give in `setup`, without "models/"), and the
    # family of the model the session runs (its rules are the app's); set per
    # server by `gemini_doors`.
    policy: ClassVar[GeminiPolicy] = GeminiPolicy()
    allowed_models: ClassVar[tuple[str, ...]] = ()
    family: ClassVar[ModelFamily] = DEFAULT

    def __init__(self, request: Any = None) -> None:
        super().__init__(request)
        found = route(request.path) if request is not None else None
        self.route: Route = found or Route("v1beta", "BidiGenerateContent")
        self.constrained = self.route.constrained
        self.version = self.route.api_version
        self.model: str | None = None  # as the client named it in setup
        self._setup: Mapping[str, Any] = {}  # as the app sent it
        self._effective_setup: dict[str, Any] = {}  # as the session runs with it
        self._events = LiveApiEvents(vertex=self.route.vertex)
        self._inputs: LiveApiInputs | None = None
        # The app asked for session resumption: it gets handles, and may come
        # back with one on a new socket (`_resuming`: this socket did).
        self._resumption = False
        self._resuming = False

    # ------------------------------------------------------------------ opening

    def credential(self) -> str | None:
        """The client's token, where the SDKs put a key or an ephemeral token."""
        found = self._credential()
        return found[0] if found else None

    def _credential(self) -> tuple[str, bool] | None:
        """The client's token, and whether it came as an API key (`x-goog-api-key`,
        `?key=`) rather than as an access or ephemeral token."""
        request = self.request
        if request is None:
            return None
        headers = request.headers
        query = parse_qs(request.path.partition("?")[2])
        auth = _one(headers.get_all("Authorization")) or ""
        scheme, _, value = auth.partition(" ")
        candidates = (
            (_one(headers.get_all("x-goog-api-key")), True),
            (_one(query.get("key", [])), True),
            (_one(query.get("access_token", [])), False),
            (value.strip() if scheme.lower() in ("token", "bearer") else None, False),
        )
        found = next(((c.strip(), key) for c, key in candidates if c and c.strip()), None)
        return (found[0].removeprefix(EPHEMERAL_PREFIX), found[1]) if found else None

    def opening(self, frame: str | bytes) -> Opening | ErrorEvent | None:
        message = _message(frame)
        if len(message) != 1:
            raise invalid(INVALID)
        ((key, setup),) = message.items()
        if TOP_LEVEL.get(key) is None:
            raise invalid(f'Invalid JSON payload received. Unknown name "{str(key)[:60]}": Cannot find field.')
        if TOP_LEVEL[key] != "setup" or not isinstance(setup, Mapping):
            raise invalid(INVALID)  # setup comes first
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
        self._resumption = self._events.resumption = True
        handle = get_field(resumption, "handle")
        if handle is None or handle == "":
            return start
        session_id, _, resume_token = handle.partition(".") if isinstance(handle, str) else ("", "", "")
        if not session_id or not resume_token:
            raise invalid(INVALID_SESSION_HANDLE)
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
        """The service's goAway: the connection ends in `time_left` seconds (an
        app that asked for resumption comes back with its handle)."""
        return dumps({"goAway": {"timeLeft": f"{max(0.0, time_left):.3f}s"}})

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
        # The message is read whole before its model is looked up.
        unknown = unknown_field("setup", setup, self.route)
        if unknown is not None:
            raise invalid(unknown)
        name = _model_name(model, self.route)
        if name is None:
            raise ProtocolError("model_not_found", self._not_found(model), fatal=True)
        if not self.policy.allows_model(name):
            shown = repr(name[:100])
            hint = f"the app asked for model {shown}: allow it with --gemini-model {shown} (or the policy's models)"
            raise ProtocolError("model_not_found", self._not_found(model), fatal=True, hint=hint)
        refused = (vertex_refusal(setup) if self.route.vertex else None) or setup_refusal(
            setup, self.family, f"models/{name}"
        )
        if refused is not None:
            raise invalid(refused)
        self.model = str(model)
        self._effective_setup = dict(setup)
        self._events.transcribe_input = get_field(setup, "inputAudioTranscription") is not None
        self._events.transcribe_output = get_field(setup, "outputAudioTranscription") is not None
        # Vertex AI's own (an unknown name elsewhere): its VAD signals, from the
        # model's voice activity; never sent to Google, whose Gemini API refuses it.
        self._events.vad_signal = self.route.vertex and get_field(setup, "explicitVadSignal") is True
        manual = manual_turns(setup)
        # Only a family that seeds history this way takes `historyConfig`; 2.5
        # answers a completed seed whatever it says (Pipecat seeds it so).
        seeding = initial_history(setup) and self.family.history_flag
        self._inputs = LiveApiInputs(self.route, self.family, self.policy, manual=manual, seeding=seeding)
        self._inputs.calls = self._events.calls
        config = client_config(setup, self.policy)
        if config is not None and not seeding and config.history_config is not None:
            config = config.model_copy(update={"history_config": None})
        if config is None or config.realtime_input_config is None:
            # How the model hears the app is the app's to say; said nothing,
            # it is the service's default (detection on, its own tuning),
            # never the server's own realtimeInputConfig.
            config = (config or types.LiveConnectConfig()).model_copy(
                update={"realtime_input_config": types.RealtimeInputConfig()}
            )
        return SessionStart(
            token=self.credential(),
            input_rate=DEFAULT_INPUT_RATE,
            turn_taking="manual" if manual else "auto",
            config=config,
        )

    def _not_found(self, model: Any) -> str:
        """The service's words for a model it does not serve, as the app named it."""
        if self.route.vertex:
            return vertex_not_found(str(model or ""))
        return not_found(str(model or "models/"), self.version)

    # ------------------------------------------------------------------ inputs

    def inputs(self, frame: str | bytes) -> Iterable[Input]:
        message = _message(frame)
        if len(message) != 1:
            raise invalid(INVALID)
        ((key, body),) = message.items()
        kind = TOP_LEVEL.get(key)
        if kind is None:
            raise invalid(f'Invalid JSON payload received. Unknown name "{str(key)[:60]}": Cannot find field.')
        if kind == "setup":
            raise invalid(INVALID)  # setup comes once, first
        if self._inputs is None:  # a session taken over from the fleet: read as it was set up
            self._inputs = LiveApiInputs(self.route, self.family, self.policy, manual=False, seeding=False)
            self._inputs.calls = self._events.calls
        return self._inputs.read(kind, body)

    # ------------------------------------------------------------------ events

    def event(self, event: ServerEvent) -> str | tuple[str, ...] | None:
        if isinstance(event, SessionReattached):
            self._resuming = False  # found: what ends it from now on ends a session
        return self._events.event(event)

    def audio(self, pcm: bytes) -> Sequence[str]:
        return self._events.audio(pcm)

    # ------------------------------------------------------------------ the end

    def closing(self, code: int, reason: str, error: ErrorEvent | None) -> tuple[int, str]:
        """The service's close for how the session ended."""
        if error is None:
            return code, reason if code == CLOSE_NORMAL else ""
        if self._resuming and (
            error.code == "session_expired" or (error.code == "unauthorized" and error.message.startswith("session.resume:"))
        ):
            return CLOSE_POLICY, SESSION_NOT_FOUND  # no session for that handle (any more)
        if error.code == "unauthorized":
            found = self._credential()
            if self.route.vertex:
                # Vertex AI takes Google Cloud credentials; an app in its
                # express mode sends an API key, told as any API key is.
                if found is None:
                    return CLOSE_POLICY, VERTEX_NO_CREDENTIAL
                return CLOSE_POLICY, BAD_KEY if found[1] else VERTEX_BAD_CREDENTIAL
            if found is None:
                return CLOSE_POLICY, UNREGISTERED
            return CLOSE_POLICY, BAD_TOKEN if self.constrained else BAD_KEY
        if error.code == "model_not_found":
            return CLOSE_POLICY, error.message
        if error.code == "invalid_argument":
            return CLOSE_INVALID, error.message
        if error.code == "session_expired":
            return CLOSE_NORMAL, error.message
        if error.code in ("idle_timeout", "server_shutdown"):
            return CLOSE_DEADLINE, DEADLINE_EXPIRED  # a deadline of ours passed: the service's words for one
        if code == CLOSE_INTERNAL:
            return CLOSE_INTERNAL, "Internal error encountered."
        return code, error.message


def gemini_doors(
    allowed_models: Iterable[str] = (), policy: GeminiPolicy | None = None, *, model: str | None = None
) -> dict[str, type[GeminiLiveDoor]]:
    """The Live API's paths, each with a door that allows these model patterns
    (besides the policy's) and keeps the policy's rules, answering for the
    family of `model` (the model the server runs; by default the first
    allowed name)."""
    policy = (policy or GeminiPolicy()).with_models(allowed_models)
    served = model or next(iter(policy.models), "")
    door = type(
        "GeminiLiveDoor",
        (GeminiLiveDoor,),
        {"policy": policy, "allowed_models": policy.models, "family": family_of(served) if served else DEFAULT},
    )
    return dict.fromkeys(GEMINI_PATHS, door)


# ---------------------------------------------------------------------- helpers


def _one(values: Sequence[str]) -> str | None:
    """A field the client may give once, as given; given several times, all of
    them as one value (as HTTP reads a repeated field), which is no key: the
    service's answer to it is its answer to a wrong key."""
    return ", ".join(values) if values else None


def _model_name(model: Any, where: Route) -> str | None:
    """The model's name without its prefix: `models/NAME` on the Gemini API,
    `[projects/P/locations/L/]publishers/google/models/NAME` on Vertex AI."""
    if not isinstance(model, str):
        return None
    if where.vertex:
        head, found, name = model.rpartition("models/")
        if found and name and (head == "" or head.endswith("publishers/google/")):
            return name
        return None
    if model.startswith("models/") and len(model) > len("models/"):
        return model.removeprefix("models/")
    return None


def _message(frame: str | bytes) -> dict[str, Any]:
    """A client frame as the service reads it: one JSON object (binary frames too)."""
    try:
        obj = json.loads(frame)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise invalid("Invalid JSON payload received. Unexpected token.") from None
    if not isinstance(obj, dict):
        raise invalid(INVALID)
    return obj
