"""Session records: what happened in one conversation, to read back and to replay.

`live serve --record DIR` writes one folder per session, `DIR/<UTC start>-<id>/`:

- `events.jsonl`: one JSON object per line, each with `t` (seconds since the
  session started, from the monotonic clock) and `kind`:
  `session` (the header: id, model, agent, start time, the server's limits),
  `client` (a client JSON message, secrets removed), `client.audio` (`n` bytes
  of PCM16 appended to `in.wav`), `server` (an event as the client got it),
  `server.audio` (`n` bytes appended to `out.wav`), `model.connect`,
  `model.send` and `model` (what went to and came from the model, with `conn`
  numbering its connections; model audio is appended to `model.wav`),
  `model.end` (how a connection ended), `truncated`, and `end`.
- `in.wav` (the user's audio, at the session's input rate), `out.wav` (the
  reply audio sent to the user) and `model.wav` (the audio the model sent):
  PCM16 mono WAV files any audio tool reads.

Each session stops recording at `session_cap` bytes (a `truncated` line says
so), and no new session is recorded while the folder holds `total_cap` bytes or
more. Tokens, keys and passwords in client messages are replaced by
`"<redacted>"`; the model side never sees them. The model's session handles
(`session_resumption_update.new_handle`) are replaced the same way: a
record says a handle came, never what it was.

`SessionRecord` is the writer; `Recorder` the folder with its caps;
`current_record` is how `Recorded(llm)` finds the record of the session it
serves. `load()` reads a record back; `timeline()` renders it for people.
"""

from __future__ import annotations

import contextvars
import dataclasses
import datetime
import json
import logging
import os
import time
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from google.genai import types

from live.llm import AudioStreamEnd, ClientTurns, LlmResponse, RealtimeInput, RealtimeText

__all__ = [
    "Record",
    "Recorder",
    "SessionRecord",
    "current_record",
    "load",
    "response_from_json",
    "response_to_json",
    "timeline",
]

log = logging.getLogger("live.record")

EVENTS = "events.jsonl"
WAV_HEADER = 44
MIN_ROOM = 4096  # a record with less room than this would say nothing
SECRET_KEYS = frozenset(
    # newHandle: a Live API app's resumption handle carries its resume token.
    # new_handle: the model service's own resumption handle (resumes its session).
    {"token", "resume_token", "newhandle", "new_handle", "handle", "api_key", "apikey", "key", "password", "secret", "authorization"}
)
REDACTED = "<redacted>"

current_record: contextvars.ContextVar[SessionRecord | None] = contextvars.ContextVar(
    "live_record", default=None
)


