"""When to replace a session's model connection, as decisions without I/O.

A session is one client socket over a sequence of model connections. The
`Supervisor` is asked what to do next, given what is known now: how the current
connection ended (if it did), whether the model announced its end (go-away),
whether the conversation is at a point where nothing would be lost, and whether a
reply is overdue. It answers with a step: wait, hand over, report a stall, resume
after a delay, or give up with an error. `live.server` performs the steps; a test
(or a simulation) can drive every decision without sockets or clocks of its own.

The rules, each with its reason:

- A connection that ended with an error that is not recoverable (1007, 1008,
  quota) ends the session: replaying the same context fails again.
- How a connection ended is decided by what ended it, never by which side (the
  sending task or the receiving one) noticed first.
- A close announced by go-away is the model's normal way of ending a connection:
  it resumes at once. Every other end counts against a budget with backoff, which
  resets after a stable period, so a model that keeps closing cannot make the
  session spin and a long conversation is not failed by drops hours apart.
- Without a resumption handle there is nothing to resume: the session ends.
- After a go-away the session moves to a new connection (only with a handle to
  resume from: without one a new connection would not know the conversation, so
  the session waits for a handle, and ends when the old connection closes)
  at the first safe point
  (no reply owed or being generated, no call unanswered, the user not mid-sentence)
  or `handover_margin` seconds before the deadline, whichever comes first.
- A model that owes a reply (to a user turn or a tool result) for `stall_timeout`
  seconds is reported, and the session resumes on a new connection.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TypeAlias

from live.errors import LiveError, RecoverableConnectionError

__all__ = [
    "CLOSED",
    "GiveUp",
    "HandOver",
    "Outcome",
    "ReconnectPolicy",
    "Resume",
    "Stall",
    "Step",
    "Supervisor",
    "Wait",
]

CLOSED = "closed"
"""The outcome of a connection the model closed normally (1000)."""

Outcome: TypeAlias = LiveError | str


@dataclasses.dataclass(frozen=True, slots=True)
class Wait:
    """Nothing to do until something changes, or until `until` (None: no deadline)."""

    until: float | None


@dataclasses.dataclass(frozen=True, slots=True)
class HandOver:
    """Go-away: move to a new connection now, before the old one is closed."""


@dataclasses.dataclass(frozen=True, slots=True)
class Stall:
    """The model owes a reply for too long: tell the client, end the connection."""

    message: str


@dataclasses.dataclass(frozen=True, slots=True)
class Resume:
    """The connection ended: open a resumed one after `delay` seconds."""

    reason: str
    delay: float


@dataclasses.dataclass(frozen=True, slots=True)
class GiveUp:
    """The session cannot go on: end it with `error`."""

    error: LiveError


Step: TypeAlias = Wait | HandOver | Stall | Resume | GiveUp


@dataclasses.dataclass
class ReconnectPolicy:
    """When to try the model connection again after it failed, and when to give up.

    Delays grow from `base_delay` to `max_delay`; after `max_failures` failures in
    a row the session ends. A connection that stayed up `stable_after` seconds
    resets the count, so a long conversation is not failed by drops hours apart.
    """

    max_failures: int = 5
    base_delay: float = 0.25
    max_delay: float = 5.0
    stable_after: float = 60.0
    failures: int = 0
    _connected_at: float | None = None

    def connected(self, now: float) -> None:
        self._connected_at = now

    def failed(self, now: float) -> float | None:
        """Record a failure; the delay before the next attempt, or None to give up."""
        if self._connected_at is not None and now - self._connected_at >= self.stable_after:
            self.failures = 0
        self._connected_at = None
        self.failures += 1
        if self.failures > self.max_failures:
            return None
        return min(self.max_delay, self.base_delay * 2 ** (self.failures - 1))


class Supervisor:
    """The reconnect and hand-over decisions of one session."""

    def __init__(
        self,
        *,
        handover_margin: float = 1.0,
        stall_timeout: float = 20.0,
        policy: ReconnectPolicy | None = None,
    ) -> None:
        self.handover_margin = handover_margin
        self.stall_timeout = stall_timeout
        self.policy = policy or ReconnectPolicy()

    def connected(self, now: float) -> None:
        """A connection is up (the first, or a resumed one)."""
        self.policy.connected(now)

    def next_step(
        self,
        now: float,
        *,
        outcome: Outcome | None,
        go_away_at: float | None,
        safe_point: bool,
        awaiting_reply_since: float | None,
        has_handle: bool,
    ) -> Step:
        """What to do about the current connection, given the state at `now`."""
        if outcome is not None:
            announced = outcome == CLOSED and go_away_at is not None
            return self._after_end(now, outcome, announced=announced, has_handle=has_handle)
        if (
            go_away_at is not None
            and has_handle
            and (safe_point or now >= go_away_at - self.handover_margin)
        ):
            return HandOver()
        if awaiting_reply_since is not None and now - awaiting_reply_since > self.stall_timeout:
            return Stall(
                f"the model has not answered for {self.stall_timeout:g} s; "
                "resuming the session on a new connection"
            )
        deadlines = []
        if go_away_at is not None and has_handle:
            deadlines.append(go_away_at - self.handover_margin)
        if awaiting_reply_since is not None:
            deadlines.append(awaiting_reply_since + self.stall_timeout + 0.01)
        return Wait(min(deadlines) if deadlines else None)

    def reconnect_failed(self, now: float, error: LiveError, *, has_handle: bool) -> Step:
        """Opening a resumed connection failed: try again later, or give up."""
        return self._after_end(now, error, announced=False, has_handle=has_handle)

    def _after_end(
        self, now: float, outcome: Outcome, *, announced: bool, has_handle: bool
    ) -> Step:
        if isinstance(outcome, LiveError) and not outcome.recoverable:
            return GiveUp(outcome)
        why = str(outcome) if isinstance(outcome, LiveError) else "the model closed the connection"
        if not has_handle:
            return GiveUp(
                RecoverableConnectionError(
                    f"{why}, and the session cannot be resumed (the model gave no "
                    "resumption handle)"
                )
            )
        delay = self.policy.failed(now)
        if delay is None:
            return GiveUp(
                RecoverableConnectionError(
                    f"{why}; gave up after {self.policy.max_failures} attempts to resume"
                )
            )
        return Resume(why, 0.0 if announced else delay)


def wait_seconds(step: Wait, now: float) -> float:
    """How long a `Wait` may sleep, from `now` (infinite without a deadline)."""
    return math.inf if step.until is None else max(0.0, step.until - now)
