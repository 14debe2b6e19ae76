"""Where a `session.resume` goes: the session here, on another server, parked, or in the store.

`LiveServer` (`live.server.port`) answers, through this mixin, a socket that
asks to take over a live session: it attaches the socket to the session this
server carries, relays it to the server of the fleet that holds it, takes the
session over from the fleet's store when its holder is gone, or carries on a
parked one; and it hears from the fleet which of its sessions another server
holds now.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import TYPE_CHECKING, Any

import anyio
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from live.access.reattach import token_matches
from live.fleet.store import StoreError
from live.protocol import ErrorEvent, SessionResume, encode
from live.protocol.closes import (
    CLOSE_GOING_AWAY,
    CLOSE_NORMAL,
    CLOSE_POLICY,
    CLOSE_SERVICE_RESTART,
    CLOSE_TRY_LATER,
)
from live.server.attachment import bearer_token
from live.server.parking import ParkedSessions, park

if TYPE_CHECKING:
    from live.agent import Agent
    from live.fleet.member import Fleet
    from live.net.websocket import WebSocket
    from live.server.runner import SessionRunner

__all__ = ["SessionResumes"]

log = logging.getLogger("live.server")


class SessionResumes:
    """The port's resumes and the fleet's word on its sessions (a mixin of `LiveServer`)."""

    # What it uses of the server.
    agent: Agent
    fleet: Fleet | None
    live_sessions: dict[str, SessionRunner]
    parked: ParkedSessions

    if TYPE_CHECKING:

        @property
        def stopping(self) -> bool: ...
        def client_address(self, ws: WebSocket) -> str: ...
        def _release(self, session: SessionRunner) -> None: ...

    async def reattach(
        self, temporary: SessionRunner, message: SessionResume
    ) -> dict[str, Any] | None:
        """A socket asks to take over a live session: attach it here, relay it to
        the server of the fleet that holds it, or (its holder gone) return the
        session's stored facts for `temporary` to carry it on. None: handled.

        Authorized like a start when the server requires tokens (a valid token,
        for the subject that opened the session); the resume token works once:
        a new one goes with `session.reattached`."""
        ws = temporary.ws
        assert ws is not None
        refusal = await temporary.client.authorize(message.token, spend=False)
        if refusal is not None:
            log.warning(
                "resume of session %s refused from %s: unauthorized: %s",
                message.session_id[:40], temporary.peer, refusal,
            )
            temporary.finish(refusal, CLOSE_POLICY, ErrorEvent("unauthorized", refusal, True))
            return None
        session = self.live_sessions.get(message.session_id)
        if session is not None and session.end_reason is None and session.resume_digest:
            await self._reattach_here(temporary, message, session)
            return None
        if self.fleet is not None and not self.stopping:
            return await self._reattach_in_fleet(temporary, message)
        state = self.parked.get(message.session_id)
        if state is not None and not self.stopping:
            if not token_matches(message.resume_token, str(state.get("resume_digest") or "")) or not _same_principal(
                state.get("principal"), temporary.client.principal
            ):
                self._resume_unauthorized(temporary, message)
                return None
            self.parked.discard(message.session_id)
            return state
        self._resume_expired(temporary, message)
        return None

    async def _reattach_here(self, temporary: SessionRunner, message: SessionResume, session: SessionRunner) -> None:
        """Attach the socket to a session this server carries, with a new resume token."""
        ws = temporary.ws
        assert ws is not None
        if not token_matches(message.resume_token, session.resume_digest or "") or not _same_principal(
            session.client.principal, temporary.client.principal
        ):
            self._resume_unauthorized(temporary, message)
            return
        # Rotated before anything awaits: a second socket with the same token loses.
        resume_token = session.client.new_resume_token()
        fleet = self.fleet
        if fleet is not None and session.core is not None:
            # The new token's digest is in the store before the client holds the
            # token: if this server dies the moment after, the server taking the
            # session over accepts the new token, and the spent one nowhere.
            await fleet.save(session.id, session.durable_state())
            if session.end_reason is not None:  # it ended meanwhile
                self._resume_expired(temporary, message)
                return
        temporary.handed_off = True
        self._release(temporary)  # the conversation is counted once, as it was
        await session.client.attach(ws, message.last_seq, resume_token)
        await session.client.serve_socket(ws)

    async def park(self, session: SessionRunner, seconds: float) -> None:
        """Keep a session whose client left and may come back within `seconds`
        (`live.server.parking`): in the fleet's store, or here."""
        await park(session, seconds, self.fleet, self.parked)

    async def _reattach_in_fleet(
        self, temporary: SessionRunner, message: SessionResume
    ) -> dict[str, Any] | None:
        """Find the session in the fleet, waiting (for at most a lease and a beat)
        through what is only a moment: a holder that died but whose lease has not
        run out yet, a holder re-establishing its facts after Redis came back
        empty, Redis itself unreachable."""
        fleet = self.fleet
        assert fleet is not None
        ws = temporary.ws
        assert ws is not None
        session_id = message.session_id
        deadline = anyio.current_time() + fleet.lease_seconds * 4 / 3 + 0.5
        store_down = False
        while True:
            unreachable = False
            session = self.live_sessions.get(session_id)
            if session is not None and session.end_reason is None and session.resume_digest:
                # It was being taken over here (by another socket with the same
                # resume token): the token that took it over is spent now.
                await self._reattach_here(temporary, message, session)
                return None
            try:
                holder, address, state = await fleet.locate(session_id)
                store_down = False
            except StoreError:
                holder = address = state = None
                store_down = True
            if address is not None:
                temporary.handed_off = True
                if message.token is None:
                    # The holder checks the token again; one sent on this handshake
                    # would not reach it otherwise.
                    message = dataclasses.replace(message, token=bearer_token(ws))
                if await self._relay(ws, address, message):
                    return None
                temporary.handed_off = False  # the holder is gone: wait for its lease
                unreachable = True
            elif holder is None and state is not None:
                digest = state.get("resume_digest")
                if (
                    not digest
                    or not token_matches(message.resume_token, digest)
                    or not _same_principal(state.get("principal"), temporary.client.principal)
                ):
                    self._resume_unauthorized(temporary, message)
                    return None
                if state.get("agent") != self.agent.name:
                    break
                if await fleet.take_over(session_id):
                    return state
            if anyio.current_time() >= deadline:
                break
            pause = 0.1
            if unreachable:
                # Wake as its lease runs out, not up to a poll later: the takeover
                # is what the client waits for.
                with contextlib.suppress(StoreError):
                    pause = min(pause, await fleet.lease_left(session_id) + 0.005)
            await anyio.sleep(pause)
        if store_down:
            text = "the servers cannot reach their shared store now: reattach again shortly"
            log.info("resume of %s from %s deferred: store unavailable", session_id[:40], temporary.peer)
            temporary.finish(text, CLOSE_TRY_LATER, ErrorEvent("store_unavailable", text))
            return None
        self._resume_expired(temporary, message)
        return None

    def _resume_expired(self, temporary: SessionRunner, message: SessionResume) -> None:
        text = (
            f"no session {message.session_id[:40]!r} to resume here: it ended, or the "
            "client stayed away longer than the server waits"
        )
        log.info("resume refused from %s: session_expired", temporary.peer)
        temporary.finish(text, CLOSE_NORMAL, ErrorEvent("session_expired", text, True))

    def _resume_unauthorized(self, temporary: SessionRunner, message: SessionResume) -> None:
        text = "session.resume: the resume token (or the token's subject) does not match this session"
        log.warning(
            "resume of session %s refused from %s: wrong token",
            message.session_id[:40], temporary.peer,
        )
        temporary.finish(text, CLOSE_POLICY, ErrorEvent("unauthorized", text, True))

    async def _relay(self, ws: WebSocket, address: str, message: SessionResume) -> bool:
        """Carry a client's socket to the server of the fleet that holds its session.

        False when that server cannot be reached (it died, its lease is still
        running): the socket is untouched, and the caller may wait to take over.
        """
        log.info("relaying a resume of session %s to %s", message.session_id[:40], address)
        try:
            # The client's address goes along: a holder that trusts this server
            # (--forwarded-allow-ips) counts the socket against the client, not us.
            headers = {"X-Forwarded-For": self.client_address(ws)}
            upstream = await ws_connect(
                address, max_size=None, compression=None, open_timeout=2, additional_headers=headers
            )
        except (OSError, TimeoutError, InvalidHandshake) as exc:
            log.info("relay to %s failed: %s", address, exc)
            return False
        # How the client left is how the holder hears it left: a goodbye (1000)
        # ends the session there, a drop keeps its reattach grace.
        client_close = CLOSE_GOING_AWAY
        try:
            await upstream.send(encode(message))

            async def pump(source: Any, sink: Any) -> None:
                nonlocal client_close
                try:
                    async for frame in source:
                        await sink.send(frame)
                except ConnectionClosed as closed:
                    if source is ws and closed.rcvd is not None and closed.rcvd.code == CLOSE_NORMAL:
                        client_close = CLOSE_NORMAL
                else:
                    if source is ws and getattr(ws, "close_code", None) == CLOSE_NORMAL:
                        client_close = CLOSE_NORMAL
                tg.cancel_scope.cancel()

            async with anyio.create_task_group() as tg:
                tg.start_soon(pump, ws, upstream)
                tg.start_soon(pump, upstream, ws)
        except (OSError, ConnectionClosed) as exc:
            log.warning("relay to %s broke: %s", address, exc)
        finally:
            with anyio.CancelScope(shield=True):
                await upstream.close(client_close)
        with contextlib.suppress(ConnectionClosed):
            await ws.close(CLOSE_SERVICE_RESTART, "reattach again")
        return True

    def _durable_state(self, session_id: str) -> dict[str, Any] | None:
        """The facts of a session another server could carry on (one whose client
        can reattach); None for the others, which hold only a lease and a slot."""
        session = self.live_sessions.get(session_id)
        return None if session is None or session.core is None else session.durable_state()

    def _lost_to_fleet(self, session_id: str) -> None:
        """Another server holds this session now: stop driving it here at once;
        its client reattaches there (its facts are that server's now)."""
        session = self.live_sessions.get(session_id)
        if session is not None:
            session.let_go_to_fleet("another server of the fleet carries this session on")

    def _unsure_in_fleet(self, session_id: str) -> None:
        """This server could not renew its leases for most of a lease: a session
        whose client is away may be taken over elsewhere, so it ends here."""
        session = self.live_sessions.get(session_id)
        if session is not None and session.client.ws is None:
            session.let_go_to_fleet("its lease could not be renewed while its client was away")


def _same_principal(session: str | None, resume: str | None) -> bool:
    """A session opened with a signed token resumes only for that token's subject."""
    return session is None or session == resume
