"""Telnyx media streaming as a front door, Telnyx's webhooks and Call Control (sans-I/O but the REST calls).

A call answered with `stream_url` (Call Control's `answer`, bidirectional
`rtp` mode) streams JSON text frames: `connected`, `start` (`stream_id`,
`call_control_id`, `from`, `to`, `client_state` as the command gave it,
`media_format` with `encoding` PCMU, PCMA or L16 and its `sample_rate`),
`media` (base64 RTP payloads, numbered by `chunk`: "The order of events is not
guaranteed and the chunk number can be used to reorder the events"), `dtmf`,
`mark`, `error`, `stop`; back, `media`, `mark` and `clear`. See
developers.telnyx.com, "Media Streaming".

Telnyx keeps the two directions apart: `stream_codec` is what it streams to
us, `stream_bidirectional_codec` (and `stream_bidirectional_sampling_rate`,
which `answer` does not take; `streaming_start` and `dial` do) what it plays
of what we send. Replies go out in the latter, whatever the caller's codec.

Telnyx signs its webhooks with Ed25519: `telnyx-signature-ed25519` is the
base64 signature of `"{telnyx-timestamp}|{body}"`, checked with the account's
public key (Mission Control → Keys & Credentials → Public Key). Telnyx delivers
webhooks out of order and more than once, and re-delivers to the failover URL
unless answered 200 at once: the webhook answers 200, runs its command in a
task the server owns (`PhoneLines.run`), and gives every command a
`command_id` Telnyx dedupes on.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import http
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from live.phone.carrier import CallLine, CarrierDoor, Codec, StreamStart, codec_named, object_field
from live.protocol import ProtocolError

__all__ = [
    "REORDER_FRAMES",
    "SIGNATURE_TOLERANCE",
    "TelnyxCallControl",
    "TelnyxCallWebhook",
    "TelnyxDoor",
    "TelnyxError",
    "telnyx_signature_problem",
]

log = logging.getLogger("live.phone")

# Telnyx's own libraries refuse a webhook whose timestamp is further than this from now.
SIGNATURE_TOLERANCE = 300.0
# Media frames held to put a late one back in its place: 60 ms of audio at most.
REORDER_FRAMES = 3


def telnyx_signature_problem(
    public_key: str, body: bytes, signature: str | None, timestamp: str | None, *, now: float | None = None,
    tolerance: float = SIGNATURE_TOLERANCE,
) -> str | None:
    """None if `body` carries Telnyx's valid signature, else why not (never the signature itself)."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if not signature or not timestamp:
        return "no telnyx-signature-ed25519 / telnyx-timestamp headers"
    try:
        sent = int(timestamp)
    except ValueError:
        return "a telnyx-timestamp that is not a number"
    if abs((time.time() if now is None else now) - sent) > tolerance:
        return "a telnyx-timestamp too far from now (a replay, or a clock off)"
    try:
        key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key))
        key.verify(base64.b64decode(signature, validate=True), timestamp.encode() + b"|" + body)
    except (InvalidSignature, binascii.Error, ValueError):
        return "the signature does not match"
    return None


