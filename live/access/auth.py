"""Who may talk to the server: signed session tokens, and the Host and Origin checks.

Sans-I/O: nothing here reads a socket. The server asks `HostPolicy` about each
HTTP request before anything else, and `verify_token` about the token a client
presents in `session.start` (or as `Authorization: Bearer` on the handshake).

Tokens are JWTs signed with HS256 by the application's backend, which shares a
secret with the server (`live serve --token-secret`): short-lived (`exp` is
required, and at most `max_lifetime` away), single-use (`jti` is required;
`SpentTokens` remembers the ones that opened a session until they expire, and
a fleet's Redis does too),
naming who the user is (`sub`), which agent they may talk to (`agent`) and for
how long (`max_duration`, seconds), and, when the server names one, who issued
them (`iss`). A web page asks its own backend for one just before it connects,
so no secret ever reaches a browser.

    from live.access.auth import mint_token
    token = mint_token(secret, ttl=300, subject="user-42", agent="weather")

`live token --secret ...` prints one from a shell, for testing.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import ipaddress
import math
import os
import re
import secrets
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

import jwt

__all__ = [
    "ALGORITHM",
    "Grant",
    "HostPolicy",
    "MIN_SECRET_BYTES",
    "SpentTokens",
    "TokenRefused",
    "check_secret",
    "mint_token",
    "verify_token",
]

ALGORITHM = "HS256"
# RFC 7518 §3.2: an HS256 key must be at least as long as the hash (256 bits).
MIN_SECRET_BYTES = 32
# Clock skew tolerated between the backend that mints and the server that checks.
LEEWAY_SECONDS = 5.0
DEFAULT_TTL = 300.0
# The longest a token may be valid for, unless the server says otherwise
# (`live serve --max-token-lifetime`): a token is a short-lived pass, not an account.
DEFAULT_MAX_LIFETIME = 3600.0

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::"})
# A Host header: a name or an IPv4 address, or an IPv6 address in brackets, and
# an optional port. Anything else (user info, paths, spaces) is malformed.
_HOST_HEADER = re.compile(r"^(?:\[(?P<ip6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9._-]+))(?::(?P<port>[0-9]{1,5}))?$")


class TokenRefused(Exception):
    """A token that does not open a session; the message says why, never the token."""


@dataclasses.dataclass(frozen=True)
class Grant:
    """What a valid token allows: who, which agent, for how long."""

    subject: str | None = None
    agent: str | None = None
    max_duration: float | None = None
    expires_at: float | None = None
    token_id: str | None = None  # the `jti`
    # How many sessions the token may open (0: no limit); by default one.
    uses: int = 1
    # A wall-clock time (Unix seconds) at which a session it opened ends,
    # whenever it started (the Live API's `expireTime`).
    ends_at: float | None = None
    # The Live API's constraints on a session's setup, from a token minted on
    # the `auth_tokens` route: {"setup": {...}, "lock": [field paths] | None}.
    live: dict[str, Any] | None = None


def check_secret(secret: str) -> str:
    """The secret, if strong enough to sign with; a `ValueError` saying why not."""
    if len(secret.encode()) < MIN_SECRET_BYTES:
        raise ValueError(
            f"the token secret must be at least {MIN_SECRET_BYTES} bytes "
            "(make one with: python3 -c 'import secrets; print(secrets.token_hex(32))')"
        )
    return secret


def mint_token(
    secret: str,
    *,
    ttl: float = DEFAULT_TTL,
    subject: str | None = None,
    agent: str | None = None,
    max_duration: float | None = None,
    not_before: float | None = None,
    issuer: str | None = None,
    now: float | None = None,
    uses: int = 1,
    ends_at: float | None = None,
    live: dict[str, Any] | None = None,
) -> str:
    """A signed token that opens one session within `ttl` seconds.

    For an application's backend: call it when a signed-in user's page asks to
    talk, and hand the page the token (never the secret). `subject` names the
    user in the server's log, and binds the session to them (a reattach needs a
    token for the same subject); `agent` restricts the token to that agent;
    `max_duration` ends the session after that many seconds; `not_before` (a
    Unix time) delays when it may be used; `issuer` is the `iss` a server
    started with `--token-issuer` expects. Each token has its own `jti`: the
    server lets it open `uses` sessions (0: any number), one by default.
    `ends_at` (a Unix time) ends every session it opened then; `live` carries
    the Live API's constraints on a session's setup (`live.doors.gemini_tokens`).
    """
    check_secret(secret)
    if ttl <= 0:
        raise ValueError(f"ttl must be positive, not {ttl}")
    if max_duration is not None and max_duration <= 0:
        raise ValueError(f"max_duration must be positive, not {max_duration}")
    if isinstance(uses, bool) or not isinstance(uses, int) or uses < 0:
        raise ValueError(f"uses must be a whole number, 0 or more, not {uses!r}")
    issued = time.time() if now is None else now
    claims: dict[str, Any] = {
        "iat": int(issued),
        "exp": int(issued + ttl),
        "jti": secrets.token_urlsafe(16),
    }
    if issuer is not None:
        claims["iss"] = issuer
    if not_before is not None:
        claims["nbf"] = int(not_before)
    if subject is not None:
        claims["sub"] = subject
    if agent is not None:
        claims["agent"] = agent
    if max_duration is not None:
        claims["max_duration"] = max_duration
    if uses != 1:
        claims["uses"] = uses
    if ends_at is not None:
        claims["ends_at"] = int(ends_at)
    if live is not None:
        claims["live"] = live
    return jwt.encode(claims, secret, algorithm=ALGORITHM)


def verify_token(
    token: str,
    secret: str,
    *,
    agent: str | None = None,
    issuer: str | None = None,
    max_lifetime: float | None = DEFAULT_MAX_LIFETIME,
    now: float | None = None,
    resuming: bool = False,
) -> Grant:
    """The grant of a valid token for this server's `agent`; `TokenRefused` otherwise.

    Checks the signature (HS256 only: a token naming any other algorithm,
    `none` included, is refused), `exp` and `jti` (both required), `nbf`, `iss`
    when `issuer` is given, and that the token is valid for at most
    `max_lifetime` seconds (from `iat`, and from now), with a few seconds of
    leeway for clock skew (a token whose sessions end later, `ends_at`, is
    valid until then). Whether its `jti` was already used is
    `SpentTokens`' to say. Text that is not a token (not even UTF-8) is refused
    like any other.

    `resuming`: the token comes back to a session it opened. One that names an
    end for its sessions (`ends_at`) is good for that until then, past its
    `exp` (as the Live API's ephemeral tokens are).
    """
    try:
        token.encode()
    except UnicodeEncodeError:
        raise TokenRefused("the token is not a valid signed token (it is not UTF-8 text)") from None
    try:
        claims = jwt.decode(
            token,
            secret,
            algorithms=[ALGORITHM],
            # Resuming, `exp` is checked below, with the token's `ends_at`.
            options={"require": ["exp", "jti"], "verify_exp": not resuming},
            issuer=issuer,
            leeway=LEEWAY_SECONDS,
        )
    except jwt.InvalidIssuerError:
        raise TokenRefused("the token's issuer ('iss') is not the one this server accepts") from None
    except jwt.ExpiredSignatureError:
        raise TokenRefused("the token has expired") from None
    except jwt.ImmatureSignatureError:
        raise TokenRefused("the token is not valid yet (nbf)") from None
    except jwt.MissingRequiredClaimError as exc:
        raise TokenRefused(f"the token has no '{exc.claim}' claim") from None
    except jwt.InvalidSignatureError:
        raise TokenRefused("the token's signature does not match this server's secret") from None
    except jwt.InvalidAlgorithmError:
        raise TokenRefused(f"the token is not signed with {ALGORITHM}") from None
    except jwt.InvalidTokenError:
        raise TokenRefused("the token is not a valid signed token") from None
    except (UnicodeError, ValueError, TypeError):  # what PyJWT lets through on odd input
        raise TokenRefused("the token is not a valid signed token") from None
    subject = claims.get("sub")
    token_id = claims["jti"]
    if not isinstance(token_id, str) or not token_id:
        raise TokenRefused("the token's 'jti' claim must be a non-empty string")
    expires_at = claims["exp"]
    if isinstance(expires_at, bool) or not isinstance(expires_at, (int, float)):
        raise TokenRefused("the token's 'exp' claim must be a number")
    ends_at = claims.get("ends_at")
    if ends_at is not None and (isinstance(ends_at, bool) or not isinstance(ends_at, (int, float)) or not math.isfinite(ends_at)):
        raise TokenRefused("the token's 'ends_at' claim must be a time (Unix seconds)")
    # A token that names an end for its sessions resumes them until then.
    good_until = max(expires_at, ends_at) if ends_at is not None else expires_at
    if resuming and good_until + LEEWAY_SECONDS < (time.time() if now is None else now):
        raise TokenRefused("the token has expired")
    if max_lifetime is not None:
        current = time.time() if now is None else now
        issued = claims.get("iat")
        start = issued if isinstance(issued, (int, float)) and not isinstance(issued, bool) else current
        lifetime = good_until - min(start, current)
        if lifetime > max_lifetime + LEEWAY_SECONDS:
            raise TokenRefused(
                f"the token is valid for {_duration(lifetime)}, longer than the "
                f"{_duration(max_lifetime)} this server accepts (mint short-lived tokens, "
                "one per visit)"
            )
    token_agent = claims.get("agent")
    max_duration = claims.get("max_duration")
    if subject is not None and not isinstance(subject, str):
        raise TokenRefused("the token's 'sub' claim must be a string")
    if token_agent is not None and not isinstance(token_agent, str):
        raise TokenRefused("the token's 'agent' claim must be a string")
    if max_duration is not None and (
        isinstance(max_duration, bool)
        or not isinstance(max_duration, (int, float))
        or not 0 < max_duration < math.inf  # NaN and infinity are no duration
    ):
        raise TokenRefused("the token's 'max_duration' claim must be a positive number of seconds")
    if token_agent is not None and agent is not None and token_agent != agent:
        raise TokenRefused(f"the token is for agent {token_agent!r}, not {agent!r}")
    uses = claims.get("uses", 1)
    if isinstance(uses, bool) or not isinstance(uses, int) or uses < 0:
        raise TokenRefused("the token's 'uses' claim must be a whole number, 0 or more")
    live = claims.get("live")
    if live is not None and not isinstance(live, dict):
        raise TokenRefused("the token's 'live' claim must be an object")
    return Grant(
        subject=subject,
        agent=token_agent,
        max_duration=float(max_duration) if max_duration is not None else None,
        expires_at=float(expires_at),
        token_id=token_id,
        uses=uses,
        ends_at=float(ends_at) if ends_at is not None else None,
        live=live,
    )


def _duration(seconds: float) -> str:
    for unit, size in (("days", 86400.0), ("hours", 3600.0), ("minutes", 60.0)):
        if seconds >= 2 * size:
            return f"{seconds / size:,.0f} {unit}"
    return f"{seconds:,.0f} s"


class SpentTokens:
    """How many sessions each token (by `jti`) opened, kept until it expires.

    In this process; a server of a fleet counts each use in the fleet's
    Redis as well (`LiveServer.spend_token`), so a token opens its sessions
    once across the fleet and its restarts (docs/access.md). Bounded by what
    valid tokens can exist: every entry goes once its token's `exp` has passed.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._spent: dict[str, int] = {}
        self._expiry: list[tuple[float, str]] = []

    def exhausted(self, grant: Grant) -> bool:
        """Whether the grant's token has no session left to open (nothing is counted)."""
        self._forget_expired()
        token_id = grant.token_id
        if token_id is None or grant.uses == 0:
            return False
        return self._spent.get(token_id, 0) >= grant.uses

    def spend(self, grant: Grant) -> bool:
        """Count one use of the grant's token; False if its uses are spent.

        Called when a session opens (its setup accepted), not when its opening
        is read: an opening refused after its token was checked spends nothing.
        """
        now = self._forget_expired()
        token_id = grant.token_id
        if token_id is None or grant.uses == 0:
            return True
        used = self._spent.get(token_id, 0)
        if used >= grant.uses:
            return False
        self._spent[token_id] = used + 1
        if used:
            return True
        expires = (grant.expires_at if grant.expires_at is not None else now) + LEEWAY_SECONDS
        heapq.heappush(self._expiry, (expires, token_id))
        return True

    def _forget_expired(self) -> float:
        now = self._clock()
        while self._expiry and self._expiry[0][0] < now:
            self._spent.pop(heapq.heappop(self._expiry)[1], None)
        return now

    def __len__(self) -> int:
        return len(self._spent)


# ---------------------------------------------------------------------- Host and Origin


def host_name(header: str) -> str | None:
    """The host part of a `Host` header, lowercased (IPv6 without brackets); None if malformed."""
    match = _HOST_HEADER.match(header.strip())
    if match is None:
        return None
    port = match.group("port")
    if port is not None and int(port) > 65535:
        return None
    ip6 = match.group("ip6")
    if ip6 is not None:
        try:
            return str(ipaddress.IPv6Address(ip6))
        except ValueError:
            return None
    return match.group("name").lower().rstrip(".")


def _normalize_host(entry: str) -> str:
    """An --allow-host entry as `host_name` gives it: no port, no brackets, lowercase."""
    entry = entry.strip().lower()
    if entry in ("*", "") or entry.startswith("."):
        return entry.rstrip(".")
    try:
        return str(ipaddress.ip_address(entry.strip("[]")))
    except ValueError:
        pass
    return host_name(entry) or entry.rstrip(".")


def is_loopback(bind: str) -> bool:
    if bind.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclasses.dataclass(frozen=True)
class HostPolicy:
    """Which `Host` names and page `Origin`s may reach the server.

    The Host check stops DNS rebinding: a page on `evil.example` whose name was
    re-pointed at 127.0.0.1 reaches a local server with `Host: evil.example`, and
    is refused. The Origin check stops pages of other sites that use the
    server's real name; it compares against what is allowed, never against the
    request's own Host (which a rebinding page controls).
    """

    hosts: frozenset[str]
    origins: frozenset[str] = frozenset()
    any_host: bool = False
    any_origin: bool = False

    @classmethod
    def for_bind(
        cls, bind: str, allow_hosts: Iterable[str] = (), allow_origins: Iterable[str] = ()
    ) -> HostPolicy:
        """The policy for a server listening on `bind`.

        Loopback binds allow localhost, 127.0.0.1 and [::1]. A wildcard bind
        (0.0.0.0, ::) allows those and the names given in `allow_hosts`; any
        other bind allows its own address and `allow_hosts`. A name starting
        with a dot allows its subdomains; `*` allows any Host (no check).
        """
        names = {_normalize_host(h) for h in allow_hosts if h.strip()}
        any_host = "*" in names
        names.discard("*")
        if is_loopback(bind) or bind.strip("[]") in _WILDCARD_BINDS:
            names |= LOOPBACK_NAMES
        else:
            names.add(_normalize_host(bind))
        origins = {o.strip().lower().rstrip("/") for o in allow_origins if o.strip()}
        any_origin = "*" in origins
        origins.discard("*")
        return cls(frozenset(names), frozenset(origins), any_host, any_origin)

    def host_allowed(self, name: str) -> bool:
        return self.any_host or self._named(name)

    def _named(self, name: str) -> bool:
        if name in self.hosts:
            return True
        return any(h.startswith(".") and (name.endswith(h) or name == h[1:]) for h in self.hosts)

    def origin_allowed(self, origin: str) -> bool:
        """A page's Origin: one listed with --allow-origin, or on a host named as allowed
        (any port; `--allow-host '*'` does not extend to Origins)."""
        origin = origin.strip().lower().rstrip("/")
        if self.any_origin or origin in self.origins:
            return True
        try:
            parts = urlsplit(origin)
        except ValueError:  # `http://[`: a host that never closes is no page's
            return False
        if parts.scheme not in ("http", "https") or parts.path or parts.query:
            return False  # "null" (sandboxed frames, files) and anything odd
        name = host_name(parts.netloc)
        return name is not None and self._named(name)

    def describe(self) -> str:
        if self.any_host:
            return "any host"
        return ", ".join(sorted(f"[{h}]" if ":" in h else h for h in self.hosts))


# ---------------------------------------------------------------------- live token


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="live token",
        description=(
            "Print one signed session token (a JWT, HS256) for a server started with "
            "--token-secret. An application's backend mints them the same way with "
            "live.access.auth.mint_token."
        ),
    )
    parser.add_argument("--secret", default=os.environ.get("LIVE_TOKEN_SECRET"), help="the server's --token-secret (default: $LIVE_TOKEN_SECRET)")
    parser.add_argument("--ttl", type=float, default=DEFAULT_TTL, help="seconds the token may be used to start a session (default 300)")
    parser.add_argument("--subject", help="who the token is for (the sub claim; logged by the server)")
    parser.add_argument("--agent", help="the only agent the token may talk to")
    parser.add_argument("--max-duration", type=float, help="seconds a session started with it may last")
    parser.add_argument("--issuer", help="the iss claim (for a server started with --token-issuer)")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if not args.secret:
        print("live token: no secret: pass --secret or set LIVE_TOKEN_SECRET", file=sys.stderr)
        return 2
    try:
        token = mint_token(
            args.secret,
            ttl=args.ttl,
            subject=args.subject,
            agent=args.agent,
            max_duration=args.max_duration,
            issuer=args.issuer,
        )
    except ValueError as exc:
        print(f"live token: {exc}", file=sys.stderr)
        return 2
    print(token)
    return 0
