"""Whose connection is this: the client's address behind trusted proxies, and the
key a per-address limit counts it under.

Sans-I/O. Behind a reverse proxy every socket comes from the proxy; the proxy
says who it serves in `X-Forwarded-For` (each hop appends the address it
received from). That header is believed only from a trusted peer
(`--forwarded-allow-ips`, as uvicorn's option of that name: addresses and
networks, `*` for any; by default this machine's loopback, 127.0.0.1 and ::1,
as gunicorn's), and the client is the rightmost hop that is not itself
trusted: whatever a client writes into the header comes before the hops the
proxies added, so it can never pick its own address. A socket from a trusted
peer without the header is a client on the peer's own address (as uvicorn's
and Starlette's proxy-headers middleware take it): a process on this machine,
or a proxy that does not say whom it serves, limited as any address is.

An IPv6 client holds a whole /64 (a home or a phone gets one, and picks any
address in it), so a limit per address counts an IPv6 client by its /64.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Iterable, Sequence

__all__ = ["AddressSet", "address_key", "forwarded_client"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

IPV6_CLIENT_PREFIX = 64


def parse_ip(text: str) -> IPAddress | None:
    """An address as a socket or a proxy writes it (IPv6 maybe in brackets, IPv4
    maybe mapped into IPv6); None if it is not one."""
    text = text.strip()
    if text.startswith("[") and "]" in text:
        text = text[1:text.index("]")]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


@dataclasses.dataclass(frozen=True)
class AddressSet:
    """Addresses and networks, or every address (`*`)."""

    networks: tuple[IPNetwork, ...] = ()
    everyone: bool = False

    @classmethod
    def parse(cls, entries: Iterable[str]) -> AddressSet:
        """From a list of `1.2.3.4`, `10.0.0.0/8`, `fd00::/8` or `*` (each item may
        itself be a comma-separated list); `ValueError` naming what is not one."""
        networks: list[IPNetwork] = []
        everyone = False
        for entry in entries:
            for item in entry.split(","):
                item = item.strip()
                if not item:
                    continue
                if item == "*":
                    everyone = True
                    continue
                try:
                    networks.append(ipaddress.ip_network(item.strip("[]"), strict=False))
                except ValueError:
                    raise ValueError(f"{item!r} is not an IP address or network") from None
        return cls(tuple(networks), everyone)

    def __contains__(self, address: object) -> bool:
        if not isinstance(address, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
            return False
        return self.everyone or any(address in network for network in self.networks)


def forwarded_client(peer: str, forwarded_for: Sequence[str], trusted: AddressSet) -> tuple[str, bool]:
    """The client's address, and whether the peer is a trusted proxy.

    From a trusted peer, the rightmost `X-Forwarded-For` hop that is not trusted
    (all of them trusted: the leftmost); from any other peer, the peer itself.
    A hop that is not an address ends the walk there (the peer is kept): a proxy
    that writes garbage is not believed further.
    """
    address = parse_ip(peer)
    if address is None or address not in trusted:
        return peer, False
    hops = [hop.strip() for header in forwarded_for for hop in header.split(",") if hop.strip()]
    client = peer
    for hop in reversed(hops):
        hop_address = parse_ip(hop)
        if hop_address is None:
            break
        client = str(hop_address)
        if hop_address not in trusted:
            break
    return client, True


def address_key(address: str) -> str:
    """What a per-address limit counts a client under: an IPv4 address as is,
    an IPv6 one by its /64 network; anything else as it is written."""
    parsed = parse_ip(address)
    if parsed is None:
        return address
    if isinstance(parsed, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((parsed, IPV6_CLIENT_PREFIX), strict=False))
    return str(parsed)
