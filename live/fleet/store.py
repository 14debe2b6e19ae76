"""Shared session state: which server holds which session, what it needs to rebuild
a session elsewhere, which servers are alive, and a fleet-wide session limit.

Two implementations behind one async API: `MemoryStore` for one process (the
default, no Redis), and `RedisStore` for a fleet of servers sharing one Redis, where
leases are keys with a PX expiry (a dead server's leases simply run out) and every
read-check-write is one Lua script, so two servers never both win.

A session's facts hold its conversation (transcript, tool calls and results,
the model session's resumption handle). `RedisStore` seals them with a
`FactsKey` the servers share (AES-256-GCM, each value bound to its session)
before they leave the process, and opens only what that key sealed; `live
serve --redis` does not start without one (`--fleet-key`).

Open one with `await open_store(url, facts_key=...)` (None: a `MemoryStore`), close it with
`await store.aclose()` (or `async with`). The API, every method a coroutine:

Session directory (leases):
    claim(session_id, server_id, lease_seconds) -> bool
        True if `server_id` now holds the session, or already did (its lease is then
        extended); False while another server holds a live lease.
    heartbeat(server_id, session_ids, lease_seconds, state_ttl=None) -> set[str]
        Extends, in one round trip, the lease of each of `session_ids` that this
        server holds (and, with `state_ttl`, the expiry of its stored facts);
        returns those it no longer holds (expired, taken over, released, or
        forgotten by a Redis that restarted empty). The caller claims back those
        nobody holds, and stops serving those another server holds.
    holder(session_id) -> str | None
        The server holding a live lease; None once the lease expired (its holder died
        or let it go).
    lease_left(session_id) -> float
        Seconds until the lease runs out unless renewed; 0 when there is none (a
        server waiting to take over a dead holder's session wakes then).
    release(session_id, server_id, delete_state=False) -> bool
        Drops the lease only if `server_id` holds it (compare-and-delete), and with
        `delete_state` the session's facts too, in the same step: a server that
        lost the session never deletes what its new holder uses. True if it did.
    take_over(session_id, new_server_id, lease_seconds) -> bool
        Atomically takes a session whose holder is gone: True only if no live lease
        is held by another server.

A session's durable facts (opaque to the store; whatever JSON can carry):
    save_state(session_id, state: dict, ttl_seconds) -> None
    load_state(session_id) -> dict | None      (None: never saved, deleted or expired)
    delete_state(session_id) -> None

Server liveness, so a server can tell a client where a session's holder lives:
    announce(server_id, address, ttl_seconds) -> None
        The server is alive for `ttl_seconds`; call it again well within that time
        (every ttl/3, with `heartbeat`). A server that stops announcing is dead.
    server_address(server_id) -> str | None    (None: not alive)
    retire(server_id) -> None
        A server stopping cleanly: no longer alive, its slots come back at once.

Fleet-wide limit on concurrent sessions (a slot per conversation, whichever
server carries it, with an expiry its holder's heartbeat pushes on):
    acquire_slot(session_id, limit, ttl_seconds) -> bool
        One script: forget expired slots, count the rest, take one if fewer than
        `limit` are in use. True also if the session already had one.
    hold_slots(session_ids, ttl_seconds) -> None
        Keeps (or puts back) the slots of conversations already counted: a
        heartbeat, a takeover, a Redis that restarted empty. Never refused: a
        conversation that goes on is not a new one.
    release_slot(session_id) -> None
    slots_in_use() -> int
    A server that dies leaves its sessions' slots until they expire (the lease
    and the reattach grace: the time another server may take them over).

Tokens that open a limited number of sessions (a session token's `jti`, a
Live API ephemeral token's `uses`), counted once across the fleet and its restarts:
    spend_use(token_id, uses, ttl_seconds) -> bool
        One script: True and one more use counted if fewer than `uses` were;
        False once they are spent. The count lives until the token expires.
    token_uses(token_id) -> int
        The uses counted so far (0 for a token never used, or expired).
Backends' health, shared so that a second server does not learn an outage again
(`live.fleet.health` keeps circuit breakers in it, their rules in
`live.engine.breaker`):
    load_breakers(keys) -> (dict[key, str | None], now)
        Each key's stored text (None: none), and the store's clock in seconds
        (Redis's own `TIME`), in one round trip.
    swap_breaker(key, old, new, ttl_seconds) -> bool
        Writes `new` only if the key still holds `old` (None: nothing); False
        when another server changed it first (read again, decide again).

Failures: `StoreUnavailable` (a `StoreError`) when Redis cannot be reached. At
start `RedisStore.connect` raises it with a one-line message naming the URL (its
password masked); mid-run every method raises it within about `timeout` seconds
(1 s by default; a dropped connection is retried once at once) rather than hanging, so the caller
can carry on as a single server and log a warning.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import base64
import json
import logging
import math
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Self, TypeVar
from urllib.parse import urlsplit, urlunsplit

from live.extras import MissingExtra, require

__all__ = [
    "FactsKey",
    "MemoryStore",
    "RedisStore",
    "SessionStore",
    "StoreError",
    "StoreUnavailable",
    "open_store",
    "redact_url",
]

T = TypeVar("T")

log = logging.getLogger("live.fleet")


class StoreError(Exception):
    """A problem with the shared store the caller should report, not a bug."""


class StoreUnavailable(StoreError):
    """The store cannot be reached (refused, timed out, connection lost)."""


def _ms(seconds: float) -> int:
    """Seconds as Redis PX milliseconds: at least 1, since PX 0 is an error."""
    if not seconds > 0 or math.isinf(seconds):
        raise ValueError(f"a lease or TTL must be a positive number of seconds, not {seconds!r}")
    return max(1, round(seconds * 1000))


def _check_limit(limit: int) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError(f"limit must be a whole number of sessions, not {limit!r}")


def _json(state: dict[str, Any]) -> str:
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict, not {type(state).__name__}")
    return json.dumps(state, separators=(",", ":"), allow_nan=False)


MIN_FACTS_KEY_BYTES = 32
_SEALED = "v1:"  # a sealed value's prefix: the format, for a later one


class FactsKey:
    """The key a fleet's servers seal each session's facts with before Redis sees them.

    AES-256-GCM (`cryptography`'s AEAD), its key derived with HKDF-SHA256 from
    a secret the servers share (`--fleet-key`, 32 bytes or more). Each value
    gets a fresh 96-bit nonce and is bound to its session's id, so a value
    copied under another session's key opens nowhere, and one altered in Redis
    does not open at all. With several secrets the first seals and each opens:
    a fleet changes its key across a rolling restart without losing a takeover.
    """

    def __init__(self, *shared_secrets: str) -> None:
        if not shared_secrets:
            raise ValueError("a fleet key needs a secret")
        try:
            require("fleet", "--fleet-key", "cryptography")
        except MissingExtra as exc:
            raise StoreError(str(exc)) from None
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF

        self._ciphers = []
        for secret in shared_secrets:
            if len(secret.encode()) < MIN_FACTS_KEY_BYTES:
                raise ValueError(
                    f"a fleet key must be at least {MIN_FACTS_KEY_BYTES} bytes (make one with: "
                    "python3 -c 'import secrets; print(secrets.token_hex(32))')"
                )
            derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"live-sessions fleet facts v1")
            self._ciphers.append(AESGCM(derived.derive(secret.encode())))

    def __repr__(self) -> str:  # never the secret
        return f"FactsKey({len(self._ciphers)} secret(s))"

    def seal(self, session_id: str, text: str) -> str:
        nonce = secrets.token_bytes(12)
        sealed = self._ciphers[0].encrypt(nonce, text.encode(), _bound_to(session_id))
        return _SEALED + base64.urlsafe_b64encode(nonce + sealed).decode()

    def open(self, session_id: str, value: str) -> str | None:
        """The text `seal` sealed for this session; None for anything else
        (another key's, another session's, altered, or never sealed)."""
        from cryptography.exceptions import InvalidTag

        if not value.startswith(_SEALED):
            return None
        try:
            raw = base64.urlsafe_b64decode(value[len(_SEALED):])
        except ValueError:
            return None
        for cipher in self._ciphers:
            try:
                return cipher.decrypt(raw[:12], raw[12:], _bound_to(session_id)).decode()
            except (InvalidTag, ValueError):
                continue
        return None


def _bound_to(session_id: str) -> bytes:
    return b"live-sessions facts of " + session_id.encode()


class SessionStore(abc.ABC):
    """What servers share about sessions; see the module docstring for the contract."""

    @abc.abstractmethod
    async def claim(self, session_id: str, server_id: str, lease_seconds: float) -> bool: ...

    @abc.abstractmethod
    async def heartbeat(
        self, server_id: str, session_ids: Iterable[str], lease_seconds: float, state_ttl: float | None = None
    ) -> set[str]: ...

    @abc.abstractmethod
    async def holder(self, session_id: str) -> str | None: ...

    @abc.abstractmethod
    async def lease_left(self, session_id: str) -> float: ...

    @abc.abstractmethod
    async def release(self, session_id: str, server_id: str, *, delete_state: bool = False) -> bool: ...

    @abc.abstractmethod
    async def take_over(self, session_id: str, new_server_id: str, lease_seconds: float) -> bool: ...

    @abc.abstractmethod
    async def save_state(self, session_id: str, state: dict[str, Any], ttl_seconds: float) -> None: ...

    @abc.abstractmethod
    async def load_state(self, session_id: str) -> dict[str, Any] | None: ...

    @abc.abstractmethod
    async def delete_state(self, session_id: str) -> None: ...

    @abc.abstractmethod
    async def announce(self, server_id: str, address: str, ttl_seconds: float) -> None: ...

    @abc.abstractmethod
    async def server_address(self, server_id: str) -> str | None: ...

    @abc.abstractmethod
    async def retire(self, server_id: str) -> None: ...

    @abc.abstractmethod
    async def acquire_slot(self, session_id: str, limit: int, ttl_seconds: float) -> bool: ...

    @abc.abstractmethod
    async def hold_slots(self, session_ids: Iterable[str], ttl_seconds: float) -> None: ...

    @abc.abstractmethod
    async def release_slot(self, session_id: str) -> None: ...

    @abc.abstractmethod
    async def slots_in_use(self) -> int: ...

    @abc.abstractmethod
    async def spend_use(self, token_id: str, uses: int, ttl_seconds: float) -> bool: ...

    @abc.abstractmethod
    async def token_uses(self, token_id: str) -> int: ...

    @abc.abstractmethod
    async def load_breakers(self, keys: Iterable[str]) -> tuple[dict[str, str | None], float]: ...

    @abc.abstractmethod
    async def swap_breaker(self, key: str, old: str | None, new: str, ttl_seconds: float) -> bool: ...

    async def aclose(self) -> None:
        """Lets go of connections; the shared data stays."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


# --- one process ---------------------------------------------------------------


class _Expiring:
    """Keys with deadlines, forgotten when read after their deadline (and swept)."""

    _SWEEP_EVERY = 1024

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._items: dict[str, tuple[Any, float]] = {}
        self._writes = 0

    def get(self, key: str) -> Any | None:
        item = self._items.get(key)
        if item is None:
            return None
        if item[1] <= self._clock():
            del self._items[key]
            return None
        return item[0]

    def set(self, key: str, value: Any, seconds: float) -> None:
        self._items[key] = (value, self._clock() + _ms(seconds) / 1000)
        self._writes += 1
        if self._writes % self._SWEEP_EVERY == 0:  # bounds memory held by expired keys
            now = self._clock()
            for stale in [k for k, (_, deadline) in self._items.items() if deadline <= now]:
                del self._items[stale]

    def expire(self, key: str, seconds: float) -> bool:
        value = self.get(key)
        if value is None:
            return False
        self._items[key] = (value, self._clock() + _ms(seconds) / 1000)
        return True

    def delete(self, key: str) -> None:
        self._items.pop(key, None)

    def seconds_left(self, key: str) -> float:
        """How long a key has before its deadline (a millisecond at least)."""
        item = self._items.get(key)
        return max(0.001, item[1] - self._clock()) if item is not None else 0.001

    def count(self) -> int:
        """Keys not yet past their deadline."""
        now = self._clock()
        return sum(1 for _, deadline in self._items.values() if deadline > now)


class MemoryStore(SessionStore):
    """The store of a single process: same contract as `RedisStore`, nothing shared.

    Every method runs without awaiting anything, so each is atomic on the event loop.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time) -> None:
        self._leases = _Expiring(clock)
        self._states = _Expiring(clock)
        self._servers = _Expiring(clock)
        self._slots = _Expiring(clock)
        self._uses = _Expiring(clock)
        self._breakers = _Expiring(clock)
        self._wall_clock = wall_clock

    def _take(self, session_id: str, server_id: str, lease_seconds: float) -> bool:
        _ms(lease_seconds)
        held_by = self._leases.get(session_id)
        if held_by is not None and held_by != server_id:
            return False
        self._leases.set(session_id, server_id, lease_seconds)
        return True

    async def claim(self, session_id: str, server_id: str, lease_seconds: float) -> bool:
        return self._take(session_id, server_id, lease_seconds)

    async def take_over(self, session_id: str, new_server_id: str, lease_seconds: float) -> bool:
        return self._take(session_id, new_server_id, lease_seconds)

    async def heartbeat(
        self, server_id: str, session_ids: Iterable[str], lease_seconds: float, state_ttl: float | None = None
    ) -> set[str]:
        _ms(lease_seconds)
        lost = set()
        for session_id in session_ids:
            if self._leases.get(session_id) == server_id:
                self._leases.expire(session_id, lease_seconds)
                if state_ttl is not None:
                    self._states.expire(session_id, state_ttl)
            else:
                lost.add(session_id)
        return lost

    async def holder(self, session_id: str) -> str | None:
        return self._leases.get(session_id)

    async def lease_left(self, session_id: str) -> float:
        return 0.0 if self._leases.get(session_id) is None else self._leases.seconds_left(session_id)

    async def release(self, session_id: str, server_id: str, *, delete_state: bool = False) -> bool:
        if self._leases.get(session_id) != server_id:
            return False
        self._leases.delete(session_id)
        if delete_state:
            self._states.delete(session_id)
        return True

    async def save_state(self, session_id: str, state: dict[str, Any], ttl_seconds: float) -> None:
        # Stored as text, like Redis: the caller's dict can change afterwards, and
        # what cannot cross Redis cannot cross here either.
        self._states.set(session_id, _json(state), ttl_seconds)

    async def load_state(self, session_id: str) -> dict[str, Any] | None:
        text = self._states.get(session_id)
        return None if text is None else json.loads(text)

    async def delete_state(self, session_id: str) -> None:
        self._states.delete(session_id)

    async def announce(self, server_id: str, address: str, ttl_seconds: float) -> None:
        self._servers.set(server_id, str(address), ttl_seconds)

    async def server_address(self, server_id: str) -> str | None:
        return self._servers.get(server_id)

    async def retire(self, server_id: str) -> None:
        self._servers.delete(server_id)

    async def acquire_slot(self, session_id: str, limit: int, ttl_seconds: float) -> bool:
        _check_limit(limit)
        if self._slots.get(session_id) is None and await self.slots_in_use() >= limit:
            return False
        self._slots.set(session_id, True, ttl_seconds)
        return True

    async def hold_slots(self, session_ids: Iterable[str], ttl_seconds: float) -> None:
        for session_id in session_ids:
            self._slots.set(session_id, True, ttl_seconds)

    async def release_slot(self, session_id: str) -> None:
        self._slots.delete(session_id)

    async def slots_in_use(self) -> int:
        return self._slots.count()

    async def token_uses(self, token_id: str) -> int:
        return self._uses.get(token_id) or 0

    async def spend_use(self, token_id: str, uses: int, ttl_seconds: float) -> bool:
        _check_limit(uses)
        used = self._uses.get(token_id) or 0
        if used >= uses:
            return False
        if used:
            self._uses.set(token_id, used + 1, self._uses.seconds_left(token_id))
        else:
            self._uses.set(token_id, 1, ttl_seconds)
        return True

    async def load_breakers(self, keys: Iterable[str]) -> tuple[dict[str, str | None], float]:
        return {key: self._breakers.get(key) for key in keys}, self._wall_clock()

    async def swap_breaker(self, key: str, old: str | None, new: str, ttl_seconds: float) -> bool:
        if self._breakers.get(key) != old:
            return False
        self._breakers.set(key, new, ttl_seconds)
        return True


# --- Redis ---------------------------------------------------------------------

# Take a lease if it is free or already ours (then extend it). KEYS[1] lease.
_TAKE = """
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if held then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

# Delete a lease only if ours, and then (ARGV[2] == "1") the state. KEYS: lease, state.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if ARGV[2] == '1' then redis.call('DEL', KEYS[2]) end
  return 1
end
return 0
"""

# Extend every lease in KEYS[1..n] held by ARGV[1] (and, ARGV[3] > 0, the state key
# KEYS[n+i] of each); return the indexes (1-based) of those not held. n = ARGV[4].
_HEARTBEAT = """
local n = tonumber(ARGV[4])
local state_ms = tonumber(ARGV[3])
local lost = {}
for i = 1, n do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[i], ARGV[2])
    if state_ms > 0 then redis.call('PEXPIRE', KEYS[n + i], state_ms) end
  else
    lost[#lost + 1] = i
  end
end
return lost
"""

# The fleet-wide limit: one sorted set of session ids (KEYS[1]) scored by the
# millisecond their slot expires, on Redis's own clock. ARGV: session, limit,
# ttl ms. Returns 1 taken (or already held: its expiry pushed on), 0 full.
_ACQUIRE_SLOT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local until_ms = now + tonumber(ARGV[3])
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], until_ms, ARGV[1])
  return 1
end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], until_ms, ARGV[1])
return 1
"""

# Hold the slots of ARGV[2..] until ttl ms (ARGV[1]) from now, whatever the count.
_HOLD_SLOTS = """
local t = redis.call('TIME')
local until_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], until_ms, ARGV[i]) end
return 1
"""

# Slots not yet expired. KEYS[1] the slot set.
_COUNT_SLOTS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZCARD', KEYS[1])
"""


# One more use of a token (KEYS[1], its count) if fewer than ARGV[1] were; the
# count expires after ARGV[2] ms, from its first use. Returns 1 counted, 0 spent.
_SPEND_USE = """
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
if used >= tonumber(ARGV[1]) then return 0 end
if used == 0 then
  redis.call('SET', KEYS[1], 1, 'PX', ARGV[2])
else
  redis.call('INCR', KEYS[1])
end
return 1
"""

# Breakers' texts (KEYS) and Redis's clock in seconds, in one round trip.
_LOAD_BREAKERS = """
local t = redis.call('TIME')
local values = {}
for i = 1, #KEYS do values[i] = redis.call('GET', KEYS[i]) or '' end
return {tostring(tonumber(t[1]) + tonumber(t[2]) / 1000000), values}
"""

# Write ARGV[2] (PX ARGV[3]) only if KEYS[1] still holds ARGV[1] ('' for nothing).
_SWAP_BREAKER = """
local held = redis.call('GET', KEYS[1]) or ''
if held ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
"""


def redact_url(url: str) -> str:
    """The URL with its password masked, fit for logs and error messages."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        user = parts.username or ""
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port is not None else "")
        return urlunsplit(parts._replace(netloc=netloc))
    except ValueError:
        return "<unreadable Redis URL>"


