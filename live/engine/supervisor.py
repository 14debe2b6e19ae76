"""When to replace a session's model connection, as decisions without I/O.

A session is one client socket over a sequence of model connections. The
`Supervisor` is asked what to do next, given what is known now: how the current
connection ended (if it did), whether the model announced its end (go-away),
whether the conversation is at a point where nothing would be lost, and whether a
reply is overdue. It answers with a step: wait, hand over, report a stall, resume
after a delay, or give up with an error. `live.server.port` performs the steps; a test
(or a simulation) can drive every decision without sockets or clocks of its own.

The rules, each with its reason:

- A connection that ended with an error that is not recoverable (1007, a 1008
  at setup, quota) ends the session: replaying the same context fails again.
  (A 1008 on a connection that had worked is recoverable: `live.server.model_link`.)
- How a connection ended is decided by what ended it, never by which side (the
  sending task or the receiving one) noticed first.
- A close announced by go-away is the model's normal way of ending a connection,
  1000 or 1011 at the deadline alike: a new connection opens at once and it is
  no failure. Every other end counts against a budget with backoff; the count
  resets once a connection proves useful (it answers a turn or gives a
  resumable handle) or stays up `stable_after` seconds, so a model that keeps
  closing cannot make the session spin while one that drops now and then, between
  answers, never exhausts it.
- A new connection resumes from the newest resumption handle. Without one (a
  drop before the first handle: the service withholds them while it generates
  or a call is owed, and sends none right after setup), or when a resume is
  refused because the service no longer knows the handle, it starts fresh,
  seeded with the session's own transcript: the user hears a hiccup, not an
  ended call.
- After a go-away the session moves to a new connection at the first safe point
  (no reply owed or being generated, no call unanswered, the user not
  mid-sentence) or `handover_margin` seconds before the deadline, whichever
  comes first.
- A model that owes a reply (to a user turn or a tool result) for `stall_timeout`
  seconds is reported, and the session resumes on a new connection.

With a pool of backends (`live.backends`, `Failover`), three answers to a
failure: try again here (a drop, with the newest handle), re-seed here (the
handle refused), or move (`Move`: a fresh connection on another backend,
seeded with the transcript; a handle is bound to the backend that issued it):

- at once for what no retry here fixes: quota (429 at connect, 1011
  RESOURCE_EXHAUSTED), a model not served here, a backend that refuses or does
  not answer connects, a fresh connect refused (a bad key);
- after `retries_here` failed reconnects here (1011 on every resume), or
  when the reconnect budget here runs out;
- at once when the current backend's breaker is open (the fleet learned it is
  down): retrying it is pointless;
- to the healthiest backend not tried since the last useful connection; with
  none left, the session gives up with the last error.

A pool of one never moves: the rules above are the rules without a pool, a
quota or a missing model ending the session as before.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TypeAlias

from live.backends import Target
from live.engine.failover import LASTING, Failover, failure_cause
from live.errors import (
    ConfigurationError,
    InvalidArgumentError,
    LiveError,
    ModelUnavailableError,
    RecoverableConnectionError,
)

__all__ = [
    "CLOSED",
    "GiveUp",
    "HandOver",
    "Move",
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
    """The connection ended: open a new one after `delay` seconds, resumed from
    the session's handle, or (`fresh`, or no handle) seeded with the session's
    own transcript of the conversation."""

    reason: str
    delay: float
    fresh: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Move:
    """Carry the conversation to `target`, another backend (or model) of the
    pool, after `delay` seconds: a fresh connection there, seeded with the
    session's transcript. `cause` is one of `live.engine.failover.CAUSES`."""

    reason: str
    cause: str
    target: Target
    delay: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class GiveUp:
    """The session cannot go on: end it with `error`."""

    error: LiveError


