"""A phone carrier double: places calls to the server as Twilio does, from its public documentation.

It does what Twilio's side of a call does, and shares nothing with the
server's code: it POSTs the voice webhook as a signed form
(`X-Twilio-Signature`: base64 HMAC-SHA1, keyed with the account's auth token,
of the URL followed by each form field's name and value, sorted by name),
reads the TwiML answer, opens the `<Connect><Stream>` WebSocket and speaks
Media Streams on it: `connected`, `start` (the `<Parameter>`s as
`customParameters`), `media` every 20 ms (base64 μ-law; silence while the
caller says nothing), `dtmf`, `stop`. What the server sends back plays at real
time: a `mark` is echoed when the audio before it has played, and `clear`
drops what is buffered and echoes the marks it dropped.

    double = TwilioDouble(auth_token)
    async with double.call("http://127.0.0.1:8766/twilio/voice") as call:
        await call.speak(question_ulaw)
        await call.wait_for_reply()
        heard = call.played()  # the μ-law the caller heard
"""

from __future__ import annotations

import base64
import collections
import contextlib
import dataclasses
import hashlib
import hmac
import json
import secrets
import ssl
import time
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Mapping
from urllib.parse import urlencode, urlsplit

import anyio
import anyio.abc
import h11
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

__all__ = ["CallRefused", "TwilioCall", "TwilioDouble", "twilio_signature"]

FRAME = 160  # 20 ms of μ-law at 8 kHz
FRAME_SECONDS = 0.02
ULAW_SILENCE = b"\xff" * FRAME


class CallRefused(Exception):
    """The server did not take the call: its webhook answer, or the stream's close."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"{status}: {body[:200]}")
        self.status = status
        self.body = body


def twilio_signature(auth_token: str, url: str, params: Mapping[str, str], *, algorithm: str = "HMAC_SHA1") -> str:
    """`X-Twilio-Signature` as Twilio's security documentation defines it: "Twilio
    uses the parameters sent in the webhook (either GET or POST) and the exact
    URL your application supplied to Twilio to create this signature. The
    signature uses the HMAC-SHA1 hashing algorithm with your Twilio account's
    auth token as the secret key." With a Webhooks Rule (`HMAC_SHA256`): "Only
    the hash changes. The signed string is still the full URL followed by the
    sorted POST parameters." """
    data = url + "".join(name + params[name] for name in sorted(params))
    hash_ = {"HMAC_SHA1": hashlib.sha1, "HMAC_SHA256": hashlib.sha256}[algorithm]
    digest = hmac.new(auth_token.encode(), data.encode(), hash_).digest()
    return base64.b64encode(digest).decode()


async def http_post(url: str, form: Mapping[str, str], headers: Mapping[str, str], *,
                    local_host: str | None = None, ssl_context: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    """One POST of a form over HTTP/1.1 (Twilio's webhooks)."""
    return await http_post_raw(url, urlencode(form).encode(), {"Content-Type": "application/x-www-form-urlencoded", **headers},
                               local_host=local_host, ssl_context=ssl_context)


async def http_post_raw(url: str, body: bytes, headers: Mapping[str, str], *,
                        local_host: str | None = None, ssl_context: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    """One POST over HTTP/1.1, or HTTPS for an https:// `url` (trusting
    `ssl_context`'s authorities), from `local_host` (an address of this
    machine) if given; (status, body)."""
    parts = urlsplit(url)
    conn = h11.Connection(h11.CLIENT)
    request = h11.Request(method="POST", target=(parts.path or "/") + (f"?{parts.query}" if parts.query else ""), headers=[
        ("Host", parts.netloc), ("Content-Length", str(len(body))), ("User-Agent", "carrier-double/1.0"), *headers.items(),
    ])
    tls = parts.scheme == "https"
    async with await anyio.connect_tcp(parts.hostname or "127.0.0.1", parts.port or (443 if tls else 80), local_host=local_host,
                                       tls=tls, ssl_context=ssl_context, tls_standard_compatible=False) as stream:
        await stream.send(conn.send(request) + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage()))
        status, answer = 0, bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive())
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                answer += event.data
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                return status, bytes(answer)


def _sid(prefix: str) -> str:
    return prefix + secrets.token_hex(16)


