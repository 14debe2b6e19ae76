"""Replay a session record against the server, and compare what it does.

The transport double (`connections.double`) plays the model's recorded side:
each recorded model connection becomes a scripted session whose responses
come once the server has sent what preceded them in the record (the same
number of non-audio messages and at least as many audio bytes), after the
pauses they came after. The client's recorded messages and audio are re-sent
at their recorded times. The server's events are then compared with the
recorded ones by type, order and content; audio is compared as the number of
bytes between two events, and times within `tolerance` seconds.

From pytest, one line makes a regression test of a record::

    from live.testing.replay import assert_replays

    async def test_the_weather_conversation_still_goes_the_same_way():
        await assert_replays("tests/records/weather", agent=my_agent)

From a terminal: `live replay RECORD [--agent MODULE:ATTR]`.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import anyio
from google.genai import types
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from live.agent import Agent, agent_at
from live.llm import LlmResponse
from live.observe.record import Record, load, redact, response_from_json

__all__ = ["Difference", "ReplayResult", "assert_replays", "replay", "server_messages"]

# Fields that differ from run to run by design.
VOLATILE = {"session.started": ("session_id", "resume_token")}
"""Fields that differ in every run, per event type; `seq` is left out of every event."""


# ---------------------------------------------------------------- the model's side


def server_messages(response: LlmResponse) -> list[types.LiveServerMessage]:
    """Wire messages that the Gemini connection code maps back to `response`."""
    content: dict[str, Any] = {}
    message: dict[str, Any] = {}
    if response.content is not None and response.content.parts:
        calls = [p.function_call for p in response.content.parts if p.function_call is not None]
        others = [p for p in response.content.parts if p.function_call is None]
        if calls:
            message["tool_call"] = types.LiveServerToolCall(function_calls=calls)
        if others:
            content["model_turn"] = types.Content(role="model", parts=others)
    for name in ("input_transcription", "output_transcription"):
        value = getattr(response, name)
        if value is not None and value.finished:
            # A final the model sent goes as it came; one the mapper put
            # together at the turn's end is put together again from the fragments.
            value = getattr(response, f"{name}_sent")
        if value is not None:
            content[name] = value
    for name in ("grounding_metadata", "turn_complete_reason"):
        value = getattr(response, name)
        if value is not None:
            content[name] = value
    for name in ("turn_complete", "interrupted", "generation_complete", "waiting_for_input"):
        if getattr(response, name):
            content[name] = True
    if content:
        message["server_content"] = types.LiveServerContent(**content)
    if response.usage_metadata is not None:
        message["usage_metadata"] = response.usage_metadata
    if response.go_away_time_left is not None:
        message["go_away"] = types.LiveServerGoAway(time_left=f"{response.go_away_time_left:g}s")
    if response.session_resumption_update is not None:
        message["session_resumption_update"] = response.session_resumption_update
    if response.cancelled_tool_call_ids:
        message["tool_call_cancellation"] = types.LiveServerToolCallCancellation(
            ids=list(response.cancelled_tool_call_ids)
        )
    if response.voice_activity is not None:
        message["voice_activity"] = response.voice_activity
    return [types.LiveServerMessage(**message)] if message else []


@dataclasses.dataclass
class _Step:
    """Model output due once the server sent `messages` non-audio messages and `audio` bytes."""

    messages: int
    audio: int
    events: list[Any]


def _model_audio(record: Record) -> Iterator[bytes]:
    pcm = record.audio("model")
    offset = 0
    for entry in record.of("model"):
        for part in (entry["response"].get("content") or {}).get("parts", []):
            if "audio" in part:
                n = part["audio"]
                yield pcm[offset : offset + n]
                offset += n


def model_sessions(record: Record) -> list[Any]:
    """One scripted double session per recorded model connection, in order."""
    from connections import double  # the double is for tests and replays only

    audio = _model_audio(record)
    by_conn: dict[int, list[dict[str, Any]]] = {}
    for entry in record.of("model.connect", "model.send", "model", "model.end"):
        by_conn.setdefault(entry["conn"], []).append(entry)
    sessions = []
    for conn in sorted(by_conn):
        entries = by_conn[conn]
        end = next((e for e in entries if e["kind"] == "model.end"), None)
        if end is not None and end["how"] == "connect_failed":
            sessions.append(
                double.ScriptedSession(
                    refuse=double.Close(end.get("close_code") or 1011, end.get("reason", end.get("message", "")))
                )
            )
            continue
        steps: list[_Step] = []
        messages = audio_bytes = 0
        last = entries[0]["t"]  # the connect
        for entry in entries[1:]:
            kind = entry["kind"]
            if kind == "model.send":
                if "audio" in entry:
                    audio_bytes += entry["audio"]
                else:
                    messages += 1
                last = max(last, entry["t"])
                continue
            pause = max(0.0, entry["t"] - last)
            last = entry["t"]
            events: list[Any] = [double.Pause(pause)] if pause > 0.005 else []
            if kind == "model":
                events += server_messages(response_from_json(entry["response"], audio))
            elif kind == "model.end" and entry["how"] in ("error", "model_closed"):
                events.append(double.Close(entry.get("close_code") or 1000, entry.get("reason", entry.get("message", ""))))
            else:
                continue
            if steps and (steps[-1].messages, steps[-1].audio) == (messages, audio_bytes):
                steps[-1].events += events
            else:
                steps.append(_Step(messages, audio_bytes, events))
        sessions.append(_scripted(double, steps))
    return sessions


def _scripted(double: Any, steps: list[_Step]) -> Any:
    session = double.ScriptedSession()
    pending = list(steps)
    counted = {"messages": 0}

    def due(message: types.LiveClientMessage) -> Iterable[Any]:
        realtime = message.realtime_input
        if realtime is None or realtime.audio is None:
            counted["messages"] += 1
        out: list[Any] = []
        while pending and pending[0].messages <= counted["messages"] and pending[0].audio <= session.audio_bytes:
            out += pending.pop(0).events
        return out

    while pending and pending[0].messages == 0 and pending[0].audio == 0:
        session.push(*pending.pop(0).events)
    session.on(lambda m: True, due, times=None)
    return session


# ---------------------------------------------------------------- comparing


@dataclasses.dataclass(frozen=True)
class Item:
    """One thing the client got: an event, or a run of audio (`audio` bytes)."""

    t: float
    type: str
    event: dict[str, Any] | None = None
    audio: int = 0

    def __str__(self) -> str:
        if self.type == "audio":
            return f"{self.t:.3f} audio {self.audio} bytes ({self.audio / 48_000:.2f} s)"
        return f"{self.t:.3f} {json.dumps(self.event, sort_keys=True)}"


@dataclasses.dataclass(frozen=True)
class Difference:
    index: int
    expected: Item | None
    got: Item | None
    why: str

    def __str__(self) -> str:
        return f"#{self.index}: {self.why}\n  expected: {self.expected}\n  got:      {self.got}"


@dataclasses.dataclass
class ReplayResult:
    expected: list[Item]
    got: list[Item]
    differences: list[Difference]

    @property
    def ok(self) -> bool:
        return not self.differences

    def report(self) -> str:
        if self.ok:
            return f"replay matches the record: {len(self.got)} events and audio runs"
        lines = [f"replay differs from the record in {len(self.differences)} place(s):"]
        lines += [str(d) for d in self.differences[:10]]
        return "\n".join(lines)


def _kind(frame: dict[str, Any]) -> str:
    """An event's type: ours, or a Live API message's field (and what it says)."""
    if "type" in frame:
        return str(frame["type"])
    names = [name for name in frame if name != "usageMetadata"] or list(frame)
    if not names:
        return "?"
    body = frame[names[0]]
    inner = next(iter(body), None) if isinstance(body, dict) else None
    return f"{names[0]}.{inner}" if inner else names[0]


def _collapse(frames: Iterable[tuple[float, Any]]) -> list[Item]:
    """Events as items; consecutive audio as one item with its byte count."""
    items: list[Item] = []
    for t, frame in frames:
        if isinstance(frame, int):
            if items and items[-1].type == "audio":
                prev = items[-1]
                items[-1] = Item(prev.t, "audio", audio=prev.audio + frame)
            else:
                items.append(Item(t, "audio", audio=frame))
        else:
            for key in VOLATILE.get(frame.get("type"), ()):
                frame.pop(key, None)
            frame.pop("seq", None)
            if isinstance(frame.get("setupComplete"), dict):
                frame["setupComplete"].pop("sessionId", None)  # a new session's id, every run
            items.append(Item(t, _kind(frame), event=redact(frame)))
    return items


def compare(expected: list[Item], got: list[Item], *, tolerance: float, audio_tolerance: int) -> list[Difference]:
    differences = []
    for index in range(max(len(expected), len(got))):
        e = expected[index] if index < len(expected) else None
        g = got[index] if index < len(got) else None
        if e is None or g is None:
            differences.append(Difference(index, e, g, "missing" if g is None else "unexpected"))
            break  # after a missing or extra item, the rest is shifted
        if e.type != g.type:
            differences.append(Difference(index, e, g, f"expected {e.type}, got {g.type}"))
            break
        if e.type == "audio":
            if abs(e.audio - g.audio) > audio_tolerance:
                differences.append(Difference(index, e, g, f"audio differs by {g.audio - e.audio} bytes"))
        elif e.event != g.event:
            differences.append(Difference(index, e, g, "content differs"))
        if abs(e.t - g.t) > tolerance:
            differences.append(Difference(index, e, g, f"came {g.t - e.t:+.3f} s off its recorded time"))
    return differences


# ---------------------------------------------------------------- running


def _client_script(record: Record) -> list[tuple[float, int, str | bytes]]:
    """What the client sent: its time, how many server events it had been sent by then, the frame."""
    pcm = record.audio("in")
    offset = 0
    events_before = 0
    out: list[tuple[float, int, str | bytes]] = []
    for entry in record.of("client", "client.audio", "server"):
        if entry["kind"] == "server":
            events_before += 1
        elif entry["kind"] == "client.audio":
            n = entry["n"]
            out.append((entry["t"], events_before, pcm[offset : offset + n]))
            offset += n
        elif not entry.get("invalid"):
            message = dict(entry["event"])
            if message.get("type") == "image":
                continue  # a record keeps an image's size, not the picture
            if message.get("token") == "<redacted>":
                del message["token"]  # the replaying server asks for none
            out.append((entry["t"], events_before, json.dumps(message)))
    return out


def _as_live_api(frame: str | bytes, setup: dict[str, Any]) -> str | None:
    """A recorded client input as a Live API app sends it (None: nothing to send)."""
    if isinstance(frame, bytes):
        blob = {"data": base64.b64encode(frame).decode("ascii"), "mimeType": "audio/pcm;rate=16000"}
        return json.dumps({"realtimeInput": {"audio": blob}})
    message = json.loads(frame)
    kind = message.get("type")
    if kind == "session.start":
        return json.dumps({"setup": setup})
    if kind == "text":
        return json.dumps({"realtimeInput": {"text": message.get("text", "")}})
    if kind in ("activity.start", "activity.end"):
        return json.dumps({"realtimeInput": {"activityStart" if kind == "activity.start" else "activityEnd": {}}})
    if kind == "audio.end":
        return json.dumps({"realtimeInput": {"audioStreamEnd": True}})
    if kind == "tool.result":
        response = {k: message.get(k) for k in ("id", "name", "response")}
        return json.dumps({"toolResponse": {"functionResponses": [response]}})
    return None


def _live_api_audio(frame: str | bytes) -> int | None:
    """The reply audio's byte count of a Live API audio message (None: not one)."""
    if not isinstance(frame, str) or '"inlineData"' not in frame:
        return None
    parts = ((json.loads(frame).get("serverContent") or {}).get("modelTurn") or {}).get("parts") or []
    data = [part["inlineData"]["data"] for part in parts if "inlineData" in part]
    return sum(len(base64.b64decode(d)) for d in data) if data else None


