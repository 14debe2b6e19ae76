"""Call control as agent tools: hang up, transfer to a number.

A phone door names the call its session carries (`current_call`, set when
the stream starts, so every task of that session, tools included, sees it).
The tools act on that call through the carrier's REST API:

    from live.phone.control import end_call, transfer_call
    agent = Agent(name="desk", model=..., tools=[end_call, transfer_call])

`end_call` is `live.end_session` under a phone's name: the session ends once
the caller has heard the goodbye (the carrier's mark after its last frame),
and ending it hangs the call up (`CarrierDoor.end`).

Twilio: `calls(sid).update(twiml=...)` with `<Hangup/>` or `<Dial>`; the
stream ends when the call leaves it. The twilio library's REST client is
blocking (requests), so each call runs in a worker thread.
"""

from __future__ import annotations

import contextvars
import dataclasses
import re
from typing import Any, Protocol

import anyio

from live.agent import end_session

__all__ = ["CallControl", "PhoneCall", "TwilioCallControl", "current_call", "end_call", "transfer_call"]

E164 = re.compile(r"^\+[1-9][0-9]{6,14}$")


class CallControl(Protocol):
    async def hang_up(self, call_id: str) -> None: ...

    async def transfer(self, call_id: str, number: str) -> None: ...


@dataclasses.dataclass(frozen=True)
class PhoneCall:
    """The call a session carries: which carrier, its id there, and how to act on it."""

    carrier: str
    call_id: str
    control: CallControl | None = None


current_call: contextvars.ContextVar[PhoneCall | None] = contextvars.ContextVar("live_phone_call", default=None)


class TwilioCallControl:
    """Twilio's REST API for one account (`http_client`: the twilio library's seam, for a double)."""

    def __init__(self, account_sid: str, auth_token: str, *, http_client: Any = None) -> None:
        import logging

        from twilio.rest import Client

        # The library logs each request at INFO; its headers are no business of our log.
        logging.getLogger("twilio.http_client").setLevel(logging.WARNING)
        self._client = Client(account_sid, auth_token, http_client=http_client)

    def __repr__(self) -> str:  # never the auth token
        return "TwilioCallControl()"

    async def _update(self, call_id: str, twiml: str) -> None:
        await anyio.to_thread.run_sync(lambda: self._client.calls(call_id).update(twiml=twiml))

    async def place(self, to: str, from_: str, voice_url: str) -> str:
        """Ask Twilio to call `to` from `from_`; when answered, Twilio asks `voice_url` (our webhook). The call's sid."""
        call = await anyio.to_thread.run_sync(
            lambda: self._client.calls.create(to=to, from_=from_, url=voice_url, method="POST")
        )
        return str(call.sid)

    async def hang_up(self, call_id: str) -> None:
        from twilio.twiml.voice_response import VoiceResponse

        response = VoiceResponse()
        response.hangup()
        await self._update(call_id, str(response))

    async def transfer(self, call_id: str, number: str) -> None:
        from twilio.twiml.voice_response import VoiceResponse

        response = VoiceResponse()
        response.dial(number)
        await self._update(call_id, str(response))


def _call() -> PhoneCall:
    call = current_call.get()
    if call is None:
        raise RuntimeError("this conversation is not a phone call")
    if call.control is None:
        raise RuntimeError(f"no call control for {call.carrier} is configured on this server")
    return call


async def end_call() -> dict:
    """Hang up the phone call. Say goodbye first: the call ends once the caller has heard everything you said."""
    return await end_session()


async def transfer_call(number: str) -> dict:
    """Transfer the caller to another phone number, in international form such as +15551234567."""
    number = number.replace(" ", "").replace("-", "")
    if not E164.match(number):
        return {"error": f"{number!r} is not a phone number in international form, like +15551234567"}
    call = _call()
    assert call.control is not None
    await call.control.transfer(call.call_id, number)
    return {"transferred_to": number}