class TelnyxDoor(CarrierDoor):
    """One Telnyx media stream: one phone call."""

    name = "telnyx"
    carrier = "Telnyx"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._next_chunk: int | None = None
        self._held: dict[int, dict] = {}
        self.late_frames = 0  # media frames that came after their place was played: dropped
        self.reordered_frames = 0  # media frames put back in their place

    def _read_start(self, message: dict) -> StreamStart:
        start = message.get("start")
        if not isinstance(start, dict):
            raise ProtocolError("bad_frame", "'start' without its 'start' object")
        media = object_field(start, "media_format")
        encoding, rate = str(media.get("encoding", "")).upper(), media.get("sample_rate")
        if media.get("channels", 1) != 1:
            raise ProtocolError("unsupported_media", f"media format {media!r}: this door takes mono")
        try:
            codec = codec_named(encoding, rate if isinstance(rate, int) else 0)
        except ValueError:
            raise ProtocolError("unsupported_media", f"media format {media!r}: this door takes PCMU, PCMA or L16, mono") from None
        stream_id = str(message.get("stream_id") or "")
        if not stream_id:
            raise ProtocolError("bad_frame", "'start' names no stream_id")
        token = _client_state(start)
        custom = start.get("custom_parameters")
        facts = {k: str(v)[:200] for k, v in custom.items()} if isinstance(custom, dict) else {}
        for name in ("from", "to", "call_session_id"):
            if isinstance(start.get(name), str):
                facts[name] = start[name][:200]
        return StreamStart(
            stream_id, str(start.get("call_control_id") or "") or None, codec, token,
            caller=facts.get("from"), called=facts.get("to"), direction=facts.get("direction"), parameters=facts,
        )

    def _envelope(self, message: dict) -> dict:
        return message

    def inputs(self, frame: str | bytes):
        message = self._message(frame)
        event = message["event"]
        if event == "media":
            return self._in_order(message)
        if event == "error":
            payload = object_field(message, "payload")
            raise ProtocolError("carrier_error", f"Telnyx reports {payload.get('code')}: "
                                f"{str(payload.get('title'))[:80]}: {str(payload.get('detail'))[:160]}")
        return super().inputs(message)

    def _in_order(self, message: dict) -> list:
        """Telnyx: "The order of events is not guaranteed and the chunk number can
        be used to reorder the events." A frame ahead of its turn waits (up to
        `REORDER_FRAMES`) for the ones before it; one that comes after its place
        was played is dropped and counted."""
        media = message.get("media")
        chunk = media.get("chunk") if isinstance(media, dict) else None
        if isinstance(media, dict) and media.get("track", "inbound") not in ("inbound", "inbound_track"):
            return []
        try:
            number = int(chunk)
        except (TypeError, ValueError):
            return self._media(message)  # unnumbered: taken as it comes
        if self._next_chunk is None:
            self._next_chunk = number  # Telnyx does not say where chunks start: from the first seen
        if number < self._next_chunk or number in self._held:
            self.late_frames += 1
            return []
        if number != self._next_chunk:
            self.reordered_frames += 1
        self._held[number] = message
        out: list = []
        while self._held:
            if self._next_chunk not in self._held:
                if len(self._held) <= REORDER_FRAMES:
                    break
                self._next_chunk = min(self._held)  # the missing one is lost: go on without it
            out.extend(self._media(self._held.pop(self._next_chunk)))
            self._next_chunk += 1
        return out


class TelnyxError(OSError):
    """Telnyx's REST API refused a command, or could not be reached: `status` (0: no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True)
class StreamSettings:
    """What Telnyx streams to us and plays from us (see the module's docstring)."""

    stream_url: str
    stream_codec: str = "PCMU"  # what the caller's audio comes in ("default": the call's own)
    reply: Codec = codec_named("PCMU")  # what Telnyx plays of ours

    def fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "stream_url": self.stream_url, "stream_track": "inbound_track", "stream_codec": self.stream_codec,
            "stream_bidirectional_mode": "rtp", "stream_bidirectional_codec": self.reply.name,
        }
        if self.reply.name == "L16" or self.reply.rate != 8000:
            fields["stream_bidirectional_sampling_rate"] = self.reply.rate
        return fields

    @property
    def fits_answer(self) -> bool:
        """Whether `answer` can ask for it: it takes no `stream_bidirectional_sampling_rate`,
        and L16 is played at 16 kHz only (so the rate must be said)."""
        return self.reply.name != "L16" and self.reply.rate == 8000


