"""Short-lived signed tokens that tie a media stream to the call that asked for it.

The carrier's webhook is signed by the carrier (checked in `live.phone.webhooks`);
its answer tells the carrier to open a media stream here and hands it a token
for that one call, which the stream brings back in its `start` message. A
media socket without a token minted by this server for the call it names
opens no session: the socket is useless without a real call.
"""

from __future__ import annotations

import secrets

from live.access.auth import SpentTokens, TokenRefused, mint_token, verify_token

__all__ = ["CALL_TOKEN_TTL", "CallTokens"]

# The carrier opens the stream within a second or two of the webhook's answer;
# a token still unused after this long was not for a stream opening now.
CALL_TOKEN_TTL = 60.0


class CallTokens:
    """Mints and checks call tokens (HS256 JWTs whose subject is the call's id)."""

    def __init__(self, secret: str | None = None, *, agent: str | None = None, ttl: float = CALL_TOKEN_TTL) -> None:
        # Without a shared secret each process has its own: a fleet behind one
        # number must share one (`--token-secret`), or a stream could reach a
        # server other than the one whose webhook answered.
        self._secret = secret or secrets.token_urlsafe(32)
        self.agent = agent
        self.ttl = ttl
        # A call's token opens one stream, as a session token opens one session:
        # a copied start message opens nothing (in this process; see SpentTokens).
        self._spent = SpentTokens()

    def mint(self, call_id: str) -> str:
        return mint_token(self._secret, ttl=self.ttl, subject=f"call:{call_id}", agent=self.agent)

    def check(self, token: str | None, call_id: str | None) -> str | None:
        """None if `token` was minted here for `call_id`; else why not (never the token)."""
        if not token:
            return "the media stream carries no call token (start.customParameters.token)"
        try:
            grant = verify_token(token, self._secret, agent=self.agent)
        except TokenRefused as exc:
            return f"call token refused: {exc}"
        if not call_id or grant.subject != f"call:{call_id}":
            return "the call token is for another call"
        if not self._spent.spend(grant):
            return "the call token already opened a stream (a call's token opens one)"
        return None

    def __repr__(self) -> str:  # never the secret
        return f"CallTokens(agent={self.agent!r}, ttl={self.ttl:g})"
