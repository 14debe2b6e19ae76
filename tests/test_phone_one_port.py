"""One port for a carrier's webhook and its media stream (issue 37, finding 12).

Twilio's side is the double written from Twilio's documentation: it POSTs the
voice webhook, reads the `<Connect><Stream>` of the TwiML answer and opens that
URL as given. Twilio: "Configure your firewall rules to allow secure WebSocket
connections (TCP port 443) from Twilio to your WebSocket servers", and for the
webhook an https URL: one address, one tunnel or one load-balancer rule.
"""

from __future__ import annotations

import contextlib
import signal
import ssl
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import pytest
import trustme
from emulated import gemini_for
from phone_serving import running_phone, synthetic_ulaw

from clients.phone_double import TwilioDouble, http_post_raw
from connections.emulator import Script, running_emulator
from live.agent import Agent
from live.server.posts import PER_ADDRESS

pytestmark = pytest.mark.anyio

AGENT = Agent(name="weather", model="gemini-live-2.5-flash-preview")


@pytest.fixture(name="tls")
def tls_fixture(tmp_path: Path) -> tuple[dict[str, str], ssl.SSLContext]:
    """The server's certificate files, and a client context that trusts their authority."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    certfile, keyfile = tmp_path / "cert.pem", tmp_path / "key.pem"
    for i, pem in enumerate(cert.cert_chain_pems):
        pem.write_to_path(str(certfile), append=i > 0)
    cert.private_key_pem.write_to_path(str(keyfile))
    trust = ssl.create_default_context()
    ca.configure_trust(trust)
    return {"certfile": str(certfile), "keyfile": str(keyfile)}, trust


def _port(url: str) -> int:
    return int(urlsplit(url).port or 0)


@pytest.mark.usefixtures("both_socket_layers")
async def test_a_twilio_call_over_tls_reaches_its_webhook_and_its_stream_on_one_port(tls):
    # Twilio POSTs the https webhook, then: "On successful execution, Twilio
    # establishes a `wss` WebSocket connection to the URL and begins streaming
    # audio. `wss` is the only supported protocol." The double opens the
    # TwiML's URL as it is written: no address of the test's own.
    files, trust = tls
    async with running_emulator(Script(replies=["Sunny."])) as emu, running_phone(
        AGENT, gemini_for(emu), one_port=True, trust=trust, **files
    ) as phone:
        assert phone.webhook_url.startswith("https://")
        status, twiml, _ = await phone.double.ring(phone.webhook_url)
        assert status == 200
        stream_url, _ = phone.double.stream_of(twiml)
        assert stream_url.startswith("wss://") and _port(stream_url) == _port(phone.webhook_url)
        async with phone.double.call(phone.webhook_url) as call:  # rings again, streams to the TwiML's URL
            await call.speak(synthetic_ulaw(), silence_after=0.2)
            await call.wait_for_audio(timeout=10)
        assert len(emu.sessions) == 1
        # The port's other requests are as they were: a health probe, and a POST to no route.
        async with await anyio.connect_tcp("127.0.0.1", _port(phone.webhook_url), tls=True, ssl_context=trust,
                                           tls_standard_compatible=False) as stream:
            await stream.send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            assert (await stream.receive()).startswith(b"HTTP/1.1 200")
        status, _ = await http_post_raw(phone.webhook_url.replace("/twilio/voice", "/nowhere"), b"", {},
                                        ssl_context=trust)
        assert status == 404


@pytest.mark.usefixtures("both_socket_layers")
async def test_a_call_through_a_tunnel_to_one_plain_port():
    # A tunnel ends TLS and forwards both the webhook and the stream to one
    # local port: the stream is opened at the server's local address, its
    # handshake signed for the TwiML's URL as Twilio signs it.
    async with running_emulator(Script(replies=["Sunny."])) as emu, running_phone(
        AGENT, gemini_for(emu), one_port=True
    ) as phone:
        assert _port(phone.webhook_url) == _port(phone.media_url)
        async with phone.call() as call:
            await call.speak(synthetic_ulaw(), silence_after=0.2)
            await call.wait_for_audio(timeout=10)
        assert len(emu.sessions) == 1


@pytest.mark.usefixtures("both_socket_layers")
async def test_a_forged_webhook_on_the_shared_port_is_refused_and_opens_no_stream():
    # "Twilio will sign all inbound requests to your application with an
    # X-Twilio-Signature HTTP header": one signed with another token is not Twilio's.
    async with running_emulator(Script()) as emu, running_phone(AGENT, gemini_for(emu), one_port=True) as phone:
        status, body, _ = await phone.double.ring(phone.webhook_url, signed_with="f" * 32)
        assert status == 403 and "<Stream" not in body
        assert emu.sessions == []


@pytest.mark.usefixtures("both_socket_layers")
async def test_the_shared_port_keeps_the_post_ports_limits():
    async with running_emulator(Script()) as emu, running_phone(AGENT, gemini_for(emu), one_port=True) as phone:
        # A request head far past the 16 KiB h11 is told to hold: 431, before any route sees it.
        status, _ = await http_post_raw(phone.webhook_url, b"", {"X-Padding": "a" * (48 << 10)})
        assert status == 431
        # A body past 64 KiB: 413, refused on its Content-Length.
        status, _ = await http_post_raw(phone.webhook_url, b"x" * (65 << 10), {})
        assert status == 413
        # The port goes on answering Twilio.
        status, twiml, _ = await phone.double.ring(phone.webhook_url)
        assert status == 200 and "<Stream" in twiml
        del emu


@pytest.mark.usefixtures("both_socket_layers")
async def test_half_sent_requests_from_one_address_do_not_starve_the_carriers_webhook():
    # 64 requests from one address (not a trusted proxy's) that never finish:
    # past its bound that address is answered 429, and Twilio's webhook, from
    # another address, is answered at once all the same.
    async with running_emulator(Script()) as emu, running_phone(AGENT, gemini_for(emu), one_port=True) as phone:
        port = _port(phone.webhook_url)
        refused = 0
        async with contextlib.AsyncExitStack() as stack:
            streams = []
            for _ in range(64):
                stream = await stack.enter_async_context(await anyio.connect_tcp("127.0.0.1", port, local_host="127.0.0.3"))
                await stream.send(b"POST /twilio/voice HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 500\r\n\r\nAccount")
                streams.append(stream)
            await anyio.sleep(0.2)
            with anyio.fail_after(5):
                status, twiml, _ = await phone.double.ring(phone.webhook_url, local_host="127.0.0.2")
            assert status == 200 and "<Stream" in twiml
            for stream in streams[PER_ADDRESS:]:
                with anyio.fail_after(5):
                    refused += (await stream.receive()).startswith(b"HTTP/1.1 429")
        assert refused == 64 - PER_ADDRESS
        del emu


async def test_live_serve_twilio_answers_on_its_one_port_over_tls(tls):
    # As docs/phone.md sets it up: `live serve --twilio --public-url https://…`
    # with no second port; Twilio reaches the webhook and the stream at the
    # public URL's one address.
    from phone_serving import AUTH_TOKEN
    from test_phone_cli import LIVE, env, free_port

    files, trust = tls
    port = free_port()
    public = f"https://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [*LIVE, "serve", "--port", str(port), "--twilio", "--public-url", public,
         "--certfile", files["certfile"], "--keyfile", files["keyfile"]],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(TWILIO_AUTH_TOKEN=AUTH_TOKEN),
    )
    try:
        lines = [await anyio.to_thread.run_sync(proc.stdout.readline) for _ in range(2)]
        assert any(f"{public}/twilio/voice (served on port {port})" in line for line in lines), lines
        double = TwilioDouble(AUTH_TOKEN, ssl_context=trust)
        async with double.call(f"{public}/twilio/voice") as call:  # the stream at the TwiML's wss:// URL
            await call.speak(synthetic_ulaw(1.0), silence_after=0.3)
            await call.wait_for_audio(timeout=10)  # local/echo says it back
        proc.send_signal(signal.SIGTERM)
        assert await anyio.to_thread.run_sync(lambda: proc.wait(timeout=10)) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
