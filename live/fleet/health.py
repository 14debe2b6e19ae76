"""Backends' health, shared across a fleet: a circuit breaker per backend.

The breakers' rules are `live.engine.breaker`; this keeps them in the store
the fleet shares (`live.fleet.store`: Redis with `--redis`, this process's
memory otherwise), so that when one server learns a backend is down (quota
gone, a region refusing connects), the next server starts its new sessions
elsewhere at once instead of learning it again.

Each change is read, decided and swapped in only if nobody changed it
meanwhile (tried again otherwise), on the store's own clock. A store that
fails is one logged warning: the breakers are then this process's own until
it answers again, and no session waits on it for longer than its timeout.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable

from live.engine.breaker import Breaker, BreakerPolicy
from live.fleet.store import MemoryStore, SessionStore, StoreError

__all__ = ["BackendHealth"]

log = logging.getLogger("live.fleet")

# A breaker nobody touched for this long is forgotten (the store stays bounded).
BREAKER_TTL = 3600.0
_SWAP_TRIES = 5


class BackendHealth:
    """The breakers of a pool's backends, by key (`live.engine.failover.backend_key`)."""

    def __init__(self, policy: BreakerPolicy | None = None, store: SessionStore | None = None) -> None:
        self.policy = policy or BreakerPolicy()
        self._local = MemoryStore()
        self._store: SessionStore = store or self._local
        self._degraded = False
        self.view: dict[str, Breaker] = {}  # as last read or written, by key
        self.now = 0.0  # the store's clock at the last read or write
        self.on_change: Callable[[str, Breaker, float], None] = lambda key, breaker, now: None

    @property
    def shared(self) -> bool:
        return self._store is not self._local

    def share(self, store: SessionStore) -> None:
        """Keep the breakers in the fleet's store from now on."""
        self._store = store

    async def read(self, keys: Iterable[str]) -> dict[str, Breaker]:
        """The breakers of `keys` now (closed for those never written)."""
        keys = list(keys)
        texts, now = await self._call(lambda store: store.load_breakers(keys))
        self.now = now
        found = {key: _breaker(texts.get(key)) for key in keys}
        for key, breaker in found.items():
            self._seen(key, breaker, now)
        return found

    async def failed(self, key: str, *, at_once: bool = False, cooldown: float | None = None) -> Breaker:
        return await self._change(key, lambda b, now: self.policy.failed(b, now, at_once=at_once, cooldown=cooldown))

    async def succeeded(self, key: str) -> Breaker:
        return await self._change(key, self.policy.succeeded)

    async def probing(self, key: str) -> Breaker:
        """Take the half-open breaker's one probe (nothing for another state)."""
        return await self._change(key, self.policy.probing)

    async def _change(self, key: str, rule: Callable[[Breaker, float], Breaker]) -> Breaker:
        for _ in range(_SWAP_TRIES):
            texts, now = await self._call(lambda store: store.load_breakers([key]))
            old_text = texts.get(key)
            old = _breaker(old_text)
            new = rule(old, now)
            if new == old:
                self._seen(key, old, now)
                return old
            new_text = json.dumps(new.to_json(), sort_keys=True)
            if await self._call(lambda store: store.swap_breaker(key, old_text, new_text, BREAKER_TTL)):
                self._seen(key, new, now)
                return new
        # Changed by others at every try: theirs stands, and this was one more of the same.
        return self.view.get(key, Breaker())

    def _seen(self, key: str, breaker: Breaker, now: float) -> None:
        self.now = now
        if self.view.get(key) != breaker:
            self.view[key] = breaker
        self.on_change(key, breaker, now)

    async def _call(self, call):  # type: ignore[no-untyped-def]
        """`call(store)` on the shared store; on this process's own if it fails."""
        if self._store is not self._local:
            try:
                result = await call(self._store)
            except StoreError as exc:
                if not self._degraded:
                    self._degraded = True
                    log.warning("backends' health: the shared store is unavailable (%s); kept here until it answers", exc)
            else:
                if self._degraded:
                    self._degraded = False
                    log.warning("backends' health: the shared store answers again")
                return result
        return await call(self._local)


def _breaker(text: str | None) -> Breaker:
    if not text:
        return Breaker()
    try:
        return Breaker.from_json(json.loads(text))
    except ValueError:
        return Breaker()
