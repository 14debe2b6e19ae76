"""Seeded fault simulation of whole sessions, in virtual time.

One seed is one conversation: a random client talks to the real session code
(`LiveServer` / `ClientSession`, `SessionCore`, the reconnect supervisor, the real
`GeminiLlmConnection`) over the transport double, while a random model answers,
calls tools, gets interrupted, hands out resumption handles, goes away, drops
(seen first by the receiver or by the sender), stalls and refuses reconnects.
Everything runs on trio's `MockClock` (a 20 s stall costs nothing), the client
socket is an in-memory fake, and every choice comes from the seed: Python's
`random.Random(seed)` for behaviour and trio's scheduler randomness for the
interleavings, so a seed replays exactly.

A run has a chaotic part, then a calm part (no more faults; the client answers
what it owes and waits) and an orderly `session.close`. Then the invariants are
checked; each violation names the rule, and a failing seed prints the command
that replays it with its event trace:

    .venv/bin/python -m tests.simulation --seed 1234 -v
    .venv/bin/python -m tests.simulation --seeds 100000        # a long run

The model keeps a context per connection (what it received, inherited through
the resumption handle it resumed from), which is what "the model knows" means
below. It is as strict as the double (no resumable handle while a call is
unanswered or a reply is owed or generated). The rules, by the name a violation
carries:

- `tool-result-unknown`: every call that ran (a server tool that returned, a
  client result the server accepted, a client call that timed out) is, at the
  orderly close, in the final connection's context (as a function response, or
  named in a context note), or the client got an error naming it; calls the
  model cancelled are exempt.
- `response-to-stranger`, `response-twice`: a function response goes only to a
  connection that issued the call, once.
- `session-ended`: no recoverable fault ends a session. Allowed ends: the client
  closed or vanished; a fatal refusal the model was told to make (1007, 1008,
  quota) of a fresh connect (a resume refused with 1007 or 1008 means the handle
  is unknown: the server starts fresh); "gave up" when each of the last
  `reconnect_attempts` connects was refused or lived less than `stable_after`
  (the policy's own budget).
- `after-closed`: nothing reaches the client after `session.closed`.
- `after-turn-end`: no audio, transcript or text of a reply after the
  `turn.complete` or `turn.interrupted` that ended it (replies are tagged), but
  the one `transcript.output` with `heard: true` that says what the user heard,
  and the tail of its transcript that the model sent after its turnComplete,
  marked `late: true` (`late-tail`: only such a tail is marked).
- `audio-lost`: a reply that completed and was never cut, with no interruption or
  reconnect while it played, reaches the client whole.
- `typed-turn`: every typed turn is in the final connection's context exactly once,
  except one answered in full whose connection died before any handle held it
  (not sent again, so the user does not hear the answer twice).
- `history-resent`, `history-flag-on-resume`, `history-flag-without-history`,
  `fresh-reconnect`: history only as the first message of a fresh connection,
  the history flag only there and only with history, and a fresh connection
  once the session started only when no usable handle is left: none reached the
  server since the last fresh start, or the resume was refused for its handle.
  A fresh connection knows what its seed (the session's transcript) says.
- `no-end`, `connection-left-open`, `no-session-closed`, `server-error-logged`,
  `queue-bound`: the session's `run()` returns within 30 s of the client leaving (plus the
  reattach grace after a vanished client),
  every model connection is closed, the client is told, nothing is logged as an
  error, and the session's queues stay within their bounds (sampled).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import functools
import heapq
import itertools
import json
import logging
import math
import os
import random
import re
import struct
import sys
import time
import traceback
import uuid
from typing import Any

import anyio
import trio
import trio.testing
from google.genai import types
from websockets.exceptions import ConnectionClosedError, ConnectionClosedOK
from websockets.frames import Close as CloseFrame

from connections import double
from connections.gemini import Gemini
from live.agent import Agent
from live.protocol import SessionStart
from live.server.port import LiveServer, ServerConfig

__all__ = ["Outcome", "run_seed", "main"]

SERVER_TOOL = "lookup"
CLIENT_TOOL = "ask_user"
MODELS = ("gemini-2.5-flash-native-audio-preview", "gemini-3.1-flash-live-preview")
CONFIG = ServerConfig(
    stall_timeout=20.0,
    handover_margin=1.0,
    reconnect_attempts=5,
    stable_after=60.0,
    idle_timeout=600.0,
)
TOOL_TIMEOUT = 5.0
CLIENT_TOOL_TIMEOUT = 8.0
CALM_SECONDS = 90.0
# A client that vanished may come back within the reattach grace: the session waits for it.
CLOSE_WITHIN = 30.0 + getattr(CONFIG, "reattach_grace", 0.0)
# session.start may declare turn-taking (manual activity signals) where the server supports it.
TURN_TAKING = "turn_taking" in {f.name for f in dataclasses.fields(SessionStart)}
# Error codes a client gets for its own bad tool results: not a report of a lost result.
_TOOL_INPUT_ERRORS = {"tool_timeout", "unknown_tool_call", "tool_call_closed", "invalid_field"}
_FATAL_CODES = {"model_invalid_argument", "model_config_error", "quota_exhausted"}


# --------------------------------------------------------------------------- the client socket


class FakeSocket:
    """An in-memory stand-in for websockets' `ServerConnection`, as ClientSession uses it."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self._inbox: collections.deque[str | bytes] = collections.deque()
        self._wake = anyio.Event()
        self.vanished = False
        self.closed: tuple[int, str] | None = None

    # the client's side
    def client_send(self, frame: str | bytes) -> None:
        self._inbox.append(frame)
        self._wake.set()

    def vanish(self) -> None:
        self.vanished = True
        self._wake.set()

    def _closed_error(self) -> Exception:
        if self.vanished:
            return ConnectionClosedError(None, None)
        code, reason = self.closed or (1000, "")
        frame = CloseFrame(code, reason)
        if code in (1000, 1001):
            return ConnectionClosedOK(frame, frame, True)
        return ConnectionClosedError(frame, frame, True)

    # the server's side
    async def recv(self) -> str | bytes:
        while True:
            if self.closed is not None:
                raise self._closed_error()
            if self._inbox:
                break
            if self.vanished:
                raise self._closed_error()
            self._wake = anyio.Event()
            await self._wake.wait()
        await anyio.lowlevel.checkpoint()
        if self.closed is not None or not self._inbox:
            raise self._closed_error()
        return self._inbox.popleft()

    def __aiter__(self) -> FakeSocket:
        return self

    async def __anext__(self) -> str | bytes:
        try:
            return await self.recv()
        except ConnectionClosedOK:
            raise StopAsyncIteration from None

    async def send(self, frame: str | bytes) -> None:
        if self.closed is not None or self.vanished:
            raise self._closed_error()
        self.sim.server_frame(frame)
        if self.sim.rng.random() < 0.02:
            await anyio.sleep(self.sim.rng.uniform(0.0, 0.05))  # a client slow to read
        else:
            await anyio.lowlevel.checkpoint()

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if self.closed is None:
            self.closed = (code, reason)
            self.sim.log(f"server closes the client socket {code} {reason!r}")
        self._wake.set()
        await anyio.lowlevel.checkpoint()


# --------------------------------------------------------------------------- the model


