"""The serving port's and the metrics port's HTTP as a stranger meets it: whatever
the request, an answer with a status (never a 500 with a traceback in the log),
and the server goes on."""

from __future__ import annotations

import logging

import anyio
import pytest

from connections.local_echo import LocalEcho
from live.agent import Agent
from serving import running

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("both_socket_layers")]


async def exchange(port: int, request: bytes) -> bytes:
    """The bytes the port answers `request` with, until it closes."""
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(request)
        out = b""
        with anyio.fail_after(10):
            try:
                while True:
                    out += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return out


def status_of(answer: bytes) -> int | None:
    """The status of an HTTP answer (None: the port answered nothing)."""
    line = answer.split(b"\r\n", 1)[0].split()
    return int(line[1]) if len(line) > 1 and line[1].isdigit() else None


def loud(caplog) -> list[str]:
    """What the server logged as an error or with a traceback."""
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


def get(target: bytes, *headers: bytes) -> bytes:
    return b"GET " + target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n"


async def test_a_target_no_url_parser_reads_on_the_metrics_port_is_refused_without_a_traceback(caplog):
    async with running(Agent(name="echo", model="local/echo"), LocalEcho(), metrics_port=0) as (server, _):
        for target in (b"//[", b"//[x/metrics", b"http://[/metrics"):
            assert status_of(await exchange(server.metrics_port, get(target))) in (400, 404), target
        # The port still serves what it is for.
        assert status_of(await exchange(server.metrics_port, get(b"/metrics"))) == 200
    assert not loud(caplog)


async def test_a_nul_under_client_is_not_found_without_a_traceback(caplog):
    async with running(Agent(name="echo", model="local/echo"), LocalEcho()) as (server, _):
        for target in (b"/client/\x00", b"/client/app.js\x00.png", b"/client/%00"):
            assert status_of(await exchange(server.port, get(target))) in (400, 404), target
        assert status_of(await exchange(server.port, get(b"/client/does-not-exist.js"))) == 404
    assert not loud(caplog)


# Google's own name for the key header, as google-genai sends it (once).
KEY_HEADER = "x-goog-api-key"


async def test_two_api_keys_on_the_live_api_endpoint_are_the_services_bad_key_close(caplog):
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    from connections.emulator import Script
    from connections.emulator.wire import BAD_KEY
    from gemini_serving import MODEL, serving, token
    from live.doors.gemini_live import GEMINI_PATHS

    async with serving(Script(speed=20)) as (emu, _, url):
        endpoint = url.removesuffix("/live") + GEMINI_PATHS[0]
        key = token()
        twice = [
            [(KEY_HEADER, key), (KEY_HEADER, key)],
            [(KEY_HEADER, key), (KEY_HEADER, "another")],
            [("Authorization", f"Token {key}"), ("Authorization", f"Token {key}")],
        ]
        for case, headers in enumerate(twice):
            async with connect(endpoint, additional_headers=headers) as ws:
                await ws.send('{"setup": {"model": "models/%s"}}' % MODEL)
                with anyio.fail_after(10), pytest.raises(ConnectionClosed) as closed:
                    await ws.recv()
            assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1008, BAD_KEY), case
        # One key opens the session as before.
        async with connect(endpoint, additional_headers=[(KEY_HEADER, key)]) as ws:
            await ws.send('{"setup": {"model": "models/%s"}}' % MODEL)
            with anyio.fail_after(10):
                assert "setupComplete" in await ws.recv()
    assert not loud(caplog)


async def test_a_request_with_too_much_header_is_answered(both_socket_layers):
    async with running(Agent(name="echo", model="local/echo"), LocalEcho()) as (server, _):
        one_long = get(b"/live", b"Upgrade: websocket", b"X-Pad: " + b"a" * (17 << 10))
        many = get(b"/healthz", *(b"X-%d: %s" % (i, b"b" * 60) for i in range(300)))
        unfinished = b"GET /live HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"c" * (17 << 10)
        for request in (one_long, many, unfinished):
            status = status_of(await exchange(server.port, request))
            # picows' parser stops at 16 KiB (fixed in its Cython); websockets at its line and count limits.
            assert status == 431  # websockets answers so too
        assert status_of(await exchange(server.port, get(b"/healthz"))) == 200


async def test_an_origin_no_url_parser_reads_is_refused_without_a_traceback(caplog):
    async with running(Agent(name="echo", model="local/echo"), LocalEcho()) as (server, _):
        for origin in (b"http://[", b"https://[::1", b"http://[x]:1"):
            request = get(b"/live", b"Origin: " + origin, b"Upgrade: websocket", b"Connection: Upgrade",
                          b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", b"Sec-WebSocket-Version: 13")
            assert status_of(await exchange(server.port, request)) == 403, origin
    assert not loud(caplog)
