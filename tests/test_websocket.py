"""`live.net.websocket` behaves as websockets does, on either side of a connection.

The server and google-genai read closes, handshake refusals and messages as
websockets reports them; a `live.net.websocket.WebSocket` must report the same.
Most tests here are differential: the same peer script, once against
websockets and once against `live.net.websocket`, and what each saw compared.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc
import pytest
import websockets
from websockets.asyncio.server import ServerConnection, serve

from live.net import websocket
from live.net.websocket import WebSocket
from live.net.websocket import connect as open_socket

pytestmark = pytest.mark.anyio

Script_ = list[tuple[str, Any]]


def _random_script(rng: random.Random) -> Script_:
    """What a server does to one connection: messages (text or binary, whole or in
    fragments, empty to 200 KB), then a close with a code and reason, or a drop."""
    steps: Script_ = []
    for _ in range(rng.randrange(0, 12)):
        size = rng.choice([0, 1, 3, 100, 4096, 65_536, 200_000])
        text = rng.random() < 0.6
        payload: str | bytes = "é" * (size // 2) if text else rng.randbytes(size)
        if rng.random() < 0.25 and size > 10:
            cut = size // 3 if not text else len(payload) // 3
            steps.append(("fragments", [payload[:cut], payload[cut:]]))
        else:
            steps.append(("message", payload))
    end = rng.choice(["close", "close", "drop", "recv_then_close"])
    if end == "drop":
        steps.append(("drop", None))
    else:
        code = rng.choice([1000, 1001, 1008, 1011, 1007, 4000, 1013])
        steps.append((end, (code, rng.choice(["", "bye", "RESOURCE_EXHAUSTED: quota", "élan"]))))
    return steps


async def _serve(script: Script_, ready: Callable[[int], Awaitable[None]], **options: Any) -> None:
    async def handler(ws: ServerConnection) -> None:
        for kind, value in script:
            if kind == "message":
                await ws.send(value)
            elif kind == "fragments":
                await ws.send(value)
            elif kind == "drop":
                ws.transport.abort()
                return
            elif kind == "close":
                await ws.close(*value)
            elif kind == "recv_then_close":
                await ws.recv()
                await ws.close(*value)

    async with serve(handler, "127.0.0.1", 0, compression=None, **options) as server:
        port = server.sockets[0].getsockname()[1]
        await ready(port)


async def _observe(client: Any, *, send_first: bool) -> list[Any]:
    """Every message the client reads, then how its socket ended."""
    seen: list[Any] = []
    if send_first:
        await client.send("hello")
    while True:
        try:
            message = await client.recv(decode=False)
        except websockets.ConnectionClosed as exc:
            seen.append((type(exc).__name__, exc.rcvd and (exc.rcvd.code, exc.rcvd.reason)))
            break
        seen.append(message)
    try:
        await client.send("after the end")
    except websockets.ConnectionClosed as exc:
        seen.append(("send after the end", type(exc).__name__))
    return seen


async def _both_clients(script: Script_) -> tuple[list[Any], list[Any]]:
    send_first = any(kind == "recv_then_close" for kind, _ in script)
    results: dict[str, list[Any]] = {}

    async def ready(port: int) -> None:
        uri = f"ws://127.0.0.1:{port}/"
        async with websockets.connect(uri, compression=None, max_size=None) as ws:
            results["websockets"] = await _observe(ws, send_first=send_first)
        ours = await open_socket(uri, max_size=None)
        try:
            results["live_socket"] = await _observe(ours, send_first=send_first)
        finally:
            await ours.close()

    with anyio.fail_after(20):
        await _serve(script, ready)
    return results["websockets"], results["live_socket"]


@pytest.mark.parametrize("seed", range(24))
async def test_a_live_socket_sees_what_websockets_sees(seed: int):
    """Random server behaviour: the same messages, in order, and the same end
    (exception class, received close code and reason), then the same refusal to send."""
    script = _random_script(random.Random(seed))
    expected, got = await _both_clients(script)
    assert got == expected, script


async def test_a_message_over_max_size_closes_with_1009_as_websockets_does():
    """Too large for `max_size`: the connection fails with 1009 sent, on either socket."""
    async def handler(ws: ServerConnection) -> None:
        await ws.send(b"x" * 2000)
        await ws.wait_closed()

    async with serve(handler, "127.0.0.1", 0, compression=None) as server:
        uri = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
        ends = []
        for client in (websockets.connect(uri, max_size=1000, compression=None), _opened(uri, max_size=1000)):
            async with client as ws:
                with pytest.raises(websockets.ConnectionClosedError) as caught:
                    await ws.recv()
                ends.append(caught.value.sent.code)
    # (websockets drops the socket after its close frame; a WebSocket also reads the peer's answer.)
    assert ends == [1009, 1009]


class _opened:
    """`async with` an `open_socket(...)`."""

    def __init__(self, uri: str, **options: Any) -> None:
        self._uri, self._options = uri, options

    async def __aenter__(self) -> WebSocket:
        self._socket = await open_socket(self._uri, **self._options)
        return self._socket

    async def __aexit__(self, *exc: object) -> None:
        await self._socket.close()


async def test_a_refused_handshake_is_websockets_invalid_status_with_the_response():
    def refuse(connection: ServerConnection, request: Any) -> Any:
        return connection.respond(403, "API key not valid\n")

    async with serve(lambda ws: ws.wait_closed(), "127.0.0.1", 0, process_request=refuse) as server:
        uri = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
        with pytest.raises(websockets.InvalidStatus) as caught:
            await open_socket(uri)
    assert caught.value.response.status_code == 403
    assert b"API key not valid" in caught.value.response.body


async def test_a_closing_client_completes_the_handshake_with_its_code():
    closes: list[tuple[int | None, str | None]] = []

    async def handler(ws: ServerConnection) -> None:
        await ws.wait_closed()
        closes.append((ws.close_code, ws.close_reason))

    async with serve(handler, "127.0.0.1", 0, compression=None) as server:
        uri = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
        ours = await open_socket(uri)
        await ours.close(4001, "done here")
        assert not ours.can_send_now()
        with pytest.raises(websockets.ConnectionClosedError):  # 4001 is not a normal close, to websockets either
            await ours.recv()
        with anyio.fail_after(5):
            while not closes:
                await anyio.sleep(0.01)
    assert closes == [(4001, "done here")]


async def test_many_messages_while_nobody_reads_all_arrive_in_order():
    """A bounded queue: the socket stops reading while `max_queue` messages wait, and loses nothing."""
    count = 300

    async def handler(ws: ServerConnection) -> None:
        for i in range(count):
            await ws.send(f"{i:05d}" + "x" * 4000)
        await ws.close()

    async with serve(handler, "127.0.0.1", 0, compression=None) as server:
        uri = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
        async with _opened(uri, max_queue=4) as ours:
            await anyio.sleep(0.3)  # the server writes while nothing is read
            got = []
            with anyio.fail_after(10):
                while True:
                    try:
                        got.append(int((await ours.recv())[:5]))
                    except websockets.ConnectionClosedOK:
                        break
    assert got == list(range(count))


async def test_can_send_now_only_while_open_and_the_peer_keeps_reading():
    stop_reading = anyio.Event()

    async def handler(ws: ServerConnection) -> None:
        await ws.recv()  # reads one message, then stops reading
        await stop_reading.wait()

    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    async with serve(handler, sock=listener, max_queue=1, max_size=None, compression=None, close_timeout=0.5):
        ours = await open_socket(f"ws://127.0.0.1:{port}/", max_size=None, close_timeout=0.5)
        assert ours.can_send_now()
        await ours.send(b"x" * 1024)
        assert ours.can_send_now()  # taken at once: nothing buffered
        with anyio.move_on_after(5):
            while ours.can_send_now():
                async with anyio.create_task_group() as tg:
                    tg.start_soon(ours.send, b"x" * (1 << 16))
                    await anyio.sleep(0.01)
                    tg.cancel_scope.cancel()
        assert not ours.can_send_now(), "64 KiB frames never filled a socket whose peer stopped reading"
        stop_reading.set()
        with anyio.fail_after(15):
            await ours.close()
        assert not ours.can_send_now()


async def test_the_proxy_is_chosen_as_websockets_chooses_it(monkeypatch: pytest.MonkeyPatch):
    """HTTPS_PROXY is honoured, and NO_PROXY lets loopback through."""
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    dead_port = dead.getsockname()[1]
    dead.close()  # nothing listens there

    async def handler(ws: ServerConnection) -> None:
        await ws.send("through")

    async with serve(handler, "127.0.0.1", 0, compression=None) as server:
        uri = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{dead_port}")
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        async with _opened(uri) as ours:
            assert await ours.recv() == "through"
        monkeypatch.delenv("NO_PROXY")
        monkeypatch.delenv("no_proxy", raising=False)
        with pytest.raises(OSError):
            await open_socket(uri)




# ---------------------------------------------------------------------------- the server side


def _client_script(rng: random.Random) -> Script_:
    """What a client does: messages (text or binary, whole or in fragments), then
    a close with a code and reason, or a drop, or waiting for the server to close."""
    steps: Script_ = []
    for _ in range(rng.randrange(0, 10)):
        size = rng.choice([0, 1, 640, 4096, 65_536, 150_000])
        text = rng.random() < 0.4
        payload: str | bytes = "ü" * (size // 2) if text else rng.randbytes(size)
        if rng.random() < 0.2 and size > 10:
            steps.append(("fragments", [payload[: len(payload) // 3], payload[len(payload) // 3 :]]))
        else:
            steps.append(("message", payload))
    end = rng.choice(["close", "drop", "server_closes"])
    steps.append((end, (rng.choice([1000, 1001, 1008, 4000]), rng.choice(["", "bye", "ünïcode"]))))
    return steps


async def _server_side(serve_with: Callable[..., Any], script: Script_) -> list[Any]:
    """What a server handler sees of `script`, and how its connection ended."""
    seen: list[Any] = []
    done = anyio.Event()

    async def handler(ws: Any) -> None:
        try:
            async for message in ws:
                seen.append(message)
                if message == "close me":
                    await ws.close(4001, "as asked")
        except websockets.ConnectionClosedError as exc:
            seen.append(("error", exc.rcvd and (exc.rcvd.code, exc.rcvd.reason)))
        seen.append(("ended", ws.close_code, ws.close_reason))
        done.set()

    async with serve_with(handler, "127.0.0.1", 0, max_size=None, compression=None) as server:
        port = server.sockets[0].getsockname()[1]
        async with websockets.connect(f"ws://127.0.0.1:{port}/", max_size=None, compression=None) as client:
            for kind, value in script:
                if kind in ("message", "fragments"):
                    await client.send(value)
                elif kind == "drop":
                    client.transport.abort()
                elif kind == "close":
                    await client.close(*value)
                else:
                    await client.send("close me")
                    with pytest.raises(websockets.ConnectionClosed):
                        await client.recv()
            with anyio.fail_after(10):
                await done.wait()
    return seen


def _live_serve(handler: Any, host: str, port: int, **options: Any) -> Any:
    options.pop("compression")
    return websocket.serve(handler, host, port, **options)


@pytest.mark.parametrize("seed", range(16))
async def test_a_live_server_sees_what_a_websockets_server_sees(seed: int):
    """Random client behaviour: the handler reads the same messages in order and
    sees the same end (the loop ends on a normal close, raises otherwise, and the
    same close code and reason)."""
    script = _client_script(random.Random(seed))
    expected = await _server_side(serve, script)
    got = await _server_side(_live_serve, script)
    assert got == expected, script


async def _http_get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """A plain HTTP/1.1 GET; the status, the headers (lower-cased names) and the body."""
    stream = await anyio.connect_tcp("127.0.0.1", port)
    lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    await stream.send(("\r\n".join(lines) + "\r\n\r\n").encode())
    data = b""
    with anyio.fail_after(5):
        try:
            while True:
                data += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
            pass
    await stream.aclose()
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode().split("\r\n")
    found = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        found[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), found, body


async def test_process_request_answers_plain_http_with_its_response():
    """A `Response` from `process_request` goes out as it is: status, headers, body."""
    from websockets.datastructures import Headers
    from websockets.http11 import Response

    def routes(ws: WebSocket, request: Any) -> Any:
        if request.path == "/healthz":
            body = b'{"status": "ok"}'
            headers = Headers([("Content-Type", "application/json"), ("Content-Length", str(len(body))), ("X-Test", "1")])
            return Response(200, "OK", headers, body)
        if request.path == "/nope":
            return Response(403, "Forbidden", Headers([("Content-Length", "3")]), b"no\n")
        return None

    async with websocket.serve(lambda ws: ws.wait_closed(), "127.0.0.1", 0, process_request=routes) as server:
        port = server.sockets[0].getsockname()[1]
        status, headers, body = await _http_get(port, "/healthz")
        assert (status, headers["content-type"], headers["x-test"], body) == (200, "application/json", "1", b'{"status": "ok"}')
        status, _, body = await _http_get(port, "/nope")
        assert (status, body) == (403, b"no\n")
        # A plain GET of the socket's path is refused (it asks for no upgrade), and the server goes on.
        status, _, _ = await _http_get(port, "/live")
        assert 400 <= status < 500
        async with websockets.connect(f"ws://127.0.0.1:{port}/live") as client:
            await client.send("still serving")


async def test_a_handler_that_returns_closes_1000_and_one_that_fails_closes_1011():
    async def handler(ws: WebSocket) -> None:
        if await ws.recv() == "fail":
            raise RuntimeError("a bug")

    async with websocket.serve(handler, "127.0.0.1", 0) as server:
        url = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
        codes = []
        for word in ("return", "fail"):
            async with websockets.connect(url) as client:
                await client.send(word)
                with pytest.raises(websockets.ConnectionClosed) as caught:
                    await client.recv()
                codes.append(caught.value.rcvd.code)
    assert codes == [1000, 1011]


async def test_leaving_serve_closes_open_connections_with_1001_and_stops_listening():
    async def handler(ws: WebSocket) -> None:
        await ws.wait_closed()

    async with websocket.serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        client = await websockets.connect(f"ws://127.0.0.1:{port}/")
    with pytest.raises(websockets.ConnectionClosed) as caught:
        with anyio.fail_after(5):
            await client.recv()
    assert caught.value.rcvd.code == 1001
    with pytest.raises(OSError):
        await websockets.connect(f"ws://127.0.0.1:{port}/", open_timeout=2)


async def test_text_that_is_not_utf8_closes_with_1007():
    """As websockets does: the reader fails, the client hears 1007."""
    import struct

    async def handler(ws: WebSocket) -> None:
        with pytest.raises(websockets.ConnectionClosedError):
            await ws.recv()

    async with websocket.serve(handler, "127.0.0.1", 0) as server:
        async with websockets.connect(f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/") as client:
            # A masked text frame holding b"\xff" (websockets' client refuses to write one).
            mask = b"\x01\x02\x03\x04"
            client.transport.write(struct.pack("!BB", 0x81, 0x80 | 1) + mask + bytes([0xFF ^ mask[0]]))
            with pytest.raises(websockets.ConnectionClosedError) as caught:
                await client.recv()
    assert caught.value.rcvd.code == 1007


async def test_frames_waiting_counts_what_was_read_and_not_taken():
    arrived = anyio.Event()
    counts: list[int] = []

    async def handler(ws: WebSocket) -> None:
        await arrived.wait()
        counts.append(ws.frames_waiting())
        await ws.recv()
        counts.append(ws.frames_waiting())

    async with websocket.serve(handler, "127.0.0.1", 0) as server:
        async with websockets.connect(f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/") as client:
            for i in range(3):
                await client.send(f"{i}")
            await anyio.sleep(0.2)
            arrived.set()
            with pytest.raises(websockets.ConnectionClosedOK):
                await client.recv()
    assert counts == [3, 2]


async def test_the_fast_lane_takes_binary_frames_only_while_the_reader_waits_and_keeps_order():
    """`take_binary` sees a binary frame as it arrives while the reader waits on an
    empty queue; a frame behind a text frame the reader has not finished with, or
    several read at once, go to the reader in order."""
    seen: list[tuple[str, Any]] = []
    text_in_hand = anyio.Event()
    finish_text = anyio.Event()
    done = anyio.Event()

    async def handler(ws: WebSocket) -> None:
        ws.take_binary = lambda data: seen.append(("lane", data)) or True
        async for message in ws:
            seen.append(("reader", message))
            if message == "slow":
                text_in_hand.set()
                await finish_text.wait()  # the reader is busy with this text frame
            if message == "end":
                done.set()

    async with websocket.serve(handler, "127.0.0.1", 0) as server:
        async with websockets.connect(f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/") as client:
            await client.send(b"a")
            await anyio.sleep(0.1)
            await client.send("slow")
            await text_in_hand.wait()
            await client.send(b"b")  # arrives while the reader holds "slow"
            await anyio.sleep(0.1)
            finish_text.set()
            await anyio.sleep(0.1)
            # Several frames in one write: one read of the socket.
            client.transport.write(b"".join(_masked_binary(bytes([n])) for n in (1, 2, 3)))
            await anyio.sleep(0.1)
            await client.send(b"c")
            await anyio.sleep(0.1)
            await client.send("end")
            with anyio.fail_after(5):
                await done.wait()
    assert seen == [
        ("lane", b"a"),
        ("reader", "slow"),
        ("reader", b"b"),
        ("reader", b"\x01"),
        ("reader", b"\x02"),
        ("reader", b"\x03"),
        ("lane", b"c"),
        ("reader", "end"),
    ]


def _masked_binary(payload: bytes) -> bytes:
    """A client's binary frame as it goes on the wire (masked; short payloads only)."""
    import struct

    mask = b"\x0a\x0b\x0c\x0d"
    body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return struct.pack("!BB", 0x82, 0x80 | len(payload)) + mask + body