def _reason(exc: BaseException) -> str:
    """The cause of a connection failure in a few words ("Connection refused")."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno:
            return os.strerror(seen.errno)
        if isinstance(seen, TimeoutError) or type(seen).__name__ == "TimeoutError":
            return "timed out"
        seen = seen.__cause__ or seen.__context__
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


class RedisStore(SessionStore):
    """The store shared by a fleet: one Redis, reached through redis-py's asyncio client.

    Build it with `await RedisStore.connect(url)`, which checks Redis answers.
    Every key starts with `prefix`, so several fleets may share one Redis.
    """

    def __init__(self, client: Any, *, url: str, prefix: str = "live:", facts_key: FactsKey | None = None) -> None:
        self._client = client
        self._url = redact_url(url)
        self._prefix = prefix
        self._facts_key = facts_key
        self._take = client.register_script(_TAKE)
        self._release = client.register_script(_RELEASE)
        self._heartbeat = client.register_script(_HEARTBEAT)
        self._acquire_slot = client.register_script(_ACQUIRE_SLOT)
        self._hold_slots = client.register_script(_HOLD_SLOTS)
        self._count_slots = client.register_script(_COUNT_SLOTS)
        self._spend_use = client.register_script(_SPEND_USE)
        self._load_breakers = client.register_script(_LOAD_BREAKERS)
        self._swap_breaker = client.register_script(_SWAP_BREAKER)

    @property
    def url(self) -> str:
        """The Redis URL, password masked."""
        return self._url

    @classmethod
    async def connect(
        cls, url: str, *, prefix: str = "live:", timeout: float = 1.0, facts_key: FactsKey | None = None
    ) -> RedisStore:
        """A store on the Redis at `url` (redis://, rediss://, unix://), once it answers PING.

        `facts_key` seals sessions' facts before they reach Redis; without one
        they are stored as JSON, in clear (tests, and tools that read them).

        Raises `StoreUnavailable` ("cannot reach Redis at URL: reason") if it does not,
        and `StoreError` for a URL that is not a Redis URL.
        """
        try:
            require("fleet", "--redis", "redis")
        except MissingExtra as exc:
            raise StoreError(str(exc)) from None
        import redis.asyncio
        import redis.exceptions
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        shown = redact_url(url)
        try:
            client = redis.asyncio.from_url(
                url,
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
                # One immediate retry on a fresh connection covers one the server closed
                # while idle; none on a timeout, since a Redis that does not answer within
                # `timeout` will not answer the retry either (the library's default backs
                # off and retries for seconds, which would stall the caller).
                retry=Retry(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,)),
                health_check_interval=30,
                decode_responses=True,
            )
        except ValueError:  # its text may quote the URL, password and all
            raise StoreError(f"not a Redis URL (redis://, rediss:// or unix://): {shown}") from None
        store = cls(client, url=url, prefix=prefix, facts_key=facts_key)
        try:
            await store._call(client.ping)
        except StoreUnavailable:
            await store.aclose()
            raise
        except Exception as exc:  # refused AUTH, a wrong database number
            await store.aclose()
            raise StoreUnavailable(f"cannot use Redis at {shown}: {_reason(exc)}") from None
        return store

    async def aclose(self) -> None:
        try:
            await self._client.aclose()
        except Exception:  # closing a connection to a Redis that went away
            pass

    async def _call(self, method: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        import redis.exceptions

        try:
            return await method(*args, **kwargs)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError, TimeoutError) as exc:
            raise StoreUnavailable(f"cannot reach Redis at {self._url}: {_reason(exc)}") from None
        except redis.exceptions.RedisError as exc:  # READONLY after a failover, OOM, MISCONF
            raise StoreError(f"Redis at {self._url} refused: {_reason(exc)}") from None
        except RuntimeError as exc:
            # A pooled connection whose transport the event loop already closed
            # (after a timeout mid-reply): drop the pool's connections, so the
            # next call opens a fresh one.
            with contextlib.suppress(Exception):
                await self._client.connection_pool.disconnect()
            raise StoreUnavailable(f"cannot reach Redis at {self._url}: {_reason(exc)}") from None

    def _lease(self, session_id: str) -> str:
        return f"{self._prefix}lease:{session_id}"

    def _state(self, session_id: str) -> str:
        return f"{self._prefix}state:{session_id}"

    def _server(self, server_id: str) -> str:
        return f"{self._prefix}server:{server_id}"

    async def claim(self, session_id: str, server_id: str, lease_seconds: float) -> bool:
        keys = [self._lease(session_id)]
        return bool(await self._call(self._take, keys=keys, args=[server_id, _ms(lease_seconds)]))

    async def take_over(self, session_id: str, new_server_id: str, lease_seconds: float) -> bool:
        keys = [self._lease(session_id)]
        return bool(await self._call(self._take, keys=keys, args=[new_server_id, _ms(lease_seconds)]))

    async def heartbeat(
        self, server_id: str, session_ids: Iterable[str], lease_seconds: float, state_ttl: float | None = None
    ) -> set[str]:
        ids = list(session_ids)
        ms = _ms(lease_seconds)
        state_ms = 0 if state_ttl is None else _ms(state_ttl)
        if not ids:
            return set()
        keys = [self._lease(s) for s in ids] + [self._state(s) for s in ids]
        lost = await self._call(self._heartbeat, keys=keys, args=[server_id, ms, state_ms, len(ids)])
        return {ids[int(index) - 1] for index in lost}

    async def holder(self, session_id: str) -> str | None:
        return await self._call(self._client.get, self._lease(session_id))

    async def lease_left(self, session_id: str) -> float:
        ms = await self._call(self._client.pttl, self._lease(session_id))
        return max(0, int(ms)) / 1000  # -2: no lease, -1: one without expiry (never set so)

    async def release(self, session_id: str, server_id: str, *, delete_state: bool = False) -> bool:
        keys = [self._lease(session_id), self._state(session_id)]
        return bool(await self._call(self._release, keys=keys, args=[server_id, "1" if delete_state else "0"]))

    async def save_state(self, session_id: str, state: dict[str, Any], ttl_seconds: float) -> None:
        text = _json(state)
        if self._facts_key is not None:
            text = self._facts_key.seal(session_id, text)
        await self._call(self._client.set, self._state(session_id), text, px=_ms(ttl_seconds))

    async def load_state(self, session_id: str) -> dict[str, Any] | None:
        text = await self._call(self._client.get, self._state(session_id))
        if text is None:
            return None
        if self._facts_key is not None:
            opened = self._facts_key.open(session_id, text)
            if opened is None:
                # Not sealed with this fleet's key (another key, a server without
                # one, or altered in Redis): nothing this server can carry on.
                log.warning("session %s: its stored facts do not open with this server's --fleet-key", session_id[:40])
                return None
            text = opened
        try:
            state = json.loads(text)
        except ValueError:
            log.warning("session %s: its stored facts are not readable", session_id[:40])
            return None
        return state if isinstance(state, dict) else None

    async def delete_state(self, session_id: str) -> None:
        await self._call(self._client.delete, self._state(session_id))

    async def announce(self, server_id: str, address: str, ttl_seconds: float) -> None:
        await self._call(self._client.set, self._server(server_id), str(address), px=_ms(ttl_seconds))

    async def server_address(self, server_id: str) -> str | None:
        return await self._call(self._client.get, self._server(server_id))

    async def retire(self, server_id: str) -> None:
        await self._call(self._client.delete, self._server(server_id))

    def _slot_set(self) -> str:
        return f"{self._prefix}slots"

    async def acquire_slot(self, session_id: str, limit: int, ttl_seconds: float) -> bool:
        _check_limit(limit)
        args = [session_id, limit, _ms(ttl_seconds)]
        return bool(await self._call(self._acquire_slot, keys=[self._slot_set()], args=args))

    async def hold_slots(self, session_ids: Iterable[str], ttl_seconds: float) -> None:
        ids = list(session_ids)
        if ids:
            await self._call(self._hold_slots, keys=[self._slot_set()], args=[_ms(ttl_seconds), *ids])

    async def release_slot(self, session_id: str) -> None:
        await self._call(self._client.zrem, self._slot_set(), session_id)

    async def slots_in_use(self) -> int:
        return int(await self._call(self._count_slots, keys=[self._slot_set()]))

    def _uses_key(self, token_id: str) -> str:
        # A digest: a token's id is the issuer's text, of any length.
        return f"{self._prefix}uses:{hashlib.sha256(token_id.encode()).hexdigest()[:32]}"

    def _breaker(self, key: str) -> str:
        return f"{self._prefix}breaker:{key}"

    async def load_breakers(self, keys: Iterable[str]) -> tuple[dict[str, str | None], float]:
        names = list(keys)
        if not names:
            return {}, time.time()
        now, values = await self._call(self._load_breakers, keys=[self._breaker(k) for k in names])
        return {k: (v or None) for k, v in zip(names, values, strict=True)}, float(now)

    async def swap_breaker(self, key: str, old: str | None, new: str, ttl_seconds: float) -> bool:
        args = [old or "", new, _ms(ttl_seconds)]
        return bool(await self._call(self._swap_breaker, keys=[self._breaker(key)], args=args))

    async def token_uses(self, token_id: str) -> int:
        return int(await self._call(self._client.get, self._uses_key(token_id)) or 0)

    async def spend_use(self, token_id: str, uses: int, ttl_seconds: float) -> bool:
        _check_limit(uses)
        args = [uses, _ms(ttl_seconds)]
        return bool(await self._call(self._spend_use, keys=[self._uses_key(token_id)], args=args))


async def open_store(
    url: str | None, *, facts_key: FactsKey | None, prefix: str = "live:", timeout: float = 1.0
) -> SessionStore:
    """The store for `live serve --redis URL`: a `RedisStore` on `url` sealing
    facts with `facts_key`, or a `MemoryStore` when there is none (a single server).

    Raises `StoreUnavailable` with a one-line message if Redis does not answer.
    """
    if not url:
        return MemoryStore()
    return await RedisStore.connect(url, prefix=prefix, timeout=timeout, facts_key=facts_key)
