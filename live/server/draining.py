"""Stopping the port's sessions well: handed to the fleet, phone calls let end.

`LiveServer` (`live.server.port`) drains through this mixin when it stops:
sessions that can move are handed to another server of the fleet; phone calls
cannot move, so no new call is taken (`call_refusal`, asked by the carriers'
webhooks), the calls on this server go on for a while, and then the agent says
goodbye to each caller still on before the call is hung up.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from live.server.config import ServerConfig
    from live.server.runner import SessionRunner

__all__ = ["GOODBYE_INSTRUCTION", "Draining"]

log = logging.getLogger("live.server")

# What the agent is told when its server stops with a call still on.
GOODBYE_INSTRUCTION = (
    "[This call has to end now: the service is restarting. Tell the caller, in one short sentence, "
    "that you have to go and that they can call back, and say goodbye.]"
)


class Draining:
    """The port's draining (a mixin of `LiveServer`)."""

    # What it uses of the server.
    config: ServerConfig
    sessions: set[SessionRunner]
    live_sessions: dict[str, SessionRunner]
    _draining: bool

    if TYPE_CHECKING:

        @property
        def stopping(self) -> bool: ...

    async def drain(self) -> None:
        """Stop taking sessions and hand every session to the fleet (or end it)."""
        self._draining = True
        timeout = self.config.drain_timeout
        async with anyio.create_task_group() as tg:
            for session in list(self.live_sessions.values()):
                tg.start_soon(session.hand_to_fleet, timeout)

    def call_refusal(self) -> str | None:
        """None while a new phone call would be taken, else why not: `draining`
        (the server is stopping) or `full`. Asked by the carriers' webhooks, so
        a caller hears a sentence (or a busy tone) rather than a stream refused."""
        if self._draining or self.stopping:
            return "draining"
        if len(self.sessions) >= self.config.max_sessions:
            return "full"
        return None

    async def drain_calls(self) -> None:
        """Stopping: phone calls cannot move to another server, and ending one
        hangs up on a person. No new session is taken; the calls on this
        server go on until they end, for `call_drain_timeout` at most; then
        the agent says goodbye to each caller still on (`goodbye_timeout` at
        most), and the call is hung up."""
        self._draining = True
        config = self.config
        calls = [s for s in self.sessions if s.door.capabilities.call and s.core is not None and s.end_reason is None]
        if not calls:
            return
        log.info("stopping: %d call(s) go on for up to %g s before a goodbye", len(calls), config.call_drain_timeout)
        with anyio.move_on_after(config.call_drain_timeout):
            while any(s in self.sessions for s in calls):
                await anyio.sleep(0.1)
        still = [s for s in calls if s in self.sessions and s.end_reason is None]
        if still:
            log.info("stopping: saying goodbye on %d call(s)", len(still))
        async with anyio.create_task_group() as tg:
            for session in still:
                tg.start_soon(session.say_goodbye, GOODBYE_INSTRUCTION, config.goodbye_timeout)
