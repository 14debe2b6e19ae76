"""The POST routes on the WebSocket port: carriers' webhooks, the Live API's `auth_tokens`.

A carrier's webhook and its media stream reach the server on one address, so
one tunnel or one load-balancer rule serves a number. The WebSocket layers
hand a connection whose request is a POST here (`live.net.one_port`), as a
byte stream; it is read and answered by the POST routes' own handling
(`live.net.http_post`: its size, time and count bounds, its signatures
checked by the routes before anything else). Anyone can reach the port, so
one address has at most `PER_ADDRESS` POSTs open at once (an IPv6 client by
its /64); more are answered 429 and closed. A trusted proxy's are not
counted: its clients are many.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Mapping

import anyio
import anyio.abc

from live.access.addresses import AddressSet, address_key, parse_ip
from live.net.http_post import Handler, PostListener

__all__ = ["PER_ADDRESS", "PortPosts"]

log = logging.getLogger("live.server")

# POSTs open at once from one address (a carrier sends one webhook per call
# event, at once: 8 in flight is a burst no carrier's address needs).
PER_ADDRESS = 8
_TOO_MANY = b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 0\r\nConnection: close\r\nServer: live\r\n\r\n"


class PortPosts:
    """The POST routes a WebSocket port serves, bounded per address."""

    def __init__(self, routes: Mapping[str, Handler], trusted_proxies: AddressSet) -> None:
        self.listener = PostListener(routes, "", 0)  # its handling only: it listens on no port of its own
        self.trusted_proxies = trusted_proxies
        self._open: Counter[str] = Counter()

    @property
    def routes(self) -> dict[str, Handler]:
        return self.listener.routes

    async def serve(self, stream: anyio.abc.ByteStream) -> None:
        """One POST connection, from its first byte to its answer."""
        key = self._key(stream)
        if key is not None and self._open[key] >= PER_ADDRESS:
            log.warning("refused a POST from %s: %d of its requests are open already", key, PER_ADDRESS)
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                with anyio.move_on_after(1):
                    await stream.send(_TOO_MANY)
            await stream.aclose()
            return
        if key is not None:
            self._open[key] += 1
        try:
            await self.listener.handle(stream)
        finally:
            if key is not None:
                self._open[key] -= 1
                if not self._open[key]:
                    del self._open[key]

    def _key(self, stream: anyio.abc.ByteStream) -> str | None:
        """What the per-address bound counts this peer under; None: not counted."""
        try:
            peer = stream.extra(anyio.abc.SocketAttribute.remote_address)
        except anyio.TypedAttributeLookupError:
            peer = None
        address = str(peer[0]) if isinstance(peer, tuple) else "?"
        ip = parse_ip(address)
        if ip is not None and ip in self.trusted_proxies:
            return None
        return address_key(address)
