"""@google/genai's browser build, unmodified, in Debian Chromium, against the
server's Live API endpoint: the page is on its own origin (which the server
must allow), and puts the key in the query as the browser SDK does."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import anyio
import pytest
from emulated import MODEL
from gemini_serving import (
    serving,
    token,
)

from browsers import CHROMIUM
from connections.emulator import Script
from live.liveapi import BAD_KEY

pytestmark = [pytest.mark.anyio, pytest.mark.browser]

BROWSER = Path(__file__).parent / "browser"
MODULES = BROWSER / "node_modules"
APP = "https://app.example"  # the app's own origin, served by the test
FILES = {
    "/": (BROWSER / "genai_web.html", "text/html"),
    "/sdk/genai/web/index.mjs": (MODULES / "@google" / "genai" / "dist" / "web" / "index.mjs", "text/javascript"),
}
# The SDK's one import, p-retry, is CommonJS, which an app's bundler converts;
# it retries REST requests only (never a Live socket), so the page gets a
# module that tries once.
P_RETRY = b"export default async function pRetry(run) { return run(1); }\n"


async def one_turn_in_chromium(port: int, key: str) -> dict:
    """Open the app's page in headless Chromium and wait for its one turn."""
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian chromium is not installed (apt-get install chromium)")
    if not all(path.exists() for path, _ in FILES.values()):
        pytest.skip("@google/genai is not installed (./test runs npm ci in tests/browser)")
    playwright_api = pytest.importorskip("playwright.async_api")
    async with playwright_api.async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            # The server's certificate is from the test's own CA; the page's
            # origin has no address (the test serves it), so Chromium would
            # take it for a public site reaching into this machine.
            args=[
                "--no-sandbox", "--disable-gpu", "--ignore-certificate-errors", "--no-first-run",
                "--disable-features=LocalNetworkAccessChecks",
            ],
        )
        try:
            page = await browser.new_page()

            async def serve(route) -> None:
                where = urlsplit(route.request.url).path
                path, kind = FILES.get(where, (None, None))
                if where == "/sdk/p-retry/index.js":
                    await route.fulfill(status=200, body=P_RETRY, content_type="text/javascript")
                elif path is None:
                    await route.fulfill(status=404, body="not found")
                else:
                    await route.fulfill(status=200, body=path.read_bytes(), content_type=kind)

            await page.route(f"{APP}/**", serve)
            query = urlencode({"base": f"https://127.0.0.1:{port}", "key": key, "model": MODEL, "text": "hello"})
            await page.goto(f"{APP}/?{query}")
            with anyio.fail_after(20):
                while (result := await page.evaluate("window.result ?? null")) is None:
                    await anyio.sleep(0.05)
            return result
        finally:
            await browser.close()


async def test_google_genai_in_a_browser_talks_to_it_unmodified(ca, cert_files):
    script = Script(speed=20, replies=["Hello from the browser."])
    async with serving(script, allowed_origins=(APP,), **cert_files) as (emu, _, url):
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        result = await one_turn_in_chromium(port, token())
        assert result["setupComplete"] and result["turnComplete"], json.dumps(result)
        assert result["said"] == "Hello from the browser."
        assert result["audioBytes"] > 24_000
        # A wrong key is the service's close, as the page's SDK reports it.
        refused = await one_turn_in_chromium(port, "not-a-token")
        assert refused["close"] == {"code": 1008, "reason": BAD_KEY}
        assert len(emu.sessions) == 1


async def test_a_page_on_an_origin_the_server_does_not_allow_is_refused(ca, cert_files):
    async with serving(Script(speed=20), **cert_files) as (emu, _, url):
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        result = await one_turn_in_chromium(port, token())
        assert not result["setupComplete"] and result["close"] is not None
        assert emu.sessions == []
