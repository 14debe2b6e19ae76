"""The floor of a Python relay: frames passed through verbatim, as reference peers.

    python -m bench.floor_relay --port 8000 --upstream wss://127.0.0.1:9000/ws/...
    python -m bench.floor_relay --socket websockets --port 8000 --upstream ...

The least a relay on a given socket layer can cost on this machine: every
client connection gets one TLS connection to the upstream, and each message is
read and written again unchanged, both ways (no decoding, no session, no
pacing, no limits). Clients speak the Gemini Live protocol itself (the
`gemini` client protocol of the benchmark), so the relay has nothing to
translate. `bench.real` runs it twice beside `live serve`, as reference peers:

- `floor`: on `live.net.websocket` (picows), the sockets `live serve` runs on:
  what ours costs on top of two socket operations per frame and TLS;
- `floor-websockets`: on websockets and asyncio, the socket layer most Python
  relays use: what that layer alone costs.
"""

from __future__ import annotations

import argparse
import os
import ssl
import sys
from typing import Any

import anyio
from websockets.exceptions import ConnectionClosed

from live.net.loop import backend_options

__all__ = ["main", "peer", "websockets_peer"]

SOCKETS = ("picows", "websockets")


def _layer(name: str) -> tuple[Any, Any, dict[str, Any]]:
    """`connect`, `serve` and the options both need, on the socket layer `name`."""
    if name == "websockets":
        from websockets.asyncio.client import connect
        from websockets.asyncio.server import serve

        return connect, serve, {"max_size": None, "compression": None}
    from live.net.websocket import connect, serve

    return connect, serve, {"max_size": None}


async def _pipe(source, sink) -> None:  # noqa: ANN001 - either side's connection
    try:
        async for message in source:
            await sink.send(message)
    except ConnectionClosed:
        pass


def _handler(connect: Any, options: dict[str, Any], upstream: str, key: str, context: ssl.SSLContext):  # noqa: ANN202
    async def handle(client: Any) -> None:
        async with await connect(upstream, ssl=context, additional_headers={"x-goog-api-key": key}, **options) as model:
            async with anyio.create_task_group() as tg:
                async def down() -> None:
                    await _pipe(model, client)
                    # The model's close reaches the client as it was (an error stays one).
                    code = model.close_code
                    if code in (None, 1005, 1006, 1015):  # not sendable: none given, or no close frame
                        code = 1000 if code in (None, 1005) else 1011
                    await client.close(code, model.close_reason or "")
                    tg.cancel_scope.cancel()

                tg.start_soon(down)
                await _pipe(client, model)
                tg.cancel_scope.cancel()

    return handle


async def _serve(port: int, upstream: str, socket_layer: str) -> None:
    connect, serve, options = _layer(socket_layer)
    context = ssl.create_default_context()  # trusts SSL_CERT_FILE
    key = os.environ.get("GOOGLE_API_KEY", "")
    async with serve(_handler(connect, options, upstream, key, context), "127.0.0.1", port, **options):
        await anyio.sleep_forever()


def _peer(name: str, socket_layer: str):  # noqa: ANN202 - bench.real.Peer, imported late (bench.real imports this module)
    from bench.real import Peer

    return Peer(
        name,
        ["{python}", "-m", "bench.floor_relay", "--socket", socket_layer, "--port", "{port}", "--upstream", "{ws_url}"],
        "ws://127.0.0.1:{port}/",
        "gemini",
    )


def peer():  # noqa: ANN201
    """`floor`: the verbatim relay on `live.net.websocket`, the sockets `live serve` runs on."""
    return _peer("floor", "picows")


def websockets_peer():  # noqa: ANN201
    """`floor-websockets`: the verbatim relay on websockets."""
    return _peer("floor-websockets", "websockets")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.floor_relay", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the Live endpoint's wss:// URL")
    parser.add_argument("--socket", choices=SOCKETS, default="picows", help="the socket layer (picows: live.net.websocket)")
    args = parser.parse_args(argv)
    try:
        anyio.run(_serve, args.port, args.upstream, args.socket, backend_options=backend_options("auto"))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
