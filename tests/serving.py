"""Helpers for tests that run the session server on a loopback port."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable

import anyio

from clients.client import AudioFrame, LiveClient
from live.agent import Agent
from live.llm import BaseLlm
from live.observe.record import Recorder
from live.server.port import LiveServer, ServerConfig


@contextlib.asynccontextmanager
async def running(
    agent: Agent, llm: BaseLlm, *, recorder: Recorder | None = None, doors=None, **config
) -> AsyncIterator[tuple[LiveServer, str]]:
    """A server on a free port; yields it and its `/live` URL; stops it on exit."""
    config.setdefault("audio_lead", None)
    config.setdefault("sockets", os.environ.get("LIVE_SOCKETS", "auto"))
    server = LiveServer(agent, llm, ServerConfig(port=0, **config), recorder=recorder, doors=doors)
    async with anyio.create_task_group() as tg:
        port = await tg.start(server.serve)
        try:
            scheme = "wss" if config.get("certfile") else "ws"
            yield server, f"{scheme}://127.0.0.1:{port}/live"
        finally:
            server.stop()


async def collect(
    client: LiveClient, until: Callable[[object], bool], *, timeout: float = 5.0
) -> list[object]:
    """Events up to and including the first for which `until` is true."""
    seen: list[object] = []
    with anyio.fail_after(timeout):
        async for event in client.events():
            seen.append(event)
            if until(event):
                break
    return seen


def audio_bytes(events: list[object]) -> bytes:
    return b"".join(e.data for e in events if isinstance(e, AudioFrame))


def kinds(events: list[object]) -> list[str]:
    """Event types in order, with runs of audio collapsed to one 'audio'."""
    out: list[str] = []
    for e in events:
        name = "audio" if isinstance(e, AudioFrame) else e.type  # type: ignore[attr-defined]
        if not (name == "audio" and out and out[-1] == "audio"):
            out.append(name)
    return out


def replies(events: list[object]) -> list[str]:
    """What the model said, a string per reply: each final transcript with the
    late tail that may follow it (`late: true`, after its turn ended)."""
    from live import protocol as p

    said: list[str] = []
    for e in events:
        if isinstance(e, p.TranscriptOutput) and not e.heard:
            if e.late and said:
                said[-1] += e.text
            elif e.final:
                said.append(e.text)
    return said


async def late_tail(client: LiveClient, *, within: float = 1.0) -> list[object]:
    """Events after a turn's end up to its transcript's late tail, if one comes
    `within` seconds (Gemini may send the last words after turnComplete). A
    client that folds tails into their reply (the default) has read it already."""
    from live import protocol as p

    if client._tails is not None:
        return []
    seen: list[object] = []
    with anyio.move_on_after(within):
        async for event in client.events():
            seen.append(event)
            if isinstance(event, p.TranscriptOutput) and event.late:
                break
    return seen
