"""Twilio's webhooks: what answers "a call came in; what now?".

The answer is TwiML that connects the call to a bidirectional media stream on
this server, with a token for that one call (`live.phone.calls`) and what the
webhook said of the call (who called whom) as `<Parameter>`s, and after the
stream a sentence: Twilio runs the verbs after `</Connect>` once the stream
ends from our side, so a stream that fails still ends with words, never a
dead line. Every request must carry Twilio's signature of itself
(`TwilioSignatures`): a request that does not (forged, altered, sent to
another URL) is refused with 403 and nothing else is said. Twilio's signature
covers no time, so a captured request stays valid forever: a call's id gets
its token once, and a replay of its webhook is refused (409).

A server that takes no calls now (full, or draining for a deploy) answers as
the operator chose (`busy`): `say` a sentence and hang up, `reject` (the
caller hears busy, and Twilio bills nothing), or `fallback` (503, so Twilio
asks the number's Fallback URL).

`TwilioVoiceWebhook.answer` is the decision, without I/O but the store;
carriers POST their webhooks with a form body, served by
`live.net.http_post.PostListener` (or on the WebSocket port: `live.net`).
"""

from __future__ import annotations

import http
import ipaddress
import logging
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from live.net.http_post import Handler, HttpAnswer, plain
from live.phone.calls import CallTokens

__all__ = ["CALL_FIELDS", "Handler", "HttpAnswer", "TwilioSignatures", "TwilioVoiceWebhook", "stream_url_for"]

log = logging.getLogger("live.phone")

# "The combined length of each <Parameter> name and value attributes must be under 500 characters."
MAX_PARAMETER = 499
# The webhook's fields that go along to the stream (`<Parameter>`s) for the
# agent: who called whom and what Twilio knows of them. Not the account's id,
# nor `CallToken` (what lets a call be forwarded with its caller ID).
CALL_FIELDS = (
    "From", "To", "Direction", "CallerName", "ForwardedFrom", "CallerCity", "CallerState", "CallerZip",
    "CallerCountry", "FromCity", "FromState", "FromZip", "FromCountry", "ToCity", "ToState", "ToZip", "ToCountry",
    "StirVerstat", "AnsweredBy", "ParentCallSid", "transfer_failed", "transfer_status",
)
BUSY_CHOICES = ("say", "reject", "fallback")
DEFAULT_BUSY_MESSAGE = "Sorry, all our lines are busy. Please call again later."
DEFAULT_GOODBYE = "Sorry, this call cannot go on. Please call again later. Goodbye."


def _loopback(host: str | None) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return False


def stream_url_for(public_url: str, path: str) -> str:
    """The wss:// URL of a media path under the server's public https:// URL (its path kept).

    Twilio: "wss is the only supported protocol", and "The url does not support
    query string parameters". A plain ws:// or http:// address is taken only
    on loopback (a test, a local tunnel's far end)."""
    parts = urlsplit(public_url)
    if parts.query or parts.fragment:
        raise ValueError(f"{public_url!r}: a public URL with a query or fragment cannot carry a media stream")
    if parts.scheme in ("https", "wss"):
        scheme = "wss"
    elif parts.scheme in ("http", "ws") and _loopback(parts.hostname):
        scheme = "ws"
    else:
        raise ValueError(f"{public_url!r}: carriers open media streams on wss:// only (an https:// public URL)")
    return f"{scheme}://{parts.netloc}{parts.path.rstrip('/')}{path}"


def check_stream_url(url: str) -> str:
    """`url` if a carrier can open a stream on it (wss://, no query; ws:// on loopback); else ValueError."""
    parts = urlsplit(url)
    if parts.query or parts.fragment:
        raise ValueError(f"{url!r}: a media stream's URL takes no query string (Twilio: use <Parameter>s)")
    if parts.scheme != "wss" and not (parts.scheme == "ws" and _loopback(parts.hostname)):
        raise ValueError(f"{url!r}: carriers open media streams on wss:// only")
    return url


