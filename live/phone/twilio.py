"""Twilio Media Streams as a front door (sans-I/O; the work is `live.phone.carrier`'s).

A bidirectional stream (`<Connect><Stream>`) sends JSON text frames:
`connected`, `start` (`streamSid`, `callSid`, the TwiML's `<Parameter>`s as
`customParameters`, `mediaFormat`: μ-law, 8 kHz, mono), `media`, `dtmf`,
`mark`, `stop`; every message we send names the `streamSid`. See
twilio.com/docs/voice/media-streams/websocket-messages.

Twilio signs the stream's WebSocket handshake as it signs webhooks
(`x-twilio-signature`); `handshake_check` checks it against the `<Stream
url>` the webhook's answer gave, the strictest reading of what Twilio signs.
"""

from __future__ import annotations

from collections.abc import Callable

from live.phone.carrier import PCMU, CarrierDoor, StreamStart, dtmf_text, object_field
from live.phone.webhooks import CALL_FIELDS, TwilioSignatures
from live.protocol import ProtocolError

__all__ = ["CALL_FIELDS", "TwilioDoor", "dtmf_text", "handshake_check"]

class TwilioDoor(CarrierDoor):
    """One Twilio media stream: one phone call."""

    name = "twilio"
    carrier = "Twilio"

    @property
    def stream_sid(self) -> str | None:
        return self.stream_id

    @property
    def call_sid(self) -> str | None:
        return self.call_id

    def _read_start(self, message: dict) -> StreamStart:
        start = message.get("start")
        if not isinstance(start, dict):
            raise ProtocolError("bad_frame", "'start' without its 'start' object")
        media = object_field(start, "mediaFormat")
        if (media.get("encoding"), media.get("sampleRate"), media.get("channels", 1)) != ("audio/x-mulaw", 8000, 1):
            raise ProtocolError("unsupported_media", f"media format {media!r}: this door takes μ-law, 8 kHz, mono")
        stream_sid = str(start.get("streamSid") or message.get("streamSid") or "")
        if not stream_sid:
            raise ProtocolError("bad_frame", "'start' names no streamSid")
        parameters = start.get("customParameters")
        parameters = parameters if isinstance(parameters, dict) else {}
        token = parameters.get("token")
        facts = {k: v[:200] for k, v in parameters.items() if k in CALL_FIELDS and isinstance(v, str)}
        direction = facts.get("Direction", "")
        return StreamStart(
            stream_sid, str(start.get("callSid") or "") or None, PCMU, token if isinstance(token, str) else None,
            caller=facts.get("From"), called=facts.get("To"),
            direction="outbound" if direction.startswith("outbound") else "inbound" if direction else None,
            parameters=facts,
        )

    def _envelope(self, message: dict) -> dict:
        return {"event": message.pop("event"), "streamSid": self.stream_id, **message}


def handshake_check(signatures: TwilioSignatures, stream_url: Callable[[], str]) -> Callable[[object], str | None]:
    """Why a media socket's handshake is not Twilio's, or None.

    Twilio: "You must also configure your application to validate the
    X-Twilio-Signature header"; on a WebSocket request the header's name is
    all lowercase. What URL it signs is not written down; the strictest
    reading is the `<Stream url>` exactly (wss://), with no parameters (a GET
    upgrade has no form).
    """

    def check(request: object) -> str | None:
        headers = getattr(request, "headers", None)
        if headers is None:
            return "the media stream's handshake is unknown"
        problem = signatures.problem(stream_url(), {}, headers)
        return None if problem is None else f"the media stream's handshake is not Twilio's ({problem})"

    return check
