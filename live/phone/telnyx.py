"""Telnyx media streaming as a front door, and Telnyx's webhook signatures (sans-I/O).

A call answered with `stream_url` (Call Control's `answer`, bidirectional
`rtp` mode) streams JSON text frames: `connected`, `start` (`stream_id`,
`call_control_id`, `client_state` as the answer gave it, `media_format` with
`encoding` PCMU, PCMA or L16 and its `sample_rate`), `media` (base64 RTP
payloads; their order is not guaranteed, hence `media.chunk`), `dtmf`, `mark`,
`error`, `stop`; back, `media`, `mark` and `clear`. See
developers.telnyx.com, "Media Streaming".

Telnyx signs its webhooks with Ed25519: `telnyx-signature-ed25519` is the
base64 signature of `"{telnyx-timestamp}|{body}"`, checked with the account's
public key (Mission Control → Keys & Credentials → Public Key).
"""

from __future__ import annotations

import base64
import binascii
import time

from live.phone.carrier import CODECS, CarrierDoor, StreamStart, l16, object_field
from live.protocol import ProtocolError

__all__ = ["SIGNATURE_TOLERANCE", "TelnyxDoor", "telnyx_signature_problem"]

# Telnyx's own libraries refuse a webhook whose timestamp is further than this from now.
SIGNATURE_TOLERANCE = 300.0


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
        self._last_chunk = -1
        self.late_frames = 0  # media frames that came after a later one: dropped

    def _read_start(self, message: dict) -> StreamStart:
        start = message.get("start")
        if not isinstance(start, dict):
            raise ProtocolError("bad_frame", "'start' without its 'start' object")
        media = object_field(start, "media_format")
        encoding, rate = str(media.get("encoding", "")).upper(), media.get("sample_rate")
        channels = media.get("channels", 1)
        if encoding in CODECS and rate == 8000 and channels == 1:
            codec = CODECS[encoding]
        elif encoding == "L16" and rate in (8000, 16000) and channels == 1:
            codec = l16(rate)
        else:
            raise ProtocolError("unsupported_media", f"media format {media!r}: this door takes PCMU, PCMA or L16, mono")
        stream_id = str(message.get("stream_id") or "")
        if not stream_id:
            raise ProtocolError("bad_frame", "'start' names no stream_id")
        token = None
        state = start.get("client_state")
        if isinstance(state, str) and state:
            try:
                token = base64.b64decode(state, validate=True).decode("ascii")
            except (binascii.Error, UnicodeDecodeError):
                token = None
        return StreamStart(stream_id, str(start.get("call_control_id") or "") or None, codec, token)

    def _envelope(self, message: dict) -> dict:
        return message

    def inputs(self, frame: str | bytes):
        message = self._message(frame)
        event = message["event"]
        if event == "media":
            # Telnyx does not promise order: a frame older than one already
            # passed on would be heard out of place; it is dropped and counted.
            chunk = (message.get("media") or {}).get("chunk") if isinstance(message.get("media"), dict) else None
            try:
                number = int(chunk) if chunk is not None else None
            except (TypeError, ValueError):
                number = None
            if number is not None:
                if number <= self._last_chunk:
                    self.late_frames += 1
                    return self._owed()
                self._last_chunk = number
        elif event == "error":
            payload = object_field(message, "payload")
            raise ProtocolError("carrier_error", f"Telnyx reports {payload.get('code')}: "
                                f"{str(payload.get('title'))[:80]}: {str(payload.get('detail'))[:160]}")
        return super().inputs(message)


class TelnyxCallControl:
    """Telnyx's Call Control REST API (v2) for one API key: answer with a stream, hang up, transfer.

    Plain HTTPS with the standard library (the requests are three small JSON
    POSTs), in a worker thread so the event loop never waits on the network.
    """

    def __init__(self, api_key: str, *, base_url: str = "https://api.telnyx.com/v2", timeout: float = 10.0) -> None:
        self._api_key = api_key
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def __repr__(self) -> str:  # never the API key
        return f"TelnyxCallControl(base_url={self.base_url!r})"

    async def _action(self, call_id: str, action: str, body: dict) -> None:
        import json
        import urllib.parse
        import urllib.request

        import anyio

        url = f"{self.base_url}/calls/{urllib.parse.quote(call_id, safe=':')}/actions/{action}"
        request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
            "Authorization": f"Bearer {self._api_key}", "Content-Type": "application/json", "Accept": "application/json",
        })

        def post() -> None:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310 (our own https URL)
                response.read()

        await anyio.to_thread.run_sync(post)

    async def answer(self, call_id: str, *, stream_url: str, client_state: str, codec: str = "PCMU") -> None:
        await self._action(call_id, "answer", {
            "stream_url": stream_url, "stream_track": "inbound_track", "stream_bidirectional_mode": "rtp",
            "stream_bidirectional_codec": codec, "client_state": client_state,
        })

    async def hang_up(self, call_id: str) -> None:
        await self._action(call_id, "hangup", {})

    async def transfer(self, call_id: str, number: str) -> None:
        await self._action(call_id, "transfer", {"to": number})


class TelnyxCallWebhook:
    """`POST /telnyx/call`: check Telnyx's signature; answer an incoming call with a media stream here."""

    def __init__(self, public_key: str, control: TelnyxCallControl, stream_url: str, tokens, *, codec: str = "PCMU") -> None:
        self._public_key = public_key
        self.control = control
        self.stream_url = stream_url
        self.tokens = tokens
        self.codec = codec

    def __repr__(self) -> str:
        return f"TelnyxCallWebhook(stream_url={self.stream_url!r})"

    async def answer(self, target: str, headers, body: bytes):
        import http
        import json
        import logging

        from live.phone.webhooks import HttpAnswer

        log = logging.getLogger("live.phone")
        problem = telnyx_signature_problem(
            self._public_key, body, headers.get("telnyx-signature-ed25519"), headers.get("telnyx-timestamp"),
        )
        if problem is not None:
            log.warning("telnyx webhook refused: %s", problem)
            return HttpAnswer(http.HTTPStatus.FORBIDDEN.value, b"forbidden\n")
        try:
            data = json.loads(body)["data"]
            kind, payload = data["event_type"], data.get("payload") or {}
            if not isinstance(payload, dict):
                raise TypeError("payload")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            return HttpAnswer(http.HTTPStatus.BAD_REQUEST.value, b"not a Telnyx webhook event\n")
        if kind == "call.initiated" and payload.get("direction") == "incoming":
            call_id = str(payload.get("call_control_id") or "")
            if not call_id:
                return HttpAnswer(http.HTTPStatus.BAD_REQUEST.value, b"call.initiated without call_control_id\n")
            state = base64.b64encode(self.tokens.mint(call_id).encode()).decode()
            try:
                await self.control.answer(call_id, stream_url=self.stream_url, client_state=state, codec=self.codec)
            except OSError as exc:  # urllib's errors are OSErrors; never the request's headers
                log.warning("telnyx call %s: answering failed: %s", call_id[:60], exc)
                return HttpAnswer(http.HTTPStatus.BAD_GATEWAY.value, b"could not answer the call\n")
            log.info("telnyx call %s answered with a stream to %s", call_id[:60], self.stream_url)
        return HttpAnswer(http.HTTPStatus.OK.value, b"ok\n")
