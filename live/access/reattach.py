"""What a session keeps so that a client whose socket dropped can come back.

Every frame the server sends on a session's stream has a sequence number: JSON
events carry it as `seq` (the first key of the object), and each binary audio
frame counts one more. A client that reattaches (`session.resume`) says the
last number it received; the session replays what it kept after that.

`ReplayBuffer` keeps the newest frames within two bounds, and says what happens
at them: over `max_audio_bytes` of reply audio the oldest audio frame is dropped
first (a late reply is worth less than a lost event), then over `max_events`
the oldest event. A replay reports how many frames after the client's number
were no longer kept (`missed`). No I/O here.

The resume token is a credential for one session: 256 random bits, compared in
constant time against its SHA-256 digest, which is all a server keeps (or
stores in a shared store).
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import secrets

__all__ = ["ReplayBuffer", "new_resume_token", "token_digest", "token_matches", "with_seq"]


def new_resume_token() -> str:
    return secrets.token_urlsafe(32)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_matches(token: str, digest: str) -> bool:
    """Whether `token` is the one `digest` was made of (text that is not
    UTF-8, such as a lone surrogate a JSON frame can spell, is no token)."""
    try:
        return hmac.compare_digest(token_digest(token), digest)
    except UnicodeEncodeError:
        return False


def with_seq(frame: str, seq: int) -> str:
    """A JSON event frame with its sequence number as the first key."""
    return f'{{"seq":{seq},{frame[1:]}'


class ReplayBuffer:
    """The newest frames of a session's stream, numbered, within bounds."""

    def __init__(self, *, max_audio_bytes: int = 480_000, max_events: int = 512) -> None:
        self._frames: collections.deque[tuple[int, str | bytes]] = collections.deque()
        self._audio_bytes = 0
        self._events = 0
        self.max_audio_bytes = max_audio_bytes
        self.max_events = max_events
        self.last_seq = 0
        self.dropped = 0

    def add(self, frame: str | bytes) -> int:
        """Keep the next frame of the stream; returns its sequence number."""
        self.last_seq += 1
        self._frames.append((self.last_seq, frame))
        if type(frame) is bytes:
            self._audio_bytes += len(frame)
            if self._audio_bytes > self.max_audio_bytes:
                self._drop_oldest(audio=True)
        else:
            self._events += 1
            if self._events > self.max_events:
                self._drop_oldest(audio=False)
        return self.last_seq

    def after(self, last_seq: int) -> tuple[list[str | bytes], int]:
        """The kept frames numbered after `last_seq`, and how many are missing."""
        frames = [frame for seq, frame in self._frames if seq > last_seq]
        wanted = max(0, self.last_seq - last_seq)
        return frames, wanted - len(frames)

    def _drop_oldest(self, *, audio: bool) -> None:
        for index, (_, frame) in enumerate(self._frames):
            if (type(frame) is bytes) == audio:
                del self._frames[index]
                self.dropped += 1
                if audio:
                    self._audio_bytes -= len(frame)
                else:
                    self._events -= 1
                return
