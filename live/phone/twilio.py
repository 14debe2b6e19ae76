"""Twilio Media Streams as a front door (sans-I/O; the work is `live.phone.carrier`'s).

A bidirectional stream (`<Connect><Stream>`) sends JSON text frames:
`connected`, `start` (`streamSid`, `callSid`, the TwiML's `<Parameter>`s as
`customParameters`, `mediaFormat`: μ-law, 8 kHz, mono), `media`, `dtmf`,
`mark`, `stop`; every message we send names the `streamSid`. See
twilio.com/docs/voice/media-streams/websocket-messages.
"""

from __future__ import annotations

from live.phone.carrier import PCMU, CarrierDoor, StreamStart, dtmf_text, object_field
from live.protocol import ProtocolError

__all__ = ["TwilioDoor", "dtmf_text"]


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
        parameters = start.get("customParameters") or {}
        token = parameters.get("token") if isinstance(parameters, dict) else None
        return StreamStart(stream_sid, str(start.get("callSid") or "") or None, PCMU,
                           token if isinstance(token, str) else None)

    def _envelope(self, message: dict) -> dict:
        return {"event": message.pop("event"), "streamSid": self.stream_id, **message}
