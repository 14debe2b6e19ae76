"""`live.net.websocket` at the edges a real network has: cancelled dials, redirects,
SOCKS proxies, slow or silent peers, long close reasons, failed TLS handshakes,
and a process where picows cannot be imported at all.

Every peer here is real and on loopback: a raw TCP server that speaks just
enough HTTP, a SOCKS5 proxy, websockets' own client and server.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import os
import ssl
import struct
import subprocess
import sys
import time

import anyio
import anyio.abc
import pytest
import trustme
import websockets
from websockets.asyncio.client import connect as websockets_connect

from live.net import websocket
from live.net.websocket import connect as open_socket

pytestmark = pytest.mark.anyio

_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def _accept_key(key: str) -> str:
    return base64.b64encode(hashlib.sha1((key + _GUID).encode()).digest()).decode()


async def _read_request(stream: anyio.abc.ByteStream) -> dict[str, str]:
    """An HTTP request's headers (lower-case names), read off a raw stream."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive()
    head = data.split(b"\r\n\r\n", 1)[0].decode()
    headers = {}
    for line in head.split("\r\n")[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return headers


def _upgrade(headers: dict[str, str]) -> bytes:
    return (
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Accept: {_accept_key(headers['sec-websocket-key'])}\r\n\r\n"
    ).encode()


async def test_a_dial_cancelled_while_the_upgrade_is_in_flight_leaves_no_connection():
    """A client that hangs up while its model connection opens, or a connect
    deadline: the peer must see that connection closed, not kept alive by pings."""
    closed_after_upgrade = anyio.Event()
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)

    async def slow_upgrade(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            headers = await _read_request(stream)
            await anyio.sleep(0.4)  # the dial is cancelled meanwhile
            await stream.send(_upgrade(headers))
            with anyio.move_on_after(5):
                try:
                    while await stream.receive():
                        pass  # a close frame, then the end
                except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
                    pass
                closed_after_upgrade.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, slow_upgrade)
        with anyio.move_on_after(0.1):
            await open_socket(f"ws://127.0.0.1:{port}/")
            pytest.fail("the dial should have been cancelled")
        with anyio.fail_after(3):
            await closed_after_upgrade.wait()  # closed at once, once picows made it
        tg.cancel_scope.cancel()


