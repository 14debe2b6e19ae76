"""A caller's keys gathered into entries (sans-I/O): a PIN is one turn, not four.

The clock is the call's own media: carriers send a frame every 20 ms whether
the caller speaks or not, each with its `timestamp` (milliseconds since the
stream began), so a pause is measured in the audio that came meanwhile, with
no timer of the server's.
"""

from __future__ import annotations

from live.agent import KeyEntry

__all__ = ["KeyEntries", "entry_text", "key_text"]


def key_text(digit: str) -> str:
    """What the model is told of one key, when keys are not gathered."""
    return f"[The caller pressed the key {digit} on their phone's keypad.]"


def entry_text(keys: str, ended_by: str) -> str:
    """What the model is told of an entry."""
    how = {"terminator": "ending with", "pause": "then paused", "length": "the most keys one entry takes"}[ended_by]
    if ended_by == "terminator":
        return f"[The caller entered {keys} on their phone's keypad ({how} {keys[-1]}).]"
    return f"[The caller entered {keys} on their phone's keypad ({how}).]"


class KeyEntries:
    """Keys as they come (`press`), media time as it passes (`tick`): each returns
    the text of an entry when one ends, else None."""

    def __init__(self, settings: KeyEntry) -> None:
        self.settings = settings
        self._keys = ""
        self._last_key_ms = 0.0

    @property
    def pending(self) -> str:
        return self._keys

    def press(self, digit: str, now_ms: float) -> str | None:
        settings = self.settings
        if settings.pause <= 0:
            return key_text(digit)
        self._keys += digit
        self._last_key_ms = now_ms
        if digit in settings.terminators:
            return self._end("terminator")
        if len(self._keys) >= settings.max_keys:
            return self._end("length")
        return None

    def tick(self, now_ms: float) -> str | None:
        if self._keys and now_ms - self._last_key_ms >= self.settings.pause * 1000:
            return self._end("pause")
        return None

    def _end(self, how: str) -> str:
        keys, self._keys = self._keys, ""
        return entry_text(keys, how)