def redact(value: Any) -> Any:
    """A copy of a JSON value with every secret-looking key's value replaced."""
    if isinstance(value, dict):
        return {
            k: (REDACTED if k.lower() in SECRET_KEYS else redact(v)) for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


# ---------------------------------------------------------------- model side as JSON

def response_to_json(response: LlmResponse, audio_sink: Any = None) -> dict[str, Any]:
    """An `LlmResponse` as JSON; audio parts become `{"audio": n}` (bytes to `audio_sink`)."""
    out: dict[str, Any] = {}
    for field in dataclasses.fields(LlmResponse):
        value = getattr(response, field.name)
        if value is None or value is False or value == () or (field.name == "partial" and not value):
            continue
        if field.name == "content":
            parts = []
            for part in value.parts or ():
                blob = part.inline_data
                if blob is not None and (blob.mime_type or "").startswith("audio/"):
                    data = blob.data or b""
                    if audio_sink is not None:
                        audio_sink(data)
                    parts.append({"audio": len(data), "mime_type": blob.mime_type})
                else:
                    parts.append(part.model_dump(mode="json", exclude_none=True))
            out["content"] = {"role": value.role, "parts": parts}
        elif hasattr(value, "model_dump"):
            out[field.name] = value.model_dump(mode="json", exclude_none=True)
        elif isinstance(value, tuple):
            out[field.name] = list(value)
        else:
            out[field.name] = value
    return out


_PYDANTIC_FIELDS: dict[str, Any] = {
    "input_transcription": types.Transcription,
    "output_transcription": types.Transcription,
    "input_transcription_sent": types.Transcription,
    "output_transcription_sent": types.Transcription,
    "usage_metadata": types.UsageMetadata,
    "grounding_metadata": types.GroundingMetadata,
    "session_resumption_update": types.LiveServerSessionResumptionUpdate,
    "voice_activity": types.VoiceActivity,
}


def response_from_json(obj: dict[str, Any], audio: Iterator[bytes] | None = None) -> LlmResponse:
    """The inverse of `response_to_json`; audio parts take their bytes from `audio`."""
    kwargs: dict[str, Any] = {}
    for key, value in obj.items():
        if key == "content":
            parts = []
            for part in value.get("parts", []):
                if "audio" in part:
                    data = next(audio) if audio is not None else b"\x00" * part["audio"]
                    parts.append(types.Part(inline_data=types.Blob(data=data, mime_type=part.get("mime_type"))))
                else:
                    parts.append(types.Part.model_validate(part))
            kwargs["content"] = types.Content(role=value.get("role"), parts=parts)
        elif key in _PYDANTIC_FIELDS:
            kwargs[key] = _PYDANTIC_FIELDS[key].model_validate(value)
        elif key == "turn_complete_reason":
            kwargs[key] = types.TurnCompleteReason(value)
        elif key == "cancelled_tool_call_ids":
            kwargs[key] = tuple(value)
        else:
            kwargs[key] = value
    return LlmResponse(**kwargs)


_OTHER_FIELDS = tuple(
    f.name for f in dataclasses.fields(LlmResponse) if f.name not in ("content", "partial")
)


def _bare_audio(response: LlmResponse) -> types.Blob | None:
    """The one audio blob of a response that carries nothing else, or None."""
    content = response.content
    if content is None or not content.parts or len(content.parts) != 1:
        return None
    blob = content.parts[0].inline_data
    if blob is None or not (blob.mime_type or "").startswith("audio/"):
        return None
    for name in _OTHER_FIELDS:
        value = getattr(response, name)
        if value is not None and value is not False and value != ():
            return None
    return blob


def _sent_to_json(item: types.Content | RealtimeInput | list[types.Content] | ClientTurns | RealtimeText) -> dict[str, Any]:
    if isinstance(item, list):
        return {"history": [redact(c.model_dump(mode="json", exclude_none=True)) for c in item]}
    if isinstance(item, ClientTurns):
        turns = [redact(c.model_dump(mode="json", exclude_none=True)) for c in item.turns]
        return {"turns": turns, "turn_complete": item.turn_complete}
    if isinstance(item, RealtimeText):
        return {"text": item.text}
    if isinstance(item, types.Content):
        return {"content": item.model_dump(mode="json", exclude_none=True)}
    if isinstance(item, types.Blob):
        kind = "audio" if (item.mime_type or "").startswith("audio/") else "blob"
        return {kind: len(item.data or b""), "mime_type": item.mime_type}
    if isinstance(item, types.ActivityStart):
        return {"activity_start": True}
    if isinstance(item, types.ActivityEnd):
        return {"activity_end": True}
    if isinstance(item, AudioStreamEnd):
        return {"audio_stream_end": True}
    return {"other": type(item).__name__}


# ---------------------------------------------------------------- writing


def _close_reason(error: BaseException) -> str | None:
    """The model's own close reason behind `error`, for a replay to close with.

    Taken from the SDK error it came from, and only when it appears as is in
    the error's message: a connection removes secrets from its messages, so a
    reason that does not appear there is not written either.
    """
    details = getattr(error.__cause__, "details", None)
    message = getattr(error, "message", None)
    if isinstance(details, str) and isinstance(message, str) and details and details in message:
        return details
    return None


def _private_file(path: Path, mode: str, **kwargs: Any) -> IO[Any]:
    """A new file only its owner may read: records hold voices, transcripts and
    model session handles."""
    return open(path, mode, opener=lambda name, flags: os.open(name, flags, 0o600), **kwargs)


class _Wav:
    """A PCM16 mono WAV file opened on first write."""

    def __init__(self, path: Path, rate: int) -> None:
        self.path = path
        self.rate = rate
        self._file: wave.Wave_write | None = None
        self._raw: IO[bytes] | None = None

    @property
    def started(self) -> bool:
        return self._file is not None

    def write(self, data: bytes) -> None:
        if self._file is None:
            self._raw = _private_file(self.path, "wb")
            self._file = wave.open(self._raw, "wb")
            self._file.setnchannels(1)
            self._file.setsampwidth(2)
            self._file.setframerate(self.rate)
        self._file.writeframesraw(data)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()  # writes the final sizes into the header
            self._file = None
        if self._raw is not None:
            self._raw.close()  # wave closes only the files it opened itself
            self._raw = None


class SessionRecord:
    """The writer of one session's record; every method is cheap and never raises.

    A write that fails (disk full, folder removed) stops the record and is
    logged once: a broken record must not break the conversation.
    """

    def __init__(
        self,
        folder: Path,
        header: dict[str, Any],
        *,
        cap: int,
        input_rate: int = 16_000,
        clock: Any = time.monotonic,
    ) -> None:
        folder.mkdir(mode=0o700, parents=True, exist_ok=False)
        self.folder = folder
        self.cap = cap
        self.size = 0
        self.open = True
        self._clock = clock
        self._t0 = clock()
        self._events: IO[str] = _private_file(folder / EVENTS, "w", encoding="utf-8", buffering=1 << 14)
        self._in = _Wav(folder / "in.wav", input_rate)
        self._out = _Wav(folder / "out.wav", 24_000)
        self._model = _Wav(folder / "model.wav", 24_000)
        self._connections = 0
        self._line({"t": 0.0, "kind": "session", **header})

    @property
    def elapsed(self) -> float:
        return self._clock() - self._t0

    # -- the client side ------------------------------------------------------------

    def client_text(self, raw: str) -> None:
        if not self.open:
            return
        try:
            message = json.loads(raw)
        except ValueError:
            # Not JSON: keep its size only, since it may hold anything.
            self._line({"t": self._t(), "kind": "client", "invalid": True, "bytes": len(raw)})
            return
        if isinstance(message, dict) and message.get("type") == "image" and isinstance(message.get("data"), str):
            # The picture itself is not kept: its size says what was sent.
            message = {**message, "data": f"<{len(message['data'])} base64 characters>"}
        self._line({"t": self._t(), "kind": "client", "event": redact(message)})

    def client_event(self, message: dict[str, Any]) -> None:
        """A client message already parsed (`session.start`, read before the record began)."""
        if self.open:
            self._line({"t": self._t(), "kind": "client", "event": redact(message)})

    def client_audio(self, data: bytes) -> None:
        if not self.open:
            return
        self._audio(self._in, data, "client.audio")

    def server_frame(self, frame: str | bytes) -> None:
        if not self.open:
            return
        if type(frame) is bytes:
            self._audio(self._out, frame, "server.audio")
        elif '"resume_token"' in frame or '"newHandle"' in frame:
            # session.started (a Live API app's sessionResumptionUpdate) carries
            # the session's reattach credential: never recorded.
            self._line({"t": self._t(), "kind": "server", "event": redact(json.loads(frame))})
        else:
            # Already JSON, and made by the server: written as it went out.
            self._raw(f'{{"t":{self._t():.4f},"kind":"server","event":{frame}}}\n')

    def unsent_event(self, frame: str) -> None:
        """A session event its client's door had no frame for (a phone has no
        screen: its transcripts, what the caller heard of a reply), kept here."""
        if self.open:
            self._raw(f'{{"t":{self._t():.4f},"kind":"event","event":{frame}}}\n')

    # -- the model side ------------------------------------------------------------

    def model_connect(self, request_summary: dict[str, Any]) -> int:
        self._connections += 1
        if self.open:
            self._line({"t": self._t(), "kind": "model.connect", "conn": self._connections, **request_summary})
        return self._connections

    def model_sent(self, conn: int, item: types.Content | RealtimeInput | list[types.Content] | ClientTurns | RealtimeText) -> None:
        if not self.open:
            return
        if type(item) is types.Blob and (item.mime_type or "").startswith("audio/"):
            self._raw(f'{{"t":{self._t():.4f},"kind":"model.send","conn":{conn},"audio":{len(item.data or b"")}}}\n')
            return
        self._line({"t": self._t(), "kind": "model.send", "conn": conn, **_sent_to_json(item)})

    def model_response(self, conn: int, response: LlmResponse) -> None:
        if not self.open:
            return
        audio = _bare_audio(response)
        if audio is not None:  # the hot path: one chunk of reply audio, nothing else
            self._model_audio(audio.data or b"")
            self._raw(
                f'{{"t":{self._t():.4f},"kind":"model","conn":{conn},"response":{{"content":{{"role":"model",'
                f'"parts":[{{"audio":{len(audio.data or b"")},"mime_type":{json.dumps(audio.mime_type)}}}]}},'
                f'"partial":{"true" if response.partial else "false"}}}}}\n'
            )
            return
        entry = response_to_json(response, self._model_audio)
        update = entry.get("session_resumption_update")
        if isinstance(update, dict) and update.get("new_handle"):
            # The upstream session's handle resumes that session (its conversation
            # and all) for whoever holds it with the key: never kept. A replay
            # needs only to know there was one.
            entry["session_resumption_update"] = {**update, "new_handle": REDACTED}
        self._line({"t": self._t(), "kind": "model", "conn": conn, "response": entry})

    def model_end(self, conn: int, error: BaseException | None, how: str) -> None:
        if not self.open:
            return
        entry: dict[str, Any] = {"t": self._t(), "kind": "model.end", "conn": conn, "how": how}
        if error is not None:
            entry["error"] = type(error).__name__
            entry["message"] = str(error)
            code = getattr(error, "close_code", None)
            if code is not None:
                entry["close_code"] = code
            reason = _close_reason(error)
            if reason is not None:
                entry["reason"] = reason
        self._line(entry)

    # -- end -----------------------------------------------------------------------

    def close(self, reason: str) -> None:
        if self.open:
            self._line({"t": self._t(), "kind": "end", "reason": reason})
        self._stop()

    # -- internals -----------------------------------------------------------------

    def _t(self) -> float:
        return round(self._clock() - self._t0, 4)

    def _model_audio(self, data: bytes) -> None:
        if self.open:
            self._audio(self._model, data, None)

    def _audio(self, wav: _Wav, data: bytes, kind: str | None) -> None:
        size = len(data) + (0 if wav.started else WAV_HEADER)
        if self.size + size > self.cap:
            self._truncate()
            return
        try:
            wav.write(data)
        except OSError as exc:
            self._fail(exc)
            return
        self.size += size
        if kind is not None:
            self._raw(f'{{"t":{self._t():.4f},"kind":"{kind}","n":{len(data)}}}\n')

    def _line(self, entry: dict[str, Any]) -> None:
        self._raw(json.dumps(entry, separators=(",", ":"), ensure_ascii=False, default=str) + "\n")

    def _raw(self, line: str) -> None:
        if self.size + len(line) > self.cap:
            self._truncate()
            return
        try:
            self._events.write(line)
        except (OSError, ValueError) as exc:
            self._fail(exc)
            return
        self.size += len(line)

    def _truncate(self) -> None:
        if not self.open:
            return
        try:
            # Beyond the cap by this one line, so that a reader knows.
            line = json.dumps({"t": self._t(), "kind": "truncated", "cap": self.cap}) + "\n"
            self._events.write(line)
            self.size += len(line)
        except (OSError, ValueError):
            pass
        self._stop()

    def _fail(self, exc: BaseException) -> None:
        log.warning("record %s stopped: %s", self.folder, exc)
        self._stop()

    def _stop(self) -> None:
        self.open = False
        for closer in (self._events.close, self._in.close, self._out.close, self._model.close):
            try:
                closer()
            except (OSError, ValueError):
                pass


class Recorder:
    """A folder of session records with a cap per session and a total cap.

    The total is measured from the folder itself (every process writing to it
    counts), at most every `rescan_seconds`, and between scans this process
    adds what it wrote; a session is not recorded while the total has reached
    `total_cap`.
    """

    def __init__(
        self,
        folder: str | os.PathLike[str],
        *,
        session_cap: int = 50 << 20,
        total_cap: int = 1 << 30,
        rescan_seconds: float = 10.0,
    ) -> None:
        self.folder = Path(folder)
        # Made private when it is made here; a folder that exists keeps its mode
        # (it may be shared), and each session's folder within is private anyway.
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.session_cap = session_cap
        self.total_cap = total_cap
        self.rescan_seconds = rescan_seconds
        self._used = 0
        self._scanned_at = -float("inf")
        self._open: list[SessionRecord] = []
        self._warned = False

    def used(self) -> int:
        now = time.monotonic()
        if now - self._scanned_at >= self.rescan_seconds:
            self._used = sum(
                f.stat().st_size for f in self.folder.glob("*/*") if f.is_file()
            )
            self._scanned_at = now
            self._open = [r for r in self._open if r.open]
        else:
            self._used += sum(r.size for r in self._open)  # an upper bound until the next scan
        return self._used

    def start(self, session_id: str, header: dict[str, Any], *, input_rate: int) -> SessionRecord | None:
        """A new record, or None when the folder is full (logged once per filling)."""
        used = self.used()
        if self.total_cap - used < MIN_ROOM:
            if not self._warned:
                log.warning(
                    "not recording: %s holds %d bytes, at its cap of %d", self.folder, used, self.total_cap
                )
                self._warned = True
            return None
        self._warned = False
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
        cap = min(self.session_cap, self.total_cap - used)
        try:
            record = SessionRecord(
                self.folder / f"{stamp}-{session_id}",
                {"id": session_id, "started": datetime.datetime.now(datetime.UTC).isoformat(), **header},
                cap=cap,
                input_rate=input_rate,
            )
        except OSError as exc:
            log.warning("not recording session %s: %s", session_id, exc)
            return None
        self._open.append(record)
        return record


# ---------------------------------------------------------------- reading


@dataclasses.dataclass
class Record:
    """A record read back: its header, its lines, and its audio files."""

    folder: Path
    header: dict[str, Any]
    entries: list[dict[str, Any]]

    def audio(self, name: str) -> bytes:
        """The PCM16 of `in`, `out` or `model` (empty when none was recorded)."""
        path = self.folder / f"{name}.wav"
        if not path.is_file():
            return b""
        with wave.open(str(path), "rb") as wav:
            return wav.readframes(wav.getnframes())

    def of(self, *kinds: str) -> list[dict[str, Any]]:
        return [e for e in self.entries if e.get("kind") in kinds]


def load(path: str | os.PathLike[str]) -> Record:
    """Read a record: its folder, or its `events.jsonl`.

    Raises ValueError with a readable message for anything that is not one.
    """
    target = Path(path)
    folder = target if target.is_dir() else target.parent
    events = folder / EVENTS if target.is_dir() else target
    if not events.is_file():
        raise ValueError(f"{path}: no such record (expected a folder with {EVENTS}, or the file itself)")
    entries = []
    with open(events, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                entries.append(json.loads(line))
            except ValueError:
                # The last line of a record whose server was killed may be cut short.
                log.warning("%s:%d is not JSON; the record ends there", events, number)
                break
    if not entries or entries[0].get("kind") != "session":
        raise ValueError(f"{events}: not a session record (its first line is not a session header)")
    return Record(folder, entries[0], entries)


def _audio_seconds(n: int, rate: int) -> float:
    return n / (2 * rate)


def timeline(record: Record) -> Iterator[str]:
    """A readable account: who spoke, what was transcribed, tools, interruptions, latencies."""
    h = record.header
    end = next((e for e in reversed(record.entries) if e["kind"] == "end"), None)
    duration = f"{end['t']:.1f} s" if end else "unfinished"
    yield f"session {h.get('id')}  model {h.get('model')}  agent {h.get('agent')}  started {h.get('started')}  ({duration})"
    call = h.get("call")
    if isinstance(call, dict):
        yield (f"call {call.get('id')} on {call.get('carrier')}: {call.get('direction') or 'a call'} "
               f"from {call.get('from') or '?'} to {call.get('to') or '?'}")
    rate = int(h.get("input_rate", 16_000))
    user_audio: list[float] = []  # [start, seconds]
    agent_audio: list[float] = []
    turn_end: float | None = None
    calls: dict[str, float] = {}

    def flush_user() -> Iterator[str]:
        if user_audio:
            yield f"{user_audio[0]:8.3f}  user    audio {user_audio[1]:.2f} s"
            user_audio.clear()

    def flush_agent() -> Iterator[str]:
        if agent_audio:
            yield f"{agent_audio[0]:8.3f}  agent   audio {agent_audio[1]:.2f} s"
            agent_audio.clear()

    for e in record.entries[1:]:
        kind, t = e.get("kind"), float(e.get("t", 0.0))
        if kind == "client.audio":
            if user_audio:
                user_audio[1] += _audio_seconds(e["n"], rate)
            else:
                user_audio.extend([t, _audio_seconds(e["n"], rate)])
            continue
        if kind == "server.audio":
            if turn_end is not None:
                yield from flush_user()
                yield f"{t:8.3f}  latency first reply audio {1000 * (t - turn_end):.0f} ms after the end of the user's turn"
                turn_end = None
            if agent_audio:
                agent_audio[1] += _audio_seconds(e["n"], 24_000)
            else:
                agent_audio.extend([t, _audio_seconds(e["n"], 24_000)])
            continue
        if kind == "model.send" and e.get("activity_end"):
            turn_end = t
        if kind == "model" and (e["response"].get("voice_activity") or {}).get("voice_activity_type") == "ACTIVITY_END":
            turn_end = t
        if kind == "model.send" and "content" in e:
            parts = e["content"].get("parts", [])
            if any("text" in p for p in parts) and e["content"].get("role") == "user":
                turn_end = t
        line = _describe(e, t, calls)
        if line is not None:
            yield from flush_user()
            yield from flush_agent()
            yield line
    yield from flush_user()
    yield from flush_agent()


def _describe(e: dict[str, Any], t: float, calls: dict[str, float]) -> str | None:
    kind = e.get("kind")
    prefix = f"{t:8.3f}  "
    if kind == "client":
        if e.get("invalid"):
            return prefix + f"client  (not JSON, {e['bytes']} bytes)"
        msg = e["event"]
        mtype = msg.get("type")
        if mtype == "text":
            return prefix + f"user    typed: {msg.get('text')!r}"
        if mtype == "image":
            return prefix + f"user    showed an image: {msg.get('mime_type')}, {msg.get('data')}"
        if mtype == "tool.result":
            return prefix + f"client  tool result {msg.get('name')} ({msg.get('id')}): {json.dumps(msg.get('response'))}"
        return prefix + f"client  {mtype}"
    if kind in ("server", "event"):
        ev = e["event"]
        etype = ev.get("type")
        if etype == "transcript.input" and ev.get("final"):
            return prefix + f"user    said: {ev.get('text')!r}"
        if etype == "transcript.output" and ev.get("final"):
            heard = " (heard)" if ev.get("heard") else ""
            return prefix + f"agent   said{heard}: {ev.get('text')!r}"
        if etype == "turn.interrupted":
            return prefix + "user    barged in: reply interrupted"
        if etype == "tool.call":
            calls[ev.get("id")] = t
            return prefix + f"tool    call {ev.get('name')}({json.dumps(ev.get('args'))}) on the {ev.get('runs_on')} [{ev.get('id')}]"
        if etype == "tool.result":
            took = t - calls.pop(ev.get("id"), t)
            return prefix + f"tool    result {ev.get('name')}: {json.dumps(ev.get('response'))} after {1000 * took:.0f} ms"
        if etype == "error":
            return prefix + f"error   {ev.get('code')}: {ev.get('message')}"
        if etype in ("session.started", "session.closed", "session.reconnecting", "session.resumed", "turn.complete", "tool.cancelled"):
            detail = ev.get("reason") or ""
            return prefix + f"server  {etype}{(': ' + detail) if detail else ''}"
        if etype == "usage":
            return prefix + f"usage   prompt {ev.get('prompt_tokens')} response {ev.get('response_tokens')} total {ev.get('total_tokens')}"
        return None
    if kind == "model.connect":
        resumed = " (resumed)" if e.get("resumed") else ""
        return prefix + f"model   connection {e['conn']} opened{resumed}"
    if kind == "model.end":
        why = f": {e.get('error')} {e.get('message', '')}".rstrip() if e.get("error") else f" ({e.get('how')})"
        return prefix + f"model   connection {e['conn']} ended{why}"
    if kind == "truncated":
        return prefix + f"record  truncated at its cap of {e.get('cap')} bytes"
    if kind == "end":
        return prefix + f"end     {e.get('reason')}"
    return None
