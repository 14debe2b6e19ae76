"""Who may open a session on the port: the limits, and the counts they are kept by.

`LiveServer` (`live.server.port`) counts, through this mixin, every socket it
admits: in all, while it waits for its opening (pending), and per client address
(behind a trusted proxy, the client its `X-Forwarded-For` names); and refuses a
new socket past a limit with the error that says which. A session opened with a
signed token, or a carrier's stream its door vouched for, stops counting
against its address; a socket's counts are released once, whoever asks first.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from live.access.addresses import AddressSet, address_key, forwarded_client
from live.protocol import ErrorEvent
from live.server.attachment import peer_address

if TYPE_CHECKING:
    from websockets.http11 import Request

    from live.net.websocket import WebSocket
    from live.server.config import ServerConfig
    from live.server.runner import SessionRunner

__all__ = ["SessionAdmission"]


class SessionAdmission:
    """The port's admission limits and counts (a mixin of `LiveServer`)."""

    # What it uses of the server (the counts are made in its `__init__`).
    config: ServerConfig
    trusted_proxies: AddressSet
    sessions: set[SessionRunner]
    pending: set[SessionRunner]
    pending_per_address: Counter[str]
    per_address: Counter[str]
    _counted: dict[SessionRunner, str | None]
    _uncounted: set[SessionRunner]
    _draining: bool

    def client_address(self, ws: WebSocket) -> str:
        """The client's address: the socket's peer, or behind a trusted proxy the
        client its `X-Forwarded-For` names (`live.access.addresses`)."""
        return self._client(ws)[0]

    def _client(self, ws: WebSocket) -> tuple[str, bool]:
        return self._forwarded(peer_address(ws), getattr(ws, "request", None))

    def _forwarded(self, peer: str, request: Request | None) -> tuple[str, bool]:
        """The client's address (`live.addresses.forwarded_client`): from a
        trusted proxy, the client its `X-Forwarded-For` names; without the
        header, or from any other peer, the peer itself."""
        forwarded = request.headers.get_all("X-Forwarded-For") if request is not None else []
        return forwarded_client(peer, forwarded, self.trusted_proxies)

    def _key(self, session: SessionRunner) -> str:
        """The address a socket counts under in the per-address limits."""
        ws = session.ws
        return address_key(self.client_address(ws)) if ws is not None else "?"

    def _count(self, session: SessionRunner) -> None:
        """Count a socket against the limits: in all, pending, and per address."""
        key = self._key(session)
        self.sessions.add(session)
        self.pending.add(session)
        self._counted[session] = key
        self.per_address[key] += 1
        self.pending_per_address[key] += 1

    def not_pending(self, session: SessionRunner) -> None:
        """A socket's opening was read (or it ended): it waits no more."""
        if session not in self.pending:
            return
        self.pending.discard(session)
        key = self._counted.get(session)
        if key is not None:
            _decrement(self.pending_per_address, key)

    def _release(self, session: SessionRunner) -> None:
        """Stop counting a socket's session; once, whoever asks first."""
        self.not_pending(session)
        self.sessions.discard(session)
        if session not in self._counted:
            return
        key = self._counted.pop(session)
        if session in self._uncounted:
            self._uncounted.discard(session)
        elif key is not None:
            _decrement(self.per_address, key)

    def token_admitted(self, session: SessionRunner) -> None:
        """A session opened with a signed token no longer counts against its
        client's address: the token, minted by the operator's backend for one
        session (or a few), is its limit. A server-side app (a bot server
        reaching the Live API endpoint for its callers) opens many sessions
        from one address."""
        key = self._counted.get(session)
        if key is None:
            return
        self._counted[session] = None
        _decrement(self.per_address, key)

    def vouched(self, session: SessionRunner) -> None:
        """A socket its door authorized as a carrier's stream for a real call:
        it stops counting against its address (a carrier's media server
        brings every call on it from the same few addresses)."""
        key = self._counted.get(session)
        if key is None or session in self._uncounted:
            return
        self._uncounted.add(session)
        _decrement(self.per_address, key)

    def _admission(self, session: SessionRunner) -> ErrorEvent | None:
        """Why a new socket may not wait for `session.start`, if it may not."""
        config = self.config
        if self._draining:
            return ErrorEvent(
                "server_draining",
                "this server is stopping and takes no new sessions; try again (another server will)",
                True,
            )
        if len(self.sessions) >= config.max_sessions:
            return ErrorEvent(
                "capacity",
                f"the server is at its limit of {config.max_sessions} sessions; try again later",
                True,
            )
        if len(self.pending) >= config.max_pending:
            return ErrorEvent(
                "pending_limit",
                f"{config.max_pending} sockets are already waiting to start a session; "
                "try again later",
                True,
            )
        key = self._key(session)
        if self.pending_per_address[key] >= config.max_pending_per_ip:
            return ErrorEvent(
                "pending_limit",
                f"your address already has {config.max_pending_per_ip} sockets waiting to start "
                "a session (the server's limit per address); start one and try again",
                True,
            )
        if self.per_address[key] >= config.max_sessions_per_ip:
            return ErrorEvent(
                "address_limit",
                f"your address already has {config.max_sessions_per_ip} sessions open "
                "(the server's limit per address); close one and try again",
                True,
            )
        return None

    def _unnamed_hint(self, session: SessionRunner) -> str:
        """For the log: a socket from a trusted proxy that named no client
        counts as the proxy's own address, with every other such client."""
        ws = session.ws
        if ws is None:
            return ""
        client, via_proxy = self._client(ws)
        if not via_proxy or client != peer_address(ws):
            return ""
        return (
            f" ({client} is a trusted proxy's address and the socket named no client: if it is a "
            "proxy, it must set X-Forwarded-For, or all its clients count as one)"
        )


def _decrement(counter: Counter[str], key: str) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]