class TelnyxCallControl:
    """Telnyx's Call Control REST API (v2) for one API key: answer with a stream, hang up, transfer, dial.

    Plain HTTPS with the standard library (small JSON POSTs), in a worker
    thread so the event loop never waits on the network. Every command has a
    `command_id` made of the call and the action: "Telnyx will ignore any
    command with the same command_id for the same call_control_id", so a
    command repeated (a duplicate webhook, a hang-up asked twice) is done once.
    """

    def __init__(self, api_key: str, *, base_url: str = "https://api.telnyx.com/v2", timeout: float = 10.0,
                 connection_id: str | None = None) -> None:
        self._api_key = api_key
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.connection_id = connection_id  # the Call Control application, for `dial`

    def __repr__(self) -> str:  # never the API key
        return f"TelnyxCallControl(base_url={self.base_url!r})"

    async def _post(self, path: str, body: dict) -> dict:
        import urllib.error
        import urllib.request

        import anyio

        request = urllib.request.Request(self.base_url + path, data=json.dumps(body).encode(), method="POST", headers={
            "Authorization": f"Bearer {self._api_key}", "Content-Type": "application/json", "Accept": "application/json",
        })

        def post() -> dict:
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310 (our own https URL)
                    data = response.read()
            except urllib.error.HTTPError as exc:
                detail = exc.read()[:300].decode("utf-8", "replace")
                raise TelnyxError(exc.code, f"Telnyx answered {exc.code}: {detail}") from None
            except OSError as exc:
                raise TelnyxError(0, f"Telnyx could not be reached: {exc}") from None
            try:
                return json.loads(data or b"{}")
            except ValueError:
                return {}

        return await anyio.to_thread.run_sync(post)

    async def _action(self, call_id: str, action: str, body: dict, *, command: str | None = None) -> dict:
        import urllib.parse

        body = {**body, "command_id": f"{command or action}:{call_id}"[:250]}
        return await self._post(f"/calls/{urllib.parse.quote(call_id, safe=':')}/actions/{action}", body)

    async def answer(self, call_id: str, stream: StreamSettings, *, client_state: str) -> None:
        """Answer with the stream; where `answer` cannot ask for the reply's
        codec and rate (L16), answer first and start the stream after."""
        if stream.fits_answer:
            await self._action(call_id, "answer", {**stream.fields(), "client_state": client_state})
            return
        await self._action(call_id, "answer", {"client_state": client_state})
        await self._action(call_id, "streaming_start", {**stream.fields(), "client_state": client_state})

    async def reject(self, call_id: str, cause: str = "USER_BUSY") -> None:
        await self._action(call_id, "reject", {"cause": cause})

    async def speak(self, call_id: str, text: str, *, client_state: str) -> None:
        await self._action(call_id, "answer", {"client_state": client_state})
        await self._action(call_id, "speak", {"payload": text, "voice": "female", "language": "en-US",
                                              "client_state": client_state})

    async def hang_up(self, call_id: str) -> None:
        await self._action(call_id, "hangup", {})

    async def transfer(self, call_id: str, number: str) -> None:
        await self._action(call_id, "transfer", {"to": number}, command=f"transfer-{number}")

    async def dial(self, to: str, from_: str, *, webhook_url: str, client_state: str | None = None,
                   stream: StreamSettings | None = None, machine_detection: str | None = None) -> str:
        """Call `to` from `from_` through the Call Control application; the call's `call_control_id`."""
        if not self.connection_id:
            raise TelnyxError(0, "dialling out needs the Call Control application's id ($TELNYX_CONNECTION_ID)")
        body: dict[str, Any] = {"connection_id": self.connection_id, "to": to, "from": from_, "webhook_url": webhook_url}
        if stream is not None:
            body.update(stream.fields())
        if client_state is not None:
            body["client_state"] = client_state
        if machine_detection:
            body["answering_machine_detection"] = machine_detection
        answer = await self._post("/calls", body)
        call_id = (answer.get("data") or {}).get("call_control_id")
        if not isinstance(call_id, str) or not call_id:
            raise TelnyxError(0, "Telnyx's answer to dial names no call_control_id")
        return call_id


# What the webhook does when it cannot take a call: (call id) -> the command to run.
BusyPolicy = Callable[[str], Awaitable[None] | None]


