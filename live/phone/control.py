"""Call control as agent tools: hang up, transfer to a destination the operator named.

A phone door names the call its session carries (`current_call`, set when
the stream starts, so every task of that session, tools included, sees it):
its carrier and id, who called whom, what the carrier's webhook said of it,
and the transfer destinations the operator allows. The tools act on that
call through the carrier's REST API:

    from live.phone.control import end_call, transfer_to
    agent = Agent(name="desk", model=..., tools=[end_call, transfer_to({"sales": "+15551234567"})])

`transfer_call(destination)` takes a destination's name, never a number: the
names are the operator's (`transfer_to(...)` in the agent, or `live serve
--transfers FILE`), and a name that is not one of them is refused and logged,
with no request to the carrier. A number the model makes up (a premium-rate
line a caller talked it into) is never dialled.

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
import logging
import re
import tomllib
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

import anyio

from live.agent import end_session

__all__ = [
    "CallControl",
    "PhoneCall",
    "TransferRefused",
    "TwilioCallControl",
    "current_call",
    "end_call",
    "load_destinations",
    "transfer_call",
    "transfer_to",
]

log = logging.getLogger("live.phone")

E164 = re.compile(r"^\+[1-9][0-9]{6,14}$")
# A destination's name: what the model says, what the operator wrote.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.-]{0,39}$")


class CallControl(Protocol):
    async def hang_up(self, call_id: str) -> None: ...

    async def transfer(self, call_id: str, number: str) -> None: ...


@dataclasses.dataclass(frozen=True)
class PhoneCall:
    """The call a session carries: which carrier, its id there, who called whom,
    and how to act on it.

    - `caller`, `called`: the numbers (E.164, or a SIP address) as the carrier
      gave them; `direction`: `inbound` (someone called the agent) or
      `outbound` (`live call`).
    - `parameters`: what the carrier's webhook said of the call (Twilio's form
      fields, such as `CallerName`, `FromCity`, `ForwardedFrom`; Telnyx's
      `start` fields), as text.
    - `destinations`: names the operator allows transfers to, and their numbers.
    """

    carrier: str
    call_id: str
    control: CallControl | None = None
    caller: str | None = None
    called: str | None = None
    direction: str | None = None
    parameters: Mapping[str, str] = dataclasses.field(default_factory=dict)
    destinations: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def describe(self) -> str:
        """The call in a few sentences, for the model's instruction."""
        way = "called in" if self.direction != "outbound" else "was called by this agent"
        said = [f"This conversation is a phone call ({self.carrier}, call id {self.call_id})."]
        if self.caller:
            said.append(f"The caller's number is {self.caller}; they {way}" + (f" to {self.called}." if self.called else "."))
        name = self.parameters.get("CallerName") or self.parameters.get("caller_id_name")
        if name:
            said.append(f"The caller ID name is {name}.")
        if self.parameters.get("AnsweredBy"):
            said.append(f"Answering machine detection: {self.parameters['AnsweredBy']}.")
        if self.parameters.get("transfer_failed"):
            said.append(f"The caller was being transferred to {self.parameters['transfer_failed']}, and the "
                        f"transfer did not go through ({self.parameters.get('transfer_status', 'failed')}).")
        said.append("The caller hears you; keys they press reach you as short bracketed notes.")
        return " ".join(said)


current_call: contextvars.ContextVar[PhoneCall | None] = contextvars.ContextVar("live_phone_call", default=None)


class TransferRefused(ValueError):
    """A transfer destination file that cannot be used; the message says why."""


