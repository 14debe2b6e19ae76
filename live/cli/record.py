"""`live record show FILE`: a session record as a readable timeline."""

from __future__ import annotations

import argparse
import sys

from live.observe.record import load, timeline


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="live record", description="Read session records written by `live serve --record DIR`.")
    sub = parser.add_subparsers(dest="command", required=True)
    show = sub.add_parser("show", help="print a record as a timeline: who spoke, transcripts, tools, interruptions, latencies")
    show.add_argument("record", metavar="FILE", help="a record's folder, or its events.jsonl")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        record = load(args.record)
    except (ValueError, OSError) as exc:
        print(f"live record: {exc}", file=sys.stderr)
        return 2
    try:
        for line in timeline(record):
            print(line)
    except BrokenPipeError:  # `| head`
        pass
    return 0