@dataclasses.dataclass
class Heard:
    """What reached the caller's side, with the double's clock (seconds since the call began)."""

    media: list[tuple[float, bytes]] = dataclasses.field(default_factory=list)  # received audio, in 20 ms frames
    messages: list[tuple[float, bytes]] = dataclasses.field(default_factory=list)  # received media messages' payloads
    clears: list[float] = dataclasses.field(default_factory=list)
    marks_echoed: list[str] = dataclasses.field(default_factory=list)
    frames: list[dict] = dataclasses.field(default_factory=list)  # every message, as received


class TwilioCall:
    """One call in progress: the caller's mouth (`speak`, `press`) and ear (`heard`)."""

    def __init__(self, ws, stream_sid: str, call_sid: str, started: float) -> None:
        self.ws = ws
        self.stream_sid = stream_sid
        self.call_sid = call_sid
        self.started = started
        self.heard = Heard()
        self.closed: tuple[int | None, str] | None = None
        self._sequence = 2
        self._chunk = 0
        # The caller's side of the line: 20 ms frames of μ-law (Twilio's only format).
        self.frame_bytes = FRAME
        self.line_silence = ULAW_SILENCE
        self.reply_frame_bytes = FRAME  # what the handset plays per 20 ms of what it gets
        self._outgoing: collections.deque[bytes] = collections.deque()
        # The caller's playback buffer: frames and marks in the order received.
        self._buffer: list[tuple[str, bytes | str]] = []
        self._played: list[bytes] = []
        self._sent_speech_end: float | None = None
        self._got_audio = anyio.Event()
        self.new_twiml: str | None = None  # what the REST API moved the call to
        # The TwiML after </Connect>: "Twilio executes the remaining TwiML
        # instructions only after your server closes the WebSocket connection."
        self.rest_of_twiml: list[tuple[str, str]] = []
        # What the caller heard after the stream ended: those verbs, run when
        # the server closed the stream (not when the call left it, or hung up).
        self.after_stream: list[tuple[str, str]] = []
        self.hung_up_by_caller = False
        self._tasks: anyio.abc.TaskGroup | None = None

    def now(self) -> float:
        return time.monotonic() - self.started

    # How this carrier names the stream and numbers messages on the wire.
    STREAM_FIELD = "streamSid"
    SEQUENCE_FIELD = "sequenceNumber"

    async def _send(self, message: dict) -> None:
        message = {"event": message.pop("event"), self.SEQUENCE_FIELD: str(self._sequence),
                   self.STREAM_FIELD: self.stream_sid, **message}
        self._sequence += 1
        await self.ws.send(json.dumps(message))

    def _addressed(self, message: dict) -> bool:
        """Twilio's messages to Twilio name the stream they are for."""
        return message.get("streamSid") == self.stream_sid

    async def _send_frame(self, audio: bytes) -> None:
        """One frame of the caller's line (a double that reorders them overrides this)."""
        await self._media(audio)

    async def _media(self, ulaw: bytes) -> None:
        self._chunk += 1
        await self._send({
            "event": "media",
            "media": {"track": "inbound", "chunk": str(self._chunk), "timestamp": str(self._chunk * 20),
                      "payload": base64.b64encode(ulaw).decode()},
        })

    async def speak(self, ulaw: bytes, *, silence_after: float = 0.0) -> None:
        """Say `ulaw` (the line's own encoding: μ-law on Twilio; the line sends it
        in 20 ms frames at real time); return when it is said."""
        size = self.frame_bytes
        frames = [ulaw[i : i + size] for i in range(0, len(ulaw), size)]
        if frames:
            frames[-1] += self.line_silence[len(frames[-1]):]
        self._outgoing.extend(frames)
        while self._outgoing:
            await anyio.sleep(FRAME_SECONDS / 2)
        self._sent_speech_end = self.now()
        if silence_after:
            await self.silence(silence_after)

    async def silence(self, seconds: float) -> None:
        """Say nothing for `seconds` (the line carries silence meanwhile)."""
        await anyio.sleep(seconds)

    async def _line(self) -> None:
        """The caller's microphone: a frame every 20 ms, speech when there is some, else silence."""
        deadline = time.monotonic()
        while self.closed is None:
            try:
                await self._send_frame(self._outgoing.popleft() if self._outgoing else self.line_silence)
            except ConnectionClosed:
                return  # the server hung up: _receive records how
            deadline += FRAME_SECONDS
            await anyio.sleep(max(0.0, deadline - time.monotonic()))

    async def press(self, digit: str) -> None:
        await self._send({"event": "dtmf", "dtmf": {"track": "inbound_track", "digit": digit}})

    async def send_raw(self, frame: str | bytes) -> None:
        """A frame as is (for tests of what a server does with a bad one)."""
        await self.ws.send(frame)

    def leave_soon(self, twiml: str) -> None:
        """`leave_stream`, as a task of the call's own (the REST request does not wait for it)."""
        self.new_twiml = twiml
        if self._tasks is not None:
            self._tasks.start_soon(self.leave_stream, twiml)

    async def leave_stream(self, twiml: str) -> None:
        """The call was given new TwiML (REST): it leaves the stream, which stops."""
        self.new_twiml = twiml
        await self.hang_up()
        with contextlib.suppress(ConnectionClosed):
            await self.ws.close()

    async def hang_up(self) -> None:
        """The caller hangs up (or the call left the stream): "Twilio sends a stop
        message when the Stream has stopped or the call has ended." """
        if self.closed is None and self.new_twiml is None:
            self.hung_up_by_caller = True
        with contextlib.suppress(ConnectionClosed):
            await self._send({"event": "stop",
                              "stop": {"accountSid": "AC", "callSid": self.call_sid}})

    @property
    def speech_ended_at(self) -> float | None:
        return self._sent_speech_end

    def played(self) -> bytes:
        """The μ-law the caller's ear played so far."""
        return b"".join(self._played)

    def received(self) -> bytes:
        return b"".join(frame for _, frame in self.heard.media)

    async def wait_for_audio(self, timeout: float = 10.0) -> float:
        """Seconds on the call's clock when the first reply frame arrived."""
        with anyio.fail_after(timeout):
            await self._got_audio.wait()
        return self.heard.media[0][0]

    async def wait_quiet(self, quiet: float = 0.6, timeout: float = 20.0, *, after: int = 0) -> None:
        """Until no reply audio arrived for `quiet` seconds, once more than
        `after` reply frames came (a later answer: pass how many were heard)."""
        await self.wait_for_audio(timeout)
        with anyio.fail_after(timeout):
            while len(self.heard.media) <= after or not self._buffer_empty_for(quiet):
                await anyio.sleep(0.05)

    def _buffer_empty_for(self, quiet: float) -> bool:
        last = self.heard.media[-1][0] if self.heard.media else 0.0
        return not self._buffer and self.now() - last >= quiet

    # ------------------------------------------------------------------ the ear

    async def _receive(self) -> None:
        try:
            async for frame in self.ws:
                message = json.loads(frame)
                self.heard.frames.append(message)
                event = message.get("event")
                if not self._addressed(message):
                    raise AssertionError(f"a message for another stream: {message!r}")
                if event == "media":
                    payload = base64.b64decode(message["media"]["payload"], validate=True)
                    if not self._heard_media(payload):
                        continue
                    # "The audio can be of any size"; "The media messages are buffered
                    # and played in the order received": the handset plays 20 ms at a time.
                    now = self.now()
                    self.heard.messages.append((now, payload))
                    size = self.reply_frame_bytes
                    for i in range(0, len(payload), size):
                        self.heard.media.append((now, payload[i : i + size]))
                        self._buffer.append(("media", payload[i : i + size]))
                    self._got_audio.set()
                elif event == "mark":
                    self._buffer.append(("mark", message["mark"]["name"]))
                elif event == "clear":
                    self.heard.clears.append(self.now())
                    dropped = [item for kind, item in self._buffer if kind == "mark"]
                    self._buffer.clear()
                    for name in dropped:
                        await self._echo_mark(name)
                else:
                    raise AssertionError(f"not a message Twilio takes: {message!r}")
        except ConnectionClosed as exc:
            self.closed = (exc.rcvd.code if exc.rcvd else None, exc.rcvd.reason if exc.rcvd else "")
        else:
            rcvd = getattr(self.ws, "close_rcvd", None)
            self.closed = (rcvd.code if rcvd else None, rcvd.reason if rcvd else "")
        self._stream_ended()

    def _stream_ended(self) -> None:
        """The server closed the stream: unless the call left it (REST) or the
        caller hung up, Twilio goes on with the TwiML after </Connect> ("If there
        is no further verb, Twilio will end the phone call.")."""
        if self.new_twiml is None and not self.hung_up_by_caller:
            self.after_stream = list(self.rest_of_twiml)

    def _heard_media(self, payload: bytes) -> bool:
        """Whether the carrier plays this payload ("The audio can be of any size.")."""
        return True

    async def _echo_mark(self, name: str) -> None:
        self.heard.marks_echoed.append(name)
        with contextlib.suppress(ConnectionClosed):
            await self._send({"event": "mark", "mark": {"name": name}})

    async def _play(self) -> None:
        """The handset: one buffered frame per 20 ms, marks echoed as they are reached."""
        deadline = time.monotonic()
        while True:
            while self._buffer and self._buffer[0][0] == "mark":
                await self._echo_mark(self._buffer.pop(0)[1])  # type: ignore[arg-type]
            if self._buffer:
                self._played.append(self._buffer.pop(0)[1])  # type: ignore[arg-type]
                deadline += FRAME_SECONDS
            else:
                deadline = time.monotonic() + 0.005
            await anyio.sleep(max(0.0, deadline - time.monotonic()))


