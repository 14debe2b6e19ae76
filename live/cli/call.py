"""`live call NUMBER --from NUMBER ...`: serve an agent on a phone line and have it call someone.

It is `live serve --twilio` (or `--telnyx`; every serve option applies:
`--agent`, `--public-url`, ...) that, once it listens, asks the carrier's REST
API to call NUMBER from one of the account's numbers; when the person answers,
the carrier asks this server's webhook what to do, and the call becomes a
session like any incoming one. The call's progress (ringing, answered, who
answered, ended) is printed as the carrier reports it, and the server stops
once the call has ended.

Answering-machine detection (`--machine`): `hangup` (the default) talks to a
person and hangs up on a machine; `message` waits for the greeting's end (the
beep) and has the agent leave its message, told that a machine answered;
`off` talks to whoever answers.

    live call +15551234567 --from +15557654321 --agent samples.weather:agent \\
        --public-url https://voice.example.com

Twilio needs $TWILIO_ACCOUNT_SID and $TWILIO_AUTH_TOKEN; Telnyx ($TELNYX_API_KEY,
$TELNYX_PUBLIC_KEY) also $TELNYX_CONNECTION_ID, the Call Control application
that places the call.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from live.phone.control import E164

__all__ = ["MACHINE_POLICIES", "main", "place_call"]

log = logging.getLogger("live.phone")

MACHINE_POLICIES = ("hangup", "message", "off")
# What each policy asks the carrier to detect.
TWILIO_DETECTION = {"hangup": "Enable", "message": "DetectMessageEnd"}
TELNYX_DETECTION = {"hangup": "detect", "message": "greeting_end"}
ENDED = ("completed", "busy", "failed", "no-answer", "canceled", "call.hangup")


async def place_call(
    lines: Any, number: str, from_: str, public_url: str, *, carrier: str = "twilio", machine: str = "hangup",
    control: Any = None, report: Callable[[dict[str, str]], None] | None = None,
) -> str:
    """Ask the carrier to call `number`; its webhooks come to `public_url`. The call's id.

    `report` gets the call's progress as the carrier tells it (status callbacks,
    who answered)."""
    base = public_url.rstrip("/")
    if carrier == "telnyx":
        webhook = lines.telnyx_webhook
        detection = TELNYX_DETECTION.get(machine)
        call_id = await webhook.control.dial(number, from_, webhook_url=f"{base}/telnyx/call",
                                             machine_detection=detection)
        webhook.outbound[call_id] = {"policy": machine if detection else "off", "machine_detection": detection,
                                     "report": report}
        return call_id
    webhook = lines.twilio_webhook
    options: dict[str, Any] = {
        "status_callback": f"{base}/twilio/status", "status_callback_method": "POST",
        # "If you want to receive multiple events, specify each one in a separate
        # status_callback_event parameter."
        "status_callback_event": ["initiated", "ringing", "answered", "completed"],
    }
    detection = TWILIO_DETECTION.get(machine)
    if detection:
        options["machine_detection"] = detection
    sid = await control.place(number, from_, f"{base}/twilio/voice", **options)
    webhook.outbound[sid] = {"policy": machine if detection else "off", "sid": sid, "report": report}
    return sid


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="live call", description=__doc__.split("\n")[0],
                                     epilog="Every other option is `live serve`'s (see `live serve --help`).")
    parser.add_argument("number", help="whom to call, in international form (+15551234567)")
    parser.add_argument("--from", dest="from_", required=True, metavar="NUMBER", help="the account's number to call from")
    parser.add_argument("--carrier", choices=("twilio", "telnyx"), default="twilio", help="whose line (default twilio)")
    parser.add_argument("--machine", choices=MACHINE_POLICIES, default="hangup",
                        help="when an answering machine picks up: hangup, leave a message after the beep, or off "
                        "(no detection: talk to whoever answers) (default hangup)")
    args, serve_argv = parser.parse_known_args(argv)
    for flag, value in (("NUMBER", args.number), ("--from", args.from_)):
        if not E164.match(value):
            print(f"live call: {flag} {value!r} is not a number in international form, like +15551234567", file=sys.stderr)
            return 2
    control = None
    if args.carrier == "twilio":
        account_sid, auth_token = os.environ.get("TWILIO_ACCOUNT_SID"), os.environ.get("TWILIO_AUTH_TOKEN")
        if not account_sid or not auth_token:
            print("live call: needs $TWILIO_ACCOUNT_SID and $TWILIO_AUTH_TOKEN (Twilio console, Account Info)", file=sys.stderr)
            return 2
    elif not os.environ.get("TELNYX_CONNECTION_ID"):
        print("live call: --carrier telnyx needs $TELNYX_CONNECTION_ID (the Call Control application's id)", file=sys.stderr)
        return 2

    async def call_when_ready(server: Any, serve_args: argparse.Namespace) -> None:
        lines = serve_args.phone_lines
        nonlocal control
        if args.carrier == "twilio":
            from live.phone.control import TwilioCallControl

            control = TwilioCallControl(os.environ["TWILIO_ACCOUNT_SID"], os.environ["TWILIO_AUTH_TOKEN"])

        def report(progress: dict[str, str]) -> None:
            status = progress.get("CallStatus") or progress.get("status") or ""
            who = progress.get("AnsweredBy") or progress.get("answered_by")
            print(f"live: call {progress.get('CallSid') or progress.get('call') or '?'}: {status or 'answered'}"
                  + (f" (answered by {who})" if who else ""), flush=True)
            if status in ENDED:
                server.stop()

        if lines.twilio_webhook is not None:
            lines.twilio_webhook.on_status = report
        try:
            sid = await place_call(lines, args.number, args.from_, serve_args.public_url, carrier=args.carrier,
                                   machine=args.machine, control=control, report=report)
        except Exception as exc:  # the REST API's refusal, said in one line
            text = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            print(f"live call: {args.carrier.capitalize()} did not place the call: {text}", file=sys.stderr, flush=True)
            server.stop()
            return
        print(f"live: calling {args.number} from {args.from_} (call {sid}); Ctrl-C stops the server", flush=True)

    from live.cli import serve as serve_cli

    flag = f"--{args.carrier}"
    if flag not in serve_argv:
        serve_argv = [*serve_argv, flag]
    return serve_cli.main(serve_argv, after_ready=call_when_ready)
