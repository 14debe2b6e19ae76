"""The Live API's endpoint served for tests: the Live emulator playing Google
behind our server, over TLS, and google-genai pointed at it as an app would."""

from __future__ import annotations

import dataclasses
import ssl
from pathlib import Path
from typing import Any

import anyio
import pytest
import trustme
from emulated import MODEL, gemini_for
from google import genai
from google.genai import errors, types
from serving import running

from connections.emulator import Script, running_emulator
from live.agent import Agent
from live.access.auth import mint_token
from live.doors.gemini_live import gemini_doors
from live.server.port import DEFAULT_DOORS

SECRET = "a-test-secret-that-is-long-enough-for-hs256"
STOCK = types.FunctionDeclaration(
    name="check_stock",
    description="How many of an item are in stock.",
    parameters=types.Schema(type="OBJECT", properties={"item": types.Schema(type="STRING")}),
)
AGENT = Agent(name="shop", model=MODEL, client_tools=[STOCK])


# Fixtures for every test module (a plugin of tests/conftest.py).
@pytest.fixture(scope="module", name="ca")
def ca_fixture() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(name="cert_files")
def cert_files_fixture(ca: trustme.CA, tmp_path: Path) -> dict[str, str]:
    cert = ca.issue_cert("127.0.0.1", "localhost")
    certfile, keyfile = tmp_path / "cert.pem", tmp_path / "key.pem"
    for i, pem in enumerate(cert.cert_chain_pems):
        pem.write_to_path(str(certfile), append=i > 0)
    cert.private_key_pem.write_to_path(str(keyfile))
    return {"certfile": str(certfile), "keyfile": str(keyfile)}


@pytest.fixture(name="trusted")
def trusted_fixture(ca: trustme.CA, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test CA as the process's trust store (`SSL_CERT_FILE`, which
    google-genai reads), so an app's client needs no change but its base URL."""
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
    return ca_file


def app_client(url: str, key: str, **http_options: Any) -> genai.Client:
    """google-genai as an app builds it with only its base URL changed: every
    other setting at its default (the API version v1 among them)."""
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    return genai.Client(api_key=key, http_options={"base_url": f"https://127.0.0.1:{port}", **http_options})


def sdk_client(url: str, ca: trustme.CA, key: str, api_version: str = "v1beta") -> genai.Client:
    """google-genai as an app builds it, pointed at our server."""
    context = ssl.create_default_context()
    ca.configure_trust(context)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    return genai.Client(
        vertexai=False,
        api_key=key,
        http_options=types.HttpOptions(
            base_url=f"https://127.0.0.1:{port}",
            api_version=api_version,
            async_client_args={"ssl": context},
        ),
    )


def token() -> str:
    return mint_token(SECRET, agent=AGENT.name, ttl=600)


async def turn(session: Any, *, timeout: float = 10.0) -> list[types.LiveServerMessage]:
    """Messages up to the turn's end (`receive()` stops after turnComplete)."""
    seen = []
    with anyio.fail_after(timeout):
        async for message in session.receive():
            seen.append(message)
    return seen


def said(messages: list[types.LiveServerMessage]) -> str:
    return "".join(
        m.server_content.output_transcription.text or ""
        for m in messages
        if m.server_content and m.server_content.output_transcription
    )


def reply_audio(messages: list[types.LiveServerMessage]) -> bytes:
    return b"".join(
        part.inline_data.data
        for m in messages
        if m.server_content and m.server_content.model_turn
        for part in m.server_content.model_turn.parts or []
        if part.inline_data and part.inline_data.mime_type == "audio/pcm;rate=24000"
    )


def serving(script: Script, *, agent: Agent = AGENT, model: str = MODEL, **config: Any):
    """The emulator with `script`, and our server before it with the endpoint
    on, running `agent` on `model` (an app may name `model`)."""

    # The last words of a reply's transcript come after its turnComplete on
    # some models (as on the real service); these tests read one turn at a time.
    script = dataclasses.replace(script, profile_overrides={**script.profile_overrides, "late_transcripts": False})

    class Both:
        async def __aenter__(self):
            self.emu_cm = running_emulator(script)
            emu = await self.emu_cm.__aenter__()
            doors = {**DEFAULT_DOORS, **gemini_doors([model], policy=config.pop("policy", None), model=model)}
            config.setdefault("token_secret", SECRET)
            served = agent if agent.model == model else dataclasses.replace(agent, model=model)
            self.server_cm = running(served, gemini_for(emu, model), doors=doors, **config)
            server, url = await self.server_cm.__aenter__()
            return emu, server, url

        async def __aexit__(self, *exc):
            await self.server_cm.__aexit__(*exc)
            await self.emu_cm.__aexit__(*exc)

    return Both()


CONFIG = types.LiveConnectConfig(
    response_modalities=[types.Modality.AUDIO],
    output_audio_transcription=types.AudioTranscriptionConfig(),
    input_audio_transcription=types.AudioTranscriptionConfig(),
)


async def refused(url: str, ca: trustme.CA, key: str, model: str = MODEL, api_version: str = "v1beta") -> tuple[int, str]:
    client = sdk_client(url, ca, key, api_version)
    with pytest.raises(errors.APIError) as caught:
        with anyio.fail_after(10):
            async with client.aio.live.connect(model=model, config=CONFIG) as session:
                await turn(session)
    return caught.value.code, caught.value.details