def _left_without_hearing_closed(record: Record) -> bool:
    """The client sent `session.close`, and the record has no `session.closed` after it."""
    closed_at = next(
        (e["t"] for e in record.entries if e["kind"] == "client" and (e.get("event") or {}).get("type") == "session.close"),
        None,
    )
    return closed_at is not None and not any(
        e["kind"] == "server" and (e.get("event") or {}).get("type") == "session.closed" for e in record.entries
    )


def _agent_for(record: Record, agent: Agent | None) -> Agent:
    model = record.header.get("model") or "gemini-2.5-flash"
    if agent is None:
        spec = record.header.get("agent_spec")
        if spec:
            agent = agent_at(spec)
        else:
            agent = Agent(name=record.header.get("agent") or "assistant", model=model)
    return agent.with_model(model) if agent.model != model else agent


async def replay(
    path: str | Path | Record,
    *,
    agent: Agent | None = None,
    tolerance: float = 1.0,
    audio_tolerance: float = 0.5,
    server_config: dict[str, Any] | None = None,
) -> ReplayResult:
    """Replay a record against a fresh in-process server; returns the comparison.

    `agent` defaults to the record's (`agent_spec`, when the server knew it);
    its tools run for real. `tolerance` is in seconds for event times;
    `audio_tolerance` is seconds of reply audio a run may differ by (a
    barge-in discards what was queued at that moment, which timing decides).
    """
    from connections import double
    from connections.gemini import Gemini
    from live.doors.gemini_live import GEMINI_PATHS, gemini_doors
    from live.server.port import DEFAULT_DOORS, LiveServer, ServerConfig

    record = path if isinstance(path, Record) else load(path)
    the_agent = _agent_for(record, agent)
    wire_model = record.header.get("model") or "gemini-2.5-flash"
    if not wire_model.startswith("gemini"):
        wire_model = "gemini-2.5-flash"  # the double speaks Gemini's protocol whatever was recorded
    llm = Gemini(wire_model, transport=double.DoubleTransport(*model_sessions(record)))
    # Settings this version no longer has (a record made by an older one) are left out.
    known = {f.name for f in dataclasses.fields(ServerConfig)}
    recorded = {k: v for k, v in (record.header.get("config") or {}).items() if k in known}
    config = ServerConfig(port=0, **{**recorded, **(server_config or {})})
    # A Live API app's session is replayed through the endpoint it came through,
    # opened with the setup it ran with; others through /live.
    live_api = record.header.get("door") == "gemini"
    setup = record.header.get("client_setup") or {}
    doors = {**DEFAULT_DOORS, **gemini_doors(["*"], model=record.header.get("model"))} if live_api else None
    server = LiveServer(the_agent, llm, config, doors=doors)
    path = GEMINI_PATHS[0] if live_api else "/live"
    expected = _collapse(
        (e["t"], e["event"] if e["kind"] == "server" else e["n"]) for e in record.of("server", "server.audio")
    )
    end = next((e["t"] for e in reversed(record.entries) if e["kind"] in ("end", "truncated")), None)
    got_frames: list[tuple[float, Any]] = []
    events_seen = [0]
    arrived = [anyio.Event()]
    async with anyio.create_task_group() as tg:
        port = await tg.start(server.serve)
        try:
            async with ws_connect(f"ws://127.0.0.1:{port}{path}", max_size=None) as ws:
                t0 = anyio.current_time()

                async def send_all() -> None:
                    for t, events_before, frame in _client_script(record):
                        if live_api:
                            frame = _as_live_api(frame, setup)
                            if frame is None:
                                continue
                        # Causes first: what the client answered must have arrived
                        # (a slower replay must not send a turn before the resume).
                        with anyio.move_on_after(tolerance + 5):
                            while events_seen[0] < events_before:
                                arrived[0] = anyio.Event()
                                await arrived[0].wait()
                        delay = t0 + t - anyio.current_time()
                        if delay > 0:
                            await anyio.sleep(delay)
                        try:
                            await ws.send(frame)
                        except ConnectionClosed:
                            return
                    if end is not None and not any(
                        e["kind"] == "client" and (e.get("event") or {}).get("type") == "session.close"
                        for e in record.entries
                    ):
                        # The client left without session.close: leave at the same
                        # moment, once what it had heard by then has come (it left
                        # after hearing it: a slower replay must not cut it off).
                        heard_by_end = sum(1 for e in record.entries if e["kind"] == "server" and e["t"] <= end)
                        with anyio.move_on_after(tolerance + 5):
                            while events_seen[0] < heard_by_end:
                                arrived[0] = anyio.Event()
                                await arrived[0].wait()
                        delay = t0 + end - anyio.current_time()
                        if delay > 0:
                            await anyio.sleep(delay)
                        await ws.close()

                async def receive_all() -> None:
                    with anyio.move_on_after((end or 0) + tolerance + 5):
                        try:
                            async for frame in ws:
                                t = anyio.current_time() - t0
                                audio = _live_api_audio(frame) if live_api else None
                                if isinstance(frame, bytes):
                                    got_frames.append((t, len(frame)))
                                elif audio is not None:
                                    got_frames.append((t, audio))
                                else:
                                    event = json.loads(frame)
                                    got_frames.append((t, event))
                                    events_seen[0] += 1
                                    arrived[0].set()
                                    if event.get("type") == "session.closed":
                                        return
                        except ConnectionClosed:
                            return

                async with anyio.create_task_group() as io:
                    io.start_soon(send_all)
                    await receive_all()
                    io.cancel_scope.cancel()
        finally:
            server.stop()
    got = _collapse(got_frames)
    if _left_without_hearing_closed(record) and got and got[-1].type == "session.closed":
        # The client sent session.close and closed its socket at once (the
        # Python client did, before it waited for the answer): the server's
        # session.closed was never sent, so the record cannot have it.
        got.pop()
    return ReplayResult(
        expected, got, compare(expected, got, tolerance=tolerance, audio_tolerance=int(audio_tolerance * 48_000))
    )


async def assert_replays(path: str | Path | Record, **options: Any) -> ReplayResult:
    """Replay `path` (see `replay`) and fail with a readable report if it differs."""
    result = await replay(path, **options)
    if not result.ok:
        raise AssertionError(result.report())
    return result
