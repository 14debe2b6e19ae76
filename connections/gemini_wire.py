"""The lean wire path for audio: Live frames that carry only audio skip the SDK's per-message work.

A conversation is mostly audio: a 20 ms microphone frame up and a 40 ms reply
chunk down, thousands a minute. For each, google-genai builds and validates
pydantic objects, walks dicts through its converters and re-encodes base64,
which costs several times what the socket and TLS do. Here:

- **Up**: `send_realtime_input(audio=...)` is written from a text template
  taken from the installed SDK's own output (its key names, its base64
  alphabet), with one SIMD base64 encode (pybase64) and no object built.
- **Down**: a `serverContent` frame of reply audio, turn signals and
  transcript fragments (nearly every frame of a conversation; `decode_frame`
  says which) is parsed once (orjson), its audio decoded as canonical base64
  (pybase64, ten times faster
  than `binascii`; anything not canonical is left to the SDK, whose decoder
  refuses some of it), and the message built from empty
  instances with its values (`live.unchecked`: no validation, the shape was
  checked by hand); the connection reads a frame of reply audio alone as
  its model turn's `Content`, without the message around it
  (`LeanSession.frames`). Anything orjson reads differently from `json` (a number,
  a lone surrogate) is outside the accepted shape and goes to the SDK.
  Every other frame (e.g. setup, tool calls, usage, go-away, errors, closes) goes
  through the SDK's own `AsyncSession.receive()`, fed from the same socket, so
  it means exactly what it means on the SDK path.

`calibrate()` checks, once per process and backend, that the fast path gives
what the installed SDK gives: it runs the SDK's real send and receive code on
probe frames (both key casings, both base64 alphabets, signals and transcripts) against an in-memory
socket and compares. If anything differs, or the SDK's session lacks what the
fast path relies on, sessions use the SDK's own path and one log line says why.
`Gemini(wire="sdk")` chooses the SDK's path outright.

`lean_session()` also has the SDK dial a picows socket (`connections.live_socket`)
in place of websockets': the same frames, framed in compiled code.
"""

from __future__ import annotations

import binascii
import collections
import contextlib
import dataclasses
import functools
import json
import logging
import re
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

import orjson
import pybase64
import pydantic
import websockets
from google.genai import live as genai_live
from google.genai import types

from connections.live_socket import dialed_here, dialing
from live.unchecked import unchecked

__all__ = ["LeanSession", "WireCodec", "calibrate", "fits_template", "lean_session"]

logger = logging.getLogger(__name__)

_URLSAFE_TO_STANDARD: Final = str.maketrans("-_", "+/")
# A mime type that needs no JSON escaping and cannot break the template.
_PLAIN_MIME: Final = re.compile(r"[A-Za-z0-9/;=.+\-]+\Z")
# Bytes whose base64 holds both alphabet-specific characters ('+/' or '-_').
_PROBE: Final = bytes([0xFB, 0xFF, 0xBF]) * 4 + b"live"
_PROBE_MIME: Final = "audio/pcm;rate=16000"


class _NoFrame(Exception):
    """The in-memory socket has no frame queued: the SDK asked for one more."""


class _FrameSocket:
    """Stands in for the SDK's socket: hands it frames (or a close) we read, keeps what it sends."""

    def __init__(self) -> None:
        self._frames: collections.deque[bytes | BaseException] = collections.deque()
        self.sent: list[str] = []

    def put(self, item: bytes | BaseException) -> None:
        self._frames.append(item)

    async def recv(self, decode: bool | None = None) -> bytes:
        if not self._frames:
            raise _NoFrame
        item = self._frames.popleft()
        if isinstance(item, BaseException):
            raise item
        return item

    async def send(self, message: str) -> None:
        self.sent.append(message)

    async def close(self, *args: Any, **kwargs: Any) -> None:
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class WireCodec:
    """How this SDK writes an audio frame, and whether bare audio chunks may be decoded by hand.

    `head` + base64(data) + `middle` + mime type + `tail` is exactly the SDK's
    text for `send_realtime_input(audio=Blob(data, mime_type))`; `urlsafe` says
    which alphabet it uses. Built only by `calibrate()`.
    """

    head: str
    middle: str
    tail: str
    urlsafe: bool
    decode_frames: bool

    def encode_audio(self, data: bytes | None, mime_type: str | None) -> str | None:
        """The SDK's text for an audio frame, or None when it cannot be written from the template
        (see `fits_template`)."""
        if not fits_template(data, mime_type):
            return None
        encoded = pybase64.b64encode(data, altchars=b"-_" if self.urlsafe else None)
        return f"{self.head}{encoded.decode('ascii')}{self.middle}{mime_type}{self.tail}"

    def decode(self, raw: bytes | str) -> types.LiveServerMessage | types.Content | None:
        """What a common `serverContent` frame means (see `decode_lean`); None for any other."""
        if not self.decode_frames:
            return None
        return decode_lean(raw)


