"""One server's part in a fleet that shares sessions through a `SessionStore`.

With `live serve --redis URL`, every server announces itself and holds a lease
on each session it serves, renewed by a heartbeat (a third of a lease); each
session's durable facts (its resumption handle, tool calls and results, owed
turn, the digest of its reattach token, how far its stream got, when its token
runs out) are written to the store as soon as they change, one write of a
session's facts at a time, in order; a new reattach token's digest is written
before the client is told the token, so the token a client holds is the one a
takeover accepts, and a spent one opens nothing anywhere. When a client
reattaches to a server that does not hold its session:

- the holder is alive: this server relays the client's socket to it;
- the holder is dead (its lease ran out) or handed the session off while
  draining: this server takes the session over from the store and resumes its
  model session from the stored handle.

The store can fail mid-run, pause, or come back empty:

- A session's lease is the right to drive it. A heartbeat that finds a lease
  gone (Redis restarted empty, or paused past the lease) claims it back when
  nobody else holds it, and writes the session's facts again; when another
  server holds it, this server stops serving it at once (`on_lost`), so two
  servers never drive one session. A server that could not renew its leases
  for most of a lease stops the sessions whose client is away (`on_unsure`):
  another server may be taking them over.
- Facts and slots live as long as a takeover may still come (the lease and the
  reattach grace) and are pushed on by the heartbeat. A heartbeat renews only
  sessions still served here when its calls return; a session that ended
  while Redis was away, or while a heartbeat was in flight (whose calls may
  reach Redis after the session's release), is let go again at the next
  heartbeat that reaches Redis, so its slot comes back then.
- With a fleet-wide limit, a new session is admitted only when the store
  counts it (closed when the store is away: the limit is a promise); a
  takeover never needs room (the conversation was counted already).

Every store failure is one logged warning and a single-server answer, never a
crashed session; the warning is logged again only after the store came back
and failed anew.
"""

from __future__ import annotations

import enum
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import anyio

from live.access.auth import LEEWAY_SECONDS, Grant, SpentTokens
from live.fleet.store import SessionStore, StoreError

__all__ = ["Admission", "Fleet", "TokenUses"]

log = logging.getLogger("live.fleet")
T = TypeVar("T")


class Admission(enum.Enum):
    """What the fleet says to a new session."""

    ADMITTED = "admitted"
    FULL = "full"  # the fleet-wide limit is reached
    UNKNOWN = "unknown"  # the store cannot count it now


