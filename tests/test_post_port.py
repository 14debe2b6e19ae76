"""The POST port (carriers' webhooks, the Live API's auth_tokens) as a stranger meets it:
whatever arrives there, the server and its conversations go on, and the port
keeps answering everyone else."""

from __future__ import annotations

import contextlib
import os
import logging
import signal
import socket
import struct
import subprocess
import sys

import anyio
import pytest

from audio_fixtures import silence, speak
from gemini_serving import ca_fixture, cert_files_fixture  # noqa: F401 (fixtures)
from clients.client import LiveClient
from clients.phone_double import TwilioDouble
from live.access.addresses import address_key
from live.net import http_post
from live import protocol as p
from live.net.http_post import HttpAnswer, PostListener
from phone_serving import AUTH_TOKEN
from serving import audio_bytes, collect
from test_gemini_tokens import backend, create, minting
from test_phone_cli import env, free_port

pytestmark = pytest.mark.anyio

LIVE = [sys.executable, "-m", "live.cli"]


async def raw(port: int, request: bytes, *, source: str = "127.0.0.1") -> bytes:
    """What the port answers to `request`, sent as is from `source` (a loopback address)."""
    async with await anyio.connect_tcp("127.0.0.1", port, local_host=source) as stream:
        await stream.send(request)
        out = b""
        with anyio.fail_after(15):
            try:
                while True:
                    out += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return out


