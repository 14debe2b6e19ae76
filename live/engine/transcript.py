"""The conversation as the session itself heard it: what a fresh connection is seeded with.

A model connection resumed from a handle continues from the service's own
state. When there is no usable handle (the connection dropped before the
first one, or the service no longer knows it), the session opens a fresh
connection and seeds it with this transcript: the user's words (typed, or as
transcribed), the model's (as transcribed or written), the tools it called and
what they returned, in order. A turn still owed an answer is last, so the model
answers it.

Bounded: at most `max_chars` of text; beyond it the oldest entries go first
(a long conversation loses its beginning, never its end). No I/O.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Sequence
from typing import Any

from google.genai import types

__all__ = ["Transcript"]

# 32 K characters: about 8 K tokens, some minutes of conversation.
MAX_CHARS = 32_000


class Transcript:
    """Entries of (role, text), oldest first; consecutive ones of a role join in a turn."""

    def __init__(self, max_chars: int = MAX_CHARS) -> None:
        self.max_chars = max_chars
        self._entries: collections.deque[tuple[str, str]] = collections.deque()
        self._chars = 0

    def __len__(self) -> int:
        return len(self._entries)

    def seed(self, history: Sequence[types.Content]) -> None:
        """The history the session started with (its text; audio cannot be history)."""
        for content in history:
            text = "".join(part.text or "" for part in content.parts or () if not part.thought)
            self._add("model" if content.role == "model" else "user", text)

    def user(self, text: str) -> None:
        """What the user typed, or said (its final transcript)."""
        self._add("user", text)

    def model(self, text: str) -> None:
        """What the model said (its final transcript) or wrote."""
        self._add("model", text)

    def model_tail(self, text: str) -> None:
        """The tail of what the model said last (its transcript came late)."""
        if self._entries and self._entries[-1][0] == "model" and text.strip():
            role, said = self._entries.pop()
            self._chars -= len(said)
            self._add(role, said + text)
        else:
            self.model(text)

    def call(self, name: str, args: dict[str, Any]) -> None:
        self._add("model", f"[called {name}({_json(args)})]")

    def result(self, name: str, args: dict[str, Any], response: dict[str, Any]) -> None:
        """A tool's result as the model was told it (told to the model as the user's input)."""
        self._add("user", f"[{name}({_json(args)}) returned {_json(response)}]")

    @property
    def last_role(self) -> str | None:
        return self._entries[-1][0] if self._entries else None

    def contents(self) -> list[types.Content]:
        """The conversation as history: one content per turn, roles alternating."""
        turns: list[types.Content] = []
        role: str | None = None
        texts: list[str] = []
        for entry_role, text in self._entries:
            if entry_role != role and texts:
                turns.append(_turn(role, texts))
                texts = []
            role = entry_role
            texts.append(text)
        if texts:
            turns.append(_turn(role, texts))
        return turns

    def snapshot(self) -> list[list[str]]:
        """The entries, JSON-able (for a fleet's stored facts)."""
        return [[role, text] for role, text in self._entries]

    def restore(self, entries: list[list[str]]) -> None:
        for role, text in entries:
            self._add(role, text)

    def _add(self, role: str, text: str) -> None:
        text = text.strip()
        if not text:
            return
        if len(text) > self.max_chars:
            text = text[-self.max_chars :]
        self._entries.append((role, text))
        self._chars += len(text)
        while self._chars > self.max_chars:
            _, old = self._entries.popleft()
            self._chars -= len(old)


def _turn(role: str | None, texts: list[str]) -> types.Content:
    return types.Content(role=role or "user", parts=[types.Part(text="\n".join(texts))])


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":"))