@contextlib.asynccontextmanager
async def on_the_line(call: TwilioCall, calls: dict, key: str) -> AsyncIterator[TwilioCall]:
    """A connected call's handset running (hearing, playing, the line), listed in
    `calls` under `key` until it hangs up."""
    calls[key] = call
    async with anyio.create_task_group() as tg:
        call._tasks = tg
        tg.start_soon(call._receive)
        tg.start_soon(call._play)
        tg.start_soon(call._line)
        try:
            yield call
        finally:
            calls.pop(key, None)
            await call.hang_up()
            tg.cancel_scope.cancel()


class TwilioRestDouble:
    """Twilio's REST API for calls, as the twilio library's `http_client` seam sees it.

    `POST /2010-04-01/Accounts/{AccountSid}/Calls/{CallSid}.json` with `Twiml`
    (`<Hangup/>`, `<Dial>`) moves a live call off its stream: the stream gets
    `stop` and closes. `POST .../Calls.json` (`To`, `From`, `Url`) places a
    call: the double then rings `Url` as it rings an inbound one. Requests are
    checked for the account's Basic credentials (401 otherwise).
    """

    def __init__(self, double: TwilioDouble) -> None:
        self.double = double
        self.requests: list[tuple[str, str, dict]] = []
        self.is_async = False
        self.timeout = None
        self.logger = None
        self._test_only_last_request = None
        self._test_only_last_response = None
        self.fail_next: int | None = None

    def request(self, method, uri, params=None, data=None, headers=None, auth=None, timeout=None, allow_redirects=False):
        from twilio.http.response import Response

        self.requests.append((method, uri, dict(data or {})))
        if self.fail_next is not None:  # Twilio's API failing (a test asks for it)
            status, self.fail_next = self.fail_next, None
            return Response(status, json.dumps({"code": 20500, "message": "Internal Server Error", "status": status}))
        if auth != (self.double.account_sid, self.double.auth_token):
            return Response(401, json.dumps({"code": 20003, "message": "Authenticate", "status": 401}))
        path = urlsplit(uri).path
        prefix = f"/2010-04-01/Accounts/{self.double.account_sid}/Calls"
        if method == "POST" and path.startswith(prefix + "/") and path.endswith(".json"):
            call_sid = path[len(prefix) + 1 : -len(".json")]
            call = self.double.calls.get(call_sid)
            if call is None:
                return Response(404, json.dumps({"code": 20404, "message": "not found", "status": 404}))
            if "Twiml" in (data or {}):
                # Twilio answers the request at once; the call leaves its stream meanwhile.
                anyio.from_thread.run_sync(call.leave_soon, data["Twiml"])
            return Response(200, json.dumps({"sid": call_sid, "account_sid": self.double.account_sid, "status": "in-progress"}))
        if method == "POST" and path == prefix + ".json":
            call_sid = _sid("CA")
            self.double.placed.append({"sid": call_sid, **dict(data or {})})
            return Response(201, json.dumps({"sid": call_sid, "account_sid": self.double.account_sid, "status": "queued",
                                             "to": data.get("To"), "from": data.get("From")}))
        return Response(404, json.dumps({"code": 20404, "message": "not found", "status": 404}))


