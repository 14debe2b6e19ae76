"""What the user heard of a reply they interrupted (no I/O).

The model's output transcript comes in fragments interleaved with its audio;
the server queues both in the model's order, so each fragment has a place in
the reply's audio: the bytes queued before it. When the user barges in, the
part of the reply they heard ends where playback was: the client reports how
much of the reply it played, or else the server estimates it from what it
released to the client and how far that was ahead of real time. The heard
transcript is the reply's transcript cut at that point: whole fragments
before it, and of the fragment being spoken the share of its words that its
share of audio had reached.
"""

from __future__ import annotations

__all__ = ["BYTES_PER_SECOND", "HeardTracker", "cut_transcript"]

BYTES_PER_SECOND = 24_000 * 2  # reply audio: PCM16 mono at 24 kHz


def cut_transcript(fragments: list[tuple[int, str]], total: int, played: int) -> str:
    """The transcript heard after `played` bytes of a reply of `total` bytes.

    `fragments` are (audio bytes queued before the fragment, its text), in order.
    """
    out = []
    for index, (start, text) in enumerate(fragments):
        end = fragments[index + 1][0] if index + 1 < len(fragments) else total
        if played >= end or (played > start and end <= start):
            out.append(text)
            continue
        if played <= start:
            break
        words = text.split(" ")
        spoken = sum(1 for w in words if w)
        keep = int(spoken * (played - start) / (end - start))
        taken = []
        for word in words:
            if keep <= 0 and word:
                break
            taken.append(word)
            if word:
                keep -= 1
        out.append(" ".join(taken).rstrip())
        break
    return "".join(out)


class HeardTracker:
    """Where the current reply's transcript fragments sit in the session's reply audio.

    Positions are bytes of reply audio queued since the session began (the
    model's order); `sent` counts the bytes that left for the client.
    """

    __slots__ = ("queued", "sent", "reply_start", "fragments")

    def __init__(self) -> None:
        self.queued = 0
        self.sent = 0
        self.reply_start = 0
        self.fragments: list[tuple[int, str]] = []

    def audio_queued(self, nbytes: int) -> None:
        self.queued += nbytes

    def filler_queued(self, nbytes: int) -> None:
        """Audio of no reply (the hold sound) queued: the next reply starts after it."""
        self.queued += nbytes
        if not self.fragments:
            self.reply_start = self.queued

    def audio_sent(self, nbytes: int) -> None:
        self.sent += nbytes

    def fragment(self, text: str) -> None:
        if text:
            self.fragments.append((self.queued, text))

    def reply_ended(self) -> None:
        """The reply was complete: the next fragment starts a new one."""
        self.reply_start = self.queued
        self.fragments = []

    def interrupted(self, unplayed_seconds: float) -> InterruptedReply | None:
        """The reply the user barged in on, or None when no reply had begun.

        `unplayed_seconds` is how much of what was sent had not been played at
        real-time playback: the estimate a client's own report replaces. The
        reply's queued audio that was never sent is dropped now.
        """
        fragments = self.fragments
        sent = max(0, self.sent - self.reply_start)
        estimate = max(0, sent - int(unplayed_seconds * BYTES_PER_SECOND))
        reply = InterruptedReply(
            [(position - self.reply_start, text) for position, text in fragments],
            self.queued - self.reply_start,
            sent,
            estimate,
        )
        self.sent = max(self.sent, self.queued)
        self.reply_ended()
        return reply if fragments else None


class InterruptedReply:
    """An interrupted reply's transcript and audio, to be cut where playback was."""

    __slots__ = ("fragments", "total", "sent", "estimate")

    def __init__(self, fragments: list[tuple[int, str]], total: int, sent: int, estimate: int) -> None:
        self.fragments = fragments
        self.total = total
        self.sent = sent
        self.estimate = estimate

    def heard(self, played_seconds: float | None = None) -> tuple[str, float]:
        """The heard transcript and seconds played: the client's figure, else the estimate.

        Playback cannot have passed what was sent.
        """
        played = self.estimate if played_seconds is None else int(played_seconds * BYTES_PER_SECOND)
        played = max(0, min(played, self.sent))
        return cut_transcript(self.fragments, self.total, played), played / BYTES_PER_SECOND