def fits_template(data: Any, mime_type: str | None) -> bool:
    """Whether an audio frame can be written from the SDK's template: bytes, and a
    mime type that needs no JSON escaping (else the SDK writes it)."""
    return type(data) is bytes and mime_type is not None and _plain_mime(mime_type)


@functools.lru_cache(maxsize=64)
def _plain_mime(mime_type: str) -> bool:
    """Whether `mime_type` goes into the template as it is (a session sends one or two)."""
    return _PLAIN_MIME.match(mime_type) is not None


def _b64decode(text: Any) -> bytes | None:
    """Canonical base64 in one alphabet or the other; None for anything else.

    Canonical: padded, and the unused bits of the last character zero, which
    is what the SDK's decoder (pydantic's) insists on; it also takes unpadded
    text, which is rare enough to leave to it.
    """
    if type(text) is not str:
        return None
    altchars = None
    try:
        data = pybase64.b64decode(text, validate=True)
    except ValueError:  # binascii.Error too
        if "+" in text or "/" in text:
            return None  # not standard base64, and not URL-safe either
        altchars = b"-_"
        try:
            data = pybase64.b64decode(text, altchars=altchars, validate=True)
        except ValueError:
            return None
    if pybase64.b64encode_as_string(data, altchars=altchars) != text:
        return None  # "QR==" is b"A" to some decoders and an error to the SDK's
    return data


_CONTENT_KEYS: Final = frozenset({"parts", "role"})

# Empty instances, copied with the message's values (`live.unchecked`): values
# set, nothing validated, the same objects `model_copy(update=...)` makes.
_MESSAGE: Final = types.LiveServerMessage.model_construct()
_SERVER_CONTENT: Final = types.LiveServerContent.model_construct()
_CONTENT: Final = types.Content.model_construct()
_PART: Final = types.Part.model_construct()
_BLOB: Final = types.Blob.model_construct()
_SET_MESSAGE: Final = frozenset({"server_content"})
_SET_SERVER_CONTENT: Final = frozenset({"model_turn"})
_SET_CONTENT: Final = frozenset({"parts"})
_SET_CONTENT_ROLE: Final = frozenset({"parts", "role"})
_SET_PART: Final = frozenset({"inline_data"})
_SET_BLOB: Final = frozenset({"data", "mime_type"})


_TRANSCRIPTION: Final = types.Transcription.model_construct()
# The serverContent fields decoded by hand (camelCase, as the service writes
# them): the reply's audio, the turn's signals, and transcript fragments.
_FLAGS: Final = {"turnComplete": "turn_complete", "generationComplete": "generation_complete", "interrupted": "interrupted"}
_TRANSCRIPTS: Final = {"outputTranscription": "output_transcription", "inputTranscription": "input_transcription"}
_TRANSCRIPT_KEYS: Final = {"text": str, "finished": bool}


def decode_frame(raw: bytes | str) -> types.LiveServerMessage | None:
    """A `serverContent` frame of reply audio, turn signals and transcripts; None for any other.

    `{"serverContent": {...}}` and nothing else, whose fields are among
    `modelTurn` (audio parts only), `turnComplete`, `generationComplete`,
    `interrupted` (booleans), `outputTranscription` and `inputTranscription`
    (`text`, `finished`): what a conversation is made of, frame after frame.
    """
    decoded = decode_lean(raw)
    if type(decoded) is types.Content:
        return _audio_message(decoded)
    return decoded  # type: ignore[return-value]


def _audio_message(model_turn: types.Content) -> types.LiveServerMessage:
    """The message around a bare audio chunk's model turn (see `decode_lean`)."""
    server_content = unchecked(_SERVER_CONTENT, _SET_SERVER_CONTENT, {"model_turn": model_turn})
    return unchecked(_MESSAGE, _SET_MESSAGE, {"server_content": server_content})


