"""A reply's late transcript tails folded into the reply, as a client reads it.

Gemini does not order transcripts with the model's turn: the last words of a
reply may reach the client after that reply's final transcript and even after
its `turn.complete`, as `transcript.output` with `late: true`. A loop that
prints each final transcript and stops at `turn.complete` would print the
reply cut short ("You said: What's the weather in Lis").

`LateTails` sits between the socket and such a loop. It holds a reply's final
transcript until the turn is over, appends every late tail that arrives
meanwhile to it, and lets the final and `turn.complete` go once the tail has
come, or `wait` seconds after `turn.complete` when none comes, or at once when
anything else arrives (the next reply's audio, the user's words, a tool call).
Everything else passes through untouched, in order (`generation.complete`
too, at once: it tells a player the reply's audio is all there, and must not
wait for text). A tail later than that
still comes through as it was sent, `late: true`, for the client to append to
the last reply. No I/O: `feed` what arrives, call `expire` at `deadline`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Generic, TypeVar

from live.protocol import GenerationComplete, TranscriptOutput, TurnComplete, Usage

__all__ = ["LATE_TAIL_WAIT", "LateTails"]

LATE_TAIL_WAIT = 0.3
"""Seconds to wait after `turn.complete` for a reply's late tail."""

Item = TypeVar("Item")

# What may come between a reply's final transcript and the end of its turn,
# held with the final so the order stays as sent. `generation.complete` is
# not: it tells a player to play what it holds of the reply now.
_TURN_END = (Usage,)


def _reply_final(item: Any) -> bool:
    return type(item) is TranscriptOutput and item.final and not item.heard and not item.late


class LateTails(Generic[Item]):
    """Hold a reply's final transcript until its turn ended; fold its late tails in."""

    def __init__(self, wait: float = LATE_TAIL_WAIT) -> None:
        self.wait = wait
        self._held: list[Any] = []
        self._deadline: float | None = None

    @property
    def deadline(self) -> float | None:
        """When `expire` lets what is held go (None: nothing waits on a clock)."""
        return self._deadline

    def feed(self, item: Item, now: float) -> list[Item]:
        """What the client reads now, given `item` arrived at `now`."""
        held = self._held
        if not held:
            if _reply_final(item):
                held.append(item)
                return []
            return [item]
        if type(item) is TranscriptOutput and item.late:
            held[0] = dataclasses.replace(held[0], text=held[0].text + item.text)
            if self._deadline is not None:
                return self.flush()  # the tail after turn.complete came: the turn is whole
            return []
        if type(item) is GenerationComplete:
            return [item]  # the reply's audio is all there: a player must not wait for text
        if isinstance(item, _TURN_END):
            held.append(item)
            return []
        if type(item) is TurnComplete and self._deadline is None:
            held.append(item)
            self._deadline = now + self.wait
            return []
        return self.flush() + self.feed(item, now)

    def expire(self, now: float) -> list[Item]:
        """What is held, once its deadline passed (else nothing)."""
        if self._deadline is not None and now >= self._deadline:
            return self.flush()
        return []

    def flush(self) -> list[Item]:
        """Everything held, in order; nothing is held after."""
        out, self._held, self._deadline = self._held, [], None
        return out
