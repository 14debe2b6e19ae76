"""`live replay RECORD`: replay a session record against a fresh server and compare."""

from __future__ import annotations

import argparse
import sys

import anyio

from live.agent import agent_at
from live.observe.record import load
from live.testing.replay import replay

__all__ = ["main"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="live replay",
        description="Replay a session record against a fresh server, with the transport double "
        "playing the model's recorded side, and compare the server's events with the record.",
    )
    parser.add_argument("record", metavar="RECORD", help="a record's folder, or its events.jsonl")
    parser.add_argument("--agent", metavar="MODULE:ATTR", help="the agent to serve (default: the one recorded)")
    parser.add_argument("--tolerance", type=float, default=1.0, help="seconds an event may move (default 1)")
    args = parser.parse_args(argv)
    try:
        record = load(args.record)
        agent = None
        if args.agent:
            try:
                agent = agent_at(args.agent)
            except ValueError as exc:
                raise ValueError(f"--agent {exc}") from None
        result = anyio.run(lambda: replay(record, agent=agent, tolerance=args.tolerance))
    except (ValueError, OSError) as exc:
        print(f"live replay: {exc}", file=sys.stderr)
        return 2
    print(result.report())
    return 0 if result.ok else 1