class TelnyxCallWebhook:
    """`POST /telnyx/call`: check Telnyx's signature; answer an incoming call with a media stream here.

    The decision is made at once and the webhook answered 200; the Call
    Control command runs in the lines' task (`commands`), not in the request.
    """

    def __init__(self, public_key: str, control: TelnyxCallControl, stream_url: str, tokens, *,
                 line: CallLine | None = None, stream_codec: str = "PCMU") -> None:
        self._public_key = public_key
        self.control = control
        self.stream_url = stream_url
        self.tokens = tokens
        self.line = line
        self.stream_codec = stream_codec
        # Set by the lines: how a command is queued, whether calls are taken
        # now (None) or why not, and what a caller hears then.
        self.commands: Callable[[str, Callable[[], Awaitable[None]]], bool] | None = None
        self.refusal: Callable[[], str | None] = lambda: None
        self.busy = "reject"
        self.busy_message = "Sorry, all our lines are busy. Please call again later."
        self.outbound: dict[str, Any] = {}  # call id -> what `live call` asked for (its AMD policy)
        self.counted: Callable[[str], None] = lambda answer: None  # metrics: how each webhook was answered
        self.count_status: Callable[[str], None] = lambda status: None  # metrics: calls' progress
        self._ended: dict[str, None] = {}  # calls Telnyx said ended (newest last, bounded): nothing to hang up
        self.events: list[tuple[str, str]] = []  # (event type, call id) taken, newest last (bounded)

    def __repr__(self) -> str:
        return f"TelnyxCallWebhook(stream_url={self.stream_url!r})"

    @property
    def stream(self) -> StreamSettings:
        reply = self.line.reply_codec if self.line is not None else codec_named("PCMU")
        return StreamSettings(self.stream_url, self.stream_codec, reply)

    def _queue(self, what: str, command: Callable[[], Awaitable[None]]) -> bool:
        if self.commands is None:  # no task to run it in: not served
            log.warning("telnyx: no task runs Call Control commands here; %s dropped", what)
            return False
        return self.commands(what, command)

    async def answer(self, target: str, headers, body: bytes):
        from live.phone.webhooks import HttpAnswer

        problem = telnyx_signature_problem(
            self._public_key, body, headers.get("telnyx-signature-ed25519"), headers.get("telnyx-timestamp"),
        )
        if problem is not None:
            log.warning("telnyx webhook refused: %s", problem)
            self.counted("forbidden")
            return HttpAnswer(http.HTTPStatus.FORBIDDEN.value, b"forbidden\n")
        try:
            data = json.loads(body)["data"]
            kind, payload = str(data["event_type"]), data.get("payload") or {}
            event_id = str(data.get("id") or "")
            if not isinstance(payload, dict):
                raise TypeError
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            return HttpAnswer(http.HTTPStatus.BAD_REQUEST.value, b"not a Telnyx webhook event\n")
        call_id = str(payload.get("call_control_id") or "")
        # "Do not depend on single delivery": an event is acted on once.
        if event_id and not await self.tokens.once(f"telnyx-event:{event_id}", 3600.0):
            self.counted("duplicate")
            return HttpAnswer(http.HTTPStatus.OK.value, b"ok (seen)\n")
        self.events = [*self.events[-255:], (kind, call_id)]
        self.count_status(kind)
        if not call_id:
            return HttpAnswer(http.HTTPStatus.OK.value, b"ok\n")
        state = _client_state(payload)
        asked = self.outbound.get(call_id)
        if asked is not None and kind in ("call.initiated", "call.answered", "call.hangup") and callable(asked.get("report")):
            asked["report"]({"call": call_id, "status": kind,
                             **({"cause": str(payload.get("hangup_cause"))[:40]} if kind == "call.hangup" else {})})
        queued = True
        if kind == "call.initiated" and payload.get("direction") == "incoming":
            queued = await self._incoming(call_id)
        elif kind == "call.answered" and call_id in self.outbound:
            queued = await self._outbound_answered(call_id)
        elif kind in ("call.machine.detection.ended", "call.machine.premium.detection.ended",
                      "call.machine.greeting.ended", "call.machine.premium.greeting.ended"):
            queued = await self._machine(kind, call_id, str(payload.get("result") or ""))
        elif kind in ("streaming.failed", "streaming.stopped") and call_id not in self._ended:
            # The stream is the conversation: without it the caller would sit in
            # billed silence (closing the socket does not end a Telnyx call).
            if kind == "streaming.failed":
                log.warning("telnyx call %s: the media stream failed: %s", call_id[:60],
                            str(payload.get("failure_reason"))[:200])
            queued = self._queue("hangup", lambda: self.control.hang_up(call_id))
        elif kind == "call.speak.ended" and state == "busy":
            queued = self._queue("hangup", lambda: self.control.hang_up(call_id))
        elif kind == "call.hangup":
            self.outbound.pop(call_id, None)
            self._ended[call_id] = None
            while len(self._ended) > 4096:
                del self._ended[next(iter(self._ended))]
            log.info("telnyx call %s ended (%s, by %s)", call_id[:60], str(payload.get("hangup_cause"))[:40],
                     str(payload.get("hangup_source"))[:20])
        if not queued:
            return HttpAnswer(http.HTTPStatus.SERVICE_UNAVAILABLE.value, b"busy: try again\n")
        return HttpAnswer(http.HTTPStatus.OK.value, b"ok\n")

    async def _incoming(self, call_id: str) -> bool:
        why = self.refusal()
        if why is not None:
            log.warning("telnyx call %s not taken: %s (%s)", call_id[:60], why, self.busy)
            self.counted(self.busy)
            if self.busy == "fallback":
                return False  # a non-200: Telnyx re-delivers to the failover URL
            if self.busy == "say":
                state = base64.b64encode(b"busy").decode()
                return self._queue("speak", lambda: self.control.speak(call_id, self.busy_message, client_state=state))
            return self._queue("reject", lambda: self.control.reject(call_id, "USER_BUSY"))
        token = await self.tokens.mint_once(call_id)
        if token is None:
            log.warning("telnyx call %s: its call.initiated came again; the call was answered already", call_id[:60])
            self.counted("replayed")
            return True
        self.counted("stream")
        return self._answer_later(call_id, token)

    def _answer_later(self, call_id: str, token: str) -> bool:
        state = base64.b64encode(token.encode()).decode()
        stream = self.stream

        async def answer() -> None:
            await self.control.answer(call_id, stream, client_state=state)
            log.info("telnyx call %s answered with a stream to %s", call_id[:60], stream.stream_url)

        return self._queue("answer", answer)

    async def _outbound_answered(self, call_id: str) -> bool:
        asked = self.outbound.get(call_id) or {}
        if asked.get("machine_detection"):
            return True  # the stream starts once detection says who answered
        return await self._start_outbound_stream(call_id)

    async def _start_outbound_stream(self, call_id: str) -> bool:
        token = await self.tokens.mint_once(call_id)
        if token is None:
            return True
        state = base64.b64encode(token.encode()).decode()
        stream = self.stream

        async def start() -> None:
            await self.control._action(call_id, "streaming_start", {**stream.fields(), "client_state": state})

        return self._queue("streaming_start", start)

    async def _machine(self, kind: str, call_id: str, result: str) -> bool:
        asked = self.outbound.get(call_id)
        if asked is None:
            return True
        policy = asked.get("policy", "human")
        human = result in ("human", "human_residence", "human_business", "not_sure")
        asked.setdefault("answered_by", result)
        if "greeting" in kind:
            if policy == "message" and result in ("beep_detected", "ended", "no_beep_detected", "not_sure"):
                asked["answered_by"] = "machine_end_beep" if result == "beep_detected" else "machine_end_other"
                self._report(call_id, asked)
                return await self._start_outbound_stream(call_id)
            return True
        self._report(call_id, asked)
        if human:
            return await self._start_outbound_stream(call_id)
        if policy == "message":
            return True  # wait for the greeting's end (the beep)
        return self._queue("hangup", lambda: self.control.hang_up(call_id))

    @staticmethod
    def _report(call_id: str, asked: dict) -> None:
        log.info("telnyx call %s answered by %s", call_id[:60], asked.get("answered_by"))
        report = asked.get("report")
        if callable(report):
            report({"call": call_id, "answered_by": asked.get("answered_by")})


def _client_state(payload: dict) -> str | None:
    state = payload.get("client_state")
    if not isinstance(state, str) or not state:
        return None
    try:
        return base64.b64decode(state, validate=True).decode("ascii")
    except ValueError:  # not base64 (binascii.Error), not ASCII text, or not ASCII base64 at all
        return None
