"""The `live` command: `live serve`, `live call`, `live emulator`, `live mic`, `live record`, `live replay`.

Each subcommand lives in the module that implements it and owns its own
arguments; this dispatcher only imports the one that was asked for.
"""

from __future__ import annotations

import importlib
import sys

_COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("live.cli.serve", "run the session server (WebSocket /live, browser page /)"),
    "call": ("live.cli.call", "serve an agent on Twilio and have it call a phone number"),
    "emulator": ("connections.emulator.cli", "run a local Gemini Live endpoint over TLS"),
    "mic": ("clients.mic", "talk to a server from this terminal's microphone"),
    "token": ("live.access.auth", "print a signed session token for a server started with --token-secret"),
    "record": ("live.cli.record", "read session records (`live record show FILE`)"),
    "replay": ("live.cli.replay", "replay a session record against the server and compare"),
}


def _usage() -> str:
    lines = ["usage: live COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in _COMMANDS.items()]
    lines += ["", "`live COMMAND --help` describes each command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command not in _COMMANDS:
        print(f"live: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(_COMMANDS[command][0])
    return int(module.main(rest) or 0)

