"""A circuit breaker for one backend, as data and rules without I/O.

Closed, the backend is tried. After `failures` failures in a row (or at once,
for a failure that says the backend cannot serve anyone: quota, a refused key,
a model it does not serve) it opens: new sessions start elsewhere, sessions
that fail there move on rather than retry. After `cooldown` seconds it is
half-open: one session may probe it (the probe is held for `probe_timeout`
seconds, so a whole fleet does not rush at it); a success closes it, a failure
opens it again.

A `Breaker` is plain data a fleet keeps in its store (`to_json`, `from_json`),
so that the second server does not learn an outage again: the rules here
compute the next state, the store swaps it in (`live.fleet.health`). Times are
the store's clock (seconds).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Final, Literal, TypeAlias

__all__ = ["CLOSED", "Breaker", "BreakerPolicy", "HALF_OPEN", "OPEN", "State"]

State: TypeAlias = Literal["closed", "half_open", "open"]
CLOSED: Final = "closed"
HALF_OPEN: Final = "half_open"
OPEN: Final = "open"


@dataclasses.dataclass(frozen=True, slots=True)
class Breaker:
    """`failures` in a row; open until `open_until` (None: closed); a
    half-open probe out until `probe_until`."""

    failures: int = 0
    open_until: float | None = None
    probe_until: float | None = None

    def state(self, now: float) -> State:
        if self.open_until is None:
            return CLOSED
        return OPEN if now < self.open_until else HALF_OPEN

    def may_try(self, now: float) -> bool:
        """Closed, or half-open with no probe out: a session may connect here."""
        state = self.state(now)
        return state == CLOSED or (state == HALF_OPEN and (self.probe_until is None or now >= self.probe_until))

    def rank(self, now: float) -> int:
        """How healthy, for choosing: 0 closed, 1 half-open and free to probe,
        2 half-open with a probe out, 3 open."""
        state = self.state(now)
        if state == CLOSED:
            return 0
        if state == HALF_OPEN:
            return 1 if self.may_try(now) else 2
        return 3

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v}

    @classmethod
    def from_json(cls, data: Any) -> Breaker:
        """A stored breaker; a closed one for anything unreadable (a fresh start
        costs one failure more, a broken entry must not stop sessions)."""
        if not isinstance(data, dict):
            return cls()
        try:
            failures = int(data.get("failures", 0))
            open_until = _time(data.get("open_until"))
            probe_until = _time(data.get("probe_until"))
        except (TypeError, ValueError):
            return cls()
        return cls(max(0, failures), open_until, probe_until)


def _time(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(value)
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class BreakerPolicy:
    """When a breaker opens, for how long, and how long a probe may take."""

    failures: int = 3
    cooldown: float = 30.0
    probe_timeout: float = 15.0

    def failed(self, breaker: Breaker, now: float, *, at_once: bool = False, cooldown: float | None = None) -> Breaker:
        """A failure there: open once `failures` in a row (or `at_once`), and
        again at once after a failed probe."""
        failures = breaker.failures + 1
        if at_once or failures >= self.failures or breaker.state(now) != CLOSED:
            return Breaker(failures, now + (self.cooldown if cooldown is None else cooldown), None)
        return Breaker(failures, None, None)

    def succeeded(self, breaker: Breaker, now: float) -> Breaker:
        """A connection there worked: closed, the count forgotten."""
        return Breaker()

    def probing(self, breaker: Breaker, now: float) -> Breaker:
        """A session takes the half-open breaker's one probe."""
        if breaker.state(now) != HALF_OPEN:
            return breaker
        return dataclasses.replace(breaker, probe_until=now + self.probe_timeout)
