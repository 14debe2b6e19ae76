"""Call tokens: what ties a media stream to the call whose webhook asked for it.

The carrier's webhook is signed by the carrier (checked in `live.phone.webhooks`);
its answer tells the carrier to open a media stream here and hands it a token
for that one call, which the stream brings back in its `start` message. A
media socket without a token minted by this server for the call it names
opens no session: the socket is useless without a real call.

Call tokens are of their own kind: JWTs signed with a key derived from the
server's secret for calls alone, so a call's token never opens a `/live`
session (nor a session token a stream), whatever `--token-secret` is. Each
call gets one token in its whole life, fleet-wide: a webhook replayed (Twilio
signs no time, so a captured request stays valid) mints nothing, and a token
opens one stream. With a fleet the store (`live.fleet.store`)
counts both (`spend_use`, one use); without one, this process does.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import secrets

from live.access.auth import TokenRefused, mint_token, verify_token
from live.fleet.store import MemoryStore, SessionStore, StoreError

__all__ = ["CALL_LIFETIME", "CALL_TOKEN_TTL", "CallTokens"]

log = logging.getLogger("live.phone")

# The carrier opens the stream within a second or two of the webhook's answer;
# a token still unused after this long was not for a stream opening now.
CALL_TOKEN_TTL = 60.0
# How long a call's id is remembered as having had its token: the longest a
# call lasts (Twilio's and Telnyx's limit is four hours), and an hour more.
CALL_LIFETIME = 5 * 3600.0
# What the derived key is for: call tokens and nothing else.
_PURPOSE = b"live.phone: call tokens"


class CallTokens:
    """Mints and checks call tokens (HS256 JWTs whose subject is the call's id)."""

    def __init__(
        self, secret: str | None = None, *, agent: str | None = None, ttl: float = CALL_TOKEN_TTL,
        store: SessionStore | None = None,
    ) -> None:
        # Without a shared secret each process has its own: a fleet behind one
        # number must share one (`--token-secret`), or a stream could reach a
        # server other than the one whose webhook answered.
        base = secret or secrets.token_urlsafe(32)
        digest = hmac.new(base.encode(), _PURPOSE, hashlib.sha256).digest()
        self._secret = base64.urlsafe_b64encode(digest).decode()
        self.agent = agent
        self.ttl = ttl
        # Where "once" is counted: the fleet's store, with this process's own
        # memory for when the store cannot answer.
        self.store = store
        self._local = MemoryStore()

    async def once(self, key: str, ttl: float) -> bool:
        """True the first time `key` is used within `ttl` seconds (fleet-wide with a store)."""
        local = await self._local.spend_use(key, 1, ttl)
        if self.store is None:
            return local
        try:
            return await self.store.spend_use(key, 1, ttl) and local
        except StoreError as exc:
            log.warning("call tokens: the fleet's store did not answer (%s); counting in this server alone", exc)
            return local

    def mint(self, call_id: str) -> str:
        """A token for `call_id` (not counted: `mint_once` is what a webhook uses)."""
        return mint_token(self._secret, ttl=self.ttl, subject=f"call:{call_id}", agent=self.agent)

    async def mint_once(self, call_id: str, occasion: str = "") -> str | None:
        """The call's token, the first time this call (on this `occasion`: a
        transfer that came back is another) asks; None every time after."""
        if not await self.once(f"call-token:{call_id}:{occasion}", CALL_LIFETIME):
            return None
        return self.mint(call_id)

    def check(self, token: str | None, call_id: str | None) -> str | None:
        """None if `token` was minted here for `call_id`; else why not (never the token)."""
        if not token:
            return "the media stream carries no call token"
        try:
            grant = verify_token(token, self._secret, agent=self.agent)
        except TokenRefused as exc:
            return f"call token refused: {exc}"
        if not call_id or grant.subject != f"call:{call_id}":
            return "the call token is for another call"
        return None

    async def spend(self, token: str | None) -> str | None:
        """After `check`: the token opens its one stream, fleet-wide; else why not."""
        try:
            grant = verify_token(token or "", self._secret, agent=self.agent)
        except TokenRefused as exc:
            return f"call token refused: {exc}"
        if not await self.once(f"call-stream:{grant.token_id}", self.ttl + 10):
            return "the call token already opened a stream (a call's token opens one)"
        return None

    def __repr__(self) -> str:  # never the secret
        return f"CallTokens(agent={self.agent!r}, ttl={self.ttl:g})"
