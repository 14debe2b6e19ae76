"""A round-robin TCP load balancer without stickiness, for a fleet on one machine.

Each new connection goes to the next server in turn; a server that refuses
connections (it died) is skipped. Used by the fleet's tests and benchmarks.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio
from anyio.abc import SocketAttribute, SocketStream

__all__ = ["round_robin"]


async def _pipe(source: SocketStream, sink: SocketStream) -> None:
    with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
        while True:
            await sink.send(await source.receive())
    with contextlib.suppress(Exception):
        await sink.send_eof()


@contextlib.asynccontextmanager
async def round_robin(ports: list[int]) -> AsyncIterator[int]:
    """Serve on a free loopback port (yielded), spreading connections over `ports`."""
    turn = [0]

    async def handle(client: SocketStream) -> None:
        async with client:
            for _ in range(len(ports)):
                port = ports[turn[0] % len(ports)]
                turn[0] += 1
                try:
                    backend = await anyio.connect_tcp("127.0.0.1", port)
                except OSError:
                    continue  # a dead server: the next one
                async with backend, anyio.create_task_group() as tg:
                    tg.start_soon(_pipe, client, backend)
                    tg.start_soon(_pipe, backend, client)
                return

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handle)
        yield listener.extra(SocketAttribute.local_port)
        tg.cancel_scope.cancel()
