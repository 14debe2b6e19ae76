"""Every parser a stranger reaches before authentication, each with its contract.

A target takes one input (structured: what the parser is handed) and checks
what the server promises of it: no exception but the parser's documented
error type escapes, the answer is an answer (a status, an error value), and
nothing is logged as an error or with a traceback. A broken promise raises.

The property-based tests (`tests/test_fuzz_*.py`, hypothesis) draw structured
inputs; the coverage-guided fuzzer (`python -m bench.fuzz`, atheris) makes
them from bytes with each target's `from_bytes`, starting from its `seeds`.

Targets:

- `http_request`: the POST port's request reader (`live.net.http_request`), fed
  the bytes a connection reads, in chunks;
- `twilio_webhook`, `telnyx_webhook`, `auth_tokens`: the POST routes, as the
  listener hands them a request (half the time signed or keyed as the carrier
  or backend would, so what is read after the check is reached too);
- `port_request`: the WebSocket port's and the metrics port's HTTP routes
  (`LiveServer._process_request`, `_metrics_only`), with the request as
  either WebSocket layer builds it;
- `native_door`, `gemini_door`, `twilio_door`, `telnyx_door`: each door's
  frames, from its first (`opening`) to those of a started session (`inputs`);
- `tokens`: session tokens (unsigned, and signed with any claims), call
  tokens, resume tokens, Telnyx's webhook signatures.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import json
import logging
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode

__all__ = ["TARGETS", "Target", "LoudLog"]

SECRET = "a-token-secret-long-enough-for-hs256-signing"
TWILIO_AUTH_TOKEN = "0123456789abcdef0123456789abcdef"
MINT_KEY = "a-backends-mint-key-for-fuzzing"
PUBLIC_URL = "https://voice.example.com"
MODEL = "gemini-live-2.5-flash-preview"
AGENT = "fuzzed"
# Frames in `from_bytes`: 0xFF never occurs in UTF-8, so it parts frames; a part
# that is not UTF-8 is a binary frame.
FRAME_SEPARATOR = b"\xff"
# The statuses an answer may carry.
HTTP_POST_STATUSES = frozenset({200, 400, 403, 404, 405, 408, 409, 413, 414, 429, 431, 501, 502, 503, 505})
PORT_STATUSES = frozenset({200, 400, 403, 404, 503})


class LoudLog(logging.Handler):
    """Fails a target that logs an error, or any record with a traceback, under `live`."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.loud: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR or record.exc_info:
            self.loud.append(f"{record.name}: {record.getMessage()}")


@contextlib.contextmanager
def quiet_or_fail() -> Iterator[None]:
    """Run a target's body; fail it if it logged loudly."""
    handler = LoudLog()
    logger = logging.getLogger("live")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
    assert not handler.loud, handler.loud


def run_sync(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """A coroutine that never waits on I/O (the handlers, with the carriers' REST
    API stubbed), run to its end here."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise AssertionError("the coroutine waited on something")


def _parts(data: bytes) -> list[str | bytes]:
    """Frames from bytes: parted at 0xFF; UTF-8 parts are text frames, others binary."""
    frames: list[str | bytes] = []
    for part in data.split(FRAME_SEPARATOR):
        try:
            frames.append(part.decode("utf-8"))
        except UnicodeDecodeError:
            frames.append(part)
    return frames


def _head(data: bytes) -> tuple[str, list[tuple[str, str]]]:
    """A request's path and headers, from `path\\nName: value\\n...` (as picows
    reads them: the path as ASCII with escapes, values as Latin-1)."""
    lines = data.decode("latin-1").split("\n")
    path = lines[0].encode("latin-1").decode("ascii", "surrogateescape")
    headers = []
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.append((name, value.strip()))
    return path, headers


# ---------------------------------------------------------------------- the POST port


def http_request(chunks: Sequence[bytes]) -> None:
    """The POST port's reader: every connection's bytes end in a request or an answer."""
    from live.net.http_request import HttpAnswer, PostRequest, RequestReader

    reader = RequestReader()
    outcome: object = None
    for chunk in [*(c for c in chunks if c), b""]:
        outcome = reader.feed(chunk)
        if outcome is not None:
            break
    assert isinstance(outcome, (PostRequest, HttpAnswer)), outcome
    if isinstance(outcome, PostRequest):
        assert outcome.target.startswith("/") and outcome.target.startswith(outcome.path)
        assert len(outcome.body) <= 64 << 10
        answer = HttpAnswer(200, b"ok\n")
    else:
        assert outcome.status in HTTP_POST_STATUSES, outcome
        answer = outcome
    assert reader.respond(answer).startswith(b"HTTP/1.1 %d " % answer.status)


@dataclasses.dataclass(frozen=True)
class Posted:
    """A request as the POST listener hands it to a route, and whether the
    carrier (or backend) signed or keyed it."""

    query: str
    headers: Mapping[str, str]
    body: bytes
    signed: bool


def _posted(data: bytes) -> Posted:
    signed = bool(data[:1]) and data[0] % 2 == 1
    query, _, body = data[1:].partition(b"\n")
    return Posted(query.decode("ascii", "replace"), {}, body, signed)


class _Answering:
    """Telnyx's Call Control API, answering every call at once (no network)."""

    async def answer(self, call_id: str, **_: Any) -> None:
        return None