def decode_lean(raw: bytes | str) -> types.LiveServerMessage | types.Content | None:
    """`decode_frame`, except that a frame of reply audio alone (nearly every
    frame of a reply) comes as its model turn's `Content`: all a reader of the
    message would take from it, without the two objects around it."""
    try:
        frame = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None  # the SDK's path reports it
    if type(frame) is not dict or len(frame) != 1:
        return None
    sc = frame.get("serverContent")
    if type(sc) is not dict or not sc:
        return None
    if len(sc) == 1 and "modelTurn" in sc:  # the hot path: a bare audio chunk
        return _model_turn(sc["modelTurn"])
    values: dict[str, Any] = {}
    for key, value in sc.items():
        if key == "modelTurn":
            value = _model_turn(value)
            if value is None:
                return None
            values["model_turn"] = value
        elif key in _FLAGS:
            if type(value) is not bool:
                return None
            values[_FLAGS[key]] = value
        elif key in _TRANSCRIPTS:
            if type(value) is not dict or not all(_TRANSCRIPT_KEYS.get(k) is type(v) for k, v in value.items()):
                return None
            values[_TRANSCRIPTS[key]] = unchecked(_TRANSCRIPTION, frozenset(value), value)
        else:
            return None
    server_content = unchecked(_SERVER_CONTENT, frozenset(values), values)
    return unchecked(_MESSAGE, _SET_MESSAGE, {"server_content": server_content})


def _model_turn(turn: Any) -> types.Content | None:
    """`{"parts": [{"inlineData": {...}}, ...], "role"?: str}`: audio parts only."""
    if type(turn) is not dict or not turn.keys() <= _CONTENT_KEYS:
        return None
    role = turn.get("role")
    parts = turn.get("parts")
    if type(parts) is not list or not parts or ("role" in turn and type(role) is not str):
        return None
    built = []
    for part in parts:
        if type(part) is not dict or len(part) != 1:
            return None
        blob = part.get("inlineData", part.get("inline_data"))
        if type(blob) is not dict or len(blob) != 2:
            return None
        mime = blob.get("mimeType", blob.get("mime_type"))
        if type(mime) is not str or not mime.startswith("audio/"):
            return None
        data = _b64decode(blob.get("data"))
        if data is None:
            return None
        inline = unchecked(_BLOB, _SET_BLOB, {"data": data, "mime_type": mime})
        built.append(unchecked(_PART, _SET_PART, {"inline_data": inline}))
    if role is None:
        return unchecked(_CONTENT, _SET_CONTENT, {"parts": built})
    return unchecked(_CONTENT, _SET_CONTENT_ROLE, {"parts": built, "role": role})


# ---------------------------------------------------------------------------- calibration

_calibrated: dict[bool, tuple[WireCodec | None, str]] = {}
_warned_no_socket = False
_warned_not_dialed = False  # said once a process: the lean wire is not on the picows socket


def _probe_frames() -> list[bytes]:
    """Frames as the service might write them: audio in both casings and alphabets, with and
    without a role; turn signals; transcripts; all of these at once."""
    standard = binascii.b2a_base64(_PROBE, newline=False).decode()
    urlsafe = standard.translate(str.maketrans("+/", "-_"))
    frames = []
    for data in (standard, urlsafe):
        for part_key, mime_key in (("inlineData", "mimeType"), ("inline_data", "mime_type")):
            for role in ({}, {"role": "model"}):
                part = {part_key: {mime_key: "audio/pcm;rate=24000", "data": data}}
                frames.append(json.dumps({"serverContent": {"modelTurn": {"parts": [part, part], **role}}}).encode())
    signals: list[dict[str, Any]] = [
        {"turnComplete": True},
        {"generationComplete": True},
        {"interrupted": True},
        {"turnComplete": False},
        {"outputTranscription": {"text": "Bonjour à tous", "finished": False}},
        {"inputTranscription": {"text": "hi"}},
        {"inputTranscription": {"finished": True}},
        {"outputTranscription": {}},
        {
            "modelTurn": {"parts": [{"inlineData": {"mimeType": "audio/pcm;rate=24000", "data": standard}}]},
            "outputTranscription": {"text": "hi"},
            "generationComplete": True,
            "turnComplete": True,
        },
    ]
    frames.extend(json.dumps({"serverContent": signal}).encode() for signal in signals)
    return frames


def _same(a: Any, b: Any) -> bool:
    """Equal values and equal sets of given fields, all the way down (the mapper reads both)."""
    if isinstance(a, pydantic.BaseModel) or isinstance(b, pydantic.BaseModel):
        if type(a) is not type(b) or a.model_fields_set != b.model_fields_set:
            return False
        return all(_same(getattr(a, name), getattr(b, name)) for name in type(a).model_fields)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


