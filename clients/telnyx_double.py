"""A Telnyx double: calls the server as Telnyx Call Control does, from Telnyx's public documentation.

An incoming call is a signed webhook (`call.initiated`, JSON; Ed25519 over
`"{telnyx-timestamp}|{body}"` with the account's key); the application
answers through the REST API (`POST /v2/calls/{call_control_id}/actions/answer`
with `stream_url`, `client_state`, bidirectional `rtp` mode, or `answer` then
`streaming_start`), which this double serves on a port of its own and checks
for the API key. Then the double opens the stream and speaks Telnyx's media
streaming messages (`connected`, `start` with `media_format` and the
command's `client_state`, `media` with `chunk` numbers, `dtmf`, `stop`;
snake_case, `stream_id`), and plays what comes back as `TwilioCall` does
(marks echoed when played, `clear`).

What it holds the server to, each from Telnyx's own words:

- Replies are decoded as the command asked Telnyx to play them:
  `stream_bidirectional_codec` ("Indicates codec for bidirectional streaming
  RTP payloads", default "PCMU, 8 kHz") at `stream_bidirectional_sampling_rate`
  (default 8000; `answer` does not take it: the double refuses the parameter
  there, with 422, as an API that does not know it). L16 is read in network
  byte order (RFC 3551; Telnyx does not say).
- "Provided chunks of audio can be in a size of 20 milliseconds to 30
  seconds": a shorter payload is answered with error 100003 and counted.
- "The order of events is not guaranteed and the chunk number can be used to
  reorder the events": `reorder=True` sends neighbouring frames swapped now
  and then.
- Webhooks can come twice, concurrently, and out of order (`deliver`); a
  command with a `command_id` seen before for the call is ignored ("Telnyx
  will ignore any command with the same command_id for the same
  call_control_id"); a second `answer` of an answered call is refused (422).
- The stream is a fork of the call: closing the socket does not end the call.
  Only `hangup` (or the caller) does; `hangups` lists who ended each call.
"""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator

import anyio
import anyio.abc
import h11
import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from websockets.asyncio.client import connect as ws_connect

from clients.phone_double import CallRefused, TwilioCall, http_post_raw, on_the_line

__all__ = ["TelnyxCall", "TelnyxDouble", "decode_reply"]

# What `answer` takes of the stream's settings (telnyx-python's ActionAnswerParams):
# no `stream_bidirectional_sampling_rate`, no `stream_auth_token`, no `custom_parameters`.
ANSWER_STREAM_FIELDS = {"stream_url", "stream_track", "stream_codec", "stream_bidirectional_mode",
                        "stream_bidirectional_codec", "stream_bidirectional_target_legs"}
ANSWER_FIELDS = ANSWER_STREAM_FIELDS | {"client_state", "command_id", "send_silence_when_idle", "webhook_url",
                                        "preferred_codecs", "billing_group_id", "custom_headers"}
CODECS = ("PCMU", "PCMA", "G722", "OPUS", "AMR-WB", "L16")


def _ulaw_decode(data: bytes) -> np.ndarray:
    # ITU-T G.711 μ-law, from the standard's segment rule (no shared code with the server).
    code = ~np.frombuffer(data, np.uint8).astype(np.int32) & 0xFF
    t = (((code & 0x0F) << 3) + 0x84) << ((code & 0x70) >> 4)
    return np.where(code & 0x80, 0x84 - t, t - 0x84).astype(np.int16)


def _alaw_decode(data: bytes) -> np.ndarray:
    code = np.frombuffer(data, np.uint8).astype(np.int32) ^ 0x55
    t = (code & 0x0F) << 4
    segment = (code & 0x70) >> 4
    t = np.where(segment == 0, t + 8, (t + 0x108) << np.maximum(segment - 1, 0))
    return np.where(code & 0x80, t, -t).astype(np.int16)