@functools.cache
def _routes() -> dict[str, Callable[..., Any]]:
    from live.doors.gemini_tokens import AUTH_TOKENS_PATH, AuthTokenMinter
    from live.phone.calls import CallTokens
    from live.phone.lines import TELNYX_CALL_PATH, TWILIO_VOICE_PATH
    from live.phone.telnyx import TelnyxCallWebhook
    from live.phone.webhooks import TwilioVoiceWebhook

    tokens = CallTokens(SECRET, agent=AGENT)
    public_key = base64.b64encode(_telnyx_key().public_key().public_bytes_raw()).decode()
    return {
        TWILIO_VOICE_PATH: TwilioVoiceWebhook(TWILIO_AUTH_TOKEN, PUBLIC_URL, tokens).answer,
        TELNYX_CALL_PATH: TelnyxCallWebhook(public_key, _Answering(), "wss://media.example.com/telnyx/media", tokens).answer,  # type: ignore[arg-type]
        AUTH_TOKENS_PATH: AuthTokenMinter(MINT_KEY, SECRET, allowed_models=[MODEL], agent=AGENT, max_lifetime=3600).answer,
    }


@functools.cache
def _telnyx_key() -> Any:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.from_private_bytes(bytes(range(32)))


def _route(path: str, request: Posted, headers: Mapping[str, str]) -> None:
    """One request through the listener's routing to its handler: an answer, never a 500."""
    from live.net.http_post import PostListener
    from live.net.http_request import HttpAnswer, PostRequest

    target = path + (f"?{request.query}" if request.query else "")
    merged = {**{k.lower(): v for k, v in request.headers.items()}, **headers}
    listener = PostListener(_routes(), "127.0.0.1", 0)
    with quiet_or_fail():
        answer = run_sync(listener._route(PostRequest("POST", target, path, merged, request.body)))
    assert isinstance(answer, HttpAnswer) and answer.status in HTTP_POST_STATUSES, answer
    assert answer.status != 500


def twilio_webhook(request: Posted) -> None:
    from twilio.request_validator import RequestValidator

    from live.phone.lines import TWILIO_VOICE_PATH
    from live.phone.webhooks import _Form

    headers: dict[str, str] = {}
    if request.signed:
        try:
            params = _Form(parse_qsl(request.body.decode("utf-8"), keep_blank_values=True))
        except UnicodeDecodeError:
            params = _Form([])
        url = PUBLIC_URL + TWILIO_VOICE_PATH + (f"?{request.query}" if request.query else "")
        headers["x-twilio-signature"] = RequestValidator(TWILIO_AUTH_TOKEN).compute_signature(url, params)
    _route(TWILIO_VOICE_PATH, request, headers)


def telnyx_webhook(request: Posted) -> None:
    from live.phone.lines import TELNYX_CALL_PATH

    headers: dict[str, str] = {}
    if request.signed:
        timestamp = str(int(time.time()))
        signature = _telnyx_key().sign(timestamp.encode() + b"|" + request.body)
        headers = {"telnyx-timestamp": timestamp, "telnyx-signature-ed25519": base64.b64encode(signature).decode()}
    _route(TELNYX_CALL_PATH, request, headers)


def auth_tokens(request: Posted) -> None:
    from live.doors.gemini_tokens import AUTH_TOKENS_PATH

    _route(AUTH_TOKENS_PATH, request, {"x-goog-api-key": MINT_KEY} if request.signed else {})


# ---------------------------------------------------------------------- the WebSocket port


@dataclasses.dataclass(frozen=True)
class PortRequest:
    """An HTTP request on the serving or metrics port, and its peer's address."""

    path: str
    headers: Sequence[tuple[str, str]]
    peer: str = "127.0.0.1"


