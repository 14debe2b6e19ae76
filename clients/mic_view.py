"""How `live mic` prints a conversation: who speaks, transcripts as they are
spoken, tools, turn ends and errors, on a terminal or into a pipe."""

from __future__ import annotations

import io
import json
import os
from typing import Any, TextIO

from live.protocol import (
    ErrorEvent,
    ServerEvent,
    SessionClosed,
    SessionGoAway,
    SessionReconnecting,
    SessionResumed,
    TextEvent,
    ToolCallEvent,
    ToolCancelled,
    ToolResultEvent,
    TranscriptInput,
    TranscriptOutput,
    TurnComplete,
    TurnInterrupted,
)

__all__ = ["ConversationView"]


class ConversationView:
    """Prints the conversation: who speaks, transcripts, tools, turn ends, errors.

    On a terminal, transcript fragments update one line in place and each
    turn's final text is kept; elsewhere (a pipe, a log) only final lines are
    written, so the output reads as a plain transcript. Every word is printed
    once: a partial that had to be kept (a tool call or the other side came
    between) is not printed again when its final arrives, only what it lacked.
    Status lines (the gate, reconnects) go above the line being spoken and
    leave it in place. The live line is cut to the terminal's width, since
    `\r\x1b[2K` can only clear the row the cursor is on.
    """

    YOU = "you ▸ "
    AGENT = "agent ▸ "

    def __init__(self, out: TextIO, *, tty: bool | None = None, width: int | None = None) -> None:
        self.out = out
        self.tty = out.isatty() if tty is None else tty
        self._width = width  # None: ask the terminal each time (it may be resized)
        self._live: str | None = None  # the line being rewritten (tty only)
        self._partial: dict[str, str] = {"you": "", "agent": ""}
        self._shown: dict[str, str] = {"you": "", "agent": ""}  # partial text already kept
        self._active: str | None = None  # whose partial is on the live line

    # -- low level

    def _clear_live(self) -> None:
        if self._live is not None:
            self.out.write("\r\x1b[2K")
            self._live = None

    def line(self, text: str) -> None:
        """A line that stays; a transcript being spoken is kept above it."""
        self._commit_partial()
        self._write(text)

    def _write(self, text: str) -> None:
        self._clear_live()
        self.out.write(text + "\n")
        self.out.flush()

    def _columns(self) -> int:
        if self._width is not None:
            return self._width
        try:
            return os.get_terminal_size(self.out.fileno()).columns
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            return 80

    def _set_live(self, text: str) -> None:
        if not self.tty:
            return
        room = max(self._columns() - 1, 8)  # the last column would wrap on some terminals
        if len(text) > room:
            side = self._prefix(self._active or "you")
            text = side + "…" + text[len(text) - (room - len(side) - 1):]
        self.out.write("\r\x1b[2K" + text)
        self.out.flush()
        self._live = text

    def _commit_partial(self) -> None:
        """Keep the live partial line (a tool call or the other side came between).

        Only a terminal shows partials; in a pipe they wait for their final.
        """
        side = self._active
        self._active = None
        if side is None or not self.tty or not self._partial[side].strip():
            return
        self._keep(side, self._partial[side])

    def _keep(self, side: str, text: str) -> None:
        """Write `text` as a kept line, less what of it was already kept."""
        shown, whole = _normalize(self._shown[side]), _normalize(text)
        self._shown[side] = text
        if not whole or whole == shown:
            return
        if shown and whole.startswith(shown):
            self._write(self._prefix(side) + "… " + whole[len(shown):].strip())
        else:
            self._write(self._prefix(side) + whole)

    def _prefix(self, side: str) -> str:
        return self.YOU if side == "you" else self.AGENT

    # -- what the client calls

    def status(self, text: str) -> None:
        """A status line above the transcript being spoken, which stays live."""
        live = self._live
        self._write(f"· {text}")
        if live is not None and self._active is not None:
            self._set_live(self._prefix(self._active) + self._partial[self._active].strip())

    def transcript(self, side: str, text: str, final: bool) -> None:
        if not final:
            if self._active not in (None, side):
                self._commit_partial()
            self._active = side
            self._partial[side] += text
            self._set_live(self._prefix(side) + self._partial[side].strip())
            return
        if self._active == side:
            self._clear_live()
            self._active = None
        self._keep(side, text)
        self._partial[side] = ""
        self._shown[side] = ""

    def event(self, event: ServerEvent) -> None:
        if isinstance(event, TranscriptInput):
            self.transcript("you", event.text, event.final)
        elif isinstance(event, TranscriptOutput):
            if event.late:
                self.line(f"{self._prefix('agent')}… {event.text.strip()}")  # the end of the last reply
            else:
                self.transcript("agent", event.text, event.final)
        elif isinstance(event, TextEvent):
            if not event.partial:
                self.transcript("agent", event.text, True)
            else:
                self.transcript("agent", event.text, False)
        elif isinstance(event, ToolCallEvent):
            where = "" if event.runs_on == "server" else f" (runs on {event.runs_on})"
            self.line(f"⚙ {event.name}({_compact(event.args)}){where}")
        elif isinstance(event, ToolResultEvent):
            self.line(f"  ↳ {event.name}: {_compact(event.response)}")
        elif isinstance(event, ToolCancelled):
            self.line(f"  ✗ tool calls cancelled: {', '.join(event.ids)}")
        elif isinstance(event, TurnInterrupted):
            # Finals of the interrupted turn may still follow: keep the partials for them.
            self.line("— interrupted")
        elif isinstance(event, TurnComplete):
            self._flush_partials()
            self.line("— turn complete" + (f" ({event.reason})" if event.reason else ""))
        elif isinstance(event, ErrorEvent):
            self.line(f"! {event.code}: {event.message}")
        elif isinstance(event, SessionGoAway):
            pass  # the server reconnects on its own; the reconnect events say so
        elif isinstance(event, SessionReconnecting):
            self.status(f"reconnecting to the model ({event.reason})")
        elif isinstance(event, SessionResumed):
            self.status("reconnected")
        elif isinstance(event, SessionClosed):
            self._flush_partials()

    def _flush_partials(self) -> None:
        """A turn ended without final transcripts: keep what was heard, once."""
        self._clear_live()
        self._active = None
        for side in ("you", "agent"):
            if self._partial[side].strip():
                self._keep(side, self._partial[side])
            self._partial[side] = ""
            self._shown[side] = ""


def _normalize(text: str) -> str:
    return " ".join(text.split())


def _compact(value: Any, limit: int = 200) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    return text if len(text) <= limit else text[: limit - 1] + "…"
