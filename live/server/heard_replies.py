"""What the user heard of a reply cut short, told to the client.

When the user barges in, `SessionRunner` (`live.server.runner`) says, through
this mixin, how much of the interrupted reply the user heard: at once from the
server's own estimate, or, for a client that reports its playback, from that
report (or the estimate, if none comes within `PLAYBACK_REPORT_WAIT`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from live.engine.heard import InterruptedReply
from live.protocol import ServerEvent, TranscriptOutput

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

__all__ = ["PLAYBACK_REPORT_WAIT", "HeardReplies"]

# How long a client that reports its playback has, after `turn.interrupted`, to say
# how much of the reply it played before the server's estimate is used instead.
PLAYBACK_REPORT_WAIT = 0.5


class HeardReplies:
    """The runner's account of interrupted replies (a mixin of `SessionRunner`)."""

    # What it uses of the runner.
    tg: TaskGroup
    reports_playback: bool
    _heard_event: TranscriptOutput | None
    _awaiting_playback: anyio.CancelScope
    _awaited_reply: InterruptedReply | None

    if TYPE_CHECKING:

        def event(self, event: ServerEvent) -> None: ...

    def _interrupted(self, reply: InterruptedReply | None) -> None:
        """A reply was cut: say what was heard of it, now or when the client reports."""
        earlier = self._awaited_reply
        if earlier is not None:  # a new barge-in before the last one was reported
            self._awaited_reply = None
            self._awaiting_playback.cancel()
            self.event(_heard_event(earlier.heard()))
        if reply is None:
            return
        if not self.reports_playback:
            self._heard_event = _heard_event(reply.heard())
            return
        scope = self._awaiting_playback = anyio.CancelScope()
        self.tg.start_soon(self._heard_by_deadline, reply, scope)

    async def _heard_by_deadline(self, reply: InterruptedReply, scope: anyio.CancelScope) -> None:
        self._awaited_reply = reply
        with scope:
            await anyio.sleep(PLAYBACK_REPORT_WAIT)
            # No report in time: the server's own estimate.
            self._awaited_reply = None
            self.event(_heard_event(reply.heard()))

    def _heard_reported(self, played: float) -> None:
        reply = self._awaited_reply
        if reply is None:
            return  # none awaited (late, or for a reply already answered for)
        self._awaited_reply = None
        self._awaiting_playback.cancel()
        self.event(_heard_event(reply.heard(played)))


def _heard_event(heard: tuple[str, float]) -> TranscriptOutput:
    return TranscriptOutput(heard[0], True, heard=True, played=round(heard[1], 3))
