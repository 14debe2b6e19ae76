"""Where a session's model connections go, as decisions without I/O.

A resumption handle recovers a dropped connection, on the backend that issued
it. Some failures it does not recover: a key's quota exhausted (429 at
connect, 1011 RESOURCE_EXHAUSTED mid-session), a backend that refuses or does
not answer connects, a model not served in a region, 1011 on every resume.
For those the conversation moves: a fresh connection on another backend of
the pool (`live.backends`), seeded with the session's transcript.

`failure_cause` says which failures those are; `Failover` keeps one session's
place in the pool and chooses where it goes: the healthiest target it has not
tried since its last useful connection (breakers closed first, then a
half-open one free to probe, then a half-open one being probed, then an open
one; pool order among equals). When every target was tried, there is nowhere
left: the supervisor gives up (`live.engine.supervisor`). Breakers are kept by
the fleet and pushed in (`update_health`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Final

from live.backends import Target
from live.engine.breaker import Breaker
from live.errors import (
    ConfigurationError,
    InvalidArgumentError,
    LiveError,
    ModelUnavailableError,
    QuotaExhaustedError,
    UnreachableError,
)

__all__ = ["AT_ONCE", "CAUSES", "LASTING", "Failover", "backend_key", "failure_cause", "failure_label", "model_key"]

CAUSES: Final = ("quota", "model_missing", "unreachable", "refused", "unavailable", "breaker_open")
"""Why a session moved, as metric labels (a closed set)."""

# Causes that say the backend cannot serve anyone now: its breaker opens at once.
AT_ONCE: Final = frozenset({"quota", "refused"})

# Causes that last (a key's quota, a model a backend does not serve, a key it
# refuses): a session they met on every target does not go round again.
LASTING: Final = frozenset({"quota", "model_missing", "refused"})


def backend_key(target: Target) -> str:
    """The breaker a backend's failures count against."""
    return f"backend:{target.name}"


def model_key(target: Target) -> str:
    """The breaker of one model at one backend (a model it does not serve)."""
    return f"model:{target.model_key}"


def failure_cause(error: LiveError, *, fresh: bool) -> str | None:
    """The cause to move for, when `error` is a failure resumption cannot fix
    here (None: try again here, or give up, as without a pool).

    `fresh` says the connection that failed started fresh (no handle): a
    configuration refusal then is the backend's (a bad key, a project without
    the API), not a handle the service forgot.
    """
    if isinstance(error, QuotaExhaustedError):
        return "quota"
    if isinstance(error, ModelUnavailableError):
        return "model_missing"
    if isinstance(error, UnreachableError):
        return "unreachable"
    if fresh and isinstance(error, ConfigurationError):
        return "refused"
    return None


class Failover:
    """One session's place in the pool: its target, and where it may go next."""

    def __init__(self, targets: Sequence[Target]) -> None:
        if not targets:
            raise ValueError("a session needs at least one target")
        self.targets = tuple(targets)
        self.current: Target = self.targets[0]
        self._health: dict[str, Breaker] = {}
        self._health_now = 0.0  # the store's clock when the breakers were read
        self._tried: set[Target] = set()  # failed since the last useful connection
        self._moves = 0
        self._left_at: dict[Target, int] = {}  # the move each target was last left at

    @property
    def single(self) -> bool:
        """A pool of one: nowhere to move, the behaviour without a pool."""
        return len(self.targets) == 1

    def update_health(self, breakers: Mapping[str, Breaker], now: float) -> None:
        """The breakers as the fleet knows them, at `now` on the store's clock
        (every decision below is taken at that time)."""
        self._health.update(breakers)
        self._health_now = now

    def rank(self, target: Target) -> int:
        """How healthy a target is: the worse of its backend's and its model's breakers."""
        worst = 0
        for key in (backend_key(target), model_key(target)):
            breaker = self._health.get(key)
            if breaker is not None:
                worst = max(worst, breaker.rank(self._health_now))
        return worst

    def open_here(self) -> bool:
        """The current target's breaker is open: retrying it is pointless."""
        return not self.single and self.rank(self.current) == 3

    def first(self) -> Target:
        """Where a new session starts: the healthiest target, pool order among equals."""
        self.current = self._best(self.targets) or self.targets[0]
        return self.current

    def next_target(self) -> Target | None:
        """Where to move from the current target (marked tried): the healthiest
        untried one, or None when every target was tried."""
        self._tried.add(self.current)
        self._moves += 1
        self._left_at[self.current] = self._moves
        return self._best([t for t in self.targets if t not in self._tried])

    def another_round(self) -> Target:
        """Every target was tried: the healthiest one other than the current
        (the one tried longest ago among equals), the others tried anew from here."""
        self._tried = {self.current}
        others = [t for t in self.targets if t != self.current]
        return min(others, key=lambda t: (self.rank(t), self._left_at.get(t, -1)), default=self.current)

    def moved(self, target: Target) -> None:
        self.current = target

    def useful(self) -> None:
        """A connection answered: the failures before it are forgotten."""
        self._tried.clear()

    def _best(self, candidates: Sequence[Target]) -> Target | None:
        best: Target | None = None
        best_rank = math.inf
        for target in candidates:
            rank = self.rank(target)
            if rank < best_rank:
                best, best_rank = target, rank
        return best


def failure_label(error: LiveError, *, fresh: bool) -> str | None:
    """What a failed connect says of its backend, for its breaker and metrics
    (one of `live.server.backends.FAILURE_CAUSES`); None when it is no fault
    of the backend's: a handle it forgot, a context it refused (1007)."""
    cause = failure_cause(error, fresh=fresh)
    if cause is not None:
        return cause
    if isinstance(error, InvalidArgumentError) or isinstance(error, ConfigurationError):
        return None
    return "unavailable" if error.recoverable else None
