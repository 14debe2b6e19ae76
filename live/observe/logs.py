"""Log lines as text or as JSON, each carrying the id of the session it is about.

The server sets `current_session` when a session starts; every line logged
from that session's tasks (the server's, a tool's, the model connection's)
then carries its id, with no change to the calls that log. `--log-format json`
writes one object per line with the same facts as the text format (time,
level, logger, message, the worker in a multi-process server), plus `session`
and the structured `fields` a line passes as `extra={"fields": {...}}`. A
phone call's lines carry its id (`current_call_id`): `call` in JSON, and
`[call ID]` at the end of a text line.
Nothing here adds request headers, tokens or keys: a line holds what its
caller put in its message.

A message may hold what a client sent (a session id, a call's id), so no
record can write more than its own line: both formats escape control
characters, the Unicode line and paragraph separators and the bidirectional
overrides (`\\n`, `\\x1b`, `\\u2028`); in text, a traceback's lines are
indented under the record's, so only a record starts a line at its first column.
"""

from __future__ import annotations

import contextvars
import datetime
import json
import logging
import re

__all__ = ["JsonFormatter", "TextFormatter", "configure", "current_session", "escape_controls"]

# What can end or rewrite a line for whoever reads the log: C0 and C1 controls
# (newlines, carriage return, terminal escapes), DEL, the Unicode line and
# paragraph separators, and the marks that reorder text on screen.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_UNSAFE_IN_JSON = re.compile("[\x7f-\x9f\u2028\u2029\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_UNSAFE_BUT_NEWLINE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
# Where a traceback's lines start, under their record's first line.
TRACEBACK_INDENT = "    "


def _escaped(match: re.Match[str]) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


def escape_controls(text: str) -> str:
    """`text` on one line: every character that could end or rewrite it, escaped as Python writes it."""
    return _UNSAFE.sub(_escaped, text)


def _indented(text: str) -> str:
    """A traceback (or stack) under its record: newlines kept, each line indented."""
    text = _UNSAFE_BUT_NEWLINE.sub(_escaped, text.rstrip("\n"))
    return "\n".join(TRACEBACK_INDENT + line for line in text.split("\n"))

__all__ = ["JsonFormatter", "configure", "current_call_id", "current_session"]

current_session: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "live_session", default=None
)
# A phone session's call (the carrier's id: Twilio's CallSid, Telnyx's
# call_control_id), set by its door: every line of that session carries it.
current_call_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "live_call", default=None
)


class _SessionFilter(logging.Filter):
    """Stamps each record with the session (and the phone call) of the task that logged it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "session"):
            record.session = current_session.get()
        if not hasattr(record, "call"):
            record.call = current_call_id.get()
        record.call_tag = f" [call {record.call}]" if record.call else ""
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def __init__(self, worker: int | None = None) -> None:
        super().__init__()
        self.worker = worker

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self.worker is not None:
            out["worker"] = self.worker
        session = getattr(record, "session", None)
        if session is not None:
            out["session"] = session
        call = getattr(record, "call", None)
        if call is not None:
            out["call"] = call
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            for key, value in fields.items():
                out.setdefault(key, value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        # json escapes C0 controls itself; the rest of what could break a line
        # can only be inside a string here, where a \\u escape means the same.
        return _UNSAFE_IN_JSON.sub(_json_escaped, json.dumps(out, default=str, ensure_ascii=False))


def _json_escaped(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


class TextFormatter(logging.Formatter):
    """`time LEVEL logger: message` on one line, whatever the message holds; a
    traceback follows on lines of its own, indented."""

    def format(self, record: logging.LogRecord) -> str:
        record.message = record.getMessage()
        if self.usesTime():
            record.asctime = self.formatTime(record, self.datefmt)
        text = escape_controls(self.formatMessage(record))
        # Formatted here, not from the record's cache: another handler's
        # formatter may have cached it unescaped.
        if record.exc_info:
            text += "\n" + _indented(self.formatException(record.exc_info))
        elif record.exc_text:
            text += "\n" + _indented(record.exc_text)
        if record.stack_info:
            text += "\n" + _indented(self.formatStack(record.stack_info))
        return text


# Loggers that write frames' contents at DEBUG.
FRAME_TRACERS = ("websockets", "picows", "live.net.websocket.picows")


def configure(level: str = "INFO", format: str = "text", worker: int | None = None) -> None:
    """Set up the root logger for `live serve` (text or json)."""
    handler = logging.StreamHandler()
    handler.addFilter(_SessionFilter())
    if format == "json":
        handler.setFormatter(JsonFormatter(worker))
    else:
        tag = f"[worker {worker}]" if worker is not None else ""
        handler.setFormatter(TextFormatter(f"%(asctime)s %(levelname)s %(name)s{tag}: %(message)s%(call_tag)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level))
    # The socket layers trace every frame at DEBUG, payloads included (tokens
    # in session.start, keys in handshakes, audio): never shown, whatever the level.
    for name in FRAME_TRACERS:
        logging.getLogger(name).setLevel(max(logging.INFO, root.level))
