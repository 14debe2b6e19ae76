"""A session's part in a fleet: the facts it leaves, and how it is handed on or taken over.

`SessionRunner` (`live.server.runner`) keeps, through this mixin, what another
server of the fleet (`live.fleet`) needs to carry the session on
(`durable_state`), writes it through when it changes, becomes a session taken
over from the store (`_adopt`), and, when its server drains or loses its lease,
leaves the session to another server (or parks it while its client is away).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
from google.genai import types

from live.observe.logs import current_session
from live.protocol import DEFAULT_INPUT_RATE, SessionGoAway, SessionResume, SessionStart
from live.protocol.closes import CLOSE_SERVICE_RESTART
from live.server.model_link import stored_client_config

if TYPE_CHECKING:
    from live.doors.base import FrontDoor
    from live.engine.session import SessionCore
    from live.observe.watch import SessionObserver
    from live.protocol import ErrorEvent
    from live.server.attachment import ClientAttachment
    from live.server.model_link import ModelLink

__all__ = ["FleetHandover"]


class FleetHandover:
    """The runner's side of the fleet (a mixin of `SessionRunner`)."""

    # What it uses of the runner.
    id: str
    server: Any  # the SessionServer (`live.server.runner`)
    model: str
    door: FrontDoor
    core: SessionCore
    client: ClientAttachment
    link: ModelLink
    obs: SessionObserver
    turn_taking: str
    client_config: types.LiveConnectConfig | None
    adopted: dict[str, Any] | None
    ends_at: float | None
    to_fleet: bool
    parked: bool

    if TYPE_CHECKING:

        def finish(self, reason: str, close_code: int = ..., error: ErrorEvent | None = None) -> None: ...
        def shutdown(self) -> None: ...

    def durable_state(self) -> dict[str, Any]:
        """What another server of the fleet needs to carry this session on."""
        core = self.core
        return {
            "agent": self.server.agent.name,
            "model": self.model,
            "input_rate": int(core.input_mime.rsplit("=", 1)[1]) if core else 16000,
            "turn_taking": self.turn_taking,
            "resume_digest": self.client.resume_digest,
            "principal": self.client.principal,
            "last_seq": self.client.replay.last_seq,
            "ends_at": self.ends_at,
            "client_config": (
                self.client_config.model_dump(mode="json", exclude_none=True) if self.client_config is not None else None
            ),
            "core": core.snapshot() if core is not None else {},
            # Where its model connection is: its handle resumes only there.
            "backend": self.link.target.name if self.link.target is not None else None,
            "backend_model": self.link.target.model if self.link.target is not None else None,
        }

    def facts_changed(self) -> None:
        """What a takeover needs changed (a handle, a call, a result, a turn sent):
        the fleet writes it through now rather than at the next heartbeat."""
        fleet = self.server.fleet
        if fleet is not None and self.core is not None and self.id in self.server.live_sessions:
            fleet.changed(self.id)

    def leave_parked(self, reason: str) -> None:
        """The client left and may come back later than the session waits with
        its model connection open: end it here, its facts kept (`park`)."""
        self.parked = bool(self.door.kept_after_leaving) and self.door.resumable() and self.core is not None
        self.finish(reason)

    def let_go_to_fleet(self, reason: str) -> None:
        """Stop serving the session here, its facts left to the fleet: its
        client is told to reattach (1012), and reaches whoever carries it on."""
        self.to_fleet = True
        self.finish(reason, CLOSE_SERVICE_RESTART)

    def _adopt(self, message: SessionResume, state: dict[str, Any]) -> SessionStart:
        """Become the session `state` describes, on this server, for this socket."""
        self.id = message.session_id
        current_session.set(self.id)
        self.adopted = state
        ends_at = state.get("ends_at")
        self.ends_at = float(ends_at) if isinstance(ends_at, (int, float)) else None
        self.client.resume_digest = state.get("resume_digest")
        principal = state.get("principal")
        self.client.principal = principal if isinstance(principal, str) else None
        self.client.replay.last_seq = message.last_seq
        client_config = state.get("client_config")
        return SessionStart(
            input_rate=int(state.get("input_rate") or DEFAULT_INPUT_RATE),
            turn_taking=str(state.get("turn_taking") or "auto"),
            # What the app's own setup asked of the model (its door reads one).
            config=stored_client_config(client_config, self.id),
        )

    async def hand_to_fleet(self, time_left: float) -> None:
        """Draining: at the next safe point (or after `time_left`), leave the
        session to another server of the fleet, with its newest facts stored."""
        core = self.core
        fleet = self.server.fleet
        if core is None or fleet is None:
            self.shutdown()
            return
        async with self.client.send_lock:  # in order with the stream, and sent before the end
            self.obs.event(SessionGoAway(time_left))
            await self.client.send_frames(self.door.going_away(time_left))
        with anyio.move_on_after(time_left):
            while not core.at_safe_point:
                await anyio.sleep(0.05)
        kept = self.door.kept_after_leaving if self.door.resumable() else None
        if kept:  # its client may come back for as long: kept that long in the store
            await self.server.park(self, kept)
        else:
            await fleet.save(self.id, self.durable_state())
        self.to_fleet = True
        self.finish("handed to another server of the fleet (this one is stopping)")
