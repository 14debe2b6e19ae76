"""The server behind a real nginx, configured as docs/fleet.md says: clients are
limited and judged by their own addresses, not the balancer's.

The nginx block is read from the docs and given this test's addresses (its
upstream, its port, its certificate), nothing else; nginx runs from Debian's
package (`./test` installs it).
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest
import trustme
from serving import running
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from live.agent import Agent
from live.registry import default_registry

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is not installed (apt-get install nginx)"),
]

DOCS = Path(__file__).resolve().parent.parent / "docs"
AGENT = Agent(name="test", model="local/echo")


def docs_nginx_block() -> str:
    """The nginx configuration docs/fleet.md gives for a load balancer."""
    [block] = re.findall(r"```nginx\n(.*?)```", (DOCS / "fleet.md").read_text(), flags=re.S)
    return block


def this_machines_address() -> str | None:
    """An address of this machine that is not loopback (where a remote client comes from)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: it only picks the interface
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@contextlib.contextmanager
def nginx(tmp_path: Path, ca: trustme.CA, upstream_port: int) -> Iterator[int]:
    """nginx with the docs' block, in front of the server on `upstream_port`; its port."""
    names = ["127.0.0.1", "localhost", *filter(None, [this_machines_address()])]
    cert = ca.issue_cert(*names)
    certfile, keyfile = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(certfile))
    cert.private_key_pem.write_to_path(str(keyfile))
    port = free_port()
    block = docs_nginx_block()
    block, upstreams = re.subn(r"upstream live \{[^}]*\}", f"upstream live {{ server 127.0.0.1:{upstream_port}; }}", block)
    block, listens = re.subn(r"listen 443 ssl;", f"listen {port} ssl;", block)
    block, certs = re.subn(r"ssl_certificate\s+\S+;", f"ssl_certificate {certfile};", block)
    block, keys = re.subn(r"ssl_certificate_key\s+\S+;", f"ssl_certificate_key {keyfile};", block)
    assert (upstreams, listens, certs, keys) == (1, 1, 1, 1), "docs/fleet.md's nginx block changed shape"
    conf = tmp_path / "nginx.conf"
    conf.write_text(
        "events {}\n"
        f"http {{\naccess_log off;\nerror_log {tmp_path}/error.log;\n{block}\n}}\n"
    )
    proc = subprocess.Popen(
        ["nginx", "-p", str(tmp_path), "-c", str(conf), "-e", "stderr",
         "-g", f"daemon off; master_process off; pid {tmp_path}/nginx.pid;"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        for _ in range(100):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.1):
                break
            if proc.poll() is not None:
                pytest.fail(f"nginx did not start: {proc.stderr.read()}")
            import time

            time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def client_tls(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


@contextlib.asynccontextmanager
async def behind_nginx(tmp_path: Path, ca: trustme.CA, **config) -> AsyncIterator[tuple[object, int]]:
    """The server with its defaults (but `config`), and the docs' nginx before it."""
    async with running(AGENT, default_registry().resolve("local/echo"), **config) as (server, url):
        upstream = int(url.rsplit(":", 1)[1].split("/")[0])
        with nginx(tmp_path, ca, upstream) as port:
            yield server, port


async def start_from(port: int, ca: trustme.CA, source: str, forged: str | None = None) -> dict:
    """A client on `source` (an address of this machine) opens a session through nginx."""
    headers = {"X-Forwarded-For": forged} if forged else {}
    ws = await ws_connect(
        f"wss://127.0.0.1:{port}/live", ssl=client_tls(ca), local_addr=(source, 0), additional_headers=headers
    )
    with contextlib.suppress(ConnectionClosed):
        await ws.send(json.dumps({"type": "session.start"}))
    with anyio.fail_after(5):
        event = json.loads(await ws.recv())
    event["ws"] = ws
    return event


async def test_behind_the_docs_nginx_each_client_has_its_own_limit(tmp_path, ca):
    async with behind_nginx(tmp_path, ca, max_sessions_per_ip=2, reattach_grace=0) as (server, port):
        # Two clients, told apart by their own addresses (two loopback ones here).
        ann = [await start_from(port, ca, "127.0.0.2") for _ in range(2)]
        # A client that writes its own X-Forwarded-For does not become someone else.
        forged = await start_from(port, ca, "127.0.0.2", forged="203.0.113.9")
        bob = await start_from(port, ca, "127.0.0.3")
        assert [e["type"] for e in ann] == ["session.started"] * 2
        assert forged["type"] == "error" and forged["code"] == "address_limit"
        assert bob["type"] == "session.started"
        assert dict(server.per_address) == {"127.0.0.2": 2, "127.0.0.3": 1}
        for event in [*ann, forged, bob]:
            await event["ws"].close()


async def test_behind_the_docs_nginx_metrics_answer_only_this_machine(tmp_path, ca):
    address = this_machines_address()
    if address is None:
        pytest.skip("this machine has no address but loopback")

    async def scrape(host: str) -> tuple[int, str]:
        request = f"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode()
        async with await anyio.connect_tcp(host, port, tls=True, ssl_context=client_tls(ca), tls_hostname="localhost") as stream:
            await stream.send(request)
            data = b""
            with anyio.fail_after(5), contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                while True:
                    data += await stream.receive()
        head, _, body = data.partition(b"\r\n\r\n")
        return int(head.split()[1]), body.decode(errors="replace")

    async with behind_nginx(tmp_path, ca) as (_, port):
        # nginx's own socket to the server is loopback; the client it names is not.
        status, body = await scrape(address)
        assert status == 403 and "--metrics-allow-ips" in body and "live_" not in body
        status, body = await scrape("127.0.0.1")  # through nginx, from this machine
        assert status == 200 and "live_" in body
