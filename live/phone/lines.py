"""Phone lines on a server: the media doors and the webhooks for the carriers it answers.

`PhoneLines.twilio(...)` gives what `live serve --twilio` mounts: the door on
`/twilio/media` (a factory the server calls per socket) and the webhook on
`/twilio/voice` (served by `WebhookListener`, on its own port).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

from live.doors.base import FrontDoor
from live.phone.calls import CallTokens
from live.phone.control import CallControl
from live.phone.twilio import TwilioDoor
from live.phone.webhooks import Handler, TwilioVoiceWebhook

__all__ = ["PhoneLines", "TWILIO_MEDIA_PATH", "TWILIO_VOICE_PATH"]

TWILIO_VOICE_PATH = "/twilio/voice"
TWILIO_MEDIA_PATH = "/twilio/media"


@dataclasses.dataclass
class PhoneLines:
    """The doors (WebSocket path -> door factory) and webhooks (path -> handler) of a server's phone lines."""

    doors: dict[str, Callable[..., FrontDoor]] = dataclasses.field(default_factory=dict)
    webhooks: dict[str, Handler] = dataclasses.field(default_factory=dict)
    public_hosts: set[str] = dataclasses.field(default_factory=set)  # names the carriers reach us by
    twilio_webhook: TwilioVoiceWebhook | None = None

    @classmethod
    def twilio(
        cls,
        auth_token: str,
        public_url: str,
        *,
        agent: str | None = None,
        token_secret: str | None = None,
        stream_url: str | None = None,
        on_dtmf: Callable[[str, str], None] | None = None,
        control: CallControl | None = None,
    ) -> PhoneLines:
        tokens = CallTokens(token_secret, agent=agent)
        webhook = TwilioVoiceWebhook(auth_token, public_url, tokens, media_path=TWILIO_MEDIA_PATH)
        if stream_url:
            webhook.stream_url = stream_url
        lines = cls(twilio_webhook=webhook)
        lines.doors[TWILIO_MEDIA_PATH] = functools.partial(
            TwilioDoor, tokens=tokens, on_dtmf=on_dtmf, control=control
        )
        lines.webhooks[TWILIO_VOICE_PATH] = webhook.answer
        lines.public_hosts.update(h for h in (urlsplit(public_url).hostname, urlsplit(webhook.stream_url).hostname) if h)
        return lines

    def mounted_on(self, doors: Mapping[str, Callable[..., FrontDoor]]) -> dict[str, Callable[..., FrontDoor]]:
        """`doors` with the phone doors added."""
        return {**doors, **self.doors}