class _Peer:
    """The connection-to-be `process_request` is handed: only its peer's address."""

    def __init__(self, peer: str) -> None:
        self.remote_address = (peer, 40000)
        self.request = None


@functools.cache
def _server() -> Any:
    from connections.local_echo import LocalEcho
    from live.agent import Agent
    from live.doors import NativeDoor
    from live.doors.gemini_live import gemini_doors
    from live.phone.lines import PhoneLines
    from live.server.config import ServerConfig
    from live.server.port import LiveServer

    lines = PhoneLines.twilio(TWILIO_AUTH_TOKEN, PUBLIC_URL, agent=AGENT, token_secret=SECRET)
    doors = {**lines.mounted_on({"/live": NativeDoor}), **gemini_doors([MODEL])}
    config = ServerConfig(port=0, token_secret=SECRET, allowed_origins=("https://app.example",), metrics_allow_ips=("10.0.0.0/8",))
    return LiveServer(Agent(name=AGENT, model="local/echo"), LocalEcho(), config, doors=doors)


def port_request(request: PortRequest) -> None:
    """Both ports' routes: a response with a status, or None (the upgrade goes on)."""
    from websockets.datastructures import Headers
    from websockets.exceptions import InvalidHeader
    from websockets.http11 import Request, Response

    server = _server()
    try:
        # What the WebSocket layers build from the bytes (picows: `live.net.websocket.serve`).
        built = Request(request.path, Headers(list(request.headers)))
    except (UnicodeError, ValueError, InvalidHeader):
        return  # the layer itself answers 400
    with quiet_or_fail():
        for route in (server._process_request, server._metrics_only):
            answer = route(_Peer(request.peer), built)
            assert answer is None or (isinstance(answer, Response) and answer.status_code in PORT_STATUSES), answer
            if answer is None:
                assert route == server._process_request
                # An upgrade goes on to its door: made from the request, it reads its handshake.
                from live.server.port import route_path

                door = server.doors[route_path(built.path)](built)
                door.credential()


# ---------------------------------------------------------------------- doors


def _door_frames(door: Any, frames: Sequence[str | bytes], *, authorize: bool = False) -> None:
    """A door's frames as a session reads them: opening until it starts, then inputs.
    Only `ProtocolError` may escape a frame, and only a fatal one ends the socket."""
    from live.doors.base import FrontDoor
    from live.protocol import ErrorEvent, ProtocolError, SessionClose, SessionResume, SessionStart

    assert isinstance(door, FrontDoor)
    started = False
    with quiet_or_fail():
        for frame in frames:
            try:
                if not started:
                    opening = door.opening(frame)
                    assert opening is None or isinstance(opening, (SessionStart, SessionResume, SessionClose, ErrorEvent)), opening
                    if isinstance(opening, SessionStart):
                        if authorize:
                            assert isinstance(door.authorize(opening.token) or "", str)
                        door.admitted(opening, None)
                        started = True
                    elif isinstance(opening, (SessionResume, SessionClose)):
                        return
                else:
                    list(door.inputs(frame))
            except ProtocolError as exc:
                assert isinstance(exc.code, str) and isinstance(exc.message, str)
                if exc.fatal:
                    return


def native_door(frames: Sequence[str | bytes]) -> None:
    from live.doors import NativeDoor

    _door_frames(NativeDoor(None), frames)


@dataclasses.dataclass(frozen=True)
class Handshake:
    """A Live API app's handshake: which of the service's paths, its query and headers."""

    path: int
    query: str
    headers: Sequence[tuple[str, str]]


def _gemini_from_bytes(data: bytes) -> tuple[Handshake, list[str | bytes]]:
    head, _, rest = data.partition(FRAME_SEPARATOR)
    path, headers = _head(head)
    index = len(path) % 4
    return Handshake(index, path.partition("?")[2], headers), _parts(rest)


def gemini_door(handshake: Handshake, frames: Sequence[str | bytes]) -> None:
    from websockets.datastructures import Headers
    from websockets.exceptions import InvalidHeader
    from websockets.http11 import Request

    from live.doors.gemini_live import GEMINI_PATHS, gemini_doors

    door_class = gemini_doors([MODEL])[GEMINI_PATHS[0]]
    path = GEMINI_PATHS[handshake.path % len(GEMINI_PATHS)] + (f"?{handshake.query}" if handshake.query else "")
    try:
        request = Request(path, Headers(list(handshake.headers)))
    except (UnicodeError, ValueError, InvalidHeader):
        return  # the WebSocket layer answers 400
    with quiet_or_fail():
        door = door_class(request)
        door.credential()
    _door_frames(door, frames)


