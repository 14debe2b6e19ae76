"""Sessions whose client left but may come back, kept on a server of its own.

A Live API app's session outlives its socket the way the service's does: its
resumption handle works for two hours after the app left (the service's
session-management guide: "valid for 2 hours after the last session
termination"). Past the wait with its model connection open (the reattach
grace), such a session is parked: its model connection and its slot are let
go, and the facts another server would need to carry it on (`durable_state`)
are kept, here for a single server, in the fleet's store for a fleet
(`live.fleet.member.Fleet.park`). The app that comes back with its handle
takes it up again as a server of the fleet takes a session over.

Bounded: at most `max_sessions` parked sessions and `max_bytes` of their facts
(JSON text; a conversation's transcript is at most 32 K characters), the
oldest let go first, each for at most its time.

A server stopping without a fleet first tells such clients what the service
tells an app before it closes a connection (`say_going_away`: its goAway).
"""

from __future__ import annotations

import collections
import json
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:
    from live.fleet.member import Fleet
    from live.server.runner import SessionRunner

__all__ = ["ParkedSessions", "park", "say_going_away"]

log = logging.getLogger("live.server")


class ParkedSessions:
    """Parked sessions' facts by session id, each until its deadline (see the module docstring)."""

    def __init__(
        self,
        *,
        max_sessions: int = 10_000,
        max_bytes: int = 64 << 20,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_sessions = max_sessions
        self.max_bytes = max_bytes
        self._clock = clock
        # session id -> (facts as JSON text, deadline), oldest first.
        self._items: collections.OrderedDict[str, tuple[str, float]] = collections.OrderedDict()
        self._bytes = 0
        self.dropped = 0  # parked sessions let go early, for room

    def __len__(self) -> int:
        return len(self._items)

    def park(self, session_id: str, state: dict[str, Any], seconds: float) -> None:
        text = json.dumps(state, default=str)
        self._forget(session_id)
        self._items[session_id] = (text, self._clock() + seconds)
        self._bytes += len(text)
        self._expire()
        while self._items and (len(self._items) > self.max_sessions or self._bytes > self.max_bytes):
            oldest = next(iter(self._items))
            self._forget(oldest)
            self.dropped += 1

    def get(self, session_id: str) -> dict[str, Any] | None:
        """A parked session's facts, or None (never parked, taken up, or past its time)."""
        self._expire()
        item = self._items.get(session_id)
        return None if item is None else json.loads(item[0])

    def discard(self, session_id: str) -> None:
        """The session is taken up again: parked no longer."""
        self._forget(session_id)

    def _forget(self, session_id: str) -> None:
        item = self._items.pop(session_id, None)
        if item is not None:
            self._bytes -= len(item[0])

    def _expire(self) -> None:
        now = self._clock()
        while self._items:
            session_id, (_, deadline) = next(iter(self._items.items()))
            if deadline > now:
                break
            self._forget(session_id)


async def park(session: SessionRunner, seconds: float, fleet: Fleet | None, here: ParkedSessions) -> None:
    """Keep a session's facts for `seconds`: in the fleet's store, or `here`."""
    state = session.durable_state()
    if fleet is not None:
        if await fleet.park(session.id, state, seconds):
            log.info("session %s parked in the fleet's store for %g s", session.id, seconds)
        return
    here.park(session.id, state, seconds)
    log.info("session %s parked for %g s (%d parked here)", session.id, seconds, len(here))


def told_going_away(sessions: Iterable[SessionRunner]) -> list[SessionRunner]:
    """The sessions a server stopping on its own tells it goes away: those
    whose client is on a socket and whose door has a go-away of its own."""
    return [
        s
        for s in sessions
        if s.core is not None and s.end_reason is None and s.door.tells_going_away and s.client.ws is not None
    ]


async def say_going_away(sessions: Iterable[SessionRunner], seconds: float) -> None:
    """A server stopping on its own: each of `sessions` (`told_going_away`)
    hears its door's go-away (the Live API's goAway, `timeLeft` `seconds`),
    is let finish what is in flight (the reply, a call the app is answering)
    for `seconds` at most, and then ends."""

    async def tell(session: SessionRunner) -> None:
        with anyio.move_on_after(seconds):
            async with session.client.send_lock:
                await session.client.send_frames(session.door.going_away(seconds))
            while not (session.core.at_safe_point and session.outbox.empty) and session.end_reason is None:
                await anyio.sleep(0.05)
        session.shutdown()

    async with anyio.create_task_group() as tg:
        for session in sessions:
            tg.start_soon(tell, session)
