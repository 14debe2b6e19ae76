"""Who may talk to the server: Host and Origin checks, session tokens, limits before a session.

Attacks are made as an attacker would make them: raw HTTP requests with the
headers a rebinding page or a broken client sends, and tokens forged, expired
or meant for someone else.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time

import anyio
import jwt
import pytest

from live.observe.logs import FRAME_TRACERS
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from clients.client import LiveClient, SessionRefused
from live import protocol as p
from live.access.addresses import AddressSet, address_key, forwarded_client
from live.agent import Agent
from live.access.auth import HostPolicy, TokenRefused, host_name, mint_token, verify_token
from live.cli import main as live_cli
from live.registry import default_registry
from serving import collect, running

# Every test on both WebSocket layers the server can listen with.
pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("both_socket_layers")]

AGENT = Agent(name="test", model="local/echo")


def echo():
    return default_registry().resolve("local/echo")


async def raw_request(port: int, lines: list[str], host: str = "127.0.0.1") -> tuple[int, str]:
    """Send an HTTP/1.1 request line by line; the status code and body of the answer."""
    async with await anyio.connect_tcp(host, port) as stream:
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


async def test_a_refused_request_is_logged_without_its_query_string(caplog):
    """The demo page takes a token as `/?token=...`: a refusal must not log it."""
    caplog.set_level(logging.WARNING, "live.server")
    secret_query = "token=eyJhbGciOiJIUzI1NiJ9.e30.c2lnbmF0dXJl"
    async with running(AGENT, echo()) as (_, url):
        port = port_of(url)
        status, _ = await raw_request(port, [f"GET /?{secret_query} HTTP/1.1", "Host: evil.example"])
        assert status == 403
        status, _ = await raw_request(port, handshake(f"/live?{secret_query}", "Host: 127.0.0.1", "Origin: http://evil.example"))
        assert status == 403
    lines = [r.getMessage() for r in caplog.records]
    assert sum("refused HTTP request for '/'" in line or "refused HTTP request for '/live'" in line for line in lines) == 2
    assert not any("eyJ" in line or "token=" in line for line in lines)


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

    with_ports = HostPolicy.for_bind("10.0.0.2", ["Live.Example:8443", "[fd00::2]:8765"])
    assert with_ports.host_allowed("live.example") and with_ports.host_allowed("fd00::2")

    ipv6 = HostPolicy.for_bind("::1")
    assert ipv6.host_allowed(host_name("[::1]:8765") or "")


def test_host_headers_are_parsed_strictly():
    assert host_name("Example.COM:8765") == "example.com"
    assert host_name("[0:0::1]") == "::1"
    assert host_name("localhost.") == "localhost"
    for bad in ("", "a b", "user@host", "host:port", "host:123456", "[nothex]", "/path", "h:1:2"):
        assert host_name(bad) is None, bad


# ---------------------------------------------------------------------- tokens

SECRET = "a-test-secret-that-is-long-enough-for-hs256"


async def refused(url: str, token: str | None) -> SessionRefused:
    with pytest.raises(SessionRefused) as info:
        async with LiveClient.connect(url, token=token):
            pass
    return info.value


async def test_forged_expired_early_and_wrong_agent_tokens_are_refused_a_minted_one_works(caplog):
    caplog.set_level(logging.DEBUG)
    now = time.time()
    cases = {
        "signature": mint_token("another-secret-just-as-long-as-the-real-one", subject="eve"),
        "expired": mint_token(SECRET, ttl=60, now=now - 120),
        "not valid yet": mint_token(SECRET, not_before=now + 120),
        "for agent 'other'": mint_token(SECRET, agent="other"),
        "no 'exp'": jwt.encode({"sub": "eve"}, SECRET, algorithm="HS256"),
        "not a valid signed token": "not.a.jwt",
        "not signed with HS256": jwt.encode({"exp": now + 60}, None, algorithm="none"),
        "needs a token": None,
    }
    events: list[str] = []
    async with running(AGENT, echo(), token_secret=SECRET) as (_, url):
        for why, token in cases.items():
            refusal = await refused(url, token)
            assert refusal.code == "unauthorized", why
            assert why in refusal.message, (why, refusal.message)
            events.append(refusal.message)
        good = mint_token(SECRET, subject="user-42", agent="test", ttl=30)
        async with LiveClient.connect(url, token=good) as client:
            await client.send_text("hello")
            seen = await collect(client, lambda e: isinstance(e, p.TurnComplete))
            events += [repr(e) for e in seen]
            assert any(isinstance(e, p.TextEvent) and "hello" in e.text for e in seen)
    # The socket layers' frame tracing is never shown by `live serve` (live.observe.logs.FRAME_TRACERS).
    logged = [r.getMessage() for r in caplog.records if not r.name.startswith(FRAME_TRACERS)]
    assert any("subject=user-42" in line for line in logged)
    assert sum("unauthorized" in line for line in logged) == len(cases)
    # Neither the secret nor any token is ever said: not in a log line, not in an event.
    for line in logged + events:
        assert SECRET not in line
        for token in [good, *cases.values()]:
            if token:
                assert token not in line
                signature = token.split(".")[-1]
                assert not signature or signature not in line  # not even the signature part


async def test_the_static_development_token_still_works_beside_signed_ones():
    async with running(AGENT, echo(), token="dev-token", token_secret=SECRET) as (_, url):
        async with LiveClient.connect(url, token="dev-token"):
            pass
        async with LiveClient.connect(url, token=mint_token(SECRET)):
            pass
        assert (await refused(url, "dev-tokeN")).code == "unauthorized"


async def test_a_non_browser_client_may_send_the_token_as_a_bearer_header():
    async with running(AGENT, echo(), token_secret=SECRET) as (_, url):
        for token, expected in ((mint_token(SECRET), "session.started"), ("forged", "error")):
            async with ws_connect(url, additional_headers={"Authorization": f"Bearer {token}"}) as ws:
                await ws.send(json.dumps({"type": "session.start"}))
                with anyio.fail_after(5):
                    first = json.loads(await ws.recv())
                assert first["type"] == expected, first
                if expected == "error":
                    assert first["code"] == "unauthorized"


async def test_a_tokens_max_duration_ends_the_session():
    async with running(AGENT, echo(), token_secret=SECRET) as (_, url):
        token = mint_token(SECRET, max_duration=0.5)
        async with LiveClient.connect(url, token=token) as client:
            started = time.monotonic()
            events = await collect(client, lambda e: isinstance(e, p.SessionClosed), timeout=5)
            lasted = time.monotonic() - started
    error = next(e for e in events if isinstance(e, p.ErrorEvent))
    assert error.code == "session_expired" and error.fatal and "max_duration" in error.message
    assert 0.4 < lasted < 3


async def test_a_token_opens_one_session_only():
    async with running(AGENT, echo(), token_secret=SECRET) as (_, url):
        token = mint_token(SECRET, subject="ann", ttl=60)
        async with LiveClient.connect(url, token=token):
            refusal = await refused(url, token)  # a copy of it, while the first session runs
        assert refusal.code == "unauthorized" and "already used" in refusal.message
        assert (await refused(url, token)).code == "unauthorized"  # and after it ended
        async with LiveClient.connect(url, token=mint_token(SECRET, subject="ann", ttl=60)):
            pass  # a new token for the same user works
        # A token minted elsewhere without a jti cannot be told apart from its copies.
        no_jti = jwt.encode({"exp": int(time.time()) + 60, "sub": "ann"}, SECRET, algorithm="HS256")
        assert "no 'jti' claim" in (await refused(url, no_jti)).message


async def test_a_token_is_spent_only_by_a_session_that_opens():
    """A start refused after its token was checked (here Google refuses the
    model connection) spends nothing: the client may try again with it."""
    from connections import double
    from connections.gemini import Gemini

    refusing = double.ScriptedSession(refuse=double.Close(1011, "RESOURCE_EXHAUSTED: quota exceeded"))
    transport = double.DoubleTransport(refusing, double.ScriptedSession())
    llm = Gemini("gemini-2.5-flash", transport=transport)
    async with running(Agent(name="test", model="gemini-2.5-flash"), llm, token_secret=SECRET) as (_, url):
        token = mint_token(SECRET, subject="ann", ttl=60)
        first = await refused(url, token)
        assert first.code == "quota_exhausted", first
        async with LiveClient.connect(url, token=token):
            pass  # the same token opens the session it has not opened yet
        assert "already used" in (await refused(url, token)).message
    assert len(transport.connects) == 2


async def test_two_openings_racing_with_one_token_open_one_session():
    async with running(AGENT, echo(), token_secret=SECRET) as (_, url):
        token = mint_token(SECRET, subject="ann", ttl=60)
        sockets = [await ws_connect(url) for _ in range(4)]
        for ws in sockets:  # all four are read before any session opens
            await ws.send(json.dumps({"type": "session.start", "token": token}))
        firsts = [await first_event(ws) for ws in sockets]
        assert sorted(event["type"] for event in firsts) == ["error", "error", "error", "session.started"]
        assert all("already used" in event["message"] for event in firsts if event["type"] == "error")
        for ws in sockets:
            await ws.close()


async def test_a_token_valid_for_longer_than_the_ceiling_is_refused():
    century = mint_token(SECRET, ttl=100 * 365 * 86400, subject="ann")
    async with running(AGENT, echo(), token_secret=SECRET) as (_, url):
        refusal = await refused(url, century)
        assert refusal.code == "unauthorized"
        assert "longer than the 60 minutes this server accepts" in refusal.message, refusal.message
        async with LiveClient.connect(url, token=mint_token(SECRET, ttl=3000)):
            pass
    async with running(AGENT, echo(), token_secret=SECRET, max_token_lifetime=30) as (_, url):
        assert "longer than the 30 s" in (await refused(url, mint_token(SECRET, ttl=300))).message
    # A token issued long ago is as long-lived as its claims say, whatever is left of it.
    old = mint_token(SECRET, ttl=7200, now=time.time() - 7000)
    with pytest.raises(TokenRefused, match="longer than"):
        verify_token(old, SECRET)


async def test_the_issuer_is_checked_when_the_server_names_one():
    issuer = "https://app.example"
    async with running(AGENT, echo(), token_secret=SECRET, token_issuer=issuer) as (_, url):
        assert "no 'iss' claim" in (await refused(url, mint_token(SECRET))).message
        wrong = await refused(url, mint_token(SECRET, issuer="https://evil.example"))
        assert wrong.code == "unauthorized" and "issuer" in wrong.message
        async with LiveClient.connect(url, token=mint_token(SECRET, issuer=issuer)):
            pass


async def test_text_that_is_not_utf8_in_a_token_is_a_clean_refusal(caplog):
    """A lone surrogate is valid JSON (an escape) but no text: refused, never a traceback."""
    caplog.set_level(logging.DEBUG)
    assert pytest.raises(TokenRefused, verify_token, "\ud800", SECRET).value.args[0].startswith("the token is not")
    async with running(AGENT, echo(), token_secret=SECRET, token="dev-token") as (_, url):
        async with ws_connect(url) as ws:
            await ws.send('{"type": "session.start", "token": "\\ud800"}')
            event = await first_event(ws)
            assert event["type"] == "error" and event["code"] == "invalid_field" and "token" in event["message"]
            await ws.send('{"type": "session.resume", "session_id": "x", "resume_token": "\\udfff"}')
            event = await first_event(ws)
            assert event["code"] == "invalid_field" and "resume_token" in event["message"]
            # The socket goes on, and a good token still opens the session on it.
            await ws.send(json.dumps({"type": "session.start", "token": mint_token(SECRET)}))
            assert (await first_event(ws))["type"] == "session.started"
            # In the session, a typed turn that is not text is dropped with an error;
            # the session goes on (it used to end with an internal error).
            await ws.send('{"type": "text", "text": "\\ud800 hello"}')
            event = await first_event(ws)
            assert event["code"] == "invalid_json" and not event["fatal"] and "surrogate" in event["message"]
            await ws.send(json.dumps({"type": "text", "text": "hello"}))
            with anyio.fail_after(5):
                while "hello" not in json.dumps(event):
                    event = await first_event(ws)
        # Bytes that are not UTF-8 in the Authorization header.
        port = port_of(url)
        status, _ = await raw_request(port, handshake("/live", "Host: 127.0.0.1"))
        assert status == 101
        status, body = await raw_request(port, handshake("/live", "Host: 127.0.0.1", "Authorization: Bearer caf\xe9"))
        assert status in (400, 101), (status, body)  # refused as a bad header, or then as a bad token
        assert (await raw_request(port, ["GET /healthz HTTP/1.1", "Host: 127.0.0.1"]))[0] == 200
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


def test_live_token_prints_a_token_the_server_accepts(capsys):
    assert live_cli(["token", "--secret", SECRET, "--ttl", "60", "--subject", "ann", "--agent", "test"]) == 0
    token = capsys.readouterr().out.strip()
    grant = verify_token(token, SECRET, agent="test")
    assert grant.subject == "ann" and grant.agent == "test"
    assert grant.expires_at is not None and 50 < grant.expires_at - time.time() <= 60
    assert live_cli(["token", "--secret", SECRET, "--issuer", "https://app.example"]) == 0
    issued = capsys.readouterr().out.strip()
    assert verify_token(issued, SECRET, issuer="https://app.example").token_id
    assert live_cli(["token", "--secret", "short"]) == 2
    assert "at least 32 bytes" in capsys.readouterr().err


# ---------------------------------------------------------------------- before session.start


async def first_event(ws) -> dict:
    with anyio.fail_after(5):
        while True:
            frame = await ws.recv()
            if isinstance(frame, str):
                return json.loads(frame)


async def test_a_socket_that_never_starts_is_closed_after_the_start_timeout(caplog):
    caplog.set_level(logging.WARNING, "live.server")
    async with running(AGENT, echo(), start_timeout=0.3) as (server, url):
        async with ws_connect(url) as ws:
            opened = time.monotonic()
            event = await first_event(ws)
            assert event["code"] == "idle_timeout" and "0.3 s" in event["message"]
            with anyio.fail_after(5):
                await ws.wait_closed()
            waited = time.monotonic() - opened
            assert ws.close_code == 1008
        assert 0.25 < waited < 2
        with anyio.fail_after(2):
            while server.sessions or server.pending:  # the handler returns just after the close
                await anyio.sleep(0.01)
    assert any("no session.start within 0.3 s" in r.getMessage() for r in caplog.records)


async def test_pending_sockets_and_sockets_per_address_are_limited(caplog):
    caplog.set_level(logging.WARNING, "live.server")
    # No proxy trusted: 127.0.0.1 is a client like any other here.
    limits = {"max_pending": 2, "max_sessions_per_ip": 3, "reattach_grace": 0, "forwarded_allow_ips": ()}
    async with running(AGENT, echo(), **limits) as (server, url):
        async with ws_connect(url) as a, ws_connect(url) as b:
            async with ws_connect(url) as c:
                event = await first_event(c)
                assert event["code"] == "pending_limit" and event["fatal"]
                with anyio.fail_after(5):
                    await c.wait_closed()
                assert c.close_code == 1013
            # A socket that starts its session is no longer pending.
            await a.send(json.dumps({"type": "session.start"}))
            assert (await first_event(a))["type"] == "session.started"
            async with LiveClient.connect(url):
                # Three from this address now (a, b and this one): a fourth is refused.
                refusal = await refused(url, None)
                assert refusal.code == "address_limit" and "3 sessions" in refusal.message
            assert len(server.pending) == 1  # b
        with anyio.fail_after(5):
            while server.sessions:
                await anyio.sleep(0.02)
        assert not server.per_address
        async with LiveClient.connect(url):  # the slots came back
            pass
    lines = [r.getMessage() for r in caplog.records]
    assert any("pending_limit" in line for line in lines)
    assert any("address_limit" in line for line in lines)


def test_live_serve_never_shows_the_frame_tracing_of_its_sockets_even_at_debug():
    """websockets and picows write every frame at DEBUG, tokens and keys included."""
    from live.observe.logs import configure

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    tracers = {name: logging.getLogger(name).level for name in FRAME_TRACERS}
    configure("DEBUG")
    try:
        for name in FRAME_TRACERS:
            assert not logging.getLogger(name).isEnabledFor(logging.DEBUG), name
        assert logging.getLogger("live.server").isEnabledFor(logging.DEBUG)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, was in tracers.items():
            logging.getLogger(name).setLevel(was)


# ---------------------------------------------------------------------- client addresses


def test_an_ipv6_client_is_counted_by_its_64_and_a_proxy_hop_only_when_trusted():
    assert address_key("2001:db8:1:2::1") == address_key("[2001:db8:1:2:ffff:ffff:ffff:ffff]")
    assert address_key("2001:db8:1:2::1") != address_key("2001:db8:1:3::1")
    assert address_key("203.0.113.7") == "203.0.113.7" != address_key("203.0.113.8")
    assert address_key("::ffff:203.0.113.7") == "203.0.113.7"
    proxies = AddressSet.parse(["127.0.0.1, 10.0.0.0/8"])
    # The client is the rightmost hop no trusted proxy added; what it wrote itself comes first.
    assert forwarded_client("10.1.2.3", ["6.6.6.6, 203.0.113.7", "10.0.0.5"], proxies) == ("203.0.113.7", True)
    assert forwarded_client("198.51.100.9", ["203.0.113.7"], proxies) == ("198.51.100.9", False)
    assert forwarded_client("127.0.0.1", [], proxies) == ("127.0.0.1", True)
    assert forwarded_client("127.0.0.1", ["not-an-address"], proxies) == ("127.0.0.1", True)
    assert forwarded_client("198.51.100.9", ["203.0.113.7"], AddressSet.parse(["*"]))[0] == "203.0.113.7"
    with pytest.raises(ValueError, match="'nope' is not an IP address"):
        AddressSet.parse(["10.0.0.1,nope"])


async def start_as(url: str, forwarded_for: str | None) -> dict:
    headers = {"X-Forwarded-For": forwarded_for} if forwarded_for else {}
    ws = await ws_connect(url, additional_headers=headers)
    with contextlib.suppress(ConnectionClosed):  # a refusal may come first
        await ws.send(json.dumps({"type": "session.start"}))
    event = await first_event(ws)
    event["ws"] = ws
    return event


async def test_behind_a_trusted_proxy_the_limit_is_per_client_not_per_proxy():
    # The default trusts a proxy on 127.0.0.1 (the tests' own address).
    async with running(AGENT, echo(), max_sessions_per_ip=2, reattach_grace=0) as (server, url):
        opened = [await start_as(url, f"203.0.113.{i}") for i in range(1, 6)]
        assert all(e["type"] == "session.started" for e in opened)
        same = [await start_as(url, "198.51.100.1, 203.0.113.9") for _ in range(3)]
        assert [e["type"] for e in same] == ["session.started", "session.started", "error"]
        assert same[2]["code"] == "address_limit"
        # One IPv6 client, any address of its /64.
        six = [await start_as(url, f"2001:db8:aa:bb::{i}") for i in range(1, 4)]
        assert [e.get("code") for e in six] == [None, None, "address_limit"]
        assert server.per_address["203.0.113.9"] == 2
        for event in opened + same + six:
            await event["ws"].close()
    # A proxy that is not trusted cannot name its clients: they are all its own address.
    async with running(AGENT, echo(), max_sessions_per_ip=2, forwarded_allow_ips=("10.0.0.0/8",)) as (_, url):
        spoofed = [await start_as(url, f"203.0.113.{i}") for i in range(1, 4)]
        assert [e.get("code") for e in spoofed] == [None, None, "address_limit"]
        for event in spoofed:
            await event["ws"].close()


async def test_a_client_on_the_proxys_own_address_is_limited_like_any_other():
    """A socket from a trusted proxy's address that names no client is a client
    on that machine (a local process, or a proxy that does not say whom it
    serves), limited as any address is, never exempt (as uvicorn's and
    Starlette's proxy headers take it: no header, the peer is the client)."""
    for local in ("127.0.0.1", "::1"):
        async with running(AGENT, echo(), host=local, max_sessions_per_ip=2, reattach_grace=0) as (server, url):
            url = url.replace("127.0.0.1", f"[{local}]" if ":" in local else local)
            direct = [await start_as(url, None) for _ in range(3)]
            assert [e.get("code") for e in direct] == [None, None, "address_limit"]
            assert server.per_address == {address_key(local): 2}
            for event in direct:
                await event["ws"].close()


async def test_one_address_cannot_hold_every_pending_socket():
    limits = {"max_pending": 6, "max_pending_per_ip": 2, "max_sessions_per_ip": 10}
    async with running(AGENT, echo(), **limits) as (server, url):
        # Sockets that never start, from one client behind the local proxy.
        idle = [await ws_connect(url, additional_headers={"X-Forwarded-For": "203.0.113.7"}) for _ in range(3)]
        refusal = await first_event(idle[2])
        assert refusal["code"] == "pending_limit" and "your address" in refusal["message"]
        # Another client still gets in.
        other = await start_as(url, "203.0.113.8")
        assert other["type"] == "session.started"
        for ws in [*idle, other["ws"]]:
            await ws.close()


# ---------------------------------------------------------------------- /metrics


def this_machines_address() -> str | None:
    """An address of this machine that is not loopback (where a remote client comes from)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: it only picks the interface
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


async def test_metrics_answer_only_this_machine_whatever_host_a_remote_client_names(caplog):
    caplog.set_level(logging.WARNING, "live.server")
    address = this_machines_address()
    if address is None:
        pytest.skip("this machine has no address but loopback")
    scrape = ["GET /metrics HTTP/1.1", "Host: localhost"]
    async with running(AGENT, echo(), host="0.0.0.0") as (_, url):
        port = port_of(url)
        assert (await raw_request(port, scrape))[0] == 200  # from this machine
        status, body = await raw_request(port, scrape, host=address)  # from "outside", Host: localhost
        assert status == 403 and "--metrics-allow-ips" in body and "live_" not in body
        assert (await raw_request(port, ["GET /healthz HTTP/1.1", "Host: localhost"], host=address))[0] == 200
    async with running(AGENT, echo(), host="0.0.0.0", metrics_allow_ips=(f"{address}/32",)) as (_, url):
        assert (await raw_request(port_of(url), scrape, host=address))[0] == 200
    assert any("/metrics asked from" in r.getMessage() for r in caplog.records)


async def test_metrics_behind_a_proxy_on_this_machine_answer_only_this_machine(caplog):
    """The proxy's socket is loopback; the client it names is who asks."""
    caplog.set_level(logging.WARNING, "live.server")
    scrape = ["GET /metrics HTTP/1.1", "Host: localhost"]
    async with running(AGENT, echo()) as (_, url):
        port = port_of(url)
        for client in ("203.0.113.7", "127.0.0.1, 203.0.113.7", "2001:db8::1"):
            status, body = await raw_request(port, [*scrape, f"X-Forwarded-For: {client}"])
            assert status == 403 and "live_" not in body, client
        assert (await raw_request(port, [*scrape, "X-Forwarded-For: 127.0.0.1"]))[0] == 200
        assert (await raw_request(port, scrape))[0] == 200  # no proxy: this machine
    async with running(AGENT, echo(), metrics_allow_ips=("203.0.113.0/24",)) as (_, url):
        assert (await raw_request(port_of(url), [*scrape, "X-Forwarded-For: 203.0.113.7"]))[0] == 200
    async with running(AGENT, echo(), metrics_port=0) as (server, _):
        status, _ = await raw_request(server.metrics_port, ["GET /metrics HTTP/1.1", "Host: 127.0.0.1", "X-Forwarded-For: 203.0.113.7"])
        assert status == 403
    assert any("/metrics asked from 203.0.113.7" in r.getMessage() for r in caplog.records)


async def test_a_metrics_port_listens_on_loopback_and_checks_the_host():
    address = this_machines_address()
    async with running(AGENT, echo(), host="0.0.0.0", metrics_port=0) as (server, _):
        port = server.metrics_port
        assert (await raw_request(port, ["GET /metrics HTTP/1.1", "Host: 127.0.0.1"]))[0] == 200
        status, body = await raw_request(port, ["GET /metrics HTTP/1.1", "Host: evil.example"])
        assert status == 403 and "evil.example" in body  # a rebinding page gets nothing
        assert (await raw_request(port, ["GET /metrics HTTP/1.1"]))[0] == 400
        if address is not None:
            with pytest.raises(OSError):  # not listening there at all
                await raw_request(port, ["GET /metrics HTTP/1.1", "Host: localhost"], host=address)
