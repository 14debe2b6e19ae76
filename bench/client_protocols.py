"""How the load generator's simulated users talk to what they measure.

A client protocol adapter is an async context manager factory

    connect(url: str) -> AsyncContextManager[session]

whose session has `await send_audio(pcm: bytes)` (one 20 ms frame of 16 kHz
PCM16, stamped: pass the bytes through unchanged), `events()` (an async
iterator of `clients.client.AudioFrame` for reply audio, `TurnInterrupted`,
`TurnComplete` and `ErrorEvent` from `live.protocol`; anything else is
ignored) and `await close()`. Connection settings that are not in the URL come
from the environment (see each adapter).

- `live`: our client protocol, through `LiveClient`;
- `live-deflate`: the same, offering permessage-deflate as browsers do;
- `gemini`: the Gemini Live wire protocol itself (`setup`, then
  `realtimeInput` audio as base64 JSON; `serverContent` back), over TLS to the
  endpoint at `url` with the key in `GOOGLE_API_KEY` and the CA in
  `SSL_CERT_FILE`: the direct-to-model baseline;
- `module:attr`: any other adapter (e.g. a reference peer's own protocol),
  imported by name in the generator process.
"""

from __future__ import annotations

import base64
import contextlib
import importlib
import json
import os
import ssl
from collections.abc import AsyncIterator, Callable
from typing import Any, AsyncContextManager

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from clients.client import AudioFrame, LiveClient
from live.protocol import (
    ErrorEvent,
    SessionStart,
    SessionStarted,
    TurnComplete,
    TurnInterrupted,
    encode,
    parse_server_event,
)

__all__ = ["GEMINI_MODEL", "GeminiLiveClient", "resolve"]

ClientProtocol = Callable[[str], AsyncContextManager[Any]]

GEMINI_MODEL = "gemini-live-2.5-flash-preview"
INPUT_MIME = "audio/pcm;rate=16000"


@contextlib.asynccontextmanager
async def live(url: str) -> AsyncIterator[LiveClient]:
    async with LiveClient.connect(url, open_timeout=30) as client:
        yield client


@contextlib.asynccontextmanager
async def live_deflate(url: str) -> AsyncIterator[LiveClient]:
    """As a browser connects: offering permessage-deflate (LiveClient does not:
    audio does not compress)."""
    async with ws_connect(url, open_timeout=30, max_size=None, compression="deflate") as ws:
        await ws.send(encode(SessionStart()))
        for _ in range(100):
            event = parse_server_event(await ws.recv())
            if isinstance(event, SessionStarted):
                break
        else:
            raise RuntimeError("no session.started")
        client = LiveClient(ws, event)
        try:
            yield client
        finally:
            await client.close()


class GeminiLiveClient:
    """One Live API session spoken directly: what any relay does upstream, and no more."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws

    async def send_audio(self, pcm: bytes) -> None:
        data = base64.b64encode(pcm).decode("ascii")
        await self.ws.send(
            '{"realtimeInput":{"audio":{"mimeType":"' + INPUT_MIME + '","data":"' + data + '"}}}'
        )

    async def events(self) -> AsyncIterator[Any]:
        try:
            async for frame in self.ws:
                message = json.loads(frame)
                content = message.get("serverContent")
                if content is None:
                    continue
                turn = content.get("modelTurn")
                if turn is not None:
                    for part in turn.get("parts", ()):
                        inline = part.get("inlineData")
                        if inline is not None and inline.get("data"):
                            yield AudioFrame(base64.b64decode(inline["data"]))
                if content.get("interrupted"):
                    yield TurnInterrupted()
                if content.get("turnComplete"):
                    yield TurnComplete()
        except ConnectionClosed as exc:
            if exc.rcvd is not None and exc.rcvd.code != 1000:
                yield ErrorEvent(f"closed_{exc.rcvd.code}", exc.rcvd.reason, fatal=True)

    async def close(self) -> None:
        await self.ws.close()


@contextlib.asynccontextmanager
async def gemini(url: str) -> AsyncIterator[GeminiLiveClient]:
    key = os.environ.get("GOOGLE_API_KEY") or os.environ.get("GEMINI_API_KEY") or ""
    # wss:// trusts SSL_CERT_FILE, as the SDK does; ws:// is a relay on loopback.
    context = ssl.create_default_context() if url.startswith("wss:") else None
    async with ws_connect(
        url,
        ssl=context,
        additional_headers={"x-goog-api-key": key},
        open_timeout=30,
        max_size=None,
        compression=None,
    ) as ws:
        setup = {
            "setup": {
                "model": f"models/{GEMINI_MODEL}",
                "generationConfig": {"responseModalities": ["AUDIO"]},
            }
        }
        await ws.send(json.dumps(setup))
        reply = json.loads(await ws.recv())
        if "setupComplete" not in reply:
            raise RuntimeError(f"no setupComplete: {str(reply)[:200]}")
        client = GeminiLiveClient(ws)
        try:
            yield client
        finally:
            await client.close()


PROTOCOLS: dict[str, ClientProtocol] = {"live": live, "live-deflate": live_deflate, "gemini": gemini}


def resolve(name: str) -> ClientProtocol:
    """The adapter called `name`: one of PROTOCOLS, or `module:attr`."""
    if name in PROTOCOLS:
        return PROTOCOLS[name]
    module, sep, attr = name.partition(":")
    if not sep:
        raise ValueError(f"unknown client protocol {name!r}: one of {sorted(PROTOCOLS)} or module:attr")
    return getattr(importlib.import_module(module), attr)