_TYPED = re.compile(r"\bq:\d+\b")


_CHUNK_BYTES = 480  # one tagged reply chunk: 10 ms at 24 kHz


def _tag_audio(gen: int, chunk: int) -> bytes:
    return struct.pack("<II", gen, chunk) + b"\x00\x01" * 236


def _audio_gen(data: bytes) -> int | None:
    return struct.unpack_from("<I", data)[0] if len(data) >= 8 else None


def _gen_of_text(text: str) -> int | None:
    # Model text and transcripts look like "g12.3 ".
    if text.startswith("g") and "." in text:
        try:
            return int(text[1 : text.index(".")])
        except ValueError:
            return None
    return None


@dataclasses.dataclass
class Generation:
    gen: int
    chunks_left: int
    next_at: float
    answers: tuple[str, ...] = ()  # the typed turns this reply answers
    started: bool = False  # its first chunk went out


class SimSession(double.ScriptedSession):
    """A scripted session with a mind: it reacts to what it receives, at random."""

    def __init__(self, sim: Simulation, index: int) -> None:
        super().__init__(record_audio=False)
        self.sim = sim
        self.index = index
        self.ctx: list[tuple[str, str]] = []
        self.issued: dict[str, str] = {}
        self.pending: dict[str, str] = {}
        self.cancelled: set[str] = set()
        self.ignored_items: list[tuple[str, str]] = []
        self.dead = False  # the socket died (a close seen first by the sender): nothing more comes
        self.turns = 0
        self.heard = 0  # input transcripts sent: after one, late audio of a cut reply no longer comes
        self.completes: dict[int, int] = {}  # id of a turn_complete message -> the reply it ends
        self.resumed_from: str | None = None
        self.fresh_after_start = False  # seeded from the session's transcript (no usable handle)
        self.worked = False  # it answered something: past setup
        self.responses_in = 0  # function responses it received
        self.history_flag = False
        self.auto_vad = True
        self.gemini3 = False
        self.owed = False
        self.call_turn = False
        self.gen: Generation | None = None
        self.stalling = False
        self.speaking_since: float | None = None
        self.last_audio = 0.0
        self.audio_in_utterance = 0
        self.interrupt_pending = False
        self.go_away_at: float | None = None
        self.fault_at = math.inf
        self.reply_at = 0.0
        self.handles = 0
        self.opened_at = 0.0
        self.ended_at: float | None = None
        self.received_first = False
        self.wake = anyio.Event()
        self.on(lambda m: True, self._received, times=None)

    # -- connect
    def _attach(self, model: str, config: types.LiveConnectConfig) -> None:
        super()._attach(model, config)
        sim = self.sim
        now = sim.now()
        self.opened_at = now
        self.gemini3 = "gemini-3" in model
        handle = config.session_resumption.handle if config.session_resumption else None
        hc = config.history_config
        self.history_flag = bool(hc and hc.initial_history_in_client_content)
        ric = config.realtime_input_config
        aad = ric.automatic_activity_detection if ric else None
        self.auto_vad = not (aad is not None and aad.disabled)
        if handle is not None:
            self.resumed_from = handle
            if handle not in sim.handles:
                sim.violation(
                    "resume-with-bad-handle",
                    f"connection {self.index} resumes with handle {handle!r}, which the model "
                    "never marked resumable",
                )
                self.refuse = double.Close(1007, "invalid session resumption handle")
            else:
                self.ctx = list(sim.handles[handle])
            if self.history_flag:
                sim.violation(
                    "history-flag-on-resume",
                    f"connection {self.index} resumes ({handle}) with "
                    "history_config.initial_history_in_client_content set",
                )
        elif sim.established:
            if sim.handle_since_fresh and not sim.stale_refusal:
                sim.violation(
                    "fresh-reconnect",
                    f"connection {self.index} connects without a resumption handle after "
                    "the session started, though a usable handle had reached the server",
                )
            self.fresh_after_start = True
        if self.history_flag:
            if handle is None and not sim.history and not sim.established:
                sim.violation(
                    "history-flag-without-history",
                    f"connection {self.index} sets the history flag, but no history is seeded",
                )
        if self.refuse is None and sim.chaos and self.index > 0 and sim.rng.random() < 0.15:
            self.refuse = sim.random_refusal()
        if self.refuse is not None:
            self.ended_at = now
            sim.log(f"model: connect {self.index} refused {self.refuse.code} {self.refuse.reason!r}")
            stale = handle is not None and self.refuse.code in (1007, 1008)
            # A resume refused with 1007 or 1008 means the handle is no longer
            # known: the server starts fresh (and stays fresh until a connection
            # is up). Refused fresh, it is fatal.
            sim.stale_refusal = sim.stale_refusal or stale
            if (self.refuse.code in (1007, 1008) and not stale) or "RESOURCE_EXHAUSTED" in self.refuse.reason:
                sim.fatal_injected = True
            return
        sim.stale_refusal = False
        if self.fresh_after_start:
            sim.handle_since_fresh = False
        sim.log(
            f"model: connect {self.index} ({'resume ' + handle if handle else 'fresh'}"
            f"{', history flag' if self.history_flag else ''}"
            f"{', manual activity' if not self.auto_vad else ''})"
        )
        sim.established.append(self)
        self.stalling = sim.chaos and sim.rng.random() < 0.1
        if sim.chaos:
            self.fault_at = now + sim.rng.expovariate(1 / 6.0)
        sim.tg.start_soon(self._mind)

    # -- sends take a while, now and then (a socket's buffer is full)
    def _latency(self) -> None:
        """After a send: now and then it filled the socket's buffer. It was taken
        (a send made while `can_send_now()` said True never waits, as on a
        socket); the ones after it wait, and `send_audio_nowait()` takes nothing,
        until the buffer drains."""
        rng = self.sim.rng
        if rng.random() < 0.05:
            self.hold_sends()
            self.sim.tg.start_soon(self._drain, rng.choice([0.001, 0.01, 0.1]))

    async def _drain(self, seconds: float) -> None:
        await anyio.sleep(seconds)
        self.release_sends()

    async def send_realtime_input(self, **kwargs: Any) -> None:
        await self._sends_released()  # a full buffer first: what is judged below is what arrives
        if self._awaiting_seed and kwargs.get("text") is not None:
            self.ignored_items.extend(("user", q) for q in _TYPED.findall(kwargs["text"]))
            self.sim.log(f"model {self.index}: text before the history seed's turn_complete: not processed")
        await super().send_realtime_input(**kwargs)
        self._latency()

    def send_audio_nowait(self, audio: Any) -> bool:
        if not super().send_audio_nowait(audio):
            return False
        self._latency()
        return True

    async def send_client_content(self, **kwargs: Any) -> None:
        seeding = self._awaiting_seed
        await super().send_client_content(**kwargs)
        if seeding:
            # The initial history under the history flag: context, answered by nothing.
            turns = kwargs.get("turns")
            listed = [turns] if isinstance(turns, (types.Content, dict)) else list(turns or ())
            self._seed([types.Content.model_validate(t) if isinstance(t, dict) else t for t in listed])
        self._latency()

    def _seed(self, turns: list[types.Content]) -> None:
        for content in turns:
            for part in content.parts or ():
                # A turn of the session's transcript joins its entries by lines.
                for line in (part.text or "").split("\n"):
                    if line.startswith("h:"):
                        self.ctx.append(("history", line))
                    elif content.role == "model":
                        self.ctx.append(("model", line))
                    elif line:
                        self._take_text(line)

    async def send_tool_response(self, **kwargs: Any) -> None:
        await super().send_tool_response(**kwargs)
        self._latency()

    # -- what the connection receives
    async def receive(self) -> Any:
        inner = super().receive()
        try:
            async for message in inner:
                self._delivered(message)
                yield message
        finally:
            await inner.aclose()

    def _delivered(self, m: types.LiveServerMessage) -> None:
        sim = self.sim
        sc = m.server_content
        if sc is not None:
            for part in (sc.model_turn.parts or ()) if sc.model_turn else ():
                blob = part.inline_data
                if blob is not None and blob.data:
                    gen = _audio_gen(blob.data)
                    if gen is not None:
                        sim.gen_first.setdefault(gen, sim.now())
                        sim.audio_delivered[gen] += 1
            gen = self.completes.pop(id(m), None)
            if gen is not None:
                sim.gen_completed[gen] = sim.now()
        update = m.session_resumption_update
        if update is not None and update.resumable and update.new_handle:
            self.sim.handle_delivered = True
            self.sim.handle_since_fresh = True
            self.sim.delivered_handles.append(update.new_handle)

    def _received(self, m: types.LiveClientMessage) -> list[Any]:
        sim = self.sim
        now = sim.now()
        first = not self.received_first
        self.received_first = True
        ri = m.realtime_input
        if ri is not None:
            if ri.audio is not None:
                if self.speaking_since is None:
                    self.speaking_since = now
                    self.audio_in_utterance = 0
                self.audio_in_utterance += 1
                self.last_audio = now
                if self.gen is not None and self.auto_vad and sim.chaos and sim.rng.random() < 0.08:
                    self.interrupt_pending = True
            elif ri.text is not None:
                sim.log(f"model {self.index}: text {ri.text!r}")
                self._user_text(ri.text, now)
            elif ri.activity_start is not None or ri.activity_end is not None:
                if ri.activity_end is not None:
                    self._end_utterance(now, force=True)
                else:
                    self.speaking_since = now
                    self.audio_in_utterance = 0
            elif ri.audio_stream_end:
                self._end_utterance(now, force=False)
        elif m.client_content is not None:
            self._client_content(m.client_content, first, now)
        elif m.tool_response is not None:
            for fr in m.tool_response.function_responses or ():
                fid = fr.id or ""
                sim.log(f"model {self.index}: function response {fid} {fr.response}")
                if fid not in self.issued:
                    sim.violation(
                        "response-to-stranger",
                        f"function response {fid!r} sent to connection {self.index}, which never "
                        f"issued that call (it resumed from {self.resumed_from!r})",
                    )
                    return []  # the double closes the connection with 1007
                if ("response", fid) in self.ctx:
                    sim.violation(
                        "response-twice",
                        f"function response {fid!r} sent to connection {self.index} a second time",
                    )
                self.ctx.append(("response", fid))
                self.pending.pop(fid, None)
            if self.call_turn and not self.pending:
                self.call_turn = False
                self._owe(now)
        self.wake.set()
        return []

    def _client_content(self, cc: types.LiveClientContent, first: bool, now: float) -> None:
        sim = self.sim
        user_turn = False
        for content in cc.turns or ():
            for part in content.parts or ():
                # A turn of the session's transcript joins its entries by lines.
                for text in (part.text.split("\n") if part.text is not None else ()):
                    if not text:
                        continue
                    if text.startswith("h:"):
                        if not first or self.resumed_from is not None:
                            sim.violation(
                                "history-resent",
                                f"history {text!r} sent to connection {self.index}"
                                f"{' (resumed from ' + self.resumed_from + ')' if self.resumed_from else ''}"
                                f"{'' if first else ' after other input'}",
                            )
                        self.ctx.append(("history", text))
                    elif content.role == "model":
                        self.ctx.append(("model", text))  # what it said (or called): not a result
                    else:
                        self._take_text(text)
                        user_turn = user_turn or content.role == "user"
                if part.text is not None:
                    continue
                if part.function_response is not None:
                    fr = part.function_response
                    text = f"{fr.id} {fr.name} {fr.response}"
                    sim.log(f"model {self.index}: function response as context {text!r}")
                    self.ctx.append(("context", text))
                    user_turn = True
                elif part.function_call is not None:
                    self.ctx.append(("context", f"{part.function_call.id} {part.function_call.name}"))
        if cc.turn_complete and (user_turn or cc.turns):
            self._owe(now)

    def _take_text(self, text: str) -> None:
        """A user text: typed turns (q:N, several when joined) and any context note."""
        for q in _TYPED.findall(text):
            self.sim.log(f"model {self.index}: turn {q!r}")
            self.ctx.append(("user", q))
        rest = _TYPED.sub("", text).strip()
        if rest:
            self.sim.log(f"model {self.index}: context {rest[:160]!r}")
            self.ctx.append(("context", rest))

    def _user_text(self, text: str, now: float) -> None:
        self._take_text(text)
        self._owe(now)

    def _owe(self, now: float) -> None:
        self.owed = True
        self.reply_at = now + self.sim.rng.uniform(0.05, 1.0)
        if self.gen is not None and self.sim.chaos and self.sim.rng.random() < 0.3:
            self.interrupt_pending = True

    def _end_utterance(self, now: float, *, force: bool) -> None:
        spoke = self.audio_in_utterance
        self.speaking_since = None
        self.audio_in_utterance = 0
        if force or spoke:
            rng = self.sim.rng
            if spoke or rng.random() < 0.7:
                # Transcription is on: what the user said is transcribed, before any answer.
                self.heard += 1
                self.push(double.input_transcript(f"u{self.index}.{spoke}", finished=True))
            if rng.random() < 0.85 or not self.sim.chaos:
                self.ctx.append(("speech", str(spoke)))
                self._owe(now)

    # -- faults
    def _close_now(self, code: int, reason: str = "") -> None:
        self.sim.log(f"model {self.index}: closes {code} {reason!r} (receiver first)")
        self.drop(code, reason)
        self.ended_at = self.sim.now()

    def _close_sender_first(self, code: int) -> None:
        """The socket died and the sending side notices first."""
        self.sim.log(f"model {self.index}: socket dies {code} (sender first)")
        self.drop(code, "" if code == 1006 else "Internal error", seen_by="sender")
        self.dead = True
        self.ended_at = self.sim.now()

    def _violation(self, reason: str) -> None:
        # The double's own strictness: what the service rejects closes with 1007.
        self.sim.model_rejections.append(f"connection {self.index}: {reason}")
        self.sim.log(f"model {self.index}: rejects the input and closes 1007: {reason}")
        self.ended_at = self.sim.now()
        super()._violation(reason)

    def _fault(self, now: float) -> None:
        rng = self.sim.rng
        kind = rng.choices(
            ["drop_recv", "drop_send", "go_away", "stall", "close_1000", "cancel", "1008_working"],
            [0.25, 0.2, 0.3, 0.08, 0.05, 0.12, 0.1],
        )[0]
        self.fault_at = now + rng.expovariate(1 / 6.0)
        if kind == "drop_recv":
            self._close_now(rng.choice([1006, 1011]), "" if rng.random() < 0.5 else "Internal error")
            self.fault_at = math.inf
        elif kind == "drop_send" and "sender_drop" not in self.sim.avoid:
            self._close_sender_first(rng.choice([1006, 1011]))
            self.fault_at = math.inf
        elif kind == "go_away" and self.go_away_at is None:
            left = rng.choice([rng.uniform(0.1, 1.5), rng.uniform(1.5, 12.0)])
            self.go_away_at = now + left
            self.sim.log(f"model {self.index}: go-away, {left:.2f} s left")
            self.push(double.go_away(round(left, 3)))
        elif kind == "stall":
            self.stalling = True
            self.sim.log(f"model {self.index}: stops answering")
        elif kind == "close_1000":
            self._close_now(1000)
            self.fault_at = math.inf
        elif kind == "1008_working" and self.worked:
            # Mid-session, often right after a tool response (forum #109319):
            # not a configuration error on a connection that had worked.
            self._close_now(1008, "Requested entity was not found.")
            self.fault_at = math.inf
        elif kind == "cancel" and self.pending:
            call_id = rng.choice(sorted(self.pending))
            self.pending.pop(call_id)
            self.cancelled.add(call_id)
            self.sim.log(f"model {self.index}: cancels call {call_id}")
            self.push(double.tool_call_cancellation(call_id))
            if self.call_turn and not self.pending:
                self.call_turn = False
                self._owe(now)

    # -- the model's own pace
    def _idle(self) -> bool:
        return self.gen is None and not self.owed and not self.pending

    def _maybe_handle(self, p: float) -> None:
        rng = self.sim.rng
        if rng.random() >= p:
            return
        self.handles += 1
        handle = f"h{self.index}.{self.handles}"
        resumable = self._idle() and not (self.sim.chaos and rng.random() < 0.1)
        if resumable:
            self.sim.handles[handle] = tuple(self.ctx)
        self.sim.log(f"model {self.index}: handle {handle} resumable={resumable}")
        self.push(double.resumption_update(handle if resumable else None, resumable=resumable))

    def _next_wake(self, now: float) -> float:
        times = [self.fault_at, now + 2.0]
        if self.go_away_at is not None:
            times.append(self.go_away_at)
        if self.gen is not None:
            times.append(self.gen.next_at)
        elif self.owed and not self.stalling:
            times.append(self.reply_at)
        if self.speaking_since is not None and self.auto_vad:
            times.append(self.last_audio + 0.4)
        return max(0.0, min(times) - now) + 1e-6

    async def _mind(self) -> None:
        sim = self.sim
        try:
            while not (self.closed or self.dead):
                self.wake = anyio.Event()
                with anyio.move_on_after(self._next_wake(sim.now())):
                    await self.wake.wait()
                if self.closed or self.dead:
                    break
                self._step(sim.now())
        finally:
            if self.ended_at is None:
                self.ended_at = sim.now()

    def _step(self, now: float) -> None:
        sim = self.sim
        rng = sim.rng
        if not sim.chaos:
            self.stalling = False
            self.fault_at = math.inf
        if self.go_away_at is not None and now >= self.go_away_at:
            if self.sim.rng.random() < 0.5:
                self._close_now(1000, "go-away deadline")
            else:  # as the service often ends it (sokuji#179)
                self._close_now(1011, "Deadline expired before operation could complete.")
            return
        if now >= self.fault_at:
            self._fault(now)
            if self.closed or self.dead:
                return
        if self.speaking_since is not None and self.auto_vad and now >= self.last_audio + 0.4:
            if rng.random() < 0.5:
                self.heard += 1
                self.push(double.input_transcript(f"u{self.index}.partial"))
            self._end_utterance(now, force=False)
        if self.gen is not None and self.interrupt_pending:
            self.interrupt_pending = False
            gen = self.gen.gen
            self.gen = None
            sim.gen_interrupted.add(gen)
            events: list[Any] = [double.interrupted()]
            for k in range(rng.choice([0, 0, 1, 2])):
                events.append(double.audio(_tag_audio(gen, 100 + k)))
            # The service closes an interrupted turn with its own turnComplete (as
            # Gemini does); audio of the cut reply still in flight comes before it.
            closed = True
            events.append(double.turn_complete())
            sim.log(f"model {self.index}: interrupted g{gen} ({len(events) - 1} late)")
            self.push(*events)
            if not closed and rng.random() < 0.3:
                # Audio of the cut reply already on its way, arriving a while later (never
                # after a turn_complete, nor after the next reply began).
                delay = rng.choice([0.2, 0.8, 2.0])
                turns, heard = self.turns, self.heard

                async def late() -> None:
                    await anyio.sleep(delay)
                    if not self.closed and self.gen is None and (self.turns, self.heard) == (turns, heard):
                        sim.log(f"model {self.index}: late audio of g{gen}, {delay} s after the interruption")
                        self.push(double.audio(_tag_audio(gen, 200)))

                sim.tg.start_soon(late)
            return
        self.interrupt_pending = False
        gen = self.gen
        if gen is not None:
            if now < gen.next_at:
                return
            if gen.chunks_left > 0:
                gen.chunks_left -= 1
                k = gen.chunks_left
                # A reply's transcript follows the audio it transcribes: the first
                # chunk is audio (or text, for a written reply).
                roll = rng.random() if gen.started else rng.choice([0.0, 0.85])
                gen.started = True
                if roll < 0.55:
                    self.push(double.audio(_tag_audio(gen.gen, k)))
                elif roll < 0.8:
                    self.push(double.output_transcript(f"g{gen.gen}.{k} "))
                elif roll < 0.9:
                    self.push(double.text(f"g{gen.gen}.{k} "))
                else:
                    self.push(
                        double.bundle(
                            double.audio(_tag_audio(gen.gen, k)),
                            double.output_transcript(f"g{gen.gen}.{k} "),
                        )
                    )
                gen.next_at = now + rng.uniform(0.01, 0.3)
                return
            self.gen = None
            events = []
            generated = rng.random() < 0.5
            if generated:
                events.append(double.generation_complete())
            if rng.random() < 0.3:
                events.append(double.usage(prompt=10, response=20))
            events.append(double.turn_complete())
            if rng.random() < 0.2:
                # The tail of the reply's transcript after its generation ended
                # (Gemini does not order them): it belongs to this reply, marked
                # late; after turnComplete, or in its message (3.x bundles).
                tail = double.output_transcript(f"g{gen.gen}.tail ")
                if generated and rng.random() < 0.5:
                    events[-1] = double.bundle(tail, events[-1])
                else:
                    events.append(tail)
            self.completes[id(events[-1] if events[-1].server_content.turn_complete else events[-2])] = gen.gen
            for q in gen.answers:
                sim.answered[q] = self.index
            sim.log(f"model {self.index}: g{gen.gen} complete")
            self.push(*events)
            self._maybe_handle(0.8)
            return
        if self.owed and not self.stalling and now >= self.reply_at:
            self.owed = False
            if rng.random() < 0.3:
                self._call_tools(now)
            else:
                sim.gens += 1
                answers = tuple(q for kind, q in self.ctx if kind == "user" and q not in sim.answered)
                self.gen = Generation(sim.gens, rng.randint(1, 8), now, answers)
                self.worked = True
                self.turns += 1
                sim.log(f"model {self.index}: starts reply g{sim.gens}")
            return
        self._maybe_handle(0.15)

    def _call_tools(self, now: float) -> None:
        sim = self.sim
        rng = sim.rng
        calls = []
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            sim.calls += 1
            call_id = f"c{self.index}.{sim.calls}"
            name = SERVER_TOOL if rng.random() < 0.6 else CLIENT_TOOL
            calls.append(types.FunctionCall(id=call_id, name=name, args={"token": call_id}))
            self.issued[call_id] = name
            self.pending[call_id] = name
            self.ctx.append(("call", call_id))
        self.call_turn = True
        self.worked = True
        self.turns += 1
        sim.log(f"model {self.index}: calls {[(c.id, c.name) for c in calls]}")
        self.push(double.tool_calls(*calls))


