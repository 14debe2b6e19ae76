"""The fault simulation in CI: a thousand seeded conversations, every invariant checked.

See tests/simulation.py for what a run does and which invariants it checks. A
failure lists each broken rule with seeds that break it and the command that
replays one with its event trace. `LIVE_SIM_SEEDS` changes the seed count
(a longer run: `.venv/bin/python -m tests.simulation --seeds 100000`).
"""

from __future__ import annotations

import collections
import os

import pytest

import simulation
from live.engine.session import SessionCore

SEEDS = int(os.environ.get("LIVE_SIM_SEEDS", "1000"))  # the suite's share; longer runs: see above
JOBS = min(2, os.cpu_count() or 1)


def _report(outcomes: list[simulation.Outcome]) -> str:
    by_rule: dict[str, list[simulation.Outcome]] = collections.defaultdict(list)
    for outcome in outcomes:
        for rule in dict.fromkeys(simulation.rule_of(v) for v in outcome.violations):
            by_rule[rule].append(outcome)
    failed = sum(1 for o in outcomes if not o.ok)
    lines = [f"{failed} of {len(outcomes)} seeded sessions broke an invariant:"]
    for rule, broken in sorted(by_rule.items(), key=lambda kv: -len(kv[1])):
        first = broken[0]
        example = next(v for v in first.violations if simulation.rule_of(v) == rule)
        lines.append(f"- {rule}: {len(broken)} seeds ({', '.join(str(o.seed) for o in broken[:8])}...)")
        lines.append(f"    {example[:400]}")
        lines.append(f"    replay: {simulation.replay_command(first.seed)}")
    return "\n".join(lines)


def test_seeded_sessions_keep_every_invariant():
    outcomes = simulation.run_many(range(SEEDS), jobs=JOBS)
    if not all(o.ok for o in outcomes):
        pytest.fail(_report(outcomes), pytrace=False)


def test_a_seed_replays_exactly():
    # What makes a failing seed worth printing: running it again gives the same run.
    for seed in (3, 17, 41):
        first, again = simulation.run_seed(seed), simulation.run_seed(seed)
        assert first.trace == again.trace
        assert first.violations == again.violations
    assert simulation.run_seed(3).trace != simulation.run_seed(4).trace


def test_the_invariants_catch_a_session_that_forgets_typed_turns(monkeypatch):
    # A server that never sends an unanswered typed turn again after a reconnect
    # must be caught: the checks are only worth what they can fail on.
    monkeypatch.setattr(SessionCore, "connection_resumed", lambda self, now: [])
    caught = (
        seed
        for seed in range(300)
        if any(
            "[typed-turn]" in v and "it was not sent again" in v
            for v in simulation.run_seed(seed).violations
        )
    )
    assert next(caught, None) is not None