class Fleet:
    """This server's membership: its id, its address, its leases and its slots."""

    def __init__(
        self,
        store: SessionStore,
        *,
        address: str,
        lease_seconds: float = 1.5,
        reattach_grace: float = 30.0,
        max_sessions_global: int | None = None,
        server_id: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.address = address
        self.lease_seconds = lease_seconds
        # Facts and slots outlive a dead holder for as long as its client may
        # come back to another server: the lease, then the reattach grace.
        self.state_ttl = lease_seconds + reattach_grace + 1.0
        self.max_sessions_global = max_sessions_global
        self.server_id = server_id or uuid.uuid4().hex[:12]
        self.degraded = False
        self.reclaimed = 0  # leases found gone and claimed back
        self.fenced = 0  # sessions let go because another server may carry them
        self._clock = clock
        self._renewed_at = clock()  # when the last heartbeat that succeeded was sent
        self._saved: dict[str, str] = {}  # session id -> the facts last written
        self._changed: set[str] = set()
        # Sessions that ended while the store was away: let go at the next beat.
        self._unreleased: dict[str, bool] = {}
        self._gone: set[str] = set()  # held by another server now: never written here
        # Sessions this server started or took over and has not ended: the only
        # ones a heartbeat renews, claims back or counts.
        self._serving: set[str] = set()
        # The sessions of the heartbeat in flight: one that ends meanwhile is let
        # go again after it, since the beat's calls may land after its release.
        self._beating: set[str] = set()
        self._writing: dict[str, anyio.Lock] = {}  # session id -> its facts' writes, one at a time
        self._wake = anyio.Event()

    async def _safe(self, call: Callable[[], Awaitable[T]], fallback: T) -> T:
        try:
            result = await call()
        except StoreError as exc:
            self._store_failed(exc)
            return fallback
        self._store_answered()
        return result

    def _store_failed(self, exc: Exception) -> None:
        if not self.degraded:
            self.degraded = True
            log.warning("shared store unavailable (%s): serving as a single server", exc)

    def _store_answered(self) -> None:
        if self.degraded:
            self.degraded = False
            # It may have come back empty: everything is written again.
            self._saved.clear()
            log.warning("shared store reachable again: back in the fleet")

    # -- membership -----------------------------------------------------------------

    def changed(self, session_id: str) -> None:
        """A session's facts changed in a way a takeover needs: write them now."""
        self._changed.add(session_id)
        self._wake.set()

    async def run(
        self,
        held: Callable[[], Iterable[str]],
        facts: Callable[[str], dict[str, Any] | None],
        *,
        on_lost: Callable[[str], None] = lambda session_id: None,
        on_unsure: Callable[[str], None] = lambda session_id: None,
    ) -> None:
        """Heartbeat every third of a lease, and write changed facts in between.

        `held()` names the sessions this server serves, `facts(id)` gives one's
        durable facts (None once it is gone); `on_lost(id)` is called for a
        session another server now holds, `on_unsure(id)` for each one while
        the leases could not be renewed for most of a lease.
        """
        period = self.lease_seconds / 3
        next_beat = self._clock()
        while True:
            try:
                if self._clock() >= next_beat:
                    next_beat = self._clock() + period
                    with anyio.move_on_after(period):  # a stalled store does not hold the next beat
                        await self.beat(list(held()), facts, on_lost=on_lost, on_unsure=on_unsure)
                changed, self._changed = self._changed, set()
                for session_id in changed:
                    state = facts(session_id)
                    if state is not None and not await self.save(session_id, state):
                        break
            except Exception:  # a bug here must not take every session of the server down
                log.exception("fleet heartbeat failed; trying again at the next beat")
                await anyio.sleep(period)
            if not self._changed:
                self._wake = anyio.Event()
                with anyio.move_on_after(max(0.0, next_beat - self._clock())):
                    await self._wake.wait()

    async def beat(
        self,
        session_ids: list[str],
        facts: Callable[[str], dict[str, Any] | None],
        *,
        on_lost: Callable[[str], None] = lambda session_id: None,
        on_unsure: Callable[[str], None] = lambda session_id: None,
    ) -> None:
        store = self.store
        sent_at = self._clock()
        # Only what is still served here: a session that ended (or was refused)
        # since `session_ids` was taken has nothing left to renew.
        session_ids = [s for s in session_ids if s in self._serving]
        self._beating = set(session_ids)
        try:
            await self._beat(session_ids, sent_at, facts, on_lost=on_lost, on_unsure=on_unsure)
        finally:
            self._beating = set()

    async def _beat(
        self,
        session_ids: list[str],
        sent_at: float,
        facts: Callable[[str], dict[str, Any] | None],
        *,
        on_lost: Callable[[str], None],
        on_unsure: Callable[[str], None],
    ) -> None:
        store = self.store
        unsure = sent_at - self._renewed_at > self.lease_seconds * 2 / 3
        if unsure:
            # Not renewed for most of a lease: before this beat's calls may hang on
            # a stalled store, let go of what another server may be taking over.
            for session_id in session_ids:
                on_unsure(session_id)
        try:
            await store.announce(self.server_id, self.address, self.lease_seconds)
            lost = (
                await store.heartbeat(self.server_id, session_ids, self.lease_seconds, self.state_ttl)
                if session_ids
                else set()
            )
        except StoreError as exc:
            self._store_failed(exc)
            if not unsure and self._clock() - self._renewed_at > self.lease_seconds * 2 / 3:
                # Our leases may have run out: another server may take these over.
                for session_id in session_ids:
                    on_unsure(session_id)
            return
        self._store_answered()
        self._renewed_at = sent_at
        for session_id, keep_state in list(self._unreleased.items()):
            try:
                await self._let_go(session_id, keep_state)
            except StoreError:
                break
            del self._unreleased[session_id]
        gone: set[str] = set()
        for session_id in lost:
            if session_id not in self._serving:
                continue  # it ended while the store was stalled: nothing to claim back
            if await self._reclaim(session_id):
                continue
            gone.add(session_id)
            self._gone.add(session_id)
            self._changed.discard(session_id)
            self.fenced += 1
            log.warning("session %s is held by another server now: letting it go here", session_id)
            on_lost(session_id)
        # A session that ended during the calls above is not held again; one that
        # ends during the next one is let go again at the next beat (`ended`).
        kept = [s for s in session_ids if s not in gone and s in self._serving]
        if self.max_sessions_global is not None and kept:
            await self._safe(lambda: store.hold_slots(kept, self.state_ttl), None)
        for session_id in kept:
            if session_id not in self._serving:
                continue
            state = facts(session_id)
            if state is not None and not await self.save(session_id, state):
                break  # the store failed: the next beat tries again

    async def _reclaim(self, session_id: str) -> bool:
        """A lease found gone: claim it back when nobody else holds it. True
        also when the store cannot say (the next beat asks again): only another
        holder is a reason to let the session go."""
        store = self.store
        try:
            holder = await store.holder(session_id)
            if holder is not None and holder != self.server_id:
                return False
            if not await store.claim(session_id, self.server_id, self.lease_seconds):
                return False
        except StoreError as exc:
            self._store_failed(exc)
            return True
        self.reclaimed += 1
        self._saved.pop(session_id, None)  # written again below
        log.warning("session %s: its lease was gone from the store; claimed back", session_id)
        return True

    async def save(self, session_id: str, state: dict[str, Any]) -> bool:
        """Write a session's facts if they changed; False when the store failed.

        One write of a session's facts at a time, in the order they were asked
        for: facts taken before a change (a heartbeat's) never land after the
        facts written for it (a rotated resume token's)."""
        if session_id in self._gone:
            return True  # another server carries it now: its facts are that server's
        try:
            text = json.dumps(state, sort_keys=True, default=str, allow_nan=False)
        except ValueError:  # a number JSON cannot carry (a tool's NaN): not storable
            if self._saved.get(session_id) != "unstorable":
                self._saved[session_id] = "unstorable"
                log.warning("session %s: its facts hold a non-finite number and cannot be stored", session_id)
            return True
        lock = self._writing.get(session_id)
        if lock is None:
            lock = self._writing[session_id] = anyio.Lock(fast_acquire=True)
        try:
            async with lock:
                if self._saved.get(session_id) == text or session_id not in self._serving:
                    return True  # unchanged, or it ended while an earlier write was in flight
                try:
                    await self.store.save_state(session_id, json.loads(text), self.state_ttl)
                except StoreError as exc:
                    self._store_failed(exc)
                    return False
                self._store_answered()
                if session_id in self._serving:  # not one that ended meanwhile
                    self._saved[session_id] = text
                return True
        finally:
            if not lock.locked() and not lock.statistics().tasks_waiting and self._writing.get(session_id) is lock:
                del self._writing[session_id]

    async def retire(self) -> None:
        await self._safe(lambda: self.store.retire(self.server_id), None)

    # -- sessions -------------------------------------------------------------------

    async def admit(self, session_id: str) -> Admission:
        """Count a new session against the fleet-wide limit, if there is one."""
        limit = self.max_sessions_global
        if limit is None:
            return Admission.ADMITTED
        try:
            taken = await self.store.acquire_slot(session_id, limit, self.state_ttl)
        except StoreError as exc:
            self._store_failed(exc)
            return Admission.UNKNOWN
        self._store_answered()
        return Admission.ADMITTED if taken else Admission.FULL

    async def started(self, session_id: str, state: dict[str, Any]) -> None:
        self._unreleased.pop(session_id, None)
        self._gone.discard(session_id)
        self._serving.add(session_id)
        await self._safe(lambda: self.store.claim(session_id, self.server_id, self.lease_seconds), True)
        await self.save(session_id, state)

    async def ended(self, session_id: str, *, keep_state: bool = False) -> None:
        """The session ended here (or, `keep_state`, was handed off for another server).

        Only while this server holds the session are its facts deleted and its
        slot freed: another server may carry it on by now. A handed-off
        session keeps its slot until it is taken over or its time runs out.
        """
        self._saved.pop(session_id, None)
        self._changed.discard(session_id)
        self._serving.discard(session_id)
        if session_id in self._gone:
            self._gone.discard(session_id)
            return  # its lease, facts and slot are the new holder's
        if session_id in self._beating or session_id in self._writing:
            # The heartbeat (or a write of its facts) in flight may renew its lease,
            # hold its slot or store its facts after the release below reaches
            # the store: the next beat lets go again.
            self._unreleased[session_id] = keep_state
        try:
            await self._let_go(session_id, keep_state)
        except StoreError as exc:
            # Reconciled by the heartbeat once the store answers again.
            self._store_failed(exc)
            self._unreleased[session_id] = keep_state
            return
        self._store_answered()

    async def park(self, session_id: str, state: dict[str, Any], seconds: float) -> bool:
        """A session whose client left and may come back for `seconds` (a Live
        API app, within the service's two hours): its facts are kept that long,
        and its lease and slot let go; whichever server the client comes back
        to takes it over. False when the store failed (the session is lost)."""
        self._saved.pop(session_id, None)
        self._changed.discard(session_id)
        self._gone.discard(session_id)
        store = self.store
        try:
            await store.save_state(session_id, json.loads(json.dumps(state, default=str)), seconds)
            await store.release(session_id, self.server_id)
            if self.max_sessions_global is not None:
                await store.release_slot(session_id)
        except StoreError as exc:
            self._store_failed(exc)
            return False
        self._store_answered()
        return True

    async def _let_go(self, session_id: str, keep_state: bool) -> None:
        store = self.store
        released = await store.release(session_id, self.server_id, delete_state=not keep_state)
        if keep_state:
            return
        if not released:
            # Our lease may just be gone (Redis restarted, or paused past it):
            # unless another server holds the session, its traces go too.
            if await store.holder(session_id) is not None:
                return
            await store.delete_state(session_id)
        if self.max_sessions_global is not None:
            await store.release_slot(session_id)

    async def spend_token(self, token_id: str, uses: int, expires_at: float | None) -> bool:
        """Count one use of a token across the fleet; False once its `uses` are
        spent. True also when the store cannot say: this server's own count
        (which the caller keeps) decides then, as a single server's would."""
        # Kept until the token expires (and the leeway a check allows after it).
        ttl = max(1.0, (expires_at or time.time()) + LEEWAY_SECONDS - time.time())
        return await self._safe(lambda: self.store.spend_use(token_id, uses, ttl), True)

    async def token_exhausted(self, token_id: str, uses: int) -> bool:
        """Whether a token opened its `uses` sessions across the fleet already
        (nothing counted); False when the store cannot say."""
        return await self._safe(lambda: self.store.token_uses(token_id), 0) >= uses

    async def locate(self, session_id: str) -> tuple[str | None, str | None, dict[str, Any] | None]:
        """Where a session lives: (its live holder, that holder's address or None
        when it stopped announcing itself or is this server, None), or (None,
        None, its stored facts or None when unknown). Raises `StoreError` when
        the store cannot say."""
        store = self.store
        holder = await store.holder(session_id)
        if holder == self.server_id and session_id in self._serving:
            return holder, None, None  # being taken over here, by another socket
        if holder is not None and holder != self.server_id:
            return holder, await store.server_address(holder), None
        return None, None, await store.load_state(session_id)

    async def lease_left(self, session_id: str) -> float:
        """Seconds until a session's lease runs out unless renewed (0: none).
        Raises `StoreError` when the store cannot say."""
        return await self.store.lease_left(session_id)

    async def take_over(self, session_id: str) -> bool:
        """Hold a session whose holder is gone, and its slot (never refused for room)."""
        store = self.store
        self._unreleased.pop(session_id, None)  # a release queued here earlier is stale now
        self._gone.discard(session_id)
        if not await self._safe(lambda: store.take_over(session_id, self.server_id, self.lease_seconds), False):
            return False
        self._serving.add(session_id)
        if self.max_sessions_global is not None:
            await self._safe(lambda: store.hold_slots([session_id], self.state_ttl), None)
        return True


class TokenUses:
    """How many sessions each token (by `jti`) opened: counted in this process
    (`SpentTokens`), and, for a server of a fleet, in the fleet's store too, so
    a token opens its sessions once across the fleet and across restarts.
    While the store cannot be reached, this process's count decides.

    `fleet()` names the server's fleet (None: a single server); it is asked
    each time, since a server joins its fleet after it is built.
    """

    def __init__(self, fleet: Callable[[], Fleet | None] = lambda: None, local: SpentTokens | None = None) -> None:
        self._fleet = fleet
        self.local = local if local is not None else SpentTokens()

    async def exhausted(self, grant: Grant) -> bool:
        """Whether the grant's token has no session left to open (nothing is counted)."""
        if self.local.exhausted(grant):
            return True
        fleet = self._fleet()
        if fleet is None or grant.token_id is None or not grant.uses:
            return False
        return await fleet.token_exhausted(grant.token_id, grant.uses)

    async def spend(self, grant: Grant) -> bool:
        """Count one use of the grant's token (when its session opens); False if
        its uses are spent, here or anywhere in the fleet."""
        if not self.local.spend(grant):
            return False
        fleet = self._fleet()
        if fleet is None or grant.token_id is None or not grant.uses:
            return True
        return await fleet.spend_token(grant.token_id, grant.uses, grant.expires_at)