def decode_reply(payload: bytes, codec: str) -> np.ndarray:
    """A reply payload as Telnyx would play it: PCMU, PCMA, or L16 (RFC 3551: big-endian)."""
    if codec == "PCMU":
        return _ulaw_decode(payload)
    if codec == "PCMA":
        return _alaw_decode(payload)
    if codec == "L16":
        return np.frombuffer(payload[: len(payload) // 2 * 2], ">i2").astype(np.int16)
    raise ValueError(f"the double does not decode {codec}")


class TelnyxCall(TwilioCall):
    """One Telnyx call on its stream (the caller's side, as `TwilioCall`)."""

    STREAM_FIELD = "stream_id"
    SEQUENCE_FIELD = "sequence_number"

    def __init__(self, *args, double: TelnyxDouble, reply_codec: str, reply_rate: int, encoding: str, rate: int,
                 reorder: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.double = double
        self.reply_codec = reply_codec  # what Telnyx was asked to play
        self.reply_rate = reply_rate
        width = 2 if encoding == "L16" else 1
        self.frame_bytes = rate // 50 * width  # the caller's line: 20 ms in the call's codec
        self.line_silence = {"PCMU": b"\xff", "PCMA": b"\xd5", "L16": b"\x00"}[encoding] * self.frame_bytes
        self.reorder = reorder
        self.reply_frame_bytes = reply_rate // 50 * (2 if reply_codec == "L16" else 1)
        self._held_frame: bytes | None = None
        self.short_chunks = 0  # reply payloads under 20 ms: Telnyx refuses them
        self.errors_sent: list[int] = []

    def _addressed(self, message: dict) -> bool:
        # What the application sends Telnyx needs no stream id; if one is given it must be this one.
        return message.get("stream_id", self.stream_sid) == self.stream_sid

    async def _send_frame(self, audio: bytes) -> None:
        """With `reorder`, every fifth frame goes out after the one behind it: "The
        order of events is not guaranteed and the chunk number can be used to
        reorder the events"."""
        if not self.reorder:
            await self._media(audio)
            return
        if self._held_frame is not None:
            held, self._held_frame = self._held_frame, None
            self._chunk += 1
            await self._media_numbered(audio, self._chunk + 1)
            await self._media_numbered(held, self._chunk)
            self._chunk += 1
            return
        if (self._chunk + 1) % 5 == 0:
            self._held_frame = audio
            return
        await self._media(audio)

    async def _media_numbered(self, audio: bytes, chunk: int) -> None:
        await self._send({
            "event": "media",
            "media": {"track": "inbound", "chunk": str(chunk), "timestamp": str(chunk * 20),
                      "payload": base64.b64encode(audio).decode()},
        })

    async def _media(self, audio: bytes) -> None:
        self._chunk += 1
        await self._media_numbered(audio, self._chunk)

    async def press(self, digit: str) -> None:
        """A key, as Telnyx's guide shows the event: `dtmf.digit` and `occurred_at`."""
        await self._send({"event": "dtmf", "occurred_at": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime()),
                          "dtmf": {"digit": digit}})

    def _heard_media(self, payload: bytes) -> bool:
        """ "Provided chunks of audio can be in a size of 20 milliseconds to 30
        seconds": a shorter one is refused ("100003 malformed_frame")."""
        width = 2 if self.reply_codec == "L16" else 1
        if len(payload) < self.reply_rate // 50 * width:
            self.short_chunks += 1
            self.errors_sent.append(100003)
            return False
        return True

    def reply_pcm(self) -> np.ndarray:
        """What the caller heard, decoded as the command asked Telnyx to play it (PCM16 at `reply_rate`)."""
        return decode_reply(self.received(), self.reply_codec)

    async def hang_up(self) -> None:
        """The caller hangs up: the stream stops, and the call with it."""
        if self.closed is None and self.new_twiml is None:
            self.hung_up_by_caller = True
        self.double.ended(self.call_sid, "caller")
        with contextlib.suppress(Exception):
            await self._send({"event": "stop", "stop": {"user_id": "u", "call_control_id": self.call_sid}})


class TelnyxDouble:
    """Telnyx's side of calls to one account: its signing key, its API key, its REST API."""

    def __init__(self, api_key: str | None = None) -> None:
        self._signing_key = Ed25519PrivateKey.generate()
        self.public_key = base64.b64encode(self._signing_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()
        self.api_key = api_key or "KEY" + secrets.token_hex(16)
        self.actions: list[tuple[str, str, dict]] = []  # (call_control_id, action, body) as the API got them
        self.ignored: list[tuple[str, str, dict]] = []  # commands ignored for a repeated command_id
        self.refused: list[tuple[str, str, int]] = []  # (call_control_id, action, status) the API refused
        self.calls: dict[str, TelnyxCall] = {}
        self.up: set[str] = set()  # calls still up (billed), whatever their streams did
        self.hangups: dict[str, str] = {}  # call -> who ended it ("caller", "application")
        self.dialled: list[dict] = []  # outbound calls asked for (`POST /v2/calls`)
        self._answered: dict[str, dict] = {}  # call -> the stream settings the application asked for
        self._streams: dict[str, anyio.Event] = {}
        self._commands: dict[str, set[str]] = {}
        self.api_port: int | None = None
        self.webhook_url: str | None = None

    @property
    def api_base_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}/v2"

    def sign(self, body: bytes, timestamp: int | None = None) -> dict[str, str]:
        stamp = str(int(time.time()) if timestamp is None else timestamp)
        signature = self._signing_key.sign(stamp.encode() + b"|" + body)
        return {"telnyx-signature-ed25519": base64.b64encode(signature).decode(), "telnyx-timestamp": stamp}

    def ended(self, call_id: str, by: str) -> None:
        if call_id in self.up:
            self.up.discard(call_id)
            self.hangups.setdefault(call_id, by)

    # ------------------------------------------------------------------ the REST API

    async def serve_api(self, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        self.api_port = int(listener.extra(anyio.abc.SocketAttribute.local_port))
        task_status.started(self.api_port)
        async with listener, anyio.create_task_group() as tg:
            await listener.serve(self._api_connection, task_group=tg)

    async def _api_connection(self, stream: anyio.abc.ByteStream) -> None:
        conn = h11.Connection(h11.SERVER)
        request, body = None, bytearray()
        async with stream:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await stream.receive())
                elif isinstance(event, h11.Request):
                    request = event
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                    break
            status, answer = await self._api(request, bytes(body))
            data = json.dumps(answer).encode()
            await stream.send(conn.send(h11.Response(status_code=status, headers=[
                ("Content-Type", "application/json"), ("Content-Length", str(len(data))), ("Connection", "close")]))
                + conn.send(h11.Data(data=data)) + conn.send(h11.EndOfMessage()))

    async def _api(self, request: h11.Request, body: bytes) -> tuple[int, dict]:
        headers = {k.decode().lower(): v.decode() for k, v in request.headers}
        if headers.get("authorization") != f"Bearer {self.api_key}":
            return 401, {"errors": [{"code": "10009", "title": "Authentication failed"}]}
        parts = request.target.decode().split("/")  # /v2/calls/{id}/actions/{action}
        params = json.loads(body or b"{}")
        if request.method == b"POST" and parts[1:] == ["v2", "calls"]:
            return self._dial(params)
        if request.method != b"POST" or len(parts) != 6 or parts[1:3] != ["v2", "calls"] or parts[4] != "actions":
            return 404, {"errors": [{"code": "10005", "title": "Resource not found"}]}
        call_id, action = parts[3], parts[5]
        command = params.get("command_id")
        if command is not None:
            seen = self._commands.setdefault(call_id, set())
            if command in seen:
                self.ignored.append((call_id, action, params))
                return 200, {"data": {"result": "ok"}}
            seen.add(command)
        refusal = self._refusal(call_id, action, params)
        if refusal is not None:
            self.refused.append((call_id, action, refusal[0]))
            return refusal
        self.actions.append((call_id, action, params))
        if action == "answer":
            self.up.add(call_id)
            if "stream_url" in params:
                self._stream_asked(call_id, params)
        elif action == "streaming_start":
            self._stream_asked(call_id, params)
        elif action in ("hangup", "transfer", "reject"):
            self.ended(call_id, "application" if action != "transfer" else "transferred")
            call = self.calls.get(call_id)
            if call is not None:
                call.new_twiml = f"{action} {params.get('to', '')}".strip()
                with contextlib.suppress(Exception):
                    await call._send({"event": "stop", "stop": {"user_id": "u", "call_control_id": call_id}})
                with contextlib.suppress(Exception):
                    await call.ws.close()
        return 200, {"data": {"result": "ok"}}

    def _refusal(self, call_id: str, action: str, params: dict) -> tuple[int, dict] | None:
        if action == "answer":
            unknown = sorted(set(params) - ANSWER_FIELDS)
            if unknown:
                return 422, {"errors": [{"code": "10015", "title": "Invalid parameter", "detail": f"unknown: {unknown}"}]}
            if call_id in self._answered or call_id in self.up:
                return 422, {"errors": [{"code": "90018", "title": "Call has already been answered"}]}
        if action in ("answer", "streaming_start") and "stream_url" in params:
            codec = params.get("stream_bidirectional_codec", "PCMU")
            if codec not in CODECS:  # "Case sensitive."
                return 422, {"errors": [{"code": "10015", "title": "Invalid parameter", "detail": codec}]}
        if action in ("hangup", "streaming_start", "speak", "transfer") and call_id not in self.up:
            return 422, {"errors": [{"code": "90018", "title": "Call has already ended"}]}
        return None

    def _stream_asked(self, call_id: str, params: dict) -> None:
        self._answered[call_id] = params
        self._streams.setdefault(call_id, anyio.Event()).set()

    def _dial(self, params: dict) -> tuple[int, dict]:
        for field in ("connection_id", "to", "from"):
            if not params.get(field):
                return 422, {"errors": [{"code": "10015", "title": "Invalid parameter", "detail": f"{field} is required"}]}
        call_id = "v3:" + secrets.token_urlsafe(30)
        self.dialled.append({"call_control_id": call_id, **params})
        if "stream_url" in params:
            self._stream_asked(call_id, params)
        return 200, {"data": {"call_control_id": call_id, "call_leg_id": str(uuid.uuid4()), "is_alive": True}}

    # ------------------------------------------------------------------ webhooks

    def event(self, kind: str, call_id: str, **payload) -> dict:
        return {"data": {
            "event_type": kind, "id": str(uuid.uuid4()), "occurred_at": "2026-12-02T10:00:00Z", "record_type": "event",
            "payload": {"call_control_id": call_id, "call_leg_id": str(uuid.uuid4()),
                        "call_session_id": str(uuid.uuid4()), "connection_id": "1234567890", **payload},
        }, "meta": {"attempt": 1, "delivered_to": self.webhook_url}}

    async def deliver(self, webhook_url: str, event: dict, *, times: int = 1, forged: bool = False) -> list[int]:
        """POST `event`, `times` times at once ("duplicate webhooks", "simultaneous
        (or near simultaneous) webhooks"); the statuses."""
        body = json.dumps(event).encode()
        statuses: list[int] = []

        async def post() -> None:
            headers = (TelnyxDouble() if forged else self).sign(body)
            status, _ = await http_post_raw(webhook_url, body, {"Content-Type": "application/json", **headers})
            statuses.append(status)

        async with anyio.create_task_group() as tg:
            for _ in range(times):
                tg.start_soon(post)
        return statuses

    async def ring(self, webhook_url: str, *, call_id: str | None = None, forged: bool = False,
                   times: int = 1) -> tuple[int, str, str]:
        """POST `call.initiated` for an incoming call; (status, body, call_control_id)."""
        self.webhook_url = webhook_url
        call_id = call_id or "v3:" + secrets.token_urlsafe(30)
        event = self.event("call.initiated", call_id, direction="incoming", **{"from": "+15550100001"},
                           to="+15550100002", state="parked", offered_codecs="PCMU,PCMA,G722,OPUS")
        statuses = await self.deliver(webhook_url, event, times=times, forged=forged)
        return max(statuses), "", call_id

    @contextlib.asynccontextmanager
    async def call(self, webhook_url: str, *, encoding: str = "PCMU", rate: int = 8000, stream_url: str | None = None,
                   reorder: bool = False, times: int = 1, call_id: str | None = None) -> AsyncIterator[TelnyxCall]:
        """An incoming call the server answers with a stream; the stream open until hang-up.

        `encoding` and `rate`: what the stream carries of the caller (its
        `start.media_format`); `times`: how many times `call.initiated` comes."""
        call_id = call_id or "v3:" + secrets.token_urlsafe(30)
        asked = self._streams.setdefault(call_id, anyio.Event())
        status, body, _ = await self.ring(webhook_url, call_id=call_id, times=times)
        if status != 200:
            raise CallRefused(status, body)
        with anyio.fail_after(5):
            await asked.wait()
        async with self.stream(call_id, encoding=encoding, rate=rate, stream_url=stream_url, reorder=reorder) as call:
            yield call

    @contextlib.asynccontextmanager
    async def stream(self, call_id: str, *, encoding: str = "PCMU", rate: int = 8000, stream_url: str | None = None,
                     reorder: bool = False) -> AsyncIterator[TelnyxCall]:
        """The media stream of a call the application asked one for."""
        params = self._answered[call_id]
        self.up.add(call_id)
        stream_id = str(uuid.uuid4())
        reply_codec = params.get("stream_bidirectional_codec", "PCMU")
        reply_rate = int(params.get("stream_bidirectional_sampling_rate", 8000))
        async with ws_connect(stream_url or params["stream_url"], compression=None, max_size=1 << 20) as ws:
            await ws.send(json.dumps({"event": "connected", "version": "1.0.0"}))
            await ws.send(json.dumps({"event": "start", "sequence_number": "1", "stream_id": stream_id, "start": {
                "user_id": str(uuid.uuid4()), "call_control_id": call_id, "call_session_id": str(uuid.uuid4()),
                "from": "+15550100001", "to": "+15550100002", "client_state": params.get("client_state"),
                "media_format": {"encoding": encoding, "sample_rate": rate, "channels": 1}}}))
            call = TelnyxCall(ws, stream_id, call_id, time.monotonic(), double=self, reply_codec=reply_codec,
                              reply_rate=reply_rate, encoding=encoding, rate=rate, reorder=reorder)
            async with on_the_line(call, self.calls, call_id):
                yield call
