"""Session resumption of an emulated Live connection: the handles it issues as
the session goes (a resumable one only when nothing more is coming, `resumable:
false` while the model generates or a call is unanswered), what resuming from
one restores, and the go-away before the connection's deadline.

The `Resumption` part of `EmulatorSession` (connections.emulator.core); it uses
the session's state and plumbing and has none of its own I/O. A handle the
service would not have issued (not of its form) is refused as malformed (1007
"Invalid session handle", field reports); one it does not know, or no longer
knows, per the profile (1008 "BidiGenerateContent session not found").
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

from live.liveapi import (
    DEADLINE_EXPIRED,
    INTERNAL,
    INVALID_HANDLE,
    INVALID_SESSION_HANDLE,
    SESSION_NOT_FOUND,
    UNAVAILABLE,
    duration_text,
)

__all__ = ["Resumption"]

# The form of the handles the emulator issues (the service's own are opaque
# tokens of letters, digits, "-" and "_"; the strictest reading refuses others).
_HANDLE = re.compile(r"[A-Za-z0-9_\-]{1,512}")


class Resumption:
    """Resumption for `EmulatorSession` (its state lives on the session)."""

    def _snapshot(self) -> dict[str, Any]:
        return {
            "history": copy.deepcopy(self._history),
            "turn": self._turn,
            "spoken_turns": self._spoken_turns,
            "model_turns": self._model_turns,
            "ctx_tokens": dict(self._ctx_tokens),
            "started": self._started,
        }

    def _restore(self, snap: Mapping[str, Any]) -> None:
        self._history = list(snap["history"])
        self._turn = snap["turn"]
        self._spoken_turns = snap["spoken_turns"]
        self._model_turns = snap["model_turns"]
        self._ctx_tokens = dict(snap["ctx_tokens"])
        self._started = snap["started"]

    def _resume(self, handle: str) -> bool:
        """Restore the conversation a handle stands for; False when the service refused it."""
        profile = self.profile
        if not _HANDLE.fullmatch(handle):
            self._close(1007, INVALID_SESSION_HANDLE)  # not a handle the service ever issues
            return False
        entry = self.shared.store.lookup(handle, self._now)
        if entry is None:
            if profile.unknown_handle_not_found:
                self._close(1008, SESSION_NOT_FOUND)
            else:
                self._close(1007, INVALID_HANDLE)
            return False
        if profile.resume_while_open_fails and entry.issuer in self.shared.open_connections:
            self._close(1011, INTERNAL)
            return False
        if self._dice.stale_handle():
            self._close(1008, SESSION_NOT_FOUND)
            return False
        if self._fault("on_resume"):
            return False
        self._restore(entry.snapshot)
        self.record.resumed_from = handle
        return True

    def _not_resumable(self) -> None:
        """The model is busy: an update without a handle says so."""
        if self._resumption:
            self._send({"sessionResumptionUpdate": {"resumable": False}})

    def _handle(self) -> None:
        """A resumable handle for the conversation so far; or, for a connection
        drawn to drop before its first handle, the drop instead."""
        if self._early is not None:
            code, self._early = self._early.code, None
            self._close(code, UNAVAILABLE if code == 1011 else None)
            return
        if not self._resumption:
            return
        handle = f"emulator-handle-{self.index}-{next(self._handle_seq)}"
        self.shared.store.put(
            handle, self._snapshot(), issuer=self._key, now=self._now, ttl=self.profile.handle_ttl
        )
        self.record.handles.append(handle)
        self._send({"sessionResumptionUpdate": {"newHandle": handle, "resumable": True}})

    def _more_coming(self) -> bool:
        """The model has more to do before it waits for the user."""
        return bool(
            self._gen is not None
            or self._tools is not None
            or self._async_calls
            or self._thinking is not None
            or self._waiting
            or self._answers
        )

    def _idle_point(self) -> None:
        """A turn completed: when nothing more is coming, the session is resumable."""
        if self._phase == "open" and not self._more_coming():
            self._handle()

    def _go_away(self) -> None:
        left = self.script.go_away_time_left
        self._send({"goAway": {"timeLeft": duration_text(left)}})
        code, reason = (1011, DEADLINE_EXPIRED) if self.profile.deadline_close_1011 else (1000, "")
        self._at(self._now + self.script.scaled(left), lambda: self._close(code, reason))

