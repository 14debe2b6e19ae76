"""Phone lines on a server: the media doors and the webhooks for the carriers it answers.

What `live serve --twilio` / `--telnyx` mount: a door per carrier's media
path (a factory the server calls per socket) and its webhook (served by
`live.net.http_post.PostListener`, on its own port). One `CallTokens` signs every call's
token, whichever carrier brought the call.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

from live.doors.base import FrontDoor
from live.phone.calls import CallTokens
from live.phone.control import CallControl
from live.phone.webhooks import Handler, TwilioVoiceWebhook, stream_url_for

__all__ = ["PhoneLines", "TELNYX_CALL_PATH", "TELNYX_MEDIA_PATH", "TWILIO_MEDIA_PATH", "TWILIO_VOICE_PATH"]

TWILIO_VOICE_PATH = "/twilio/voice"
TWILIO_MEDIA_PATH = "/twilio/media"
TELNYX_CALL_PATH = "/telnyx/call"
TELNYX_MEDIA_PATH = "/telnyx/media"


@dataclasses.dataclass
class PhoneLines:
    """The doors (WebSocket path -> door factory) and webhooks (path -> handler) of a server's phone lines."""

    tokens: CallTokens = dataclasses.field(default_factory=CallTokens)
    doors: dict[str, Callable[..., FrontDoor]] = dataclasses.field(default_factory=dict)
    webhooks: dict[str, Handler] = dataclasses.field(default_factory=dict)
    public_hosts: set[str] = dataclasses.field(default_factory=set)  # names the carriers reach us by
    twilio_webhook: TwilioVoiceWebhook | None = None
    telnyx_webhook: object | None = None

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
        lines = cls(tokens=CallTokens(token_secret, agent=agent))
        return lines.add_twilio(auth_token, public_url, stream_url=stream_url, on_dtmf=on_dtmf, control=control)

    def add_twilio(
        self, auth_token: str, public_url: str, *, stream_url: str | None = None,
        on_dtmf: Callable[[str, str], None] | None = None, control: CallControl | None = None,
    ) -> PhoneLines:
        from live.phone.twilio import TwilioDoor

        webhook = TwilioVoiceWebhook(auth_token, public_url, self.tokens, media_path=TWILIO_MEDIA_PATH)
        if stream_url:
            webhook.stream_url = stream_url
        self.twilio_webhook = webhook
        self.doors[TWILIO_MEDIA_PATH] = functools.partial(TwilioDoor, tokens=self.tokens, on_dtmf=on_dtmf, control=control)
        self.webhooks[TWILIO_VOICE_PATH] = webhook.answer
        self._public(public_url, webhook.stream_url)
        return self

    def add_telnyx(
        self, public_key: str, api_key: str, public_url: str, *, stream_url: str | None = None,
        api_base_url: str = "https://api.telnyx.com/v2", on_dtmf: Callable[[str, str], None] | None = None,
    ) -> PhoneLines:
        from live.phone.telnyx import TelnyxCallControl, TelnyxCallWebhook, TelnyxDoor

        control = TelnyxCallControl(api_key, base_url=api_base_url)
        stream = stream_url or stream_url_for(public_url, TELNYX_MEDIA_PATH)
        webhook = TelnyxCallWebhook(public_key, control, stream, self.tokens)
        self.telnyx_webhook = webhook
        self.doors[TELNYX_MEDIA_PATH] = functools.partial(TelnyxDoor, tokens=self.tokens, on_dtmf=on_dtmf, control=control)
        self.webhooks[TELNYX_CALL_PATH] = webhook.answer
        self._public(public_url, stream)
        return self

    def _public(self, *urls: str) -> None:
        self.public_hosts.update(h for h in (urlsplit(url).hostname for url in urls) if h)

    def mounted_on(self, doors: Mapping[str, Callable[..., FrontDoor]]) -> dict[str, Callable[..., FrontDoor]]:
        """`doors` with the phone doors added."""
        return {**doors, **self.doors}
