"""`live emulator`: run a local Gemini Live endpoint over TLS until Ctrl-C."""

from __future__ import annotations

import argparse
import json
import signal
import sys

import anyio

from connections.emulator.core import Settings
from connections.emulator.faults import FaultRates
from connections.emulator.profiles import FAMILIES
from connections.emulator.script import Fault, Script, ToolCall
from connections.emulator.server import DEV_API_KEY, running_emulator
from live.net.loop import backend_options

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="live emulator",
        description=(
            "A local Gemini Live (BidiGenerateContent) endpoint for the unmodified"
            " google-genai SDK. Prints the two lines to export, then serves until"
            " Ctrl-C. It has no recogniser and no TTS: what the user 'said' comes"
            " from --say, the reply is a synthetic voice saying --reply (default:"
            " 'You said: <transcript>.'). Each model family behaves as the real"
            " service does, bad days included (see docs/emulator.md for every"
            " behaviour and its source); --set switches one off."
        ),
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=9876, help="port (default 9876; 0 = a free port)")
    p.add_argument(
        "--api-key",
        default=None,
        help=f"the only key accepted (default: any non-empty key, e.g. {DEV_API_KEY})",
    )
    p.add_argument(
        "--api-versions",
        default="v1alpha,v1beta,v1",
        help="comma-separated API versions that serve Live (others close with 1008)",
    )
    p.add_argument("--speed", type=float, default=1.0, help="pacing factor (1 = real time)")
    p.add_argument(
        "--go-away-after",
        type=float,
        default=None,
        metavar="SECONDS",
        help="send goAway this long after setup, then close at its deadline with 1011"
        " 'Deadline expired' as the service does (e.g. 540)",
    )
    p.add_argument(
        "--go-away-time-left",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="timeLeft announced in goAway (default 5)",
    )
    p.add_argument(
        "--say",
        action="append",
        default=[],
        metavar="TEXT",
        help="what the user said in the next spoken turn (repeatable, in order)",
    )
    p.add_argument(
        "--reply",
        action="append",
        default=[],
        metavar="TEXT",
        help="what the model says in its next turn (repeatable, in order)",
    )
    p.add_argument(
        "--tool-args",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="arguments for a declared function called when the user names it",
    )
    p.add_argument(
        "--call",
        action="append",
        default=[],
        metavar="TURN:NAME[=JSON]",
        help="on user turn TURN call function NAME (with JSON arguments)",
    )
    p.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="WHEN[:N]=CODE|stall",
        help=(
            "break a session: WHEN is after_setup, after_audio_chunks, mid_generation,"
            " after_tool_call, after_tool_response, after_turn or on_resume; CODE 1006"
            " (drop), 1007, 1008, 1011, or quota (1011 RESOURCE_EXHAUSTED); fires once"
        ),
    )
    p.add_argument(
        "--profile",
        choices=("auto", *FAMILIES),
        default="auto",
        help="whose behaviour the sessions follow (default auto: by each setup's model name)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="BEHAVIOUR=VALUE",
        help=(
            "switch one behaviour of the profile, e.g. late_transcripts=false,"
            " handle_after_setup=true, handle_ttl=60 (repeatable; names in docs/emulator.md)"
        ),
    )
    p.add_argument(
        "--faults",
        choices=("none", "realistic"),
        default="none",
        help="random faults at the rates of an ordinary day (realistic) or none (default)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the random faults: the same seed and traffic replay the same faults (default 0)",
    )
    p.add_argument("--max-sessions", type=int, default=None, help="concurrent sessions allowed")
    p.add_argument(
        "--audio-keys",
        choices=("camel", "snake"),
        default="camel",
        help="write reply audio parts as inlineData/mimeType (camel, as the service does) or "
        "inline_data/mime_type (snake, which protobuf JSON readers also take)",
    )
    p.add_argument(
        "--audio-base64",
        choices=("standard", "urlsafe"),
        default="standard",
        help="the base64 alphabet of reply audio (standard, as the service writes; urlsafe, which readers also take)",
    )
    return p


def _fault(spec: str) -> Fault:
    when_part, _, action = spec.partition("=")
    when, _, n = when_part.partition(":")
    count = int(n) if n else 1
    if action == "stall":
        return Fault.stall(when, n=count)  # type: ignore[arg-type]
    if action == "quota":
        return Fault.quota(when, n=count)  # type: ignore[arg-type]
    return Fault(when, code=int(action or 1011), n=count)  # type: ignore[arg-type]


def _setting(spec: str) -> tuple[str, bool | float | None]:
    name, sep, text = spec.partition("=")
    if not sep:
        raise ValueError(f"--set {spec!r}: expected BEHAVIOUR=VALUE")
    lowered = text.strip().lower()
    if lowered in ("true", "on", "yes"):
        return name.strip(), True
    if lowered in ("false", "off", "no"):
        return name.strip(), False
    if lowered in ("none", "null"):
        return name.strip(), None
    try:
        return name.strip(), float(lowered)
    except ValueError:
        raise ValueError(f"--set {spec!r}: VALUE is true, false, none or a number") from None


def build_script(args: argparse.Namespace) -> Script:
    """The script the command-line options describe."""
    tool_args = {}
    for spec in args.tool_args:
        name, _, payload = spec.partition("=")
        tool_args[name] = json.loads(payload or "{}")
    calls: dict[int, list[ToolCall]] = {}
    for spec in args.call:
        turn, _, rest = spec.partition(":")
        name, _, payload = rest.partition("=")
        calls.setdefault(int(turn), []).append(ToolCall(name, json.loads(payload or "{}")))
    return Script(
        user_says=list(args.say),
        replies=list(args.reply),
        tool_calls=calls,
        tool_args=tool_args,
        faults=[_fault(f) for f in args.fault],
        go_away_after=args.go_away_after,
        go_away_time_left=args.go_away_time_left,
        speed=args.speed,
        max_sessions=args.max_sessions,
        audio_keys=args.audio_keys,
        audio_base64=args.audio_base64,
        profile=args.profile,
        profile_overrides=dict(_setting(spec) for spec in args.set),
        fault_rates=FaultRates.realistic() if args.faults == "realistic" else FaultRates(),
        seed=args.seed,
    )


async def _serve(args: argparse.Namespace) -> None:
    settings = Settings(
        api_key=args.api_key,
        api_versions=frozenset(v.strip() for v in args.api_versions.split(",") if v.strip()),
    )
    async with running_emulator(
        build_script(args), host=args.host, port=args.port, settings=settings
    ) as emulator:
        print(emulator.exports, flush=True)
        print(
            f"# Live emulator on {emulator.base_url}; key: "
            f"{args.api_key or 'any non-empty key'}; Ctrl-C stops it.",
            file=sys.stderr,
            flush=True,
        )
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                break
        print("# stopping", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        build_script(args)
    except (ValueError, TypeError) as exc:
        print(f"live emulator: {exc}", file=sys.stderr)
        return 2
    try:
        anyio.run(_serve, args, backend_options=backend_options("auto"))
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        print(f"live emulator: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
