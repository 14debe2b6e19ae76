"""Who may talk to the server: Host and Origin checks, session tokens, limits before a session.

Attacks are made as an attacker would make them: raw HTTP requests with the
headers a rebinding page or a broken client sends, and tokens forged, expired
or meant for someone else.
"""

from __future__ import annotations

import logging

import anyio
import pytest

from live.agent import Agent
from live.auth import HostPolicy, host_name
from live.registry import default_registry
from serving import running

pytestmark = pytest.mark.anyio

AGENT = Agent(name="test", model="local/echo")


def echo():
    return default_registry().resolve("local/echo")


async def raw_request(port: int, lines: list[str]) -> tuple[int, str]:
    """Send an HTTP/1.1 request line by line; the status code and body of the answer."""
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(("\r\n".join(lines) + "\r\n\r\n").encode())
        data = b""
        with anyio.fail_after(5):
            while True:
                try:
                    chunk = await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    break
                data += chunk
                head, sep, body = data.partition(b"\r\n\r\n")
                if sep and b" 101 " in head.split(b"\r\n")[0]:
                    break  # switched protocols: no body follows
                if sep:
                    length = next(
                        (int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")),
                        None,
                    )
                    if length is not None and len(body) >= length:
                        break
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body.decode()


def handshake(path: str = "/live", *headers: str) -> list[str]:
    return [
        f"GET {path} HTTP/1.1",
        "Upgrade: websocket",
        "Connection: Upgrade",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version: 13",
        *headers,
    ]


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


# ---------------------------------------------------------------------- Host and Origin


async def test_a_dns_rebinding_page_is_refused_before_anything_else(caplog):
    caplog.set_level(logging.WARNING, "live.server")
    async with running(AGENT, echo()) as (server, url):
        port = port_of(url)
        # What a page on evil.example sends once its name points at 127.0.0.1.
        status, body = await raw_request(
            port, handshake("/live", f"Host: evil.example:{port}", f"Origin: http://evil.example:{port}")
        )
        assert status == 403 and "--allow-host" in body
        status, _ = await raw_request(port, ["GET / HTTP/1.1", f"Host: evil.example:{port}"])
        assert status == 403
        # A probe still learns the server is up, and nothing else.
        status, body = await raw_request(port, ["GET /healthz HTTP/1.1", f"Host: 10.0.0.7:{port}"])
        assert status == 200 and body == '{"status": "ok"}'
        assert not server.sessions
        # The names of this machine work on any port (a dev server on :3000 proxies here too).
        for host in (f"localhost:{port}", "127.0.0.1", "[::1]:3000", "LOCALHOST"):
            status, _ = await raw_request(port, ["GET / HTTP/1.1", f"Host: {host}"])
            assert status == 200, host
        status, _ = await raw_request(
            port, handshake("/live", f"Host: 127.0.0.1:{port}", f"Origin: http://localhost:{port}")
        )
        assert status == 101
    assert any("evil.example" in r.getMessage() and "403" in r.getMessage() for r in caplog.records)


async def test_malformed_host_headers_are_a_400_never_a_500(caplog):
    caplog.set_level(logging.WARNING)
    async with running(AGENT, echo()) as (_, url):
        port = port_of(url)
        for headers in (
            [f"Host: 127.0.0.1:{port}", "Host: evil.example"],
            [],
            ["Host: user@127.0.0.1"],
            ["Host: 127.0.0.1:99999"],
            ["Host: "],
        ):
            status, body = await raw_request(port, handshake("/live", *headers))
            assert status == 400, (headers, status, body)
            assert body.startswith("bad request")
        two_origins = handshake("/live", "Host: 127.0.0.1", "Origin: http://localhost", "Origin: http://evil.example")
        assert (await raw_request(port, two_origins))[0] == 400
        # The server goes on.
        assert (await raw_request(port, ["GET /healthz HTTP/1.1", "Host: 127.0.0.1"]))[0] == 200
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


async def test_origin_is_checked_against_what_is_allowed_not_against_the_requests_host():
    # Even with every Host answered, a page's Origin must be on a named host.
    async with running(AGENT, echo(), allowed_hosts=("*",), allowed_origins=("https://app.example",)) as (_, url):
        port = port_of(url)
        status, _ = await raw_request(
            port, handshake("/live", f"Host: evil.example:{port}", f"Origin: http://evil.example:{port}")
        )
        assert status == 403
        ok = handshake("/live", f"Host: live.example:{port}", "Origin: https://app.example")
        assert (await raw_request(port, ok))[0] == 101
        sandboxed = handshake("/live", "Host: 127.0.0.1", "Origin: null")
        assert (await raw_request(port, sandboxed))[0] == 403


def test_host_policy_for_each_kind_of_bind_address():
    loopback = HostPolicy.for_bind("127.0.0.1")
    assert all(loopback.host_allowed(h) for h in ("localhost", "127.0.0.1", "::1"))
    assert not loopback.host_allowed("evil.example")
    assert not loopback.host_allowed("192.168.1.5")

    lan = HostPolicy.for_bind("192.168.1.5", ["live.example", ".corp.example"])
    assert lan.host_allowed("192.168.1.5") and lan.host_allowed("live.example")
    assert lan.host_allowed("a.corp.example") and lan.host_allowed("corp.example")
    assert not lan.host_allowed("evilcorp.example")
    assert not lan.host_allowed("localhost")  # not listening there
    assert lan.origin_allowed("https://live.example") and lan.origin_allowed("https://live.example:8443")
    assert not lan.origin_allowed("https://evil.example")

    wildcard = HostPolicy.for_bind("0.0.0.0", ["live.example"])
    assert wildcard.host_allowed("localhost") and wildcard.host_allowed("live.example")
    assert not wildcard.host_allowed("0.0.0.0") and not wildcard.host_allowed("evil.example")

    ipv6 = HostPolicy.for_bind("::1")
    assert ipv6.host_allowed(host_name("[::1]:8765") or "")


def test_host_headers_are_parsed_strictly():
    assert host_name("Example.COM:8765") == "example.com"
    assert host_name("[0:0::1]") == "::1"
    assert host_name("localhost.") == "localhost"
    for bad in ("", "a b", "user@host", "host:port", "host:123456", "[nothex]", "/path", "h:1:2"):
        assert host_name(bad) is None, bad
