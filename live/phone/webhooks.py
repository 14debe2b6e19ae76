"""The carriers' webhooks: what answers "a call came in; what now?".

The answer for Twilio is TwiML that connects the call to a bidirectional media
stream on this server, with a token for that one call (`live.phone.calls`).
Every request must carry the carrier's signature of itself: a request that
does not (a forged one, a replay to another URL) is refused with 403 and
nothing else is said.

`TwilioVoiceWebhook.answer` is the decision, without I/O; carriers POST their
webhooks with a form body, served by `live.net.http_post.PostListener` on a port
of its own.
"""

from __future__ import annotations

import http
import logging
from collections.abc import Mapping
from urllib.parse import parse_qsl, urlsplit

from live.net.http_post import Handler, HttpAnswer, plain
from live.phone.calls import CallTokens

__all__ = ["Handler", "HttpAnswer", "TwilioVoiceWebhook", "stream_url_for"]

log = logging.getLogger("live.phone")


def stream_url_for(public_url: str, path: str) -> str:
    """The wss:// URL of a media path, from the public https:// URL of the server."""
    parts = urlsplit(public_url)
    scheme = {"https": "wss", "http": "ws"}.get(parts.scheme, parts.scheme)
    return f"{scheme}://{parts.netloc}{path}"


class _Form(dict[str, str]):
    """A form's fields with every value of a repeated name (what the signature covers)."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        super().__init__(pairs)
        self._all: dict[str, list[str]] = {}
        for name, value in pairs:
            self._all.setdefault(name, []).append(value)

    def getlist(self, name: str) -> list[str]:
        return self._all.get(name, [])


class TwilioVoiceWebhook:
    """`POST /twilio/voice`: check Twilio's signature, answer `<Connect><Stream>` with a call token."""

    def __init__(self, auth_token: str, public_url: str, tokens: CallTokens, *, media_path: str = "/twilio/media") -> None:
        from twilio.request_validator import RequestValidator

        self._validator = RequestValidator(auth_token)
        self.public_url = public_url.rstrip("/")
        self.stream_url = stream_url_for(self.public_url, media_path)
        self.tokens = tokens

    def __repr__(self) -> str:  # never the auth token
        return f"TwilioVoiceWebhook(public_url={self.public_url!r})"

    def answer(self, target: str, headers: Mapping[str, str], body: bytes) -> HttpAnswer:
        signature = headers.get("x-twilio-signature")
        try:
            form = _Form(parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False))
        except UnicodeDecodeError:
            return plain(http.HTTPStatus.BAD_REQUEST, "the form is not UTF-8")
        # Twilio signs the URL it was given, which is the public one (a tunnel's,
        # a proxy's), not the address this listener sees.
        url = self.public_url + target
        if not signature or not self._validator.validate(url, form, signature):
            log.warning("twilio webhook refused: %s for %s", "bad signature" if signature else "no signature", url[:200])
            return plain(http.HTTPStatus.FORBIDDEN, "forbidden")
        call_sid = form.get("CallSid", "")
        if not call_sid:
            return plain(http.HTTPStatus.BAD_REQUEST, "the webhook names no CallSid")
        from twilio.twiml.voice_response import Connect, VoiceResponse

        connect = Connect()
        stream = connect.stream(url=self.stream_url)
        stream.parameter(name="token", value=self.tokens.mint(call_sid))
        response = VoiceResponse()
        response.append(connect)
        log.info("twilio call %s (%s) connected to %s", call_sid[:40], form.get("Direction", "?")[:20], self.stream_url)
        return HttpAnswer(http.HTTPStatus.OK.value, str(response).encode(), "text/xml; charset=utf-8")
