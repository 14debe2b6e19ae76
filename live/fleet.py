"""One server's part in a fleet that shares sessions through a `SessionStore`.

With `live serve --redis URL`, every server announces itself and holds a lease
on each session it serves, renewed by a heartbeat; each session's durable facts
(its resumption handle, pending tool calls, owed turn, the digest of its
reattach token, how far its stream got) are written to the store whenever they
change. When a client reattaches to a server that does not hold its session:

- the holder is alive: this server relays the client's socket to it;
- the holder is dead (its lease ran out) or handed the session off while
  draining: this server takes the session over from the store and resumes its
  model session from the stored handle.

The store can fail mid-run: every call here turns `StoreUnavailable` into one
logged warning and a single-server answer (admit, keep serving what is here),
never a crashed session; the warning is logged again only after the store came
back and failed anew.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

from live.store import SessionStore, StoreError

__all__ = ["Fleet"]

log = logging.getLogger("live.fleet")
T = TypeVar("T")


class Fleet:
    """This server's membership: its id, its address, its leases and its slots."""

    def __init__(
        self,
        store: SessionStore,
        *,
        address: str,
        lease_seconds: float = 6.0,
        state_ttl: float = 3600.0,
        max_sessions_global: int | None = None,
        server_id: str | None = None,
    ) -> None:
        self.store = store
        self.address = address
        self.lease_seconds = lease_seconds
        self.state_ttl = state_ttl
        self.max_sessions_global = max_sessions_global
        self.server_id = server_id or uuid.uuid4().hex[:12]
        self.degraded = False
        self._saved: dict[str, str] = {}  # session id -> the state last written

    async def _safe(self, call: Callable[[], Awaitable[T]], fallback: T) -> T:
        try:
            result = await call()
        except StoreError as exc:
            if not self.degraded:
                self.degraded = True
                log.warning("shared store unavailable (%s): serving as a single server", exc)
            return fallback
        if self.degraded:
            self.degraded = False
            log.warning("shared store reachable again: back in the fleet")
        return result

    # -- membership -----------------------------------------------------------------

    async def run(self, sessions: Callable[[], dict[str, Any]]) -> None:
        """Announce, renew leases and write changed session facts, every third of a lease.

        `sessions()` maps each session this server serves to its durable facts.
        """
        period = self.lease_seconds / 3
        while True:
            await self.beat(sessions())
            await anyio.sleep(period)

    async def beat(self, states: dict[str, Any]) -> None:
        store = self.store
        await self._safe(lambda: store.announce(self.server_id, self.address, self.lease_seconds), None)
        if states:
            await self._safe(
                lambda: store.heartbeat(self.server_id, list(states), self.lease_seconds), set()
            )
        for session_id, state in states.items():
            await self.save(session_id, state)

    async def save(self, session_id: str, state: dict[str, Any]) -> None:
        text = json.dumps(state, sort_keys=True, default=str)
        if self._saved.get(session_id) == text:
            return
        await self._safe(lambda: self.store.save_state(session_id, state, self.state_ttl), None)
        self._saved[session_id] = text

    async def retire(self) -> None:
        await self._safe(lambda: self.store.retire(self.server_id), None)

    # -- sessions -------------------------------------------------------------------

    async def admit(self, session_id: str) -> bool:
        """Take a fleet-wide slot (when there is a limit); True without a store."""
        limit = self.max_sessions_global
        if limit is None:
            return True
        store = self.store
        await self._safe(lambda: store.announce(self.server_id, self.address, self.lease_seconds), None)
        return await self._safe(lambda: store.acquire_slot(self.server_id, session_id, limit), True)

    async def started(self, session_id: str, state: dict[str, Any]) -> None:
        await self._safe(lambda: self.store.claim(session_id, self.server_id, self.lease_seconds), True)
        await self.save(session_id, state)

    async def ended(self, session_id: str, *, keep_state: bool = False) -> None:
        """The session ended here (or, `keep_state`, was handed off for another server)."""
        self._saved.pop(session_id, None)
        store = self.store
        if not keep_state:
            await self._safe(lambda: store.delete_state(session_id), None)
        await self._safe(lambda: store.release(session_id, self.server_id), False)
        if self.max_sessions_global is not None:
            await self._safe(lambda: store.release_slot(self.server_id, session_id), None)

    async def locate(self, session_id: str) -> tuple[str | None, dict[str, Any] | None]:
        """Where a session lives: (the live holder's address, None), or (None, its
        stored facts) when no server holds it, or (None, None) when it is unknown."""
        store = self.store
        holder = await self._safe(lambda: store.holder(session_id), None)
        if holder is not None and holder != self.server_id:
            address = await self._safe(lambda: store.server_address(holder), None)
            if address is not None:
                return address, None
        state = await self._safe(lambda: store.load_state(session_id), None)
        return None, state

    async def take_over(self, session_id: str) -> bool:
        store = self.store
        return await self._safe(
            lambda: store.take_over(session_id, self.server_id, self.lease_seconds), False
        )