def load_destinations(path: str | Path) -> dict[str, str]:
    """Transfer destinations from a TOML file: `[destinations]` of name = "+E.164"."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise TransferRefused(f"{path}: {exc}") from None
    table = data.get("destinations")
    if not isinstance(table, dict) or not table:
        raise TransferRefused(f"{path}: no [destinations] table of name = \"+15551234567\"")
    return checked_destinations(table, str(path))


def checked_destinations(table: Mapping[str, Any], where: str = "destinations") -> dict[str, str]:
    out: dict[str, str] = {}
    for name, number in table.items():
        if not isinstance(name, str) or not NAME.match(name):
            raise TransferRefused(f"{where}: {name!r} is not a destination name (letters, digits, space, _ . -)")
        if not isinstance(number, str) or not E164.match(number):
            raise TransferRefused(f"{where}: {name}: {number!r} is not a number in international form (+15551234567)")
        out[_key(name)] = number
    return out


def _key(name: str) -> str:
    return " ".join(name.lower().replace("_", " ").replace("-", " ").split())


class TwilioCallControl:
    """Twilio's REST API for one account (`http_client`: the twilio library's seam, for a double)."""

    def __init__(self, account_sid: str, auth_token: str, *, http_client: Any = None) -> None:
        from twilio.rest import Client

        # The library logs each request at INFO; its headers are no business of our log.
        logging.getLogger("twilio.http_client").setLevel(logging.WARNING)
        self._client = Client(account_sid, auth_token, http_client=http_client)

    def __repr__(self) -> str:  # never the auth token
        return "TwilioCallControl()"

    async def _update(self, call_id: str, twiml: str) -> None:
        await anyio.to_thread.run_sync(lambda: self._client.calls(call_id).update(twiml=twiml))

    async def place(self, to: str, from_: str, voice_url: str, **options: Any) -> str:
        """Ask Twilio to call `to` from `from_`; when answered, Twilio asks `voice_url` (our webhook). The call's sid.

        `options` are the REST API's (`status_callback`, `machine_detection`, ...)."""
        call = await anyio.to_thread.run_sync(
            lambda: self._client.calls.create(to=to, from_=from_, url=voice_url, method="POST", **options)
        )
        return str(call.sid)

    async def hang_up(self, call_id: str) -> None:
        from twilio.twiml.voice_response import VoiceResponse

        response = VoiceResponse()
        response.hangup()
        await self._update(call_id, str(response))

    async def transfer(self, call_id: str, number: str, *, action: str | None = None) -> None:
        """Dial `number` in place of the stream; with `action`, Twilio asks that URL
        how the dial ended (the call comes back to the agent if it failed)."""
        from twilio.twiml.voice_response import VoiceResponse

        response = VoiceResponse()
        if action:
            response.dial(number, action=action, method="POST")
        else:
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


async def _transfer(destination: str, destinations: Mapping[str, str]) -> dict:
    call = current_call.get()
    allowed = {**(call.destinations if call is not None else {}), **destinations}
    number = allowed.get(_key(destination)) if isinstance(destination, str) else None
    if number is None:
        log.warning("transfer to %r refused: not a destination the operator named (%s)",
                    str(destination)[:60], ", ".join(sorted(allowed)) or "none are")
        names = ", ".join(sorted(allowed)) or "none: no transfers are set up"
        return {"error": f"{str(destination)[:60]!r} is not a transfer destination. The destinations are: {names}."}
    call = _call()
    assert call.control is not None
    try:
        action = getattr(call.control, "transfer_action", None)
        if action is not None:
            await call.control.transfer(call.call_id, number, action=action(call, _key(destination)))
        else:
            await call.control.transfer(call.call_id, number)
    except Exception as exc:  # the carrier's refusal (HTTP error, network): the model says so
        log.warning("%s call %s: transfer to %s failed: %s", call.carrier, call.call_id[:40], _key(destination),
                    str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
        return {"error": f"the transfer to {destination} did not go through; the caller is still on the line with you"}
    log.info("%s call %s: transferred to %s", call.carrier, call.call_id[:40], _key(destination))
    return {"transferred_to": _key(destination)}


async def transfer_call(destination: str) -> dict:
    """Transfer the caller to one of the operator's named destinations (say its name, e.g. "sales").
    Tell the caller before you do: they leave this conversation."""
    return await _transfer(destination, {})


def transfer_to(destinations: Mapping[str, str]) -> Callable[[str], Awaitable[dict]]:
    """A `transfer_call` tool for these destinations (name -> number in international form)."""
    allowed = MappingProxyType(checked_destinations(destinations))

    async def transfer_call(destination: str) -> dict:
        return await _transfer(destination, allowed)

    transfer_call.__doc__ = (
        "Transfer the caller to one of these destinations, by name: " + ", ".join(sorted(allowed))
        + ". Tell the caller before you do: they leave this conversation."
    )
    return transfer_call