Step: TypeAlias = Wait | HandOver | Stall | Resume | Move | GiveUp


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

    def useful(self) -> None:
        """The connection answered a turn or gave a resumable handle: the attempts
        before it succeeded, whatever comes next."""
        self.failures = 0

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
        failover: Failover | None = None,
        retries_here: int = 2,
    ) -> None:
        self.handover_margin = handover_margin
        self.stall_timeout = stall_timeout
        self.policy = policy or ReconnectPolicy()
        self.failover = failover
        self.retries_here = retries_here
        self._failed_here = 0  # reconnects that failed on the current target, in a row
        self._going_round = False  # every target failed since the last answer: moves are paid for

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
            # After a go-away the end was announced, however it comes: 1000, or
            # 1011 "Deadline expired before operation could complete." at the
            # deadline (sokuji#179). Not a failure.
            announced = go_away_at is not None and (
                outcome == CLOSED or (isinstance(outcome, LiveError) and outcome.recoverable)
            )
            return self._after_end(now, outcome, announced=announced, has_handle=has_handle)
        if go_away_at is not None and (safe_point or now >= go_away_at - self.handover_margin):
            return HandOver()
        if awaiting_reply_since is not None and now - awaiting_reply_since > self.stall_timeout:
            return Stall(
                f"the model has not answered for {self.stall_timeout:g} s; "
                "resuming the session on a new connection"
            )
        deadlines = []
        if go_away_at is not None:
            deadlines.append(go_away_at - self.handover_margin)
        if awaiting_reply_since is not None:
            deadlines.append(awaiting_reply_since + self.stall_timeout + 0.01)
        return Wait(min(deadlines) if deadlines else None)

    def start_failed(self, now: float, error: LiveError) -> Move | GiveUp:
        """The session's first connection failed (the client was told nothing
        yet): move to the next target, or give up as without a pool. A context
        refused (1007) is the agent's, and no backend takes it."""
        if isinstance(error, InvalidArgumentError):
            return GiveUp(error)
        cause = failure_cause(error, fresh=True) or ("unavailable" if error.recoverable else None)
        if cause is None:
            return GiveUp(error)
        return self._move(now, str(error), cause) or GiveUp(error)

    def reconnect_failed(self, now: float, error: LiveError, *, has_handle: bool) -> Step:
        """Opening a new connection failed: try again later, fresh, move, or give up.

        A resume refused with 1008 or 1007 means the service no longer knows
        the handle ("BidiGenerateContent session not found", forum #186392; 1007
        after 3.8's hour): the next attempt starts fresh from the transcript.
        """
        cause = failure_cause(error, fresh=not has_handle)
        if cause is not None:
            move = self._move(now, str(error), cause)
            if move is not None:
                return move
        if (
            has_handle
            and isinstance(error, (ConfigurationError, InvalidArgumentError))
            and not isinstance(error, ModelUnavailableError)
        ):
            why = f"the model no longer knows this session ({error.message})"
            delay = self.policy.failed(now)
            if delay is None:
                return self._gave_up(why)
            return Resume(why, delay, fresh=True)
        if error.recoverable and self.failover is not None:
            self._failed_here += 1
            if self._failed_here >= self.retries_here:
                move = self._move(now, f"{error}; failed {self._failed_here} times here", "unavailable")
                if move is not None:
                    return move
        return self._after_end(now, error, announced=False, has_handle=has_handle)

    def useful(self) -> None:
        """The connection in use answered a turn or gave a resumable handle."""
        self.policy.useful()
        self._failed_here = 0
        self._going_round = False
        if self.failover is not None:
            self.failover.useful()

    def _move(self, now: float, why: str, cause: str) -> Move | None:
        """A move to the healthiest target not tried since the last useful
        connection, or None (no pool, or nowhere left). The budget of
        reconnects starts again there.

        When every target failed since then, a passing failure (unreachable,
        unavailable, a breaker open) may be over at one tried earlier: the
        session goes round the pool again, healthiest first, rather than spend
        every attempt on the target failing now; but from then on each move
        waits its backoff and is paid from the budget, so the rounds end when
        it does. A lasting failure (quota, a model missing, a refused key) on
        every target ends the session.
        """
        failover = self.failover
        if failover is None or failover.single:
            return None
        target = failover.next_target()
        if target is None:
            if cause in LASTING:
                return None
            target = failover.another_round()
            self._going_round = True
        if self._going_round:
            delay = self.policy.failed(now)
            if delay is None:
                return None
            failover.moved(target)
            self._failed_here = 0
            return Move(f"{why}; every backend failed since the last answer: trying {target} again", cause, target, delay)
        failover.moved(target)
        self.policy.failures = 0
        self._failed_here = 0
        return Move(f"{why}; moving to {target}", cause, target)

    def _after_end(
        self, now: float, outcome: Outcome, *, announced: bool, has_handle: bool
    ) -> Step:
        if isinstance(outcome, LiveError) and not outcome.recoverable:
            cause = failure_cause(outcome, fresh=False)
            move = self._move(now, str(outcome), cause) if cause is not None else None
            return move or GiveUp(outcome)
        why = str(outcome) if isinstance(outcome, LiveError) else "the model closed the connection"
        if announced:
            return Resume(why, 0.0, fresh=not has_handle)
        if self.failover is not None and self.failover.open_here():
            # The fleet learned this backend is down: retrying it is pointless.
            move = self._move(now, f"{why}; {self.failover.current.name} is down (its breaker is open)", "breaker_open")
            if move is not None:
                return move
        delay = self.policy.failed(now)
        if delay is None:
            move = self._move(now, f"{why}; {self.policy.max_failures} reconnects failed here", "unavailable")
            if move is not None:
                return move
            return self._gave_up(why)
        # Without a handle (a drop before the first one) the conversation goes
        # on from its transcript, on a fresh connection.
        return Resume(why, delay, fresh=not has_handle)

    def _gave_up(self, why: str) -> GiveUp:
        return GiveUp(
            RecoverableConnectionError(f"{why}; gave up after {self.policy.max_failures} attempts to reconnect")
        )


def wait_seconds(step: Wait, now: float) -> float:
    """How long a `Wait` may sleep, from `now` (infinite without a deadline)."""
    return math.inf if step.until is None else max(0.0, step.until - now)