async def _sdk_send_text(api_client: Any, data: bytes, mime_type: str) -> str:
    socket = _FrameSocket()
    session = genai_live.AsyncSession(api_client=api_client, websocket=socket)  # type: ignore[arg-type]
    await session.send_realtime_input(audio=types.Blob(data=data, mime_type=mime_type))
    (text,) = socket.sent
    return text


async def _sdk_receive_one(api_client: Any, raw: bytes) -> types.LiveServerMessage:
    socket = _FrameSocket()
    socket.put(raw)
    session = genai_live.AsyncSession(api_client=api_client, websocket=socket)  # type: ignore[arg-type]
    stream = session.receive()
    try:
        return await stream.__anext__()
    finally:
        with contextlib.suppress(_NoFrame):
            await stream.aclose()


async def _build(api_client: Any) -> tuple[WireCodec | None, str]:
    try:
        text = await _sdk_send_text(api_client, _PROBE, _PROBE_MIME)
    except Exception as exc:  # noqa: BLE001 - any SDK change here means: use the SDK
        return None, f"the SDK's audio send could not be observed ({type(exc).__name__}: {exc})"
    standard = binascii.b2a_base64(_PROBE, newline=False).decode()
    urlsafe = standard.translate(str.maketrans("+/", "-_"))
    if text.count(urlsafe) == 1:
        encoded, is_urlsafe = urlsafe, True
    elif text.count(standard) == 1:
        encoded, is_urlsafe = standard, False
    else:
        return None, "the SDK's audio frame does not hold the data as base64 once"
    head, rest = text.split(encoded)
    if rest.count(_PROBE_MIME) != 1 or _PROBE_MIME in head:
        return None, "the SDK's audio frame does not hold the mime type once, after the data"
    middle, tail = rest.split(_PROBE_MIME)
    codec = WireCodec(head, middle, tail, is_urlsafe, decode_frames=True)
    # A second frame, other data and rate: the template must give the SDK's text exactly.
    check = bytes(range(256)) * 3
    if codec.encode_audio(check, "audio/pcm;rate=8000") != await _sdk_send_text(api_client, check, "audio/pcm;rate=8000"):
        return None, "an audio frame written from the SDK's template differs from the SDK's own"
    for raw in _probe_frames():
        try:
            expected = await _sdk_receive_one(api_client, raw)
        except Exception:  # noqa: BLE001 - the SDK refuses this shape: so must we
            if decode_frame(raw) is not None:
                return dataclasses.replace(codec, decode_frames=False), (
                    "the SDK refuses a frame the fast path would take; frames from the model use the SDK"
                )
            continue
        if not _same(decode_frame(raw), expected):
            return dataclasses.replace(codec, decode_frames=False), (
                "a frame decoded by hand differs from the SDK's decoding; frames from the model use the SDK"
            )
    return codec, ""


async def calibrate(api_client: Any) -> WireCodec | None:
    """The codec this SDK allows, or None (with one log line per process and backend) to use the SDK's path."""
    vertex = bool(getattr(api_client, "vertexai", False))
    if vertex not in _calibrated:
        codec, why = await _build(api_client)
        _calibrated[vertex] = (codec, why)
        if why:
            logger.warning("Gemini wire: %s (google-genai %s)", why, _sdk_version())
        else:
            logger.debug("Gemini wire: the lean path matches google-genai %s", _sdk_version())
    return _calibrated[vertex][0]


def _sdk_version() -> str:
    from google.genai import version

    return version.__version__


# ---------------------------------------------------------------------------- the session