class _Form(dict[str, str]):
    """A form's fields with every value of a repeated name (what the signature covers)."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        super().__init__(pairs)
        self._all: dict[str, list[str]] = {}
        for name, value in pairs:
            self._all.setdefault(name, []).append(value)

    def getlist(self, name: str) -> list[str]:
        return self._all.get(name, [])


class TwilioSignatures:
    """Who signs Twilio's requests, and the check (twilio's `RequestValidator`).

    "By default Twilio signs webhooks with your Auth Token using HMAC-SHA1. If a
    Webhooks Rule matches the webhook URL, Twilio signs with the Setting's
    SharedKey and algorithm instead, and adds this header:
    X-Twilio-Webhooks-Signature-Settings: key=<...>,algorithm=HMAC_SHA256".
    """

    def __init__(self, auth_token: str, shared_key: str | None = None) -> None:
        from twilio.request_validator import RequestValidator

        self._token = RequestValidator(auth_token)
        self._shared = RequestValidator(shared_key) if shared_key else None

    def __repr__(self) -> str:  # never a secret
        return f"TwilioSignatures(shared_key={'set' if self._shared else 'none'})"

    def problem(self, url: str, params: Any, headers: Mapping[str, str]) -> str | None:
        """None if Twilio signed `url` and `params` as `headers` say; else why not (never the signature)."""
        from twilio.request_validator import get_signature_algorithm

        signature = headers.get("x-twilio-signature")
        if not signature:
            return "no X-Twilio-Signature"
        settings = headers.get("x-twilio-webhooks-signature-settings")
        if settings:
            if self._shared is None:
                return "signed with a Webhooks Rule's shared key, and this server has none (--twilio-shared-key)"
            validator, algorithm = self._shared, get_signature_algorithm(settings)
        else:
            validator, algorithm = self._token, None
        if not validator.validate(url, params, signature, algorithm=algorithm):
            return "bad signature"
        return None


class TwilioVoiceWebhook:
    """`POST /twilio/voice`: check Twilio's signature, answer `<Connect><Stream>` with the call's token."""

    def __init__(
        self, auth_token: str | TwilioSignatures, public_url: str, tokens: CallTokens, *,
        media_path: str = "/twilio/media", stream_url: str | None = None,
    ) -> None:
        self.signatures = auth_token if isinstance(auth_token, TwilioSignatures) else TwilioSignatures(auth_token)
        self.public_url = public_url.rstrip("/")
        self.stream_url = check_stream_url(stream_url) if stream_url else stream_url_for(self.public_url, media_path)
        self.tokens = tokens
        # Set by the lines: whether calls are taken now (None) or why not.
        self.refusal: Callable[[], str | None] = lambda: None
        self.busy = "say"
        self.busy_message = DEFAULT_BUSY_MESSAGE
        self.goodbye = DEFAULT_GOODBYE
        self.on_status: Callable[[dict[str, str]], object] | None = None  # status callbacks, as they come
        self.outbound: dict[str, dict[str, Any]] = {}  # CallSid -> what `live call` asked for (AMD policy)
        self.counted: Callable[[str], None] = lambda answer: None  # metrics: how each webhook was answered
        self.count_status: Callable[[str], None] = lambda status: None  # metrics: calls' progress

    def __repr__(self) -> str:  # never the auth token
        return f"TwilioVoiceWebhook(public_url={self.public_url!r})"

    def _form(self, target: str, headers: Mapping[str, str], body: bytes) -> _Form | HttpAnswer:
        try:
            form = _Form(parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False))
        except UnicodeDecodeError:
            return plain(http.HTTPStatus.BAD_REQUEST, "the form is not UTF-8")
        # Twilio signs the URL it was given, which is the public one (a tunnel's,
        # a proxy's), not the address this listener sees.
        url = self.public_url + target
        problem = self.signatures.problem(url, form, headers)
        if problem is not None:
            log.warning("twilio webhook refused: %s for %s", problem, url[:200])
            self.counted("forbidden")
            return plain(http.HTTPStatus.FORBIDDEN, "forbidden")
        return form

    async def answer(self, target: str, headers: Mapping[str, str], body: bytes) -> HttpAnswer:
        form = self._form(target, headers, body)
        if isinstance(form, HttpAnswer):
            return form
        call_sid = form.get("CallSid", "")
        if not call_sid:
            return plain(http.HTTPStatus.BAD_REQUEST, "the webhook names no CallSid")
        from twilio.twiml.voice_response import VoiceResponse

        occasion, facts = "", dict(form)
        dialled = form.get("DialCallStatus")
        if dialled is not None:  # a transfer's <Dial> ended: back to the agent, unless it connected
            if dialled in ("completed", "answered"):
                response = VoiceResponse()
                response.hangup()
                return self._twiml(response, "transferred")
            occasion = "transfer:" + form.get("DialCallSid", "")
            facts["transfer_failed"] = urlsplit(target).query.partition("transfer=")[2].split("&")[0][:40] or "a number"
            facts["transfer_status"] = dialled
        asked = self.outbound.get(call_sid)
        if asked is not None and form.get("AnsweredBy"):
            skip = self._machine_policy(asked, form["AnsweredBy"])
            if skip is not None:
                return skip
        why = self.refusal()
        if why is not None and dialled is None:
            log.warning("twilio call %s not taken: %s (%s)", call_sid[:40], why, self.busy)
            return self._busy()
        token = await self.tokens.mint_once(call_sid, occasion)
        if token is None:
            log.warning("twilio call %s: its webhook came again (a replay?); it has had its token", call_sid[:40])
            self.counted("replayed")
            return plain(http.HTTPStatus.CONFLICT, "this call was answered already")
        response = VoiceResponse()
        connect = response.connect()
        stream = connect.stream(url=self.stream_url)
        stream.parameter(name="token", value=token)
        for name in CALL_FIELDS:
            value = facts.get(name)
            if value and len(name) + len(value) <= MAX_PARAMETER:
                stream.parameter(name=name, value=value)
        if self.goodbye:
            # Reached only when the stream ends from our side without a hang-up:
            # a failure, or a server that could not take the stream.
            response.say(self.goodbye)
        log.info("twilio call %s (%s) connected to %s", call_sid[:40], form.get("Direction", "?")[:20], self.stream_url)
        return self._twiml(response, "stream")

    def _twiml(self, response: Any, counted: str) -> HttpAnswer:
        self.counted(counted)
        return HttpAnswer(http.HTTPStatus.OK.value, str(response).encode(), "text/xml; charset=utf-8")

    def _busy(self) -> HttpAnswer:
        from twilio.twiml.voice_response import VoiceResponse

        if self.busy == "fallback":
            self.counted("fallback")
            return plain(http.HTTPStatus.SERVICE_UNAVAILABLE, "no line free: Twilio asks the number's Fallback URL")
        response = VoiceResponse()
        if self.busy == "reject":
            response.reject(reason="busy")
            return self._twiml(response, "rejected")
        response.say(self.busy_message)
        response.hangup()
        return self._twiml(response, "busy")

    def _machine_policy(self, asked: dict[str, Any], answered_by: str) -> HttpAnswer | None:
        """An outbound call's answering-machine detection said who answered: go
        on to the agent (None), or hang up."""
        from twilio.twiml.voice_response import VoiceResponse

        known = ("human", "machine_start", "machine_end_beep", "machine_end_silence", "machine_end_other", "fax", "unknown")
        answered_by = answered_by if answered_by in known else "unknown"
        asked["answered_by"] = answered_by
        report = asked.get("report")
        if callable(report):
            report({"call": asked.get("sid", ""), "answered_by": answered_by})
        policy = asked.get("policy", "human")
        if answered_by in ("human", "unknown"):
            return None
        if policy == "message" and answered_by.startswith("machine_end"):
            return None  # after the beep: the agent leaves its message
        response = VoiceResponse()
        response.hangup()
        return self._twiml(response, "machine_hung_up")

    async def status(self, target: str, headers: Mapping[str, str], body: bytes) -> HttpAnswer:
        """`POST /twilio/status`: Twilio's status callbacks for calls placed with `live call`."""
        form = self._form(target, headers, body)
        if isinstance(form, HttpAnswer):
            return form
        fields = {k: form[k] for k in ("CallSid", "CallStatus", "AnsweredBy", "CallDuration", "Direction") if k in form}
        log.info("twilio call %s: %s%s", fields.get("CallSid", "?")[:40], fields.get("CallStatus", "?")[:20],
                 f" (answered by {fields['AnsweredBy'][:20]})" if "AnsweredBy" in fields else "")
        self.count_status(fields.get("CallStatus", ""))
        if self.on_status is not None:
            self.on_status(fields)
        return HttpAnswer(http.HTTPStatus.OK.value, b"ok\n")
