"""Property, over real sockets: whatever bytes a stranger sends to the POST port,
or as WebSocket frames to either WebSocket layer on any door's path, the
server answers and goes on, and logs no error. Servers run in a thread of
their own (anyio's blocking portal); hypothesis draws what a plain socket sends."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import socket
import struct

import pytest
from anyio.from_thread import start_blocking_portal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench import fuzz_targets as t
from test_fuzz_parsers import frames_of, gemini_messages, native_messages, requests, twilio_messages

SOCKETS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@contextlib.contextmanager
def loud_log():
    """Errors and tracebacks logged by the server or by websockets (which logs its handlers' failures)."""
    handler = t.LoudLog()
    loggers = [logging.getLogger(name) for name in ("live", "websockets")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def exchange(port: int, data: bytes, *, timeout: float = 10.0, until: bytes | None = None) -> bytes:
    """Send `data` and read the answer until the server closes (or `until` arrives);
    without `until`, say we are done first."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(data)
            if until is None:
                sock.shutdown(socket.SHUT_WR)
        out = b""
        with contextlib.suppress(OSError):
            while (until is None or until not in out) and (chunk := sock.recv(65536)):
                out += chunk
        return out


# ---------------------------------------------------------------------- the POST port


@pytest.fixture(scope="module")
def post_port():
    from live.net.http_post import PostListener

    with start_blocking_portal() as portal:
        listener = PostListener(t._routes(), "127.0.0.1", 0)
        future, port = portal.start_task(listener.serve)
        yield port
        future.cancel()


@SOCKETS
@given(st.one_of(requests(), st.lists(st.binary(max_size=300), max_size=3)))
def test_the_post_port_answers_any_bytes_with_a_status(post_port, chunks):
    with loud_log() as log:
        answer = exchange(post_port, b"".join(chunks))
    status = answer[9:12]
    assert answer.startswith(b"HTTP/1.1 ") and status.isdigit() and int(status) in t.HTTP_POST_STATUSES, answer[:80]
    assert not log.loud, log.loud


# ---------------------------------------------------------------------- WebSocket frames


@st.composite
def ws_frames(draw: st.DrawFn, payloads: st.SearchStrategy[list[str | bytes]]) -> bytes:
    """WebSocket frames from a client (RFC 6455, 5.2), mostly well formed: any
    opcode, fragments, masks, lengths that lie, or no frame at all."""
    out = b""
    for payload in draw(payloads):
        data = payload.encode("utf-8", "surrogatepass") if isinstance(payload, str) else payload
        fin = draw(st.booleans() | st.just(True))
        opcode = draw(st.sampled_from([1 if isinstance(payload, str) else 2, 0, 8, 9, 10]) | st.integers(0, 15))
        rsv = draw(st.sampled_from([0, 0, 0, 1, 7]))
        masked = draw(st.booleans() | st.just(True))
        length = len(data) if draw(st.integers(0, 9)) else draw(st.sampled_from([0, 126, 65536, 2**63 - 1, 2**64 - 1]))
        head = bytes([fin << 7 | rsv << 4 | opcode])
        if length < 126:
            head += bytes([masked << 7 | length])
        elif length < 65536:
            head += bytes([masked << 7 | 126]) + struct.pack("!H", length)
        else:
            head += bytes([masked << 7 | 127]) + struct.pack("!Q", length)
        if masked:
            key = draw(st.binary(min_size=4, max_size=4))
            data = bytes(b ^ key[i % 4] for i, b in enumerate(data))
            head += key
        out += head + data
    if draw(st.integers(0, 9)) == 0:
        out += draw(st.binary(max_size=100))
    return out


def upgrade(path: str) -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    return (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode()


GEMINI_PATH = "/ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent"
twilio_frames = frames_of(*twilio_messages)
door_payloads = st.one_of(
    st.tuples(st.just("/live"), frames_of(*native_messages)),
    st.tuples(st.just(GEMINI_PATH), frames_of(*gemini_messages)),
    st.tuples(st.just("/twilio/media"), twilio_frames),
)


@pytest.fixture(scope="module", params=["picows", "websockets"])
def ws_server(request):
    from connections.local_echo import LocalEcho
    from live.agent import Agent
    from live.doors import NativeDoor
    from live.doors.gemini_live import gemini_doors
    from live.phone.lines import PhoneLines
    from live.server.config import ServerConfig
    from live.server.port import LiveServer

    lines = PhoneLines.twilio(t.TWILIO_AUTH_TOKEN, t.PUBLIC_URL, agent=t.AGENT, token_secret=t.SECRET)
    doors = {**lines.mounted_on({"/live": NativeDoor}), **gemini_doors([t.MODEL])}
    config = ServerConfig(port=0, sockets=request.param, reattach_grace=0, start_timeout=2, audio_lead=None)
    server = LiveServer(Agent(name=t.AGENT, model="local/echo"), LocalEcho(), config, doors=doors)
    with start_blocking_portal() as portal:
        future, port = portal.start_task(server.serve)
        yield server, port
        portal.call(server.stop)
        future.result(timeout=15)


@SOCKETS
@given(door_payloads.flatmap(lambda door: st.tuples(st.just(door[0]), ws_frames(st.just(door[1])))))
def test_either_websocket_layer_takes_any_frames_on_any_door_and_goes_on(ws_server, case):
    server, port = ws_server
    path, frames = case
    with loud_log() as log, socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        # A client waits for the server's answer to its upgrade before it sends
        # frames (RFC 6455, 4.1).
        sock.sendall(upgrade(path))
        answer = b""
        while b"\r\n\r\n" not in answer and (chunk := sock.recv(4096)):
            answer += chunk
        assert answer.startswith((b"HTTP/1.1 101 ", b"HTTP/1.1 503 ")), answer[:80]
        with contextlib.suppress(OSError):
            sock.sendall(frames)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):
                pass
    assert not log.loud, log.loud


def test_the_websocket_servers_still_serve_after_the_fuzzing(ws_server):
    """After the frames above (run first): a plain client still opens a session."""
    import time

    server, port = ws_server
    deadline = time.monotonic() + 10
    while server.sessions and time.monotonic() < deadline:
        time.sleep(0.05)
    start = _masked(json.dumps({"type": "session.start"}).encode())
    answer = exchange(port, upgrade("/live") + start, timeout=5, until=b"session.started")
    assert answer.startswith(b"HTTP/1.1 101 ") and b"session.started" in answer


def _masked(payload: bytes) -> bytes:
    key = os.urandom(4)
    return bytes([0x81, 0x80 | len(payload)]) + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))