class LeanSession:
    """An SDK `AsyncSession` whose audio, transcript and turn-signal frames skip the SDK's per-message work.

    Everything else is the SDK's: other sends go to the wrapped session, other
    received frames are decoded by an SDK session reading from an in-memory
    socket we fill from the real one, so errors and closes surface as the SDK
    raises them.
    """

    def __init__(self, session: genai_live.AsyncSession, codec: WireCodec) -> None:
        self._session = session
        self._codec = codec
        self._ws = session._ws  # noqa: SLF001 - the socket the fast path writes to and reads from
        # A socket that can write synchronously (`live.net.websocket`) and say when it would not wait.
        self._send_now: Callable[[str], None] | None = getattr(self._ws, "send_nowait", None)
        self._can_send_now: Callable[[], bool] | None = getattr(self._ws, "can_send_now", None)
        self._frames = _FrameSocket()
        self._decoder = genai_live.AsyncSession(api_client=session._api_client, websocket=self._frames)  # type: ignore[arg-type]  # noqa: SLF001

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    async def send_realtime_input(self, **kwargs: Any) -> None:
        audio = kwargs.get("audio")
        if len(kwargs) == 1 and type(audio) is types.Blob:
            await self.send_audio(audio)
            return
        await self._session.send_realtime_input(**kwargs)

    async def send_audio(self, audio: types.Blob) -> None:
        """`send_realtime_input(audio=audio)`, written from the SDK's template when it allows."""
        text = self._codec.encode_audio(audio.data, audio.mime_type)
        if text is None:
            await self._session.send_realtime_input(audio=audio)
        else:
            await self._ws.send(text)

    def send_audio_nowait(self, audio: types.Blob) -> bool:
        """`send_audio(audio)` done at once, when the socket takes it without
        waiting and can write synchronously (`live.net.websocket`); whether it was sent."""
        send_now, can_send_now = self._send_now, self._can_send_now
        if send_now is None or can_send_now is None or not can_send_now():
            return False
        text = self._codec.encode_audio(audio.data, audio.mime_type)
        if text is None:
            return False
        send_now(text)
        return True

    async def send_client_content(self, **kwargs: Any) -> None:
        await self._session.send_client_content(**kwargs)

    async def send_tool_response(self, **kwargs: Any) -> None:
        await self._session.send_tool_response(**kwargs)

    async def close(self) -> None:
        await self._session.close()

    async def receive(self) -> AsyncIterator[types.LiveServerMessage]:
        """Messages up to the end of a turn, like the SDK's `receive()`."""
        async with contextlib.aclosing(self.frames()) as frames:
            async for item in frames:
                if type(item) is types.Content:
                    yield _audio_message(item)
                    continue
                message, turn_ends = item
                yield message
                if turn_ends:
                    return

    async def frames(self) -> AsyncIterator[types.Content | tuple[types.LiveServerMessage, bool]]:
        """Every frame of the connection, across turns, until its socket closes
        (then the SDK's error for the close is raised, as its `receive()` raises it).

        A frame of reply audio alone comes as its model turn's `Content` (see
        `decode_lean`); every other as its message and whether the SDK's
        `receive()` would stop after it.
        """
        decode = self._codec.decode
        while True:
            try:
                raw = await self._ws.recv(decode=False)
            except websockets.ConnectionClosed as exc:
                raw = exc  # the SDK turns it into its own error, below
            else:
                decoded = decode(raw)
                if type(decoded) is types.Content:
                    yield decoded
                    continue
                if decoded is not None:
                    # As the SDK's receive() does (no interactionStatus here).
                    yield decoded, bool(decoded.server_content.turn_complete)  # type: ignore[union-attr]
                    continue
            yield await self._sdk_decode(raw)

    async def _sdk_decode(self, raw: bytes | BaseException) -> tuple[types.LiveServerMessage, bool]:
        """The SDK's message for one frame, and whether its `receive()` would stop after it."""
        self._frames.put(raw)
        stream = self._decoder.receive()
        try:
            message = await stream.__anext__()
            try:
                await stream.__anext__()
            except StopAsyncIteration:
                return message, True
            except _NoFrame:
                return message, False
            raise RuntimeError("the SDK's receive() read a frame it was not given")
        finally:
            with contextlib.suppress(_NoFrame):
                await stream.aclose()


@contextlib.asynccontextmanager
async def lean_session(
    connect: contextlib.AbstractAsyncContextManager[genai_live.AsyncSession],
) -> AsyncIterator[genai_live.AsyncSession | LeanSession]:
    """The SDK's session from `connect`, on the lean path when `calibrate()` allows it."""
    async with contextlib.AsyncExitStack() as stack:
        with dialing() as on_picows:
            session = await stack.enter_async_context(connect)
        if on_picows and not dialed_here(getattr(session, "_ws", None)):
            global _warned_not_dialed
            if not _warned_not_dialed:
                _warned_not_dialed = True
                logger.warning("Gemini socket: google-genai %s did not dial through live.net.websocket: the lean "
                               "wire runs on the SDK's own socket, at about 1.6x the CPU per frame", _sdk_version())
        api_client = getattr(session, "_api_client", None)
        if getattr(session, "_ws", None) is None or api_client is None:
            global _warned_no_socket
            if not _warned_no_socket:
                _warned_no_socket = True
                logger.warning("Gemini wire: the SDK's session has no socket to read (google-genai %s); "
                               "using the SDK's path", _sdk_version())
            yield session
            return
        codec = await calibrate(api_client)
        yield session if codec is None else LeanSession(session, codec)