async def test_a_redirect_is_refused_and_the_credentials_go_nowhere_else():
    elsewhere: list[dict[str, str]] = []
    listener_a = await anyio.create_tcp_listener(local_host="127.0.0.1")
    listener_b = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port_a = listener_a.extra(anyio.abc.SocketAttribute.local_port)
    port_b = listener_b.extra(anyio.abc.SocketAttribute.local_port)

    async def redirect(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            await _read_request(stream)
            await stream.send(
                f"HTTP/1.1 301 Moved Permanently\r\nLocation: ws://127.0.0.1:{port_b}/\r\n"
                "Content-Length: 0\r\n\r\n".encode()
            )

    async def record(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            elsewhere.append(await _read_request(stream))

    async with anyio.create_task_group() as tg:
        tg.start_soon(listener_a.serve, redirect)
        tg.start_soon(listener_b.serve, record)
        with pytest.raises(websockets.InvalidStatus) as refused:
            await open_socket(f"ws://127.0.0.1:{port_a}/", additional_headers={"Authorization": "Bearer sekrit"})
        assert refused.value.response.status_code == 301
        await anyio.sleep(0.2)
        tg.cancel_scope.cancel()
    assert elsewhere == []


async def test_user_and_password_in_the_url_are_sent_as_basic_authentication():
    seen: list[dict[str, str]] = []
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)

    async def upgrade(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            headers = await _read_request(stream)
            seen.append(headers)
            await stream.send(_upgrade(headers))
            await stream.send(b"\x88\x02\x03\xe8")  # close 1000
            with anyio.move_on_after(1):
                while await stream.receive():
                    pass

    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, upgrade)
        ws = await open_socket(f"ws://ann:s%40cret@127.0.0.1:{port}/")
        await ws.close()
        tg.cancel_scope.cancel()
    assert seen[0]["authorization"] == "Basic " + base64.b64encode(b"ann:s@cret").decode()
    assert seen[0]["host"] == f"127.0.0.1:{port}"


class Socks5:
    """A SOCKS5 proxy (no authentication, CONNECT only) on loopback, which
    records the address form each client asked for (a name or an IP)."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []

    async def handle(self, client: anyio.abc.SocketStream) -> None:
        async with client:
            greeting = await client.receive(2)
            await client.receive(greeting[1])  # the methods offered
            await client.send(b"\x05\x00")
            head = await client.receive(4)
            kind = head[3]
            if kind == 1:
                host = ".".join(str(b) for b in await client.receive(4))
            elif kind == 3:
                size = (await client.receive(1))[0]
                host = (await client.receive(size)).decode()
            else:
                raise AssertionError(f"address type {kind}")
            (port,) = struct.unpack("!H", await client.receive(2))
            self.asked.append((host, port))
            target = await anyio.connect_tcp("127.0.0.1" if host == "localhost" else host, port)
            await client.send(b"\x05\x00\x00\x01" + bytes(4) + b"\x00\x00")
            async with target, anyio.create_task_group() as tg:
                async def pump(a, b):
                    try:
                        while True:
                            await b.send(await a.receive())
                    except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(pump, client, target)
                tg.start_soon(pump, target, client)


async def _echo_server(ready):
    async def echo(ws):
        async for message in ws:
            await ws.send(message)

    async with websockets.asyncio.server.serve(echo, "127.0.0.1", 0) as server:
        await ready(server.sockets[0].getsockname()[1])


@pytest.mark.parametrize("via", ["argument", "SOCKS_PROXY"])
async def test_a_socks5h_proxy_carries_the_connection_and_resolves_the_name(monkeypatch, via):
    proxy = Socks5()
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    proxy_port = listener.extra(anyio.abc.SocketAttribute.local_port)
    done = anyio.Event()

    async def use(port: int) -> None:
        url = f"ws://localhost:{port}/"
        if via == "argument":
            ws = await open_socket(url, proxy=f"socks5h://127.0.0.1:{proxy_port}")
        else:
            # As a user sets it; the suite's NO_PROXY (loopback) must not bypass it here.
            monkeypatch.delenv("NO_PROXY", raising=False)
            monkeypatch.delenv("no_proxy", raising=False)
            monkeypatch.setenv("SOCKS_PROXY", f"socks5h://127.0.0.1:{proxy_port}")
            ws = await open_socket(url)
        await ws.send("through the proxy")
        assert await ws.recv() == "through the proxy"
        await ws.close()
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, proxy.handle)
        tg.start_soon(_echo_server, use)
        with anyio.fail_after(5):
            await done.wait()
        tg.cancel_scope.cancel()
    assert proxy.asked[0][0] == "localhost"  # socks5h: the proxy resolves the name


async def test_a_socks_proxy_that_is_not_there_is_a_connection_error_not_a_value_error():
    with pytest.raises((OSError, websockets.InvalidHandshake)):
        await open_socket("ws://example.invalid/", proxy="socks5h://127.0.0.1:1")


async def test_open_timeout_covers_tcp_and_tls_too():
    """A peer that takes the TCP connection and never answers the TLS hello."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)

    async def mute(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            await anyio.sleep(30)

    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, mute)
        started = time.monotonic()
        with anyio.fail_after(5), pytest.raises(TimeoutError):
            await open_socket(f"wss://127.0.0.1:{port}/", ssl=ssl.create_default_context(), open_timeout=0.5)
        assert time.monotonic() - started < 2
        tg.cancel_scope.cancel()


async def test_a_long_close_reason_is_cut_between_characters_and_the_code_arrives():
    async def close_long(ws):
        await ws.close(4000, "é" * 100)  # 200 bytes of UTF-8

    async with websocket.serve(close_long, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        async with websockets_connect(f"ws://127.0.0.1:{port}/") as client:
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await client.recv()
    assert closed.value.rcvd.code == 4000
    reason = closed.value.rcvd.reason
    assert reason == "é" * 61 and len(reason.encode()) <= 123


async def _raw_client(port: int) -> anyio.abc.SocketStream:
    stream = await anyio.connect_tcp("127.0.0.1", port)
    key = base64.b64encode(os.urandom(16)).decode()
    await stream.send(
        f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive()
    assert data.startswith(b"HTTP/1.1 101")
    return stream


async def _frames_until_closed(stream: anyio.abc.SocketStream, seconds: float) -> tuple[list[int], bool]:
    """Opcodes of the frames a peer that never answers receives; and whether it was closed."""
    opcodes: list[int] = []
    with anyio.move_on_after(seconds):
        try:
            while True:
                data = await stream.receive()
                opcodes.append(data[0] & 0x0F)  # each small frame arrives in a read of its own here
                if data[0] & 0x0F == 0x8:
                    return opcodes, True
        except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
            return opcodes, True
    return opcodes, False


async def _idle(ws) -> None:
    async for _ in ws:
        pass


async def test_keepalive_pings_go_out_and_a_silent_peer_is_dropped_after_the_timeout():
    async with websocket.serve(_idle, "127.0.0.1", 0, ping_interval=0.2, ping_timeout=0.3) as server:
        stream = await _raw_client(server.sockets[0].getsockname()[1])
        opcodes, closed = await _frames_until_closed(stream, 3)
        await stream.aclose()
    assert 0x9 in opcodes and closed


async def test_ping_timeout_none_pings_and_never_drops_a_silent_peer():
    async with websocket.serve(_idle, "127.0.0.1", 0, ping_interval=0.2, ping_timeout=None) as server:
        stream = await _raw_client(server.sockets[0].getsockname()[1])
        opcodes, closed = await _frames_until_closed(stream, 1.5)
        await stream.aclose()
    assert opcodes.count(0x9) >= 1 and not closed


async def test_a_peer_that_keeps_sending_is_alive_however_late_its_pong():
    """Gemini has been seen answering pings after 8-30 s: a connection that
    delivers messages meanwhile is healthy and must not be dropped."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)

    async def talks_never_pongs(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            await stream.send(_upgrade(await _read_request(stream)))
            # A message every 0.35 s: the socket goes idle for longer than its ping
            # interval (0.2 s) between them, pings, and is never answered.
            for _ in range(6):
                await anyio.sleep(0.35)
                await stream.send(b"\x82\x01x")
            await stream.send(b"\x88\x02\x03\xe8")

    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, talks_never_pongs)
        ws = await open_socket(f"ws://127.0.0.1:{port}/", ping_interval=0.2, ping_timeout=0.3)
        got = 0
        with anyio.fail_after(5):
            while got < 6:
                assert await ws.recv() == b"x"
                got += 1
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await ws.recv()
        assert closed.value.rcvd.code == 1000  # the peer's own close, not a keepalive timeout
        tg.cancel_scope.cancel()


async def test_a_failed_tls_handshake_is_one_debug_line_not_an_error_dump(tmp_path, caplog):
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    pem = tmp_path / "cert.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(pem))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(pem))
    caplog.set_level(logging.DEBUG)

    async def echo(ws):
        async for message in ws:
            await ws.send(message)

    async with websocket.serve(echo, "127.0.0.1", 0, ssl=context) as server:
        port = server.sockets[0].getsockname()[1]
        for _ in range(3):  # a client that does not trust the certificate
            with pytest.raises(ssl.SSLCertVerificationError):
                await anyio.connect_tcp("127.0.0.1", port, tls=True, ssl_context=ssl.create_default_context())
        await anyio.sleep(0.3)
        trusting = ssl.create_default_context()
        ca.configure_trust(trusting)
        async with websockets_connect(f"wss://127.0.0.1:{port}/", ssl=trusting) as client:
            await client.send("still serving")
            assert await client.recv() == "still serving"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert sum("TLS handshake with a client failed" in r.getMessage() for r in caplog.records) == 3


def test_the_server_serves_under_asyncio_run_too():
    """Embedding: `asyncio.run`, not `anyio.run` (a handler used to be started
    from picows' callback, outside any task: every connection got 1011)."""
    from clients.client import LiveClient
    from connections.local_echo import LocalEcho
    from live import protocol as p
    from live.agent import Agent
    from live.server.port import LiveServer, ServerConfig

    async def main() -> list[str]:
        server = LiveServer(Agent(name="echo", model="local/echo"), LocalEcho("local/echo"), ServerConfig(port=0))
        serving = asyncio.create_task(server.serve())
        while server.port is None:
            await asyncio.sleep(0.01)
        kinds = []
        async with LiveClient.connect(f"ws://127.0.0.1:{server.port}/live") as client:
            await client.send_text("hello")
            async for event in client.events():
                kinds.append(getattr(event, "type", "audio"))
                if isinstance(event, p.TurnComplete):
                    break
        server.stop()
        await asyncio.wait_for(serving, 10)
        return kinds

    kinds = asyncio.run(main())
    assert "turn.complete" in kinds


def test_live_serve_runs_on_websockets_where_picows_cannot_be_imported():
    code = (
        "import sys; sys.modules['picows'] = None\n"
        "from live.cli import main; sys.exit(main(sys.argv[1:]))\n"
    )
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost"}
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-c", code, "serve", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    try:
        lines = _lines_until(process, "serving", 20)
        assert sum("picows cannot be imported" in line for line in lines) == 1

        async def talk() -> list[str]:
            from clients.client import LiveClient
            from live import protocol as p

            kinds = []
            async with LiveClient.connect(f"ws://127.0.0.1:{port}/live") as client:
                await client.send_text("hello")
                async for event in client.events():
                    kinds.append(getattr(event, "type", "audio"))
                    if isinstance(event, p.TurnComplete):
                        break
            return kinds

        assert "turn.complete" in anyio.run(talk)
    finally:
        process.terminate()
        process.wait(10)


def _free_port() -> int:
    """A free TCP port on loopback (taken from the kernel, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _lines_until(process: subprocess.Popen, marker: str, timeout: float) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        if marker in line:
            return lines
    raise AssertionError(f"no {marker!r} line within {timeout} s: {lines}")