async def test_send_nowait_writes_at_once():
    received: list[Any] = []

    async def handler(ws: ServerConnection) -> None:
        async for message in ws:
            received.append(message)

    async with serve(handler, "127.0.0.1", 0, compression=None) as server:
        ours = await open_socket(f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/")
        assert ours.can_send_now()
        ours.send_nowait("text")
        ours.send_nowait(b"\x00\x01")
        await ours.close()
        ours.send_nowait("after the close")  # dropped, no error
    assert received == ["text", b"\x00\x01"]


# ---------------------------------------------------------------------------- cancellation and odd peers


async def _full_socket(resume: anyio.Event) -> tuple[Any, int]:
    """A websockets server that reads one message, stops reading until `resume`, then
    reads everything (small buffers, so that a few frames fill them)."""

    async def handler(ws: ServerConnection) -> None:
        await ws.recv()
        await resume.wait()
        async for _ in ws:
            pass

    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    listener.bind(("127.0.0.1", 0))
    server = serve(handler, sock=listener, max_queue=1, max_size=None, compression=None, close_timeout=0.5)
    return server, listener.getsockname()[1]


async def test_a_sender_cancelled_while_the_socket_is_full_leaves_the_others_waiting():
    """Senders waiting for room share one wait: cancelling one must not cancel it
    for the others, which go on once the peer reads again."""
    resume = anyio.Event()
    server, port = await _full_socket(resume)
    async with server:
        ours = await open_socket(f"ws://127.0.0.1:{port}/", max_size=None, close_timeout=0.5)
        try:
            await ours.send(b"x")
            transport = ours.transport
            with anyio.fail_after(10):  # past the write buffer's high-water mark: sends wait
                while transport.get_write_buffer_size() <= transport.get_write_buffer_limits()[1]:
                    ours.send_nowait(b"z" * (1 << 16))
                    await anyio.sleep(0.01)
            scopes: dict[str, anyio.CancelScope] = {}
            done: list[str] = []

            async def sender(name: str) -> None:
                with anyio.CancelScope() as scope:
                    scopes[name] = scope
                    await ours.send(name.encode())
                    done.append(name)

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(sender, "first")
                    tg.start_soon(sender, "second")
                    await anyio.sleep(0.1)
                    assert done == []  # both wait for room
                    scopes["first"].cancel()
                    await anyio.sleep(0.1)
                    resume.set()
            assert done == ["second"]
        finally:
            resume.set()
            await ours.close()


async def test_a_cancelled_recv_leaves_the_socket_readable():
    async def handler(ws: ServerConnection) -> None:
        await ws.recv()  # the client's cue
        await ws.send("late")
        await ws.wait_closed()

    async with serve(handler, "127.0.0.1", 0, compression=None) as server:
        async with _opened(f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/") as ours:
            with anyio.move_on_after(0.1):
                await ours.recv()  # nothing yet: cancelled
            await ours.send("go")
            with anyio.fail_after(5):
                assert await ours.recv() == "late"


async def test_a_close_frame_without_a_code_is_answered_with_1000():
    """Browsers' `ws.close()` sends an empty close frame; the answer must carry a valid code."""
    async def handler(ws: WebSocket) -> None:
        await ws.wait_closed()

    async with websocket.serve(handler, "127.0.0.1", 0) as server:
        async with websockets.connect(f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/") as client:
            mask = b"\x01\x02\x03\x04"
            client.transport.write(bytes([0x88, 0x80]) + mask)  # CLOSE, masked, no payload
            with pytest.raises(websockets.ConnectionClosed) as caught:
                with anyio.fail_after(5):
                    await client.recv()
    assert caught.value.rcvd is not None and caught.value.rcvd.code == 1000


async def test_a_peer_that_hangs_up_before_the_upgrade_is_a_handshake_error():
    async def hang_up(stream: Any) -> None:
        await stream.receive()  # the upgrade request
        await stream.aclose()

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, hang_up)
        with pytest.raises(websockets.InvalidHandshake):
            with anyio.fail_after(5):
                await open_socket(f"ws://127.0.0.1:{port}/")
        tg.cancel_scope.cancel()


async def test_a_close_whose_wait_is_cancelled_still_ends_the_connection():
    """The close timeout holds even when the caller stops waiting sooner: the
    connection is down (no close frame came back) soon after."""
    answer = anyio.Event()

    async def handler(ws: ServerConnection) -> None:
        ws.transport.pause_reading()  # does not answer the close
        await answer.wait()

    async with serve(handler, "127.0.0.1", 0, compression=None, close_timeout=0.1) as server:
        ours = await open_socket(f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/", close_timeout=0.3)
        with anyio.move_on_after(0.05):
            await ours.close()
        assert ours.close_code is None  # not down yet
        with anyio.fail_after(5):
            await ours.wait_closed()
        assert ours.close_code == 1006
        answer.set()


async def test_a_client_sockets_kernel_receive_buffer_is_capped():
    """What one read can hand over bounds how far the socket's read buffer grows
    under a flood: the server caps the kernel's buffer for each client socket."""
    buffers: list[int] = []

    async def handler(ws: WebSocket) -> None:
        buffers.append(ws.transport.get_extra_info("socket").getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))

    async with websocket.serve(handler, "127.0.0.1", 0, receive_buffer=32 << 10) as server:
        async with websockets.connect(f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/") as client:
            with pytest.raises(websockets.ConnectionClosedOK):
                await client.recv()
    assert buffers and buffers[0] <= 2 * (32 << 10)  # Linux doubles what it is given, for its bookkeeping