# --------------------------------------------------------------------------- one run


@dataclasses.dataclass
class Outcome:
    seed: int
    violations: list[str]
    trace: list[str]
    end_reason: str | None
    connects: int
    virtual_seconds: float
    cpu_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.violations


class _ErrorLog(logging.Handler):
    def __init__(self, sim: Simulation) -> None:
        super().__init__(logging.ERROR)
        self.sim = sim

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
                exc = exc.exceptions[0]
            text = f"{record.msg % ('<id>',) if record.msg.count('%s') == 1 else text}: {type(exc).__name__}: {str(exc)[:200]}"
            exc = record.exc_info[1]
            self.sim.tracebacks.append("".join(traceback.format_exception(exc))[-3000:])
        self.sim.logged_errors.append(text)
        self.sim.log(f"server log ERROR {text}")


# Inputs and faults that trigger known defects, which a run can leave out
# (`--avoid activity,deep_json`) to look past them.
AVOIDABLE = ("activity", "deep_json", "sender_drop", "model_last_history")


class Simulation:
    def __init__(self, seed: int, avoid: frozenset[str] = frozenset()) -> None:
        self.seed = seed
        self.avoid = avoid
        self.rng = random.Random(seed)
        self.trace: list[str] = []
        self.violations: list[str] = []
        self.chaos = True
        self.handles: dict[str, tuple[tuple[str, str], ...]] = {}
        self.handle_delivered = False
        # A handle reached the server since the session last started fresh, and
        # whether the last refused connect was a resume refused for its handle.
        self.handle_since_fresh = False
        self.stale_refusal = False
        self.answered: dict[str, int] = {}  # typed turn -> the connection that answered it in full
        self.delivered_handles: list[str] = []
        self.established: list[SimSession] = []
        self.connections: list[SimSession] = []
        self.model_rejections: list[str] = []
        self.fatal_injected = False
        self.logged_errors: list[str] = []
        self.tracebacks: list[str] = []
        self.gens = 0
        self.calls = 0
        self.typed: list[str] = []
        self.history: list[dict[str, Any]] = []
        # What the client saw.
        self.events: list[tuple[float, Any]] = []
        self.closed_event: dict[str, Any] | None = None
        self.gens_seen: set[int] = set()
        self.gens_closed: dict[int, str] = {}
        self.client_calls: dict[str, str] = {}  # id -> name, waiting for the client
        self.client_answered: dict[str, str] = {}
        self.results_seen: set[str] = set()
        self.cancelled_seen: set[str] = set()
        self.timed_out: set[str] = set()
        self.error_events: list[dict[str, Any]] = []
        self.gen_first: dict[int, float] = {}
        self.audio_delivered: collections.Counter[int] = collections.Counter()
        self.audio_received: collections.Counter[int] = collections.Counter()
        self.gen_completed: dict[int, float] = {}
        self.gen_interrupted: set[int] = set()
        self.disruptions: list[float] = []  # when the client heard of an interruption or a lost connection
        # From session.reconnecting to session.resumed: the old connection is retired,
        # and what it still generates never reaches the client (by design).
        self.switches: list[tuple[float, float]] = []
        self.switching_since: float | None = None
        self.server_done = anyio.Event()
        self.session: Any = None
        self.tg: Any = None
        self.model = self.rng.choice(MODELS)

    # -- bookkeeping
    def now(self) -> float:
        return trio.current_time()

    def log(self, line: str) -> None:
        self.trace.append(f"{self.now():9.3f}  {line}")

    def violation(self, rule: str, detail: str) -> None:
        text = f"[{rule}] {detail}"
        self.violations.append(text)
        self.log(f"VIOLATION {text}")

    def random_refusal(self) -> double.Close:
        rng = self.rng
        if rng.random() < 0.85:
            return double.Close(rng.choice([1006, 1011]), "" if rng.random() < 0.5 else "Internal error")
        return rng.choice(
            [
                double.Close(1007, "Request contains an invalid argument."),
                double.Close(1008, "Requested entity was not found."),
                double.Close(1011, "RESOURCE_EXHAUSTED: quota exceeded"),
            ]
        )

    def make_session(self) -> SimSession:
        session = SimSession(self, len(self.connections))
        self.connections.append(session)
        return session

    # -- what the server sends the client
    def server_frame(self, frame: str | bytes) -> None:
        if self.closed_event is not None:
            self.violation("after-closed", f"the client got {str(frame)[:100]!r} after session.closed")
        if isinstance(frame, bytes):
            gen = _audio_gen(frame)
            # The server joins audio chunks that are due together into one frame.
            for offset in range(0, len(frame) - 7, _CHUNK_BYTES):
                chunk_gen = _audio_gen(frame[offset : offset + 8])
                if chunk_gen is not None:
                    self.audio_received[chunk_gen] += 1
            self.log(f"client <- audio g{gen}")
            self._output(gen, "audio")
            return
        event = json.loads(frame)
        kind = event.get("type")
        self.events.append((self.now(), event))
        self.log(f"client <- {frame[:160]}")
        if kind == "transcript.output" and event.get("heard"):
            pass  # what the user heard of a cut reply: sent after turn.interrupted by design
        elif kind == "transcript.output" and event.get("late"):
            gen = _gen_of_text(event.get("text", ""))
            if gen is not None and gen not in self.gens_closed:
                self.violation("late-tail", f"a late transcript of reply g{gen} reached the client before its turn ended")
        elif kind in ("transcript.output", "text"):
            final = " (final)" if event.get("final") else ""
            self._output(_gen_of_text(event.get("text", "")), kind + final)
        elif kind in ("turn.complete", "turn.interrupted"):
            if kind == "turn.interrupted" or event.get("reason"):
                self.disruptions.append(self.now())
            reason = f"({event['reason']})" if event.get("reason") else ""
            for gen in self.gens_seen - set(self.gens_closed):
                self.gens_closed[gen] = kind + reason
        elif kind == "session.closed":
            self.closed_event = event
        elif kind == "session.reconnecting":
            self.disruptions.append(self.now())
            self.switching_since = self.now()
        elif kind in ("session.resumed", "session.reattached"):
            if self.switching_since is not None:
                self.switches.append((self.switching_since, self.now()))
                self.switching_since = None
        elif kind == "tool.call" and event.get("runs_on") == "client":
            self.client_calls[event["id"]] = event["name"]
        elif kind == "tool.result":
            self.results_seen.add(event["id"])
        elif kind == "tool.cancelled":
            for call_id in event.get("ids", ()):
                self.cancelled_seen.add(call_id)
                self.client_calls.pop(call_id, None)
        elif kind == "error":
            self.error_events.append(event)
            if event.get("code") == "tool_timeout":
                for call_id in list(self.client_calls):
                    if repr(call_id) in event.get("message", ""):
                        self.timed_out.add(call_id)
                        self.client_calls.pop(call_id)

    def _output(self, gen: int | None, kind: str) -> None:
        if gen is None:
            return
        if gen in self.gens_closed:
            self.violation(
                "after-turn-end",
                f"{kind} of reply g{gen} reached the client after its {self.gens_closed[gen]}",
            )
        self.gens_seen.add(gen)

    # -- the client
    def send(self, ws: FakeSocket, obj: Any) -> None:
        frame = obj if isinstance(obj, (str, bytes)) else json.dumps(obj)
        if isinstance(frame, bytes):
            self.log(f"client -> audio {len(frame)} bytes")
        else:
            self.log(f"client -> {frame[:160]}{'...' if len(frame) > 160 else ''}")
        ws.client_send(frame)

    def _check_queues(self) -> None:
        session = self.session
        if session is None:
            return
        up, out = session.upstream, session.outbox
        if up._audio > CONFIG.audio_queue_frames or up._control > up._max_control:
            self.violation("queue-bound", f"upstream queue holds {up._audio} audio, {up._control} control")
        if out._events > out._max_events or out._audio_bytes > out._max_audio_bytes + 4096:
            self.violation("queue-bound", f"outbox holds {out._events} events, {out._audio_bytes} audio bytes")

    async def _client(self, ws: FakeSocket) -> str:
        """Plays the client; returns how the client ended: "closed", "vanished", "ended"."""
        rng = self.rng
        start: dict[str, Any] = {"type": "session.start", "input_audio": {"rate": 16000}}
        turns = rng.choice([0, 0, 1, 2, 3])
        if "model_last_history" in self.avoid and turns % 2 == 0:
            turns = max(0, turns - 1)
        for k in range(turns):
            role = "user" if k % 2 == 0 else "model"
            self.history.append({"role": role, "parts": [{"text": f"h:{k}"}]})
        if self.history:
            start["history"] = self.history
        manual = False
        if TURN_TAKING and rng.random() < 0.3:
            manual = True
            start["turn_taking"] = "manual"
        self.send(ws, start)
        with anyio.move_on_after(30):
            while not any(e.get("type") == "session.started" for _, e in self.events):
                if self.closed_event is not None:
                    return "ended"
                await anyio.sleep(0.05)
        if self.closed_event is not None:
            return "ended"
        chaos_end = self.now() + rng.uniform(3.0, 45.0)
        pending_results: list[tuple[float, str, str]] = []
        speaking = False
        while self.now() < chaos_end and self.closed_event is None:
            self._check_queues()
            # Client tool calls get answers, mostly.
            for call_id, name in list(self.client_calls.items()):
                if call_id not in [p[1] for p in pending_results] and call_id not in self.client_answered:
                    if rng.random() < 0.9:
                        pending_results.append((self.now() + rng.expovariate(1 / 2.0), call_id, name))
                    else:
                        self.client_answered[call_id] = "never"
            due = [p for p in pending_results if p[0] <= self.now()]
            for p in due:
                pending_results.remove(p)
                self._answer(ws, p[1], p[2])
            roll = rng.random()
            if roll < 0.35:
                n = rng.randint(3, 40)
                if manual and not speaking:
                    self.send(ws, {"type": "activity.start"})
                speaking = True
                self.log(f"client -> {n} audio frames, 20 ms apart")
                for _ in range(n):
                    ws.client_send(b"\x01\x02" * 320)
                    await anyio.sleep(0.02)
                    if self.closed_event is not None:
                        break
                if manual and rng.random() < 0.8:
                    self.send(ws, {"type": "activity.end"})
                    speaking = False
            elif roll < 0.55:
                self.typed.append(f"q:{len(self.typed)}")
                self.send(ws, {"type": "text", "text": self.typed[-1]})
            elif roll < 0.6:
                self.send(ws, {"type": "audio.end"})
            elif roll < 0.63:
                if "activity" not in self.avoid:
                    self.send(ws, {"type": rng.choice(["activity.start", "activity.end"])})
            elif roll < 0.72:
                self.send(ws, self._bad_frame())
            elif roll < 0.76:
                self._bad_tool_result(ws)
            elif roll < 0.765:
                self.log("client vanishes")
                ws.vanish()
                return "vanished"
            elif roll < 0.77:
                self.send(ws, {"type": "session.close"})
                return "closed-early"
            await anyio.sleep(rng.expovariate(1 / 0.7))
        if self.closed_event is not None:
            return "ended"
        # Calm: no more faults; the client answers what it owes, then waits.
        self.chaos = False
        self.log("--- calm ---")
        if manual and speaking:
            self.send(ws, {"type": "activity.end"})
        for call in self.connections:
            call.wake.set()
        calm_end = self.now() + CALM_SECONDS
        quiet_since: float | None = None
        while self.now() < calm_end and self.closed_event is None:
            self._check_queues()
            for call_id, name in list(self.client_calls.items()):
                if call_id not in self.client_answered:
                    self._answer(ws, call_id, name)
            if not self._quiet():
                quiet_since = None
            elif quiet_since is None:
                quiet_since = self.now()
            elif self.now() - quiet_since >= 3.0:
                break
            await anyio.sleep(0.5)
        if self.closed_event is not None:
            return "ended"
        self.send(ws, {"type": "session.close"})
        return "closed"

    def _quiet(self) -> bool:
        """Nothing in flight anywhere: the calm part may end early."""
        session = self.session
        core = session.core if session else None
        if core is None or not self.established:
            return False
        conn = self.established[-1]
        return (
            core.at_safe_point
            and not conn.closed
            and conn._idle()
            and conn.go_away_at is None
            and not self.client_calls
            and not session.outbox._frames
        )

    def _answer(self, ws: FakeSocket, call_id: str, name: str) -> None:
        if self.closed_event is not None or call_id not in self.client_calls:
            return
        self.client_answered[call_id] = name
        self.client_calls.pop(call_id, None)
        self.send(ws, {"type": "tool.result", "id": call_id, "name": name,
                       "response": {"answer": f"client answer for {call_id}"}})

    def _bad_frame(self) -> str | bytes:
        rng = self.rng
        return rng.choice(
            [
                lambda: "not json {",
                lambda: "[" * rng.choice([100, 5000, 60000] if "deep_json" not in self.avoid else [100]),
                lambda: '{"type": "nope"}',
                lambda: '{"type": "text"}',
                lambda: '"a string"',
                lambda: '{"type": "session.start"}',
                lambda: b"\x01\x02\x03",
                lambda: "{" * 20 + "}",
                lambda: '{"type": "tool.result", "id": 3}',
            ]
        )()

    def _bad_tool_result(self, ws: FakeSocket) -> None:
        rng = self.rng
        if self.client_answered and rng.random() < 0.5:
            call_id = rng.choice(sorted(self.client_answered))
            self.send(ws, {"type": "tool.result", "id": call_id, "name": CLIENT_TOOL, "response": {}})
        elif self.client_calls and rng.random() < 0.5:
            call_id = rng.choice(sorted(self.client_calls))
            self.send(ws, {"type": "tool.result", "id": call_id, "name": "wrong", "response": {}})
        else:
            self.send(ws, {"type": "tool.result", "id": "nosuch", "name": CLIENT_TOOL, "response": {}})

    # -- the whole run
    def agent(self) -> Agent:
        sim = self

        async def lookup(token: str) -> dict[str, Any]:
            """Looks a token up."""
            rng = sim.rng
            await anyio.sleep(rng.choice([0.0, rng.uniform(0, 1), rng.uniform(0, 7)]))
            if rng.random() < 0.1:
                raise RuntimeError(f"lookup of {token} failed")
            return {"value": f"looked up {token}"}

        ask = types.FunctionDeclaration(
            name=CLIENT_TOOL,
            description="Asks the user.",
            parameters=types.Schema(type=types.Type.OBJECT, properties={"token": types.Schema(type=types.Type.STRING)}),
        )
        return Agent(
            name="sim",
            model=self.model,
            tools=[lookup],
            client_tools=[ask],
            tool_timeout=TOOL_TIMEOUT,
            client_tool_timeout=CLIENT_TOOL_TIMEOUT,
        )

    async def run(self) -> None:
        transport = double.DoubleTransport(factory=self.make_session)
        sim = self

        @contextlib.asynccontextmanager
        async def slow_connect(model: str, config: types.LiveConnectConfig) -> Any:
            # Opening a connection takes a while: the old one goes on meanwhile.
            await anyio.sleep(sim.rng.choice([0.0, 0.0, 0.05, 0.3, 1.0]))
            async with transport(model, config) as session:
                yield session

        llm = Gemini(self.model, transport=slow_connect)
        server = LiveServer(self.agent(), llm, CONFIG, clock=trio.current_time)
        ws = FakeSocket(self)
        self.log(f"seed {self.seed}: model {self.model}")

        async def serve() -> None:
            try:
                await server._handle(ws)  # type: ignore[arg-type]
            finally:
                self.server_done.set()

        async def find_session() -> None:
            while not server.sessions and not self.server_done.is_set():
                await anyio.lowlevel.checkpoint()
            self.session = next(iter(server.sessions), None)

        how = "?"
        async with anyio.create_task_group() as tg:
            self.tg = tg
            tg.start_soon(serve)
            await find_session()
            how = await self._client(ws)
            with anyio.move_on_after(CLOSE_WITHIN):
                await self.server_done.wait()
            if not self.server_done.is_set():
                self.violation("no-end", f"the session did not end within {CLOSE_WITHIN:g} s of the client's {how}")
            tg.cancel_scope.cancel()
        self.log(f"client ended: {how}; server: {self.session.end_reason if self.session else None}")
        self._check_end(how)

    # -- invariants after the run
    def _check_end(self, how: str) -> None:
        session = self.session
        end_reason = session.end_reason if session else None
        if session is not None and self.server_done.is_set():
            for conn in self.connections:
                if not conn.closed and conn.refuse is None:
                    self.violation("connection-left-open", f"model connection {conn.index} still open after the session ended")
        for text in self.logged_errors:
            self.violation("server-error-logged", text)
        closed = self.closed_event
        if how in ("closed", "ended") and closed is None and how != "vanished":
            self.violation("no-session-closed", f"the client never got session.closed (client {how})")
        if how == "ended":
            self._check_unexpected_end(end_reason)
        if how != "closed" or closed is None or end_reason != "client closed the session":
            return
        # Audio of a reply that was never cut reaches the client whole.
        for gen, done in self.gen_completed.items():
            if gen in self.gen_interrupted:
                continue
            start = self.gen_first.get(gen, done)
            if any(start <= t <= done + 2.0 for t in self.disruptions):
                continue
            if any(a <= start <= b for a, b in self.switches) or (
                self.switching_since is not None and start >= self.switching_since
            ):
                continue  # generated by a connection already being replaced
            sent, got = self.audio_delivered[gen], self.audio_received[gen]
            if got < sent:
                self.violation(
                    "audio-lost",
                    f"reply g{gen} completed without interruption, but only {got} of its {sent} "
                    "audio chunks reached the client",
                )
        # An orderly close after the calm: what the model must know.
        final = self.established[-1] if self.established else None
        if final is None:
            return
        ctx = final.ctx
        for q in self.typed:
            count = sum(1 for item in ctx if item == ("user", q))
            if count == 0 and q in self.answered:
                # Answered in full, then its connection died before a handle held it:
                # not sent again, so the user does not hear the answer twice (a
                # documented limit of resumption).
                continue
            if count != 1:
                self.violation(
                    "typed-turn",
                    f"typed turn {q!r} is in the final model context {count} times "
                    f"(connection {final.index}, resumed from {final.resumed_from!r}); "
                    + self._whereabouts(("user", q)),
                )
        must_know = set(self.results_seen) | set(self.timed_out)
        must_know |= {c for c, name in self.client_answered.items() if name != "never"}
        rejected = {
            call_id
            for e in self.error_events
            if e.get("code") in ("tool_call_closed", "unknown_tool_call")
            for call_id in [*must_know]
            if repr(call_id) in e.get("message", "")
        }
        must_know -= rejected
        must_know -= self.cancelled_seen
        known = {cid for kind, cid in ctx if kind == "response"}
        context = " ".join(text for kind, text in ctx if kind == "context")
        for call_id in sorted(must_know):
            if call_id in known or call_id in context:
                continue
            told = [
                e for e in self.error_events
                if e.get("code") not in _TOOL_INPUT_ERRORS and call_id in e.get("message", "")
            ]
            if told:
                continue
            self.violation(
                "tool-result-unknown",
                f"call {call_id} ran, but its result is neither in the final model context "
                f"(connection {final.index}, resumed from {final.resumed_from!r}) nor reported "
                "to the client; " + self._whereabouts(("response", call_id)),
            )

    def _whereabouts(self, item: tuple[str, str]) -> str:
        """Where a lost item went: which connection got it, and whether a handle covered it."""
        kind, key = item
        got = [
            c.index
            for c in self.established
            if item in c.ctx or (kind == "response" and any(key in t for k, t in c.ctx if k == "context"))
        ]
        answered = ""
        if kind == "user":
            who = self.answered.get(key)
            answered = (
                f"; connection {who} answered it in full" if who is not None else "; never answered"
            )
        if not got:
            ignored = [c.index for c in self.established if item in c.ignored_items]
            if ignored:
                return (
                    f"connection(s) {ignored} did not process it: realtime input before the "
                    "history seed's turn_complete, under the history flag"
                )
            return "no connection received it" + answered
        covering = [h for h, snap in self.handles.items() if item in snap]
        delivered = [h for h in covering if h in self.delivered_handles]
        if delivered:
            return (
                f"connection(s) {got} received it; handle(s) {delivered} covering it reached the "
                "server, yet the session went on from an older state" + answered
            )
        return (
            f"connection(s) {got} received it; no handle covering it reached the server "
            "(the model was not resumable since), and it was not sent again after the reconnect"
            + answered
        )

    def _check_unexpected_end(self, end_reason: str | None) -> None:
        """The session ended before the client closed it: was that allowed?"""
        last_error = next(
            (e for _, e in reversed(self.events) if e.get("type") == "error" and e.get("fatal")), None
        )
        code = last_error.get("code") if last_error else None
        why = f"{code}: {last_error.get('message') if last_error else end_reason}"
        if end_reason and end_reason.startswith("client closed"):
            return
        if code in _FATAL_CODES and self.fatal_injected and not self.model_rejections:
            return
        if code == "model_connection_lost":
            message = last_error.get("message", "") if last_error else ""
            attempts = CONFIG.reconnect_attempts
            tail = self.connections[-attempts:]
            if "gave up" in message and len(tail) == attempts and all(
                c.refuse is not None or (c.ended_at or self.now()) - c.opened_at < CONFIG.stable_after
                for c in tail
            ):
                return
        detail = why
        if self.model_rejections:
            detail += f" (the model rejected: {'; '.join(self.model_rejections)})"
        self.violation("session-ended", f"the session ended before the client closed it: {detail}")