class TwilioDouble:
    """Twilio's side of calls to one account (its auth token signs every webhook)."""

    def __init__(self, auth_token: str, account_sid: str | None = None, *, shared_key: str | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.auth_token = auth_token
        # The authorities Twilio's side trusts for https:// webhooks and wss:// streams.
        self.ssl_context = ssl_context
        self.account_sid = account_sid or _sid("AC")
        # A Webhooks Rule's SharedKey: when set, every request (webhooks and the
        # stream's handshake) is signed with it and HMAC-SHA256, and says so.
        self.shared_key = shared_key
        self.calls: dict[str, TwilioCall] = {}  # calls on a stream now, by CallSid
        self.placed: list[dict] = []  # outbound calls asked for through the REST API
        self.rest = TwilioRestDouble(self)

    def signed(self, url: str, params: Mapping[str, str], signed_with: str | None = None) -> dict[str, str]:
        """The signature headers of a request to `url` with `params`."""
        if self.shared_key is not None and signed_with is None:
            return {"X-Twilio-Signature": twilio_signature(self.shared_key, url, params, algorithm="HMAC_SHA256"),
                    "X-Twilio-Webhooks-Signature-Settings": "key=webhooks_sharedkey_double,algorithm=HMAC_SHA256"}
        return {"X-Twilio-Signature": twilio_signature(signed_with or self.auth_token, url, params)}

    async def ring(self, webhook_url: str, *, signed_with: str | None = None, caller: str = "+15550100001",
                   called: str = "+15550100002", call_sid: str | None = None, extra: Mapping[str, str] | None = None,
                   direction: str = "inbound", local_host: str | None = None) -> tuple[int, str, str]:
        """POST the voice webhook; (status, body, CallSid)."""
        call_sid = call_sid or _sid("CA")
        form = {
            "AccountSid": self.account_sid, "ApiVersion": "2010-04-01", "CallSid": call_sid,
            "CallStatus": "ringing" if direction == "inbound" else "in-progress", "Called": called, "Caller": caller,
            "Direction": direction, "From": caller, "To": called, **(extra or {}),
        }
        status, body = await http_post(webhook_url, form, self.signed(webhook_url, form, signed_with), local_host=local_host,
                                       ssl_context=self.ssl_context)
        return status, body.decode("utf-8", "replace"), call_sid

    async def post(self, url: str, form: Mapping[str, str]) -> tuple[int, str]:
        """A signed POST of `form` to `url` (a status callback, a <Dial> action)."""
        status, body = await http_post(url, form, self.signed(url, form), ssl_context=self.ssl_context)
        return status, body.decode("utf-8", "replace")

    @staticmethod
    def stream_of(twiml: str) -> tuple[str, dict[str, str]]:
        """The `<Connect><Stream>` of a TwiML answer: its URL and its parameters."""
        root = ET.fromstring(twiml)
        stream = root.find("./Connect/Stream")
        if root.tag != "Response" or stream is None:
            raise CallRefused(200, f"no <Connect><Stream> in the answer: {twiml[:200]}")
        params = {p.get("name", ""): p.get("value", "") for p in stream.findall("Parameter")}
        for name, value in params.items():
            # "The combined length of each <Parameter> name and value attributes must be under 500 characters."
            if len(name) + len(value) >= 500:
                raise CallRefused(200, f"a <Parameter> of {len(name) + len(value)} characters: {name}")
        return stream.get("url", ""), params

    @staticmethod
    def verbs(twiml: str) -> list[tuple[str, str]]:
        """The TwiML document's verbs in order, as (verb, its text or its reason/url)."""
        root = ET.fromstring(twiml)
        return [(verb.tag, (verb.text or verb.get("reason") or verb.get("url") or "").strip()) for verb in root]

    @staticmethod
    def after_connect(twiml: str) -> list[tuple[str, str]]:
        """The verbs after `<Connect>`: what runs once the stream ends from the server's side."""
        verbs = TwilioDouble.verbs(twiml)
        names = [v for v, _ in verbs]
        return verbs[names.index("Connect") + 1 :] if "Connect" in names else []

    @contextlib.asynccontextmanager
    async def pick_up(self, placed: dict, *, answered_by: str | None = None,
                      stream_url: str | None = None) -> AsyncIterator[TwilioCall | None]:
        """The person (or machine) `placed` called answers (a call placed through the REST API).

        Status callbacks go where `StatusCallback` says, for the events
        `StatusCallbackEvent` names ("If no event is specified, we send the
        completed status"). With `MachineDetection`, detection blocks the call
        ("Default, blocks the execution of the call until Answering Machine
        Detection is completed") and the webhook then carries `AnsweredBy`.
        Yields the call on its stream, or None when the server's answer has no
        stream (it hung up on a machine)."""
        sid = placed["sid"]
        events = placed.get("StatusCallbackEvent") or []
        events = [events] if isinstance(events, str) else list(events)
        status_url = placed.get("StatusCallback")

        async def status(event: str, call_status: str, **extra: str) -> None:
            if status_url and (event in events or (event == "completed" and not events)):
                form = {"AccountSid": self.account_sid, "CallSid": sid, "CallStatus": call_status,
                        "Direction": "outbound-api", "To": placed["To"], "From": placed["From"], **extra}
                await self.post(status_url, form)

        await status("initiated", "queued")
        await status("ringing", "ringing")
        extra = {"AnsweredBy": answered_by} if placed.get("MachineDetection") and answered_by else {}
        status_code, answer, _ = await self.ring(placed["Url"], call_sid=sid, caller=placed["From"], called=placed["To"],
                                                 direction="outbound-api", extra=extra)
        if status_code != 200:
            raise CallRefused(status_code, answer)
        await status("answered", "in-progress", **extra)
        try:
            if "<Stream" not in answer:
                yield None
            else:
                async with self.call(placed["Url"], stream_url=stream_url, answer=answer, call_sid=sid) as call:
                    yield call
        finally:
            await status("completed", "completed", **extra)

    @contextlib.asynccontextmanager
    async def call(self, webhook_url: str, *, stream_url: str | None = None,
                   parameters: Mapping[str, str] | None = None, ring: Mapping[str, str] | None = None,
                   handshake: Mapping[str, str] | None = None, answer: str | None = None,
                   call_sid: str | None = None) -> AsyncIterator[TwilioCall]:
        """A call answered by the server's webhook, its media stream open, until hang-up.

        `stream_url` replaces the TwiML's address (the server's public one is
        a tunnel's; a test reaches the server at its local port): the
        handshake is still signed for the TwiML's URL, as Twilio would.
        `parameters` replace what the TwiML gave (to present a forged token);
        `handshake` replaces the handshake's signature headers; `ring` adds
        fields to the webhook's form; `answer` is a webhook answer already
        got (a call placed with `place` rings the server itself).
        """
        if answer is None:
            status, answer, call_sid = await self.ring(webhook_url, extra=ring, call_sid=call_sid)
            if status != 200:
                raise CallRefused(status, answer)
        assert call_sid is not None
        url, params = self.stream_of(answer)
        if stream_url is None and urlsplit(url).scheme != "wss":
            # "wss is the only supported protocol."
            raise CallRefused(200, f"Twilio opens streams on wss:// only, not {url!r}")
        if urlsplit(url).query:
            raise CallRefused(200, f"\"The url does not support query string parameters\": {url!r}")
        if parameters is not None:
            params = dict(parameters)
        # "When validating the signature on a WebSocket request, note that the
        # header parameter name will be all lowercase: x-twilio-signature."
        signed = {k.lower(): v for k, v in (self.signed(url, {}) if handshake is None else handshake).items()}
        stream_sid = _sid("MZ")
        target = stream_url or url
        tls = {"ssl": self.ssl_context} if urlsplit(target).scheme == "wss" and self.ssl_context is not None else {}
        async with ws_connect(target, compression=None, max_size=1 << 20, additional_headers=signed, **tls) as ws:
            await ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
            await ws.send(json.dumps({
                "event": "start", "sequenceNumber": "1", "streamSid": stream_sid,
                "start": {"accountSid": self.account_sid, "streamSid": stream_sid, "callSid": call_sid,
                          "tracks": ["inbound"], "customParameters": params,
                          "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}},
            }))
            call = TwilioCall(ws, stream_sid, call_sid, time.monotonic())
            call.rest_of_twiml = self.after_connect(answer)
            async with on_the_line(call, self.calls, call_sid):
                yield call
