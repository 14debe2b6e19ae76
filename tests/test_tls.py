"""Serving https:// and wss:// directly (--certfile/--keyfile), as a browser on another machine needs.

The certificate comes from a throwaway CA (trustme); clients are told to trust
that CA and nothing else, so a wrong or missing certificate fails the test.
"""

from __future__ import annotations

import base64
import hashlib
import json
import ssl
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from websockets.asyncio.client import connect as ws_connect

from audio_fixtures import speak
from connections import double
from live.agent import Agent
from live.access.auth import mint_token
from serving import running
from browsers import chromium_page, press_talk, scripted, speech_wav, wait_until

# Every test on both WebSocket layers the server can listen with.
pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("both_socket_layers")]

AGENT = Agent(name="test", model="gemini-2.5-flash")
SECRET = "a-test-secret-that-is-long-enough-for-hs256"


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def cert_files(ca: trustme.CA, tmp_path: Path) -> tuple[Path, Path]:
    cert = ca.issue_cert("localhost", "127.0.0.1", "::1")
    certfile, keyfile = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.cert_chain_pems[0].write_to_path(str(certfile))
    for extra in cert.cert_chain_pems[1:]:
        extra.write_to_path(str(certfile), append=True)
    cert.private_key_pem.write_to_path(str(keyfile))
    return certfile, keyfile


def client_context(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


def spki_hash(certfile: Path) -> str:
    """What Chromium's --ignore-certificate-errors-spki-list names: base64 SHA-256 of the key."""
    cert = x509.load_pem_x509_certificate(certfile.read_bytes())
    spki = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()


async def test_a_session_over_wss_and_the_page_over_https(ca, cert_files):
    certfile, keyfile = cert_files
    llm, session = scripted()
    async with running(AGENT, llm, certfile=str(certfile), keyfile=str(keyfile)) as (_, url):
        assert url.startswith("wss://")
        async with ws_connect(url, ssl=client_context(ca)) as ws:
            await ws.send(json.dumps({"type": "session.start"}))
            with anyio.fail_after(5):
                assert json.loads(await ws.recv())["type"] == "session.started"
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        # A client that does not trust the CA is refused by TLS itself.
        with pytest.raises(ssl.SSLCertVerificationError):
            async with ws_connect(url, ssl=ssl.create_default_context()):
                pass
        # Plain HTTP on the TLS port gets nothing served.
        with pytest.raises((ConnectionError, OSError, anyio.EndOfStream, anyio.BrokenResourceError, TimeoutError)):
            async with await anyio.connect_tcp("127.0.0.1", port) as stream:
                await stream.send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                with anyio.fail_after(3):
                    reply = await stream.receive()
                assert not reply.startswith(b"HTTP/1.1 200")
                raise ConnectionError("not served")


def test_live_serve_refuses_a_missing_or_broken_certificate(tmp_path, cert_files):
    certfile, keyfile = cert_files
    for argv, expected in (
        (["--certfile", str(tmp_path / "nope.pem")], "cannot load"),
        (["--certfile", str(certfile), "--keyfile", str(certfile)], "cannot load"),
        (["--keyfile", str(keyfile)], "--keyfile needs --certfile"),
    ):
        result = subprocess.run(
            [sys.executable, "-m", "live.cli", "serve", "--port", "0", *argv],
            capture_output=True, text=True, timeout=30,
        )
        assert result.returncode == 2, result
        assert expected in result.stderr and result.stderr.count("\n") == 1, result.stderr


@pytest.mark.browser
async def test_a_browser_talks_over_https_with_a_token_from_the_apps_backend(ca, cert_files, tmp_path):
    """Chromium trusts the test certificate; the page gets a fresh token from the
    app's token URL (played here by Playwright, minting with live.access.auth), speaks,
    and shows the reply."""
    certfile, keyfile = cert_files
    wav, fed = speech_wav(tmp_path)
    llm, session = scripted()
    minted: list[str] = []
    config = dict(certfile=str(certfile), keyfile=str(keyfile), token_secret=SECRET)
    async with running(AGENT, llm, **config) as (_, url):
        origin = url.replace("wss://127.0.0.1", "https://localhost").removesuffix("/live")
        async with chromium_page(wav, args=[f"--ignore-certificate-errors-spki-list={spki_hash(certfile)}"]) as page:

            async def token_endpoint(route):
                minted.append(mint_token(SECRET, ttl=60, subject="browser-user", agent="test"))
                await route.fulfill(status=200, content_type="application/json", body=json.dumps({"token": minted[-1]}))

            await page.route(lambda u: urlsplit(u).path == "/app/live-token", token_endpoint)
            await page.goto(f"{origin}/?token_url=/app/live-token")
            assert await page.evaluate("window.isSecureContext")
            await press_talk(page)
            record = llm.sessions[0]

            async def heard_speech():
                return len(b"".join(d for _, d in record.audio_in)) >= len(fed) // 2

            await wait_until(heard_speech, len(fed) / 32000 + 3, "speech to reach the server over wss")
            reply = speak("I hear you.", rate=24000)
            session.push(
                double.input_transcript("Hello there, can you hear me?"),
                double.output_transcript("I hear you."),
                double.audio(reply),
                double.turn_complete(),
            )
            agent = page.locator("#log li[data-side=agent][data-final] .text")
            await agent.first.wait_for(timeout=5000)
            assert await agent.all_text_contents() == ["I hear you."]
            assert page.errors == []
            html = await page.content()
    assert len(minted) == 1
    assert SECRET not in html and minted[0] not in html  # the page never shows either
