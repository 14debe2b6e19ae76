"""A session's client input: the frames its door reads, and the audio on its hot path.

`SessionRunner` (`live.server.runner`) reads its client's frames through this
mixin: a frame's inputs as the door reads them, audio straight to the model
connection when it takes it without waiting (else into the upstream queue),
everything else to the session core; and the client is told when its input was
dropped (audio or images the model does not keep up with, an image too large).
A mixin, not a helper object: the reader pumps call `take_now` and
`client_audio` on every audio frame, and they stay plain methods of the runner.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from live.doors.base import PlayedOut, SessionTask
from live.protocol import AudioEnd, ErrorEvent, ProtocolError, ServerEvent, encode
from live.protocol.closes import CLOSE_POLICY

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from live.doors.base import FrontDoor
    from live.engine.session import SessionCore
    from live.engine.turns.controller import TurnAction, TurnController
    from live.observe.record import SessionRecord
    from live.observe.watch import SessionObserver
    from live.server.config import ServerConfig
    from live.server.model_link import Connection
    from live.server.policies import SessionPolicies
    from live.server.queues import UpstreamQueue

__all__ = ["ClientInput"]

log = logging.getLogger("live.server")


class ClientInput:
    """The runner's reading of its client's frames (a mixin of `SessionRunner`)."""

    # What it uses of the runner.
    id: str
    config: ServerConfig
    clock: Callable[[], float]
    door: FrontDoor
    core: SessionCore
    upstream: UpstreamQueue[Any]
    obs: SessionObserver
    record: SessionRecord | None
    policies: SessionPolicies
    turns: TurnController | None
    tg: TaskGroup
    hears: Callable[[bytes], bool] | None
    frame_limit: int
    image_limit: int
    audio_frames_in: int
    _reported_drops: int

    if TYPE_CHECKING:

        def finish(self, reason: str, close_code: int = ..., error: ErrorEvent | None = None) -> None: ...
        def event(self, event: ServerEvent) -> None: ...
        def poke(self) -> None: ...
        async def apply(self, actions: list[Any]) -> None: ...
        def _played_out(self) -> None: ...
        async def _door_task(self, task: SessionTask) -> None: ...
        def _carry_turns(self, actions: list[TurnAction]) -> None: ...

    def client_audio(self, frame: bytes, *, behind: bool) -> None:
        """One audio frame from the client: to the model at once when its
        connection takes it without waiting, else into the upstream queue.

        At once only when the sender waits on an empty queue (nothing is ahead
        of this frame) and the reader is not `behind` (frames piled up behind
        this one are queued, so the sender joins them into one message).
        """
        if self.record is not None:
            self.record.client_audio(frame)
        if not frame:
            return
        turns = self.turns
        if turns is not None and not len(frame) & 1:
            self.audio_frames_in += 1
            if not self.hears_now(frame):
                return
            if not turns.audio(frame):
                return  # outside the user's turn: the detector hears it, the model does not
            blob = self.core.client_audio(frame)
        else:
            try:
                blob = self.core.client_audio(frame)
            except ProtocolError as exc:
                self.event(ErrorEvent(exc.code, exc.message))
                return
            self.audio_frames_in += 1
            if not self.hears_now(frame):
                return
        upstream = self.upstream
        link = cast("Connection | None", upstream.waiting_consumer)
        if link is not None and not behind and not link.muted and link.conn.send_realtime_nowait(blob):
            return
        if upstream.put_audio(blob, len(frame)):
            if upstream.holding:
                self.obs.audio_dropped_while_held()  # reported when the hold ends
            else:
                self.obs.audio_overflow()
                self._report_drops()

    def hears_now(self, frame: bytes) -> bool:
        """The agent listens now (False in a listening window's muted part)."""
        hears = self.hears
        return hears is None or hears(frame)

    async def client_frame(self, frame: str | bytes, *, behind: bool, inputs: list | None = None) -> None:
        """A frame the door reads (every text frame; binary ones too for a door
        that does not take audio as is); `inputs`: what the door already read
        of it (`read_frame`, in the socket's callback)."""
        if inputs is None:
            inputs = self.read_frame(frame)
            if inputs is None or self.take_now(inputs, behind=behind):
                return
        native = self.door.capabilities.raw_audio
        news = False  # audio alone changes nothing the model link's supervisor watches
        for item in inputs:
            if type(item) is bytes:
                self.client_audio(item, behind=behind)
                continue
            news = True
            if type(item) is PlayedOut:
                self._played_out()
                continue
            if type(item) is SessionTask:
                self.tg.start_soon(self._door_task, item)
                continue
            if not native and self.record is not None:
                self.record.client_text(encode(item))
            if self.policies.defers(item):
                continue  # typed while a must-hear segment plays: it waits (or, muted, is dropped)
            if self.turns is not None and isinstance(item, AudioEnd):
                self._carry_turns(self.turns.audio_ended())
            await self.apply(self.core.client_message(item, self.clock()))
        if news:
            self.poke()

    def read_frame(self, frame: str | bytes) -> list | None:
        """What the door reads in a frame, or None when it could not be read
        (the client is told, or the session ends for a fatal error). No waiting."""
        if self.door.capabilities.raw_audio and self.record is not None and isinstance(frame, str):
            self.record.client_text(frame)
        try:
            return list(self.door.inputs(frame))
        except ProtocolError as exc:
            error = ErrorEvent(exc.code, exc.message, exc.fatal)
            if exc.fatal:
                self.finish(exc.message, CLOSE_POLICY, error)
            else:
                self.event(error)
        except (ValueError, TypeError, AttributeError, KeyError, IndexError) as exc:
            # A frame of a shape the door did not foresee: bad input, not a
            # broken session (the door's own checks name what they refuse).
            log.info("session %s: a frame the %s door could not read (%s)", self.id, self.door.name, type(exc).__name__)
            self.event(ErrorEvent("invalid_frame", "a frame this session could not read was dropped"))
        return None

    def take_now(self, inputs: list, *, behind: bool = False) -> bool:
        """A frame's inputs when they are audio alone (or a door's report that
        the client played out): done now, with nothing to wait for; False
        (nothing done) when one needs `client_frame`."""
        for item in inputs:
            kind = type(item)
            if kind is not bytes and kind is not PlayedOut:
                return False
        for item in inputs:
            if type(item) is bytes:
                self.client_audio(item, behind=behind)
            else:
                self._played_out()
        return True

    def _report_drops(self) -> None:
        dropped = self.upstream.dropped_audio
        # The first drop, then every 50th: the client learns without being flooded.
        if dropped == 1 or dropped - self._reported_drops >= 50:
            self._reported_drops = dropped
            self.event(
                ErrorEvent(
                    "audio_overflow",
                    f"the model is not keeping up: {dropped} audio frame(s) dropped so far "
                    "(the oldest waiting audio is dropped first)",
                )
            )

    def image_too_large(self, message_size: int) -> ErrorEvent:
        config = self.config
        return ErrorEvent(
            "image_too_large",
            f"an image message of {message_size} bytes exceeds the {self.frame_limit}-byte "
            f"frame limit (images up to {self.image_limit} bytes fit); the frame was "
            "dropped (send a smaller or more compressed image, e.g. 768 px on the long side)",
        )

    def _report_image_drops(self) -> None:
        dropped = self.upstream.dropped_images
        if dropped == 1 or dropped % 10 == 0:
            self.event(
                ErrorEvent(
                    "image_overflow",
                    f"the model is not keeping up: {dropped} image(s) dropped so far "
                    "(a newer image replaces an older one still waiting)",
                )
            )
