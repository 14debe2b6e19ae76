"""The Live API's ephemeral tokens, minted by this server: `POST /v1alpha/auth_tokens`.

A backend that gives its browser app an ephemeral token calls google-genai's
`client.auth_tokens.create(config=...)` (or @google/genai's
`ai.authTokens.create`) with its Google key. Pointed at this server (its base
URL, and the server's mint key in place of the Google key), the same call gets
one of this server's session tokens, named as the service names its tokens
(`auth_tokens/...`), so the app opens its Live session here with nothing
changed. The Google key never leaves the server, and the backend never holds it.

The request's fields mean what they mean to the service:

- `uses`: how many sessions the token opens (default 1; 0: any number),
  counted like any token's uses (`SpentTokens`, and a fleet's Redis): once
  across every server of a fleet and its restarts;
- `newSessionExpireTime`: until when it opens them (default a minute from now);
- `expireTime`: when the sessions it opened end (default 30 minutes from now);
  both at most the server's token lifetime away (`--max-token-lifetime`),
  as the service bounds them by its 20 hours: a request past it is refused;
- `bidiGenerateContentSetup`: the session's setup the token locks, with
  `fieldMask` naming which of its fields (absent or empty: all of the setup is
  the token's; the app's own setup is not read). The Live API reference: "If
  field_mask is empty, and bidiGenerateContentSetup is present, then the
  effective BidiGenerateContentSetup message is taken entirely from
  bidiGenerateContentSetup in this request." A path names a field of the
  setup or one of its object's fields (`systemInstruction.parts`,
  `generationConfig.temperature`), in either spelling, as google-genai's
  `lock_additional_fields` writes them.

`AuthTokenMinter.answer` is the decision, without I/O; `constrained_setup` is
how a locked setup and an app's own are put together when the app connects.
"""

from __future__ import annotations

import copy
import datetime
import fnmatch
import hmac
import http
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import parse_qs

from live.liveapi import BAD_KEY, UNREGISTERED, get_field, not_found
from live.access.auth import LEEWAY_SECONDS, mint_token
from live.doors.gemini_policy import GeminiPolicy
from live.doors.gemini_setup import check_setup
from live.net.http_post import HttpAnswer
from live.protocol import ProtocolError

__all__ = ["AUTH_TOKENS_PATH", "AuthTokenMinter", "camel_name", "constrained_setup"]

log = logging.getLogger("live.gemini")

AUTH_TOKENS_PATH = "/v1alpha/auth_tokens"
# The longest token minted: apps send it in a header (websockets reads lines of
# up to 8 KiB) or in the URL (@google/genai in a browser).
MAX_TOKEN_CHARS = 6000
# The setup's fields that are objects: a lock may name one of their fields.
_OBJECT_FIELDS = frozenset(
    {"generationConfig", "realtimeInputConfig", "sessionResumption", "contextWindowCompression",
     "inputAudioTranscription", "outputAudioTranscription", "proactivity", "systemInstruction"}
)
MIN_MINT_KEY_CHARS = 16
# The service's defaults and bound for a token's times.
DEFAULT_NEW_SESSION_SECONDS = 60.0
DEFAULT_EXPIRE_SECONDS = 30 * 60.0
LONGEST_SECONDS = 20 * 3600.0
_SETUP_FIELDS = frozenset(
    {
        "model", "generationConfig", "systemInstruction", "tools", "realtimeInputConfig",
        "sessionResumption", "contextWindowCompression", "inputAudioTranscription",
        "outputAudioTranscription", "proactivity", "explicitVadSignal",
    }
)