@contextlib.contextmanager
def _deadlines_in_order() -> Any:
    """Trio breaks ties between equal deadlines by `id(cancel_scope)`, a memory
    address (trio/_core/_run.py, `Deadlines.add`). In virtual time deadlines tie
    all the time, so which timeout fires first, and so the order tasks wake in,
    would hang on where earlier runs in this process (and the garbage collector)
    left free memory. Break the ties by the order the deadlines were set instead."""
    deadlines = trio._core._run.Deadlines
    real_add = deadlines.add
    order = itertools.count()

    def add(self: Any, deadline: float, cancel_scope: Any) -> None:
        heapq.heappush(self._heap, (deadline, next(order), cancel_scope))
        self._active += 1

    deadlines.add = add  # type: ignore[method-assign]
    try:
        yield
    finally:
        deadlines.add = real_add  # type: ignore[method-assign]


def run_seed(seed: int, avoid: frozenset[str] = frozenset()) -> Outcome:
    """Run one seeded conversation; its outcome holds the violations and the trace."""
    cpu_started = time.process_time()
    trio._core._run._r.seed(seed)  # the scheduler's choices among ready tasks
    sim = Simulation(seed, avoid)
    handler = _ErrorLog(sim)
    server_log = logging.getLogger("live")
    server_log.addHandler(handler)
    propagate, level = server_log.propagate, server_log.level
    server_log.propagate = False
    server_log.setLevel(logging.WARNING)
    # Session and call ids come from uuid4: from the seed too, so a trace replays byte for byte.
    ids = random.Random(seed)
    real_uuid4 = uuid.uuid4
    uuid.uuid4 = lambda: uuid.UUID(int=ids.getrandbits(128), version=4)  # type: ignore[assignment]
    try:
        with _deadlines_in_order():
            anyio.run(
                sim.run,
                backend="trio",
                backend_options={"clock": trio.testing.MockClock(autojump_threshold=0)},
            )
    except BaseException as exc:  # noqa: BLE001 - a crash of the harness is a finding too
        if isinstance(exc, KeyboardInterrupt):
            raise
        sim.violations.append(f"[crash] {type(exc).__name__}: {exc}")
        sim.tracebacks.append("".join(traceback.format_exception(exc))[-4000:])
    finally:
        uuid.uuid4 = real_uuid4  # type: ignore[assignment]
        server_log.removeHandler(handler)
        server_log.propagate = propagate
        server_log.setLevel(level)
    session = sim.session
    return Outcome(
        seed=seed,
        violations=sim.violations,
        trace=sim.trace + ([""] + sim.tracebacks if sim.tracebacks else []),
        end_reason=session.end_reason if session else None,
        connects=len(sim.connections),
        virtual_seconds=sim.trace and float(sim.trace[-1].split()[0]) or 0.0,
        cpu_seconds=time.process_time() - cpu_started,
    )


