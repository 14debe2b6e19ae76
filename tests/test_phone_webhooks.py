"""The webhook listener's HTTP, as a carrier (or anyone else) meets it."""

from __future__ import annotations

import anyio
import pytest

from clients.phone_double import http_post_raw
from live.net.http_post import HttpAnswer, PostListener

pytestmark = pytest.mark.anyio


async def raw(port: int, request: bytes) -> bytes:
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(request)
        out = b""
        with anyio.fail_after(15):
            try:
                while True:
                    out += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return out


async def test_only_bounded_posts_to_known_paths_reach_a_handler():
    seen = []

    async def handler(target, headers, body):
        seen.append((target, headers.get("content-type"), body))
        return HttpAnswer(200, b"ok\n")

    listener = PostListener({"/hook": handler}, "127.0.0.1", 0)
    async with anyio.create_task_group() as tg:
        port = await tg.start(listener.serve)
        status, body = await http_post_raw(f"http://127.0.0.1:{port}/hook?x=1", b"a=1", {"Content-Type": "application/x-www-form-urlencoded"})
        assert (status, body) == (200, b"ok\n")
        assert seen == [("/hook?x=1", "application/x-www-form-urlencoded", b"a=1")]
        assert (await http_post_raw(f"http://127.0.0.1:{port}/other", b"", {}))[0] == 404
        assert b" 405 " in await raw(port, b"GET /hook HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b" 413 " in await raw(port, b"POST /hook HTTP/1.1\r\nHost: x\r\nContent-Length: 999999\r\n\r\n")
        assert b" 400 " in await raw(port, b"NOT HTTP\r\n\r\n")
        tg.cancel_scope.cancel()
    assert len(seen) == 1


async def test_a_handler_that_fails_is_a_500_without_its_insides():
    def broken(target, headers, body):
        raise RuntimeError("secret internals")

    listener = PostListener({"/hook": broken}, "127.0.0.1", 0)
    async with anyio.create_task_group() as tg:
        port = await tg.start(listener.serve)
        status, body = await http_post_raw(f"http://127.0.0.1:{port}/hook", b"", {})
        tg.cancel_scope.cancel()
    assert status == 500 and b"secret" not in body
