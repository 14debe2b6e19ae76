"""`live call NUMBER --from NUMBER ...`: serve an agent on Twilio and have it call someone.

It is `live serve --twilio` (every serve option applies: `--agent`,
`--public-url`, ...) that, once it listens, asks Twilio's REST API to call
NUMBER from one of the account's numbers; when the person answers, Twilio asks
this server's voice webhook what to do, and the call becomes a session like
any incoming one. Needs $TWILIO_ACCOUNT_SID and $TWILIO_AUTH_TOKEN.

    live call +15551234567 --from +15557654321 --agent samples.weather:agent \\
        --public-url https://voice.example.com
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from live.phone.control import E164

__all__ = ["main", "place_call"]

log = logging.getLogger("live.phone")


async def place_call(control: Any, number: str, from_: str, public_url: str) -> str:
    """Ask the carrier to call `number`; its answer comes to `public_url`'s voice webhook."""
    return await control.place(number, from_, public_url.rstrip("/") + "/twilio/voice")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="live call", description=__doc__.split("\n")[0],
                                     epilog="Every other option is `live serve`'s (see `live serve --help`).")
    parser.add_argument("number", help="whom to call, in international form (+15551234567)")
    parser.add_argument("--from", dest="from_", required=True, metavar="NUMBER", help="the account's number to call from")
    args, serve_argv = parser.parse_known_args(argv)
    for flag, value in (("NUMBER", args.number), ("--from", args.from_)):
        if not E164.match(value):
            print(f"live call: {flag} {value!r} is not a number in international form, like +15551234567", file=sys.stderr)
            return 2
    account_sid, auth_token = os.environ.get("TWILIO_ACCOUNT_SID"), os.environ.get("TWILIO_AUTH_TOKEN")
    if not account_sid or not auth_token:
        print("live call: needs $TWILIO_ACCOUNT_SID and $TWILIO_AUTH_TOKEN (Twilio console, Account Info)", file=sys.stderr)
        return 2

    async def call_when_ready(server: Any, serve_args: argparse.Namespace) -> None:
        from live.phone.control import TwilioCallControl

        control = TwilioCallControl(account_sid, auth_token)
        try:
            sid = await place_call(control, args.number, args.from_, serve_args.public_url)
        except Exception as exc:  # the REST API's refusal (twilio's exceptions), said in one line
            print(f"live call: Twilio did not place the call: {str(exc).splitlines()[0][:300]}", file=sys.stderr, flush=True)
            server.stop()
            return
        print(f"live: calling {args.number} from {args.from_} (call {sid}); Ctrl-C stops the server", flush=True)

    from live.cli import serve as serve_cli

    if "--twilio" not in serve_argv:
        serve_argv = [*serve_argv, "--twilio"]
    return serve_cli.main(serve_argv, after_ready=call_when_ready)