class AuthTokenMinter:
    """`POST /v1alpha/auth_tokens` with the server's mint key: a token of this server's.

    `mint_key` is what a backend presents where google-genai puts its key
    (`x-goog-api-key`, or `?key=`); `token_secret` signs the tokens (the
    server's `--token-secret`); `allowed_models` are the `--gemini-model`
    patterns a locked setup's model must match; `max_lifetime` bounds how long
    a token may open sessions, as for every token the server accepts.
    """

    def __init__(
        self,
        mint_key: str,
        token_secret: str,
        *,
        allowed_models: Iterable[str],
        agent: str | None = None,
        issuer: str | None = None,
        max_lifetime: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if len(mint_key) < MIN_MINT_KEY_CHARS:
            raise ValueError(f"the mint key must be at least {MIN_MINT_KEY_CHARS} characters")
        self._mint_key = mint_key.encode()
        self._secret = token_secret
        self.allowed_models = tuple(allowed_models)
        self.agent = agent
        self.issuer = issuer
        self.max_lifetime = max_lifetime
        self._clock = clock

    def __repr__(self) -> str:  # never the key or the secret
        return f"AuthTokenMinter(allowed_models={self.allowed_models!r})"

    def answer(self, target: str, headers: Mapping[str, str], body: bytes) -> HttpAnswer:
        key = headers.get("x-goog-api-key") or ", ".join(parse_qs(target.partition("?")[2]).get("key", []))
        if not key:
            return _error(http.HTTPStatus.FORBIDDEN, "PERMISSION_DENIED", UNREGISTERED)
        if not hmac.compare_digest(key.encode("utf-8", "replace"), self._mint_key):
            log.warning("auth_tokens: refused a request with a wrong key")
            return _error(http.HTTPStatus.BAD_REQUEST, "INVALID_ARGUMENT", BAD_KEY)
        try:
            request = json.loads(body or b"{}")
        except (ValueError, UnicodeDecodeError, RecursionError):
            return _invalid("Invalid JSON payload received.")
        if not isinstance(request, dict):
            return _invalid("Invalid JSON payload received.")
        try:
            return self._mint(request)
        except _Refused as exc:
            return _invalid(str(exc))

    def _mint(self, request: Mapping[str, Any]) -> HttpAnswer:
        now = self._clock()
        unknown = set(request) - {"uses", "expireTime", "newSessionExpireTime", "bidiGenerateContentSetup", "fieldMask"}
        if unknown:
            raise _Refused(f'Invalid JSON payload received. Unknown name "{sorted(unknown)[0][:60]}": Cannot find field.')
        uses = request.get("uses", 1)
        if isinstance(uses, str) and uses.isdigit():
            uses = int(uses)  # int32 fields may come as JSON strings
        if isinstance(uses, bool) or not isinstance(uses, int) or uses < 0:
            raise _Refused("uses must be a whole number, 0 (no limit) or more.")
        # The service's defaults, within this server's limit; what a request
        # asks beyond it is refused, as the service refuses what is past its own.
        longest = LONGEST_SECONDS if self.max_lifetime is None else min(LONGEST_SECONDS, self.max_lifetime)
        expire = _time(request.get("expireTime"), "expireTime", now, min(DEFAULT_EXPIRE_SECONDS, longest))
        new_sessions = _time(
            request.get("newSessionExpireTime"), "newSessionExpireTime", now, min(DEFAULT_NEW_SESSION_SECONDS, longest)
        )
        if new_sessions > expire:
            raise _Refused("newSessionExpireTime must not be later than expireTime.")
        if self.max_lifetime is not None:
            for name, at in (("newSessionExpireTime", new_sessions), ("expireTime", expire)):
                if at - now > self.max_lifetime + LEEWAY_SECONDS:
                    raise _Refused(
                        f"{name} is more than {self.max_lifetime:g} s away: this server accepts tokens "
                        "valid for at most that long (--max-token-lifetime)."
                    )
        live = None
        setup = request.get("bidiGenerateContentSetup")
        if setup is not None:
            live = {"setup": self._setup(setup), "lock": _lock(request.get("fieldMask"))}
        elif _lock(request.get("fieldMask")) is not None:
            raise _Refused("fieldMask needs bidiGenerateContentSetup.")
        token = mint_token(
            self._secret,
            ttl=max(new_sessions - now, 1.0),
            agent=self.agent,
            issuer=self.issuer,
            now=now,
            uses=uses,
            ends_at=expire,
            live=live,
        )
        if len(token) > MAX_TOKEN_CHARS:
            raise _Refused(
                f"The locked setup makes a token of {len(token)} characters; an app sends its token in a "
                f"header or in the URL, which hold about {MAX_TOKEN_CHARS}. Lock fewer or shorter fields "
                "(a long instruction belongs in the server's agent or its --gemini-policy)."
            )
        log.info("auth_tokens: minted a token for %d session(s), new sessions for %.0f s", uses, new_sessions - now)
        answer = {
            "name": "auth_tokens/" + token,
            "expireTime": _rfc3339(expire),
            "newSessionExpireTime": _rfc3339(new_sessions),
            "uses": uses,
        }
        return HttpAnswer(http.HTTPStatus.OK.value, json.dumps(answer).encode(), "application/json; charset=utf-8")

    def _setup(self, setup: Any) -> dict[str, Any]:
        """The locked setup, checked as the endpoint checks an app's setup."""
        if not isinstance(setup, dict):
            raise _Refused("bidiGenerateContentSetup must be an object.")
        setup = {camel_name(name): value for name, value in setup.items()}
        if isinstance(setup.get("systemInstruction"), str):
            # As a Content, so that a lock on its parts takes the token's words.
            setup["systemInstruction"] = {"parts": [{"text": setup["systemInstruction"]}]}
        unknown = set(setup) - _SETUP_FIELDS
        if unknown:
            raise _Refused(f'Invalid JSON payload received. Unknown name "{sorted(unknown)[0][:60]}" at \'bidi_generate_content_setup\': Cannot find field.')
        model = setup.get("model")
        if model is not None:
            if not isinstance(model, str):
                raise _Refused("bidiGenerateContentSetup.model must be a model's name.")
            if not model.startswith("models/"):
                model = setup["model"] = "models/" + model
            if not any(fnmatch.fnmatchcase(model.removeprefix("models/"), p) for p in self.allowed_models):
                raise _Refused(not_found(model, "v1alpha"))
        try:
            check_setup(setup, GeminiPolicy())
        except ProtocolError as exc:
            raise _Refused(exc.message) from None
        return setup


def constrained_setup(app: Mapping[str, Any], token: Mapping[str, Any], lock: list[str] | None) -> dict[str, Any]:
    """The setup a session runs with: the app's, with what the token locks taken from the token.

    `lock` None: the token's setup is all of it (the app's is not read but for
    its model, when the token names none). Otherwise each path in `lock`
    ("systemInstruction", "generationConfig.temperature") is the token's value
    there, or absent if the token has none; the rest is the app's.
    """
    app = {camel_name(name): value for name, value in app.items()}
    if lock is None:
        merged = copy.deepcopy(dict(token))
        merged.setdefault("model", app.get("model"))
        return merged
    merged = copy.deepcopy(app)
    for path in ["model", *lock] if token.get("model") else lock:
        head, _, rest = path.partition(".")
        head = camel_name(head)
        if not rest:
            if head in token:
                merged[head] = copy.deepcopy(token[head])
            else:
                merged.pop(head, None)
            continue
        inner = merged.get(head)
        inner = {camel_name(k): v for k, v in inner.items()} if isinstance(inner, Mapping) else {}
        value = get_field(token.get(head), camel_name(rest))
        if value is None:
            inner.pop(camel_name(rest), None)
        else:
            inner[camel_name(rest)] = copy.deepcopy(value)
        merged[head] = inner
    return merged


class _Refused(Exception):
    """A request the service answers 400 INVALID_ARGUMENT, saying why."""


def _lock(field_mask: Any) -> list[str] | None:
    """The paths a token locks; None: the whole setup (no mask, or an empty one)."""
    if field_mask is None:
        return None
    if isinstance(field_mask, list):
        paths = field_mask
    elif isinstance(field_mask, str):
        paths = field_mask.split(",")
    else:
        raise _Refused("fieldMask must be a comma-separated list of field paths.")
    if not all(isinstance(p, str) for p in paths):
        raise _Refused("fieldMask must be a comma-separated list of field paths.")
    paths = [p.strip() for p in paths if p.strip()]
    if not paths:
        return None  # empty: the setup is all the token's, never none of it
    for path in paths:
        head, _, rest = path.partition(".")
        if camel_name(head) not in _SETUP_FIELDS:
            raise _Refused(f"fieldMask names a field the setup does not have: {path[:80]!r}.")
        if rest and (camel_name(head) not in _OBJECT_FIELDS or "." in rest or not rest.strip()):
            raise _Refused(
                f"fieldMask: {path[:80]!r} cannot be locked on its own; lock {head!r} whole "
                "(a field of one of the setup's objects, such as generationConfig.temperature, may be named alone)."
            )
    return paths


def _time(value: Any, name: str, now: float, default: float) -> float:
    if value is None:
        return now + default
    if not isinstance(value, str):
        raise _Refused(f"{name} must be a time (RFC 3339).")
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise _Refused(f"{name} must be a time (RFC 3339), not {value[:60]!r}.") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    at = moment.timestamp()
    if at <= now:
        raise _Refused(f"{name} must be in the future.")
    if at - now > LONGEST_SECONDS + LEEWAY_SECONDS:
        raise _Refused(f"{name} must be less than 20 hours in the future.")
    return at


def _rfc3339(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.UTC).isoformat().replace("+00:00", "Z")


def camel_name(name: str) -> str:
    """A field's name as the service spells it in JSON (system_instruction: systemInstruction)."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _invalid(message: str) -> HttpAnswer:
    return _error(http.HTTPStatus.BAD_REQUEST, "INVALID_ARGUMENT", message)


def _error(status: http.HTTPStatus, name: str, message: str) -> HttpAnswer:
    """An error as Google's APIs write one (google-genai raises it as `errors.APIError`)."""
    body = {"error": {"code": status.value, "message": message, "status": name}}
    return HttpAnswer(status.value, json.dumps(body).encode(), "application/json; charset=utf-8")