def replay_command(seed: int, avoid: frozenset[str] = frozenset()) -> str:
    extra = f" --avoid {','.join(sorted(avoid))}" if avoid else ""
    return f".venv/bin/python -m tests.simulation --seed {seed}{extra} -v"


def rule_of(violation: str) -> str:
    return violation[1 : violation.index("]")] if violation.startswith("[") else violation


def run_many(seeds: range, *, jobs: int = 1, avoid: frozenset[str] = frozenset()) -> list[Outcome]:
    run = functools.partial(run_seed, avoid=avoid)
    if jobs <= 1:
        return [run(s) for s in seeds]
    import concurrent.futures
    import multiprocessing

    # Fresh processes, not forks of the caller (a test run's process holds
    # threads and sockets a fork would inherit); a worker that dies fails the
    # run (BrokenProcessPool) instead of leaving it waiting forever.
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
        return list(pool.map(run, seeds, chunksize=max(1, len(seeds) // (jobs * 8))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, help="run one seed")
    parser.add_argument("--seeds", type=int, default=1000, help="how many seeds to run")
    parser.add_argument("--start", type=int, default=0, help="the first seed")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--avoid", default="", help=f"leave out inputs that trigger known defects: {','.join(AVOIDABLE)}")
    parser.add_argument("-v", "--verbose", action="store_true", help="print the event trace")
    args = parser.parse_args(argv)
    avoid = frozenset(a for a in args.avoid.split(",") if a)
    unknown = avoid - set(AVOIDABLE)
    if unknown:
        parser.error(f"--avoid: unknown {sorted(unknown)}; choose from {','.join(AVOIDABLE)}")
    if args.seed is not None:
        outcome = run_seed(args.seed, avoid)
        if args.verbose:
            print("\n".join(outcome.trace))
        for v in outcome.violations:
            print(f"seed {args.seed}: {v}")
        print(f"seed {args.seed}: {'ok' if outcome.ok else 'FAILED'}; "
              f"{outcome.connects} connects, ended: {outcome.end_reason}")
        return 0 if outcome.ok else 1
    started = time.perf_counter()
    outcomes = run_many(range(args.start, args.start + args.seeds), jobs=args.jobs, avoid=avoid)
    elapsed = time.perf_counter() - started
    by_rule: dict[str, list[int]] = collections.defaultdict(list)
    for o in outcomes:
        for rule in dict.fromkeys(rule_of(v) for v in o.violations):
            by_rule[rule].append(o.seed)
    failed = [o for o in outcomes if not o.ok]
    cpu = sum(o.cpu_seconds for o in outcomes)
    print(f"{len(outcomes)} seeds in {elapsed:.1f} s with {args.jobs} jobs ({cpu / len(outcomes) * 1000:.1f} ms "
          f"of CPU each, {sum(o.virtual_seconds for o in outcomes) / len(outcomes):.0f} s of virtual time); "
          f"{len(failed)} failed")
    for rule, seeds in sorted(by_rule.items(), key=lambda kv: -len(kv[1])):
        example = next(o for o in failed if o.seed == seeds[0])
        first = next(v for v in example.violations if rule_of(v) == rule)
        print(f"  {rule}: {len(seeds)} seeds, e.g. {replay_command(seeds[0], avoid)}\n      {first[:300]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