def _carrier(door_class: Any) -> Any:
    from live.phone.calls import CallTokens

    return door_class(None, tokens=CallTokens(SECRET, agent=AGENT))


def twilio_door(frames: Sequence[str | bytes]) -> None:
    from live.phone.twilio import TwilioDoor

    _door_frames(_carrier(TwilioDoor), frames, authorize=True)


def telnyx_door(frames: Sequence[str | bytes]) -> None:
    from live.phone.telnyx import TelnyxDoor

    _door_frames(_carrier(TelnyxDoor), frames, authorize=True)


# ---------------------------------------------------------------------- tokens


@dataclasses.dataclass(frozen=True)
class TokenInput:
    """A token as a client sends it, or (`signed`) claims signed with the server's
    secret (what a token's own fields can make the server do), with a Telnyx
    signature and timestamp as a webhook's headers carry them."""

    text: str
    signed: bool = False
    signature: str = ""
    timestamp: str = ""


def _token_from_bytes(data: bytes) -> TokenInput:
    signed = bool(data[:1]) and data[0] % 2 == 1
    text, _, rest = data[1:].partition(b"\n")
    signature, _, timestamp = rest.partition(b"\n")
    try:
        decoded = text.decode("utf-8", "surrogatepass")  # a lone surrogate, as JSON can spell one
    except UnicodeDecodeError:
        decoded = text.decode("utf-8", "replace")
    return TokenInput(decoded, signed, signature.decode("latin-1"), timestamp.decode("latin-1"))


def tokens(token: TokenInput) -> None:
    import jwt

    from live.access.auth import TokenRefused, verify_token
    from live.access.reattach import token_digest, token_matches
    from live.phone.calls import CallTokens
    from live.phone.telnyx import telnyx_signature_problem

    text = token.text
    if token.signed:
        try:
            claims = json.loads(text)
        except (ValueError, RecursionError):
            claims = None
        if isinstance(claims, dict):
            try:
                text = jwt.encode(claims, SECRET, algorithm="HS256")
            except (TypeError, ValueError, OverflowError):
                return  # not claims PyJWT can write: not a token anyone holds
        else:
            text = jwt.api_jws.encode(token.text.encode("utf-8", "surrogatepass"), SECRET, algorithm="HS256")
    with quiet_or_fail():
        for resuming in (False, True):
            try:
                verify_token(text, SECRET, agent=AGENT, resuming=resuming)
            except TokenRefused:
                pass
        problem = CallTokens(SECRET, agent=AGENT).check(text, "CA0123")
        assert problem is None or isinstance(problem, str)
        assert token_matches(text, token_digest("a-resume-token")) is False
        public_key = base64.b64encode(_telnyx_key().public_key().public_bytes_raw()).decode()
        problem = telnyx_signature_problem(public_key, text.encode("utf-8", "surrogatepass"), token.signature, token.timestamp)
        assert isinstance(problem, str)


# ---------------------------------------------------------------------- the list


@dataclasses.dataclass(frozen=True)
class Target:
    """A fuzz target: its check, how it reads an input from bytes, and where mutation starts."""

    name: str
    check: Callable[..., None]
    from_bytes: Callable[[bytes], tuple[Any, ...]]
    seeds: tuple[bytes, ...]


def _frames(*frames: object) -> bytes:
    return FRAME_SEPARATOR.join(f if isinstance(f, bytes) else json.dumps(f).encode() for f in frames)


