"""The floor of a Python relay: frames passed through verbatim, as a reference peer.

    python -m bench.floor_relay --port 8000 --upstream wss://127.0.0.1:9000/ws/...

The least any relay written on `websockets` and asyncio can cost on this
machine: every client connection gets one TLS connection to the upstream, and
each message is read and written again unchanged, both ways (no decoding, no
session, no pacing, no limits). Clients speak the Gemini Live protocol itself
(the `gemini` client protocol of the benchmark), so the relay has nothing to
translate. `bench.real` runs it beside `live serve` as the reference peer
`floor`: what ours costs on top of two socket operations per frame and TLS.
"""

from __future__ import annotations

import argparse
import os
import ssl
import sys

import anyio
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from live.loop import backend_options

__all__ = ["main", "peer"]


async def _pipe(source, sink) -> None:  # noqa: ANN001 - either side's connection
    try:
        async for message in source:
            await sink.send(message)
    except ConnectionClosed:
        pass


def _handler(upstream: str, key: str, context: ssl.SSLContext):  # noqa: ANN202
    async def handle(client: ServerConnection) -> None:
        async with connect(
            upstream,
            ssl=context,
            additional_headers={"x-goog-api-key": key},
            max_size=None,
            compression=None,
        ) as model:
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


async def _serve(port: int, upstream: str) -> None:
    context = ssl.create_default_context()  # trusts SSL_CERT_FILE
    key = os.environ.get("GOOGLE_API_KEY", "")
    async with serve(_handler(upstream, key, context), "127.0.0.1", port, max_size=None, compression=None):
        await anyio.sleep_forever()


def peer():  # noqa: ANN201 - bench.real.Peer, imported late (bench.real imports this module)
    from bench.real import Peer

    return Peer(
        "floor",
        ["{python}", "-m", "bench.floor_relay", "--port", "{port}", "--upstream", "{ws_url}"],
        "ws://127.0.0.1:{port}/",
        "gemini",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.floor_relay", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the Live endpoint's wss:// URL")
    args = parser.parse_args(argv)
    try:
        anyio.run(_serve, args.port, args.upstream, backend_options=backend_options("auto"))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