@contextlib.asynccontextmanager
async def live_serve_twilio():
    """`live serve --twilio` as an operator runs it; yields (process, WebSocket port, POST port)."""
    port, post_port = free_port(), free_port()
    public = f"http://127.0.0.1:{post_port}"
    proc = subprocess.Popen(
        [*LIVE, "serve", "--port", str(port), "--twilio", "--public-url", public, "--post-port", str(post_port),
         "--stream-url", f"ws://127.0.0.1:{port}/twilio/media"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(TWILIO_AUTH_TOKEN=AUTH_TOKEN),
    )
    try:
        lines = [await anyio.to_thread.run_sync(proc.stdout.readline) for _ in range(2)]
        assert any(f"{public}/twilio/voice" in line for line in lines), lines
        yield proc, port, post_port
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


async def echoed(client: LiveClient, words: str) -> bytes:
    """Say `words` in the conversation; the reply's audio (local/echo says it back)."""
    pcm = speak(words, rate=16_000) + silence(1.0)
    for start in range(0, len(pcm), 640):
        await client.send_audio(pcm[start:start + 640])
        await anyio.sleep(0.005)
    events = await collect(client, lambda e: isinstance(e, p.TurnComplete), timeout=20)
    return audio_bytes(events)


# Request targets h11 lets through that no URL parser reads (N1): `[` opens an
# IPv6 host that never closes.
UNREADABLE_TARGETS = [b"http://[", b"//[x", b"http://[::1/twilio/voice", b"https://[/v1alpha/auth_tokens?key=1"]


async def test_a_request_target_no_url_parser_reads_ends_neither_the_server_nor_a_conversation():
    async with live_serve_twilio() as (proc, port, post_port):
        async with LiveClient.connect(f"ws://127.0.0.1:{port}/live") as client:
            assert await echoed(client, "Before the strange requests.")
            for target in UNREADABLE_TARGETS:
                for method in (b"POST", b"GET"):
                    answer = await raw(post_port, method + b" " + target + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
                    assert answer.startswith((b"HTTP/1.1 400 ", b"HTTP/1.1 404 ")), (target, answer[:80])
            assert proc.poll() is None
            # The conversation goes on, and the port still answers a carrier.
            assert await echoed(client, "After the strange requests.")
        status, _, _ = await TwilioDouble(AUTH_TOKEN).ring(f"http://127.0.0.1:{post_port}/twilio/voice")
        assert status == 200
        proc.send_signal(signal.SIGTERM)
        assert await anyio.to_thread.run_sync(lambda: proc.wait(timeout=10)) == 0
        log = proc.stderr.read()
    assert "Traceback" not in log


# ------------------------------------------------------------------ holding the port


async def ok(target, headers, body):
    return HttpAnswer(200, b"ok\n")


@contextlib.asynccontextmanager
async def listening(**options):
    """A POST listener on a free loopback port with one route, `/hook`; yields its port."""
    listener = PostListener({"/hook": ok}, "127.0.0.1", 0, client_key=address_key, **options)
    async with anyio.create_task_group() as tg:
        port = await tg.start(listener.serve)
        yield port
        tg.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def idle_sockets(port: int, count: int, source: str):
    """`count` connections from `source` that send nothing."""
    async with contextlib.AsyncExitStack() as stack:
        held = [await stack.enter_async_context(await anyio.connect_tcp("127.0.0.1", port, local_host=source))
                for _ in range(count)]
        await anyio.sleep(0.2)  # accepted and counted
        yield held


async def closed_at_once(port: int, source: str, *, within: float = 2.0) -> bytes | None:
    """What a connection from `source` that sends nothing reads before the server
    closes it (None: still open after `within` seconds)."""
    async with await anyio.connect_tcp("127.0.0.1", port, local_host=source) as stream:
        out = b""
        with anyio.move_on_after(within):
            try:
                while True:
                    out += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return out
    return None


def reset_at_once(port: int, source: str, send: bytes = b"") -> None:
    """A client that connects (sends `send`) and resets (RST) the connection straight away."""
    sock = socket.socket()
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    if send:
        sock.send(send)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


HOOK = b"POST /hook HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"


async def test_idle_sockets_from_one_address_leave_the_port_to_everyone_else(caplog, monkeypatch):
    caplog.set_level(logging.WARNING, "live.http")
    monkeypatch.setattr(http_post, "BURST_QUIET", 0.5)
    async with listening() as port:
        async with idle_sockets(port, http_post.MAX_CONNECTIONS, "127.0.0.1"):
            # Another address is answered as if nothing were held...
            assert (await raw(port, HOOK, source="127.0.0.2")).startswith(b"HTTP/1.1 200 ")
            # ...and one more from the address holding them is refused at once, saying why.
            for _ in range(20):
                answer = await closed_at_once(port, "127.0.0.1")
                assert answer is not None and answer.startswith(b"HTTP/1.1 429 "), answer
        await anyio.sleep(2)  # the burst is over
    said = [r.getMessage() for r in caplog.records if "127.0.0.1" in r.getMessage()]
    # Once when the burst starts and once, with its count, when it is over: not per socket.
    assert len(said) == 2, said
    refused = http_post.MAX_CONNECTIONS - http_post.MAX_PER_ADDRESS + 20
    assert "refusing" in said[0] and f"{refused} connection(s) from 127.0.0.1 refused" in said[1], said


@pytest.mark.parametrize("anyio_backend", [pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop")])
async def test_a_client_that_resets_while_the_port_is_full_ends_nothing(anyio_backend):
    # On uvloop (`live serve`'s loop) the reset reaches the 503's send.
    async with listening() as port:
        sources = [f"127.0.0.{n}" for n in range(2, 2 + http_post.MAX_CONNECTIONS // 8)]
        async with contextlib.AsyncExitStack() as stack:
            for source in sources:
                await stack.enter_async_context(idle_sockets(port, 8, source))
            assert (await closed_at_once(port, "127.0.0.50")).startswith(b"HTTP/1.1 503 ")
            for _ in range(20):
                reset_at_once(port, "127.0.0.51", HOOK[:20])
                reset_at_once(port, "127.0.0.51")
                await anyio.sleep(0.001)
            await anyio.sleep(0.3)
        await anyio.sleep(0.2)
        assert (await raw(port, HOOK, source="127.0.0.52")).startswith(b"HTTP/1.1 200 ")


async def test_a_request_with_too_much_header_gets_431():
    async with listening() as port:
        big = b"POST /hook HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * (17 << 10) + b"\r\nContent-Length: 0\r\n\r\n"
        assert (await raw(port, big)).startswith(b"HTTP/1.1 431 ")
        many = b"POST /hook HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"b" * 60) for i in range(400)) + b"\r\n"
        assert (await raw(port, many)).startswith(b"HTTP/1.1 431 ")


async def test_unfinished_tls_handshakes_count_end_with_the_read_deadline_and_log_no_error(ca, cert_files, caplog, monkeypatch):
    monkeypatch.setattr(http_post, "READ_TIMEOUT", 1.0)
    caplog.set_level(logging.DEBUG)
    async with minting(cert_files) as port:
        async with idle_sockets(port, http_post.MAX_PER_ADDRESS, "127.0.0.2") as held:
            # One more from that address is closed at once (a TLS client could not read a plain answer)...
            assert await closed_at_once(port, "127.0.0.2", within=0.5) == b""
            # ...a backend elsewhere mints as usual (google-genai, over TLS)...
            assert (await create(backend(port, ca), uses=1)).name.startswith("auth_tokens/")
            # ...and the handshakes never made end with the read deadline.
            with anyio.fail_after(3):
                for stream in held:
                    with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                        await stream.receive()
        for junk in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x16\x03\x01\x00\x05hello", os.urandom(300)):
            await raw(port, junk, source="127.0.0.3")
    loud = [r for r in caplog.records if r.name.startswith(("live", "anyio", "asyncio")) and (r.levelno >= logging.ERROR or r.exc_info)]
    assert not loud, [r.getMessage() for r in loud]