_TWILIO_START = {"event": "start", "sequenceNumber": "1", "streamSid": "MZ1", "start": {
    "streamSid": "MZ1", "callSid": "CA0123", "customParameters": {"token": "x"},
    "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}}
_TELNYX_START = {"event": "start", "stream_id": "s1", "start": {
    "call_control_id": "v3:1", "client_state": base64.b64encode(b"x").decode(),
    "media_format": {"encoding": "PCMU", "sample_rate": 8000, "channels": 1}}}
_MEDIA = {"event": "media", "media": {"payload": base64.b64encode(b"\xff" * 160).decode(), "chunk": "2"}}

TARGETS: dict[str, Target] = {
    target.name: target
    for target in (
        Target(
            "http_request", http_request, lambda data: (data.split(b"\xfe\xfd\xfc"),),
            (b"POST /twilio/voice?x=1 HTTP/1.1\r\nHost: a\r\nContent-Type: application/x-www-form-urlencoded\r\n"
             b"Content-Length: 9\r\n\r\nCallSid=1",
             b"POST http://a/v1alpha/auth_tokens HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{}\n\r\n0\r\n\r\n"),
        ),
        Target(
            "twilio_webhook", twilio_webhook, lambda data: (_posted(data),),
            (b"\x01\n" + urlencode({"CallSid": "CA0123", "Direction": "inbound", "From": "+1555"}).encode(), b"\x00x=1\nCallSid=CA1"),
        ),
        Target(
            "telnyx_webhook", telnyx_webhook, lambda data: (_posted(data),),
            (b"\x01\n" + json.dumps({"data": {"event_type": "call.initiated", "payload": {
                "direction": "incoming", "call_control_id": "v3:1"}}}).encode(),),
        ),
        Target(
            "auth_tokens", auth_tokens, lambda data: (_posted(data),),
            (b"\x01\n" + json.dumps({"uses": 1, "bidiGenerateContentSetup": {"model": f"models/{MODEL}",
                "generationConfig": {"temperature": 0.5}}, "fieldMask": "generationConfig.temperature"}).encode(),
             b"\x00key=a-backends-mint-key-for-fuzzing\n{}"),
        ),
        Target(
            "port_request", port_request, lambda data: (PortRequest(*_head(data)),),
            (b"/live\nHost: 127.0.0.1\nOrigin: https://app.example\nUpgrade: websocket",
             b"/healthz\nHost: localhost:8765", b"/client/app.js\nHost: [::1]:80",
             b"//ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent?key=k\nHost: 127.0.0.1",
             b"/metrics\nHost: 127.0.0.1\nX-Forwarded-For: 10.1.2.3"),
        ),
        Target(
            "native_door", native_door, lambda data: (_parts(data),),
            (_frames({"type": "session.start", "token": "t", "input_audio": {"rate": 16000}, "history": [
                {"role": "user", "parts": [{"text": "hi"}]}]}, {"type": "text", "text": "hello"},
                {"type": "tool.result", "id": "c1", "name": "f", "response": {"a": 1}},
                {"type": "image", "mime_type": "image/png", "data": ""}, {"type": "playback", "played": 1.5}),
             _frames({"type": "session.resume", "session_id": "s", "resume_token": "r", "last_seq": 3})),
        ),
        Target(
            "gemini_door", gemini_door, _gemini_from_bytes,
            (b"\nx-goog-api-key: k" + FRAME_SEPARATOR + _frames(
                {"setup": {"model": f"models/{MODEL}", "generationConfig": {"responseModalities": ["AUDIO"]},
                           "tools": [{"functionDeclarations": [{"name": "f", "parameters": {"type": "OBJECT"}}]}],
                           "sessionResumption": {}, "realtimeInputConfig": {"automaticActivityDetection": {"disabled": True}}}},
                {"realtimeInput": {"audio": {"mimeType": "audio/pcm;rate=16000", "data": "AAAA"}}},
                {"clientContent": {"turns": [{"role": "user", "parts": [{"text": "hi"}]}], "turnComplete": True}},
                {"toolResponse": {"functionResponses": [{"id": "1", "name": "f", "response": {}}]}}),
             b"x?access_token=t" + FRAME_SEPARATOR + _frames({"setup": {"model": f"models/{MODEL}",
                "sessionResumption": {"handle": "s.r"}}})),
        ),
        Target(
            "twilio_door", twilio_door, lambda data: (_parts(data),),
            (_frames({"event": "connected", "protocol": "Call", "version": "1.0.0"}, _TWILIO_START,
                     {"event": "media", "media": {"track": "inbound", "payload": _MEDIA["media"]["payload"]}},
                     {"event": "dtmf", "dtmf": {"digit": "5"}}, {"event": "mark", "mark": {"name": "1:160"}},
                     {"event": "stop"}),),
        ),
        Target(
            "telnyx_door", telnyx_door, lambda data: (_parts(data),),
            (_frames({"event": "connected", "version": "1.0.0"}, _TELNYX_START, _MEDIA,
                     {"event": "error", "payload": {"code": 1, "title": "t", "detail": "d"}}, {"event": "stop"}),),
        ),
        Target(
            "tokens", tokens, lambda data: (_token_from_bytes(data),),
            (b"\x00eyJhbGciOiJIUzI1NiJ9.e30.x", b"\x01" + json.dumps({"exp": 2e9, "jti": "j", "uses": 2, "ends_at": 2e9,
                                                                  "live": {"setup": {}}}).encode() + b"\nsig\n1700000000"),
        ),
    )
}
