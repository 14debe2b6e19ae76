"""The server's own protocol (`docs/protocol.md`): JSON events and binary PCM frames.

The browser client and `live mic` speak it on `/live`. Binary frames are audio
both ways, as is (the session's fast lane); text frames are `live.protocol`
messages. The only door that can reattach: its events are numbered (`seq`) and
kept for a replay.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from live.doors.base import Capabilities, FrontDoor, Input, Opening
from live.protocol import (
    ErrorEvent,
    ModelSignal,
    ResumptionPoint,
    ServerEvent,
    SessionClose,
    SessionResume,
    SessionStart,
    TextEvent,
    TranscriptInput,
    TranscriptOutput,
    encode,
    parse_client_message,
)

__all__ = ["NativeDoor"]


class NativeDoor(FrontDoor):
    name = "live"
    capabilities = Capabilities(reattach=True, client_tools=True, images=True, raw_audio=True, shows_mute=True)

    def opening(self, frame: str | bytes) -> Opening | ErrorEvent:
        if isinstance(frame, bytes):
            return ErrorEvent(
                "not_started",
                'audio before session.start was dropped; send {"type": "session.start"} first',
            )
        message = parse_client_message(frame)
        if isinstance(message, (SessionStart, SessionResume, SessionClose)):
            return message
        return ErrorEvent(
            "not_started",
            f'{message.type} before session.start was ignored; send {{"type": "session.start"}} first',
        )

    def inputs(self, frame: str | bytes) -> tuple[Input]:
        # Binary frames never come here (raw_audio: the session takes them as they are).
        return (parse_client_message(frame),)

    def event(self, event: ServerEvent) -> str | None:
        if type(event) is ModelSignal or type(event) is ResumptionPoint:
            return None  # another service's own messages: not on this protocol's wire
        if type(event) is TextEvent and event.thought:
            return None
        if (type(event) is TranscriptInput or type(event) is TranscriptOutput) and (
            event.fragment is not None or event.fields is not None
        ):
            event = dataclasses.replace(event, fragment=None, fields=None)  # another service's own message: not on this wire
        return encode(event)

    def audio(self, pcm: bytes) -> Sequence[bytes]:
        return (pcm,)
