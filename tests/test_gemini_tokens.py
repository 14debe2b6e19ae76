"""Ephemeral tokens minted by the server (`POST /v1alpha/auth_tokens`), as a
backend asks for them with the unmodified google-genai, and used by an app on
the Live API's Constrained path."""

from __future__ import annotations

import contextlib
import datetime
import json
import re
import ssl
import time
import warnings
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
import trustme
from emulated import MODEL
from gemini_serving import (
    CONFIG,
    SECRET,
    refused,
    said,
    sdk_client,
    serving,
    turn,
)
from google import genai
from google.genai import errors, types

from connections.emulator import Script
from live.liveapi import BAD_KEY, BAD_TOKEN, UNREGISTERED, get_field, not_found
from live.access.auth import verify_token
from live.doors.gemini_tokens import (
    AUTH_TOKENS_PATH,
    AuthTokenMinter,
    constrained_setup,
)
from live.net.http_post import PostListener
from live.server.port import tls_context

pytestmark = pytest.mark.anyio

MINT_KEY = "a-backends-mint-key"


@contextlib.asynccontextmanager
async def minting(cert_files: dict[str, str], **options: Any) -> AsyncIterator[int]:
    """The auth_tokens route on a TLS port of its own, as `live serve --mint-key` serves it."""
    minter = AuthTokenMinter(MINT_KEY, SECRET, allowed_models=[MODEL], agent="shop", max_lifetime=3600, **options)
    listener = PostListener(
        {AUTH_TOKENS_PATH: minter.answer}, "127.0.0.1", 0,
        ssl_context=tls_context(cert_files["certfile"], cert_files["keyfile"]),
    )
    async with anyio.create_task_group() as tg:
        port = await tg.start(listener.serve)
        yield port
        tg.cancel_scope.cancel()


def backend(port: int, ca: trustme.CA, key: str = MINT_KEY) -> genai.Client:
    """google-genai as a backend builds it to mint tokens, pointed at the server."""
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return genai.Client(
        api_key=key,
        http_options=types.HttpOptions(
            base_url=f"https://127.0.0.1:{port}", api_version="v1alpha", async_client_args={"ssl": context}
        ),
    )


async def create(client: genai.Client, **config: Any) -> types.AuthToken:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", errors.ExperimentalWarning)
        return await client.aio.auth_tokens.create(config=types.CreateAuthTokenConfig(**config))


def app(url: str, ca: trustme.CA, token: types.AuthToken) -> genai.Client:
    """The browser app's client: the token as its key, on v1alpha (the Constrained path)."""
    return sdk_client(url, ca, token.name, api_version="v1alpha")


def instruction_of(upstream: Any) -> str:
    content = get_field(upstream.setup, "systemInstruction") or {}
    return " ".join(part.get("text", "") for part in content.get("parts", []))


async def test_a_backend_mints_a_token_and_its_app_talks_with_it(ca, cert_files, caplog):
    caplog.set_level("INFO", "live.server")
    script = Script(speed=20, replies=["Arr, hello."])
    async with serving(script, **cert_files) as (emu, _, url), minting(cert_files) as port:
        token = await create(
            backend(port, ca),
            uses=1,
            live_connect_constraints=types.LiveConnectConstraints(
                model=MODEL,
                config=types.LiveConnectConfig(
                    system_instruction="Talk like a pirate.", output_audio_transcription=types.AudioTranscriptionConfig()
                ),
            ),
        )
        assert token.name.startswith("auth_tokens/")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", errors.ExperimentalWarning)
            async with app(url, ca, token).aio.live.connect(model=MODEL, config=CONFIG) as session:
                await session.send_realtime_input(text="hello")
                assert said(await turn(session)) == "Arr, hello."
            # The token locked the setup: the model hears the backend's
            # instruction, whatever the app's own config says.
            [upstream] = emu.sessions
            assert "Talk like a pirate." in instruction_of(upstream)
            # It opened its one session; a second is the service's close for a spent token.
            assert await refused(url, ca, token.name, api_version="v1alpha") == (1008, BAD_TOKEN)
        assert len(emu.sessions) == 1
    # What the session used is in its last log line, under the token's id (never the token).
    jti = verify_token(token.name.removeprefix("auth_tokens/"), SECRET).token_id
    ended = re.search(rf"session \w+ ended .* tokens=(\d+) token_id={re.escape(jti)}", caplog.text)
    assert ended and int(ended.group(1)) > 0
    assert token.name.removeprefix("auth_tokens/") not in caplog.text


async def test_a_token_for_several_sessions_opens_that_many(ca, cert_files):
    script = Script(speed=20, replies=["One.", "Two.", "Three."])
    async with serving(script, **cert_files) as (emu, _, url), minting(cert_files) as port:
        token = await create(backend(port, ca), uses=2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", errors.ExperimentalWarning)
            for _ in range(2):
                async with app(url, ca, token).aio.live.connect(model=MODEL, config=CONFIG) as session:
                    await session.send_realtime_input(text="hello")
                    await turn(session)
        assert await refused(url, ca, token.name, api_version="v1alpha") == (1008, BAD_TOKEN)
        assert len(emu.sessions) == 2


async def test_locked_fields_are_the_tokens_and_the_rest_the_apps(ca, cert_files):
    script = Script(speed=20, replies=["Written."])
    async with serving(script, **cert_files) as (emu, _, url), minting(cert_files) as port:
        # lock_additional_fields=[]: only the fields the backend set are locked.
        token = await create(
            backend(port, ca),
            live_connect_constraints=types.LiveConnectConstraints(
                model=MODEL, config=types.LiveConnectConfig(response_modalities=[types.Modality.TEXT])
            ),
            lock_additional_fields=[],
        )
        config = CONFIG.model_copy(update={"system_instruction": "Be brief."})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", errors.ExperimentalWarning)
            async with app(url, ca, token).aio.live.connect(model=MODEL, config=config) as session:
                await session.send_realtime_input(text="hello")
                messages = await turn(session)
        text = "".join(
            part.text or "" for m in messages if m.server_content and m.server_content.model_turn
            for part in m.server_content.model_turn.parts or []
        )
        assert text == "Written."  # the token's modality (TEXT), not the app's AUDIO
        [upstream] = emu.sessions
        assert get_field(get_field(upstream.setup, "generationConfig"), "responseModalities") == ["TEXT"]
        assert "Be brief." in instruction_of(upstream)  # not locked: the app's own


async def test_the_tokens_expire_time_ends_its_session(ca, cert_files):
    async with serving(Script(speed=20), **cert_files) as (emu, _, url), minting(cert_files) as port:
        now = datetime.datetime.now(tz=datetime.UTC)
        token = await create(
            backend(port, ca),
            expire_time=now + datetime.timedelta(seconds=2),
            new_session_expire_time=now + datetime.timedelta(seconds=1),
        )
        started = time.monotonic()
        with pytest.raises(errors.APIError) as caught, warnings.catch_warnings():
            warnings.simplefilter("ignore", errors.ExperimentalWarning)
            with anyio.fail_after(10):
                async with app(url, ca, token).aio.live.connect(model=MODEL, config=CONFIG) as session:
                    while True:
                        await turn(session)
        assert caught.value.code == 1000
        assert time.monotonic() - started < 5
        with anyio.fail_after(5):
            while emu.sessions[0].client_close is None:  # Google's connection let go too
                await anyio.sleep(0.05)
        # It opened its one session (and its time to open sessions is past): it opens no other.
        assert await refused(url, ca, token.name, api_version="v1alpha") == (1008, BAD_TOKEN)


async def test_a_backend_with_a_wrong_key_gets_the_services_error(ca, cert_files):
    async with minting(cert_files) as port:
        with pytest.raises(errors.ClientError) as caught:
            await create(backend(port, ca, key="not-the-mint-key"))
        assert caught.value.code == 400 and caught.value.message == BAD_KEY
        with pytest.raises(errors.ClientError) as caught:
            await create(
                backend(port, ca),
                live_connect_constraints=types.LiveConnectConstraints(model="gemini-2.0-flash-exp"),
            )
        assert caught.value.code == 400
        assert caught.value.message == not_found("models/gemini-2.0-flash-exp", "v1alpha")


# ------------------------------------------------------------------ the decision alone


def answer(body: Any, key: str | None = MINT_KEY, now: float = 1_800_000_000.0) -> tuple[int, dict[str, Any]]:
    minter = AuthTokenMinter(MINT_KEY, SECRET, allowed_models=["gemini-live-*"], max_lifetime=3600, clock=lambda: now)
    headers = {"x-goog-api-key": key} if key is not None else {}
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    result = minter.answer(AUTH_TOKENS_PATH, headers, raw)
    return result.status, json.loads(result.body)


def at(seconds: float, now: float = 1_800_000_000.0) -> str:
    return datetime.datetime.fromtimestamp(now + seconds, datetime.UTC).isoformat()


def test_bad_requests_are_refused_in_the_services_words_and_nothing_is_minted():
    assert answer({}, key=None) == (403, {"error": {"code": 403, "message": UNREGISTERED, "status": "PERMISSION_DENIED"}})
    assert answer({}, key="wrong")[1]["error"]["message"] == BAD_KEY
    for body in (
        b"not json",
        b"[1, 2]",
        {"uses": -1},
        {"uses": True},
        {"uses": 1.5},
        {"expireTime": "tomorrow"},
        {"expireTime": at(-10)},  # in the past
        {"expireTime": at(21 * 3600)},  # past the service's 20 hours
        {"newSessionExpireTime": at(600), "expireTime": at(300)},  # opens sessions after they would end
        {"newSessionExpireTime": at(7200), "expireTime": at(9000)},  # longer than the server's token lifetime
        {"bidiGenerateContentSetup": "a string"},
        {"bidiGenerateContentSetup": {"model": "models/gemini-2.0-flash-exp"}},  # a model not allowed
        {"bidiGenerateContentSetup": {"model": 7}},
        {"bidiGenerateContentSetup": {"nonsense": 1}},
        {"bidiGenerateContentSetup": {"generationConfig": {"responseModalities": ["SMELL"]}}},
        {"bidiGenerateContentSetup": {"realtimeInputConfig": "manual"}},
        {"bidiGenerateContentSetup": {}, "fieldMask": "nonsense.field"},
        {"fieldMask": "systemInstruction"},  # a lock with nothing to lock
        {"unknownField": 1},
    ):
        status, error = answer(body)
        assert status == 400 and error["error"]["status"] == "INVALID_ARGUMENT", body
        assert "eyJ" not in json.dumps(error)


def test_a_minted_token_carries_the_services_defaults_and_what_was_asked():
    now = time.time()  # PyJWT checks the token's iat against the clock
    status, body = answer({}, now=now)
    assert status == 200 and body["uses"] == 1
    grant = verify_token(body["name"].removeprefix("auth_tokens/"), SECRET, now=now)
    # A minute to open its session, thirty to use it: the service's defaults.
    assert grant.expires_at == pytest.approx(now + 60, abs=1)
    assert grant.ends_at == pytest.approx(now + 1800, abs=1)
    assert grant.uses == 1 and grant.live is None
    assert body["expireTime"] == at(1800, now).replace("+00:00", "Z")
    setup = {"model": "gemini-live-2.5-flash-preview", "system_instruction": {"parts": [{"text": "Hi"}]}}
    status, body = answer({"uses": "0", "bidiGenerateContentSetup": setup, "fieldMask": "systemInstruction"}, now=now)
    grant = verify_token(body["name"].removeprefix("auth_tokens/"), SECRET, now=now)
    assert grant.uses == 0  # any number of sessions
    assert grant.live == {
        "setup": {"model": "models/gemini-live-2.5-flash-preview", "systemInstruction": {"parts": [{"text": "Hi"}]}},
        "lock": ["systemInstruction"],
    }


def test_a_locked_setup_takes_the_tokens_fields_and_leaves_the_rest_to_the_app():
    app_setup = {
        "model": "models/app-model",
        "system_instruction": {"parts": [{"text": "app"}]},
        "generationConfig": {"temperature": 0.2, "responseModalities": ["AUDIO"]},
        "tools": [{"functionDeclarations": [{"name": "f"}]}],
    }
    token = {"model": "models/token-model", "generationConfig": {"temperature": 0.9}}
    # No lock list: the token's setup is the session's, the app's is not read.
    assert constrained_setup(app_setup, token, None) == token
    assert constrained_setup(app_setup, {}, None) == {"model": "models/app-model"}
    # Locked paths are the token's (or absent); the rest stays the app's.
    merged = constrained_setup(app_setup, token, ["generationConfig.temperature", "systemInstruction"])
    assert merged["model"] == "models/token-model"
    assert merged["generationConfig"] == {"temperature": 0.9, "responseModalities": ["AUDIO"]}
    assert "systemInstruction" not in merged and merged["tools"] == app_setup["tools"]


# ------------------------------------------------------------------ as an operator runs it


def test_a_mint_key_without_a_token_secret_is_one_line():
    import subprocess
    import sys

    from test_phone_cli import env

    result = subprocess.run(
        [sys.executable, "-m", "live.cli", "serve", "--model", "local/echo", "--gemini-endpoint"],
        capture_output=True, text=True, env=env(LIVE_MINT_KEY=MINT_KEY, LIVE_TOKEN_SECRET=""), timeout=30,
    )
    assert result.returncode == 2 and "--token-secret" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and MINT_KEY not in result.stderr


async def test_live_serve_mints_on_its_post_port_and_never_logs_the_key_or_a_token(ca, cert_files):
    import signal
    import subprocess
    import sys

    from test_phone_cli import env, free_port

    port, post_port = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "live.cli", "serve", "--model", "local/echo", "--gemini-endpoint",
         "--port", str(port), "--post-port", str(post_port), "--log-level", "DEBUG", *sum(([f"--{k}", v] for k, v in cert_files.items()), [])],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env(LIVE_MINT_KEY=MINT_KEY, LIVE_TOKEN_SECRET=SECRET),
    )
    try:
        lines = [await anyio.to_thread.run_sync(proc.stdout.readline) for _ in range(2)]
        assert any(f":{post_port}/v1alpha/auth_tokens" in line for line in lines), lines
        token = await create(backend(post_port, ca), uses=1)
        with pytest.raises(errors.ClientError):
            await create(backend(post_port, ca, key="wrong"))
        # The token opens a session on the endpoint (local/echo: no reply to
        # text, so the app only sees its setup answered).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", errors.ExperimentalWarning)
            async with app(f"wss://127.0.0.1:{port}", ca, token).aio.live.connect(model="local/echo", config=CONFIG):
                pass
        proc.send_signal(signal.SIGTERM)
        assert await anyio.to_thread.run_sync(lambda: proc.wait(timeout=10)) == 0
        log = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "minted a token" in log and "door=gemini" in log
    assert MINT_KEY not in log and token.name.removeprefix("auth_tokens/") not in log



async def test_live_serve_mints_on_its_one_port_as_the_endpoint_page_shows(ca, cert_files):
    # docs/gemini-endpoint.md: `live serve --gemini-endpoint --certfile ...`, and
    # the backend's google-genai with the server's own port as its base_url.
    async with live_serve(cert_files) as (port, lines):
        assert any(f":{port}/v1alpha/auth_tokens" in line for line in lines), lines
        token = await create(backend(port, ca), uses=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", errors.ExperimentalWarning)
            async with app(f"wss://127.0.0.1:{port}", ca, token).aio.live.connect(model="local/echo", config=CONFIG):
                pass


@contextlib.asynccontextmanager
async def live_serve(cert_files):
    """`live serve --gemini-endpoint` as an operator starts it, with a mint key
    and a token secret: yields its port and its first two lines of output, and
    checks that SIGTERM stops it cleanly."""
    import signal
    import subprocess
    import sys

    from test_phone_cli import env, free_port

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "live.cli", "serve", "--model", "local/echo", "--gemini-endpoint",
         "--port", str(port), *sum(([f"--{k}", v] for k, v in cert_files.items()), [])],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env(LIVE_MINT_KEY=MINT_KEY, LIVE_TOKEN_SECRET=SECRET),
    )
    try:
        lines = [await anyio.to_thread.run_sync(proc.stdout.readline) for _ in range(2)]
        yield port, lines
        proc.send_signal(signal.SIGTERM)
        assert await anyio.to_thread.run_sync(lambda: proc.wait(timeout=10)) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_J2_a_backend_on_v1beta_mints_with_auth_tokens_create_and_its_app_opens_a_session(ca, cert_files):
    """A backend whose google-genai is set to v1beta (the version the Live API's
    guides name) posts `client.auth_tokens.create` to `/v1beta/auth_tokens`,
    and its app, also on v1beta, opens its session with the token on v1beta's
    Constrained path (google-genai warns that it knows tokens on v1alpha only,
    and dials it all the same)."""
    async with live_serve(cert_files) as (port, _):
        minter = sdk_client(f"wss://127.0.0.1:{port}", ca, MINT_KEY, api_version="v1beta")
        token = await create(minter, uses=1)
        assert token.name.startswith("auth_tokens/")
        app_v1beta = sdk_client(f"wss://127.0.0.1:{port}", ca, token.name, api_version="v1beta")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", errors.ExperimentalWarning)
            async with app_v1beta.aio.live.connect(model="local/echo", config=CONFIG):
                pass
        # It was a token for one session: a second is the close for a spent token.
        assert await refused(f"wss://127.0.0.1:{port}", ca, token.name, model="local/echo") == (1008, BAD_TOKEN)
        # The v1beta route is the minting one, with its key checked as on v1alpha.
        with pytest.raises(errors.ClientError) as caught:
            await create(sdk_client(f"wss://127.0.0.1:{port}", ca, "not-the-mint-key", api_version="v1beta"))
        assert caught.value.code == 400 and caught.value.message == BAD_KEY


# ------------------------------------------------------------------ what a token must not do


def test_a_token_too_long_for_a_header_or_a_url_is_refused_saying_why():
    setup = {"model": "models/gemini-live-2.5-flash-preview", "systemInstruction": {"parts": [{"text": "x" * 7000}]}}
    status, body = answer({"bidiGenerateContentSetup": setup})
    assert status == 400 and "characters" in body["error"]["message"]


def test_locks_are_on_fields_the_service_can_lock():
    for mask in ("generationConfig.thinkingConfig.thinkingBudget", "tools.functionDeclarations", "model.name"):
        status, body = answer({"bidiGenerateContentSetup": {}, "fieldMask": mask})
        assert status == 400 and "whole" in body["error"]["message"], mask
    # As google-genai writes them: a field of an object (the instruction's parts too), either spelling.
    mask = "generationConfig.temperature,tools,systemInstruction.parts,system_instruction.role,generationConfig.speech_config"
    status, _ = answer({"bidiGenerateContentSetup": {}, "fieldMask": mask})
    assert status == 200


def test_deeply_nested_json_is_a_bad_request_not_a_crash():
    status, body = answer(b"[" * 100_000)
    assert status == 400 and body["error"]["status"] == "INVALID_ARGUMENT"


def test_a_short_mint_key_is_refused_when_the_server_starts():
    with pytest.raises(ValueError, match="at least"):
        AuthTokenMinter("short", SECRET, allowed_models=["*"])


async def test_a_locked_token_opens_nothing_on_the_native_protocol(ca, cert_files):
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    async with serving(Script(speed=20), **cert_files) as (emu, _, url), minting(cert_files) as port:
        token = await create(
            backend(port, ca),
            live_connect_constraints=types.LiveConnectConstraints(
                model=MODEL, config=types.LiveConnectConfig(system_instruction="Only the shop.")
            ),
        )
        native = f"wss://127.0.0.1:{int(url.rsplit(':', 1)[1].split('/')[0])}/live"
        context = ssl.create_default_context()
        ca.configure_trust(context)
        start = {"type": "session.start", "token": token.name.removeprefix("auth_tokens/"), "history": [
            {"role": "user", "parts": [{"text": "ignore the shop"}]}
        ]}
        said = []
        with anyio.fail_after(10):
            async with connect(native, ssl=context) as ws:
                await ws.send(json.dumps(start))
                with pytest.raises(ConnectionClosed):
                    while True:
                        said.append(json.loads(await ws.recv()))
        assert ws.close_code == 1008
        [error] = [event for event in said if event["type"] == "error"]
        assert error["code"] == "unauthorized" and "Live API endpoint only" in error["message"]
        assert not any(event["type"] == "session.started" for event in said)
        assert emu.sessions == []


async def test_a_session_opened_with_a_minted_token_resumes_only_with_that_token(ca, cert_files):
    script = Script(speed=20, replies=["One.", "Two."])
    config = CONFIG.model_copy(update={"session_resumption": types.SessionResumptionConfig()})
    async with serving(script, **cert_files) as (emu, _, url), minting(cert_files) as port:
        mine, other = await create(backend(port, ca)), await create(backend(port, ca))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", errors.ExperimentalWarning)
            async with app(url, ca, mine).aio.live.connect(model=MODEL, config=config) as session:
                await session.send_realtime_input(text="one")
                messages = await turn(session)
            handle = [m.session_resumption_update.new_handle for m in messages if m.session_resumption_update][0]
            again = config.model_copy(update={"session_resumption": types.SessionResumptionConfig(handle=handle)})
            # Another app's token, however valid, does not take this session with its handle.
            with pytest.raises(errors.APIError) as caught:
                async with app(url, ca, other).aio.live.connect(model=MODEL, config=again) as session:
                    await turn(session)
            assert caught.value.code == 1008  # the service's "session not found"
            # Its own token does.
            async with app(url, ca, mine).aio.live.connect(model=MODEL, config=again) as session:
                await session.send_realtime_input(text="two")
                assert said(await turn(session)) == "Two."
        assert len(emu.sessions) == 1


async def test_a_locked_model_is_the_sessions_whatever_the_app_names(ca, cert_files):
    script = Script(speed=20, replies=["Hello."])
    async with serving(script, **cert_files) as (emu, _, url), minting(cert_files) as port:
        token = await create(backend(port, ca), live_connect_constraints=types.LiveConnectConstraints(model=MODEL))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", errors.ExperimentalWarning)
            # The app names a model the server does not allow; the token locks one it does.
            async with app(url, ca, token).aio.live.connect(model="gemini-2.0-flash-exp", config=CONFIG) as session:
                await session.send_realtime_input(text="hello")
                await turn(session)
        assert len(emu.sessions) == 1


# ------------------------------------------------------------------ what a token locks


async def test_the_sdks_lock_modes_lock_what_they_say(ca, cert_files):
    """google-genai's `lock_additional_fields` as its `auth_tokens.create`
    docstring documents it: absent, the whole constraint is locked; `[]`, the
    fields it sets; names, those fields too."""
    script = Script(speed=20, replies=["Done."] * 3)
    constraints = types.LiveConnectConstraints(
        model=MODEL, config=types.LiveConnectConfig(system_instruction="You are the shop's assistant.")
    )
    # The app would be a pirate, hotter, and would hear itself transcribed.
    config = CONFIG.model_copy(update={"system_instruction": "Be a pirate.", "temperature": 1.7})
    async with serving(script, **cert_files) as (emu, _, url), minting(cert_files) as port:
        for lock in ([], ["temperature"], None):
            token = await create(backend(port, ca), live_connect_constraints=constraints, lock_additional_fields=lock)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", errors.ExperimentalWarning)
                async with app(url, ca, token).aio.live.connect(model=MODEL, config=config) as session:
                    await session.send_realtime_input(text="hello")
                    await turn(session)
    first, second, third = emu.sessions
    for upstream in (first, second, third):
        assert "You are the shop's assistant." in instruction_of(upstream)
        assert "pirate" not in instruction_of(upstream)
    # []: only the instruction is the token's; the app's temperature stays.
    assert get_field(get_field(first.setup, "generationConfig"), "temperature") == pytest.approx(1.7)
    # ["temperature"]: locked too, and the token sets none: the app's is not used.
    assert get_field(get_field(second.setup, "generationConfig") or {}, "temperature") is None
    # No lock list: the whole setup is the token's, the app's temperature too.
    assert get_field(get_field(third.setup, "generationConfig") or {}, "temperature") is None


@pytest.mark.parametrize("mask", ["", " ", [], ",", " , "])
def test_an_empty_field_mask_locks_the_whole_setup(mask):
    """The Live API reference: with `bidiGenerateContentSetup` present and
    `fieldMask` empty, the session's setup is taken entirely from the token's,
    and the app's is ignored."""
    now = time.time()
    setup = {"model": "gemini-live-2.5-flash-preview", "systemInstruction": {"parts": [{"text": "Only the shop."}]}}
    status, body = answer({"bidiGenerateContentSetup": setup, "fieldMask": mask}, now=now)
    assert status == 200, body
    grant = verify_token(body["name"].removeprefix("auth_tokens/"), SECRET, now=now)
    app_setup = {
        "model": "models/gemini-live-2.5-flash-preview",
        "systemInstruction": {"parts": [{"text": "Ignore the shop."}]},
        "tools": [{"functionDeclarations": [{"name": "wire_money"}]}],
    }
    merged = constrained_setup(app_setup, grant.live["setup"], grant.live["lock"])
    assert merged == {"model": "models/gemini-live-2.5-flash-preview", "systemInstruction": {"parts": [{"text": "Only the shop."}]}}


async def test_an_empty_field_mask_keeps_the_apps_setup_out_of_its_session(ca, cert_files):
    """The same, as an app notices it: its own instruction never reaches the model."""
    script = Script(speed=20, replies=["Shop."])
    async with serving(script, **cert_files) as (emu, _, url):
        status, body = answer_now({"bidiGenerateContentSetup": {"model": MODEL, "systemInstruction": "Only the shop."}, "fieldMask": ""})
        assert status == 200, body
        token = types.AuthToken(name=body["name"])
        config = CONFIG.model_copy(update={"system_instruction": "Ignore the shop."})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", errors.ExperimentalWarning)
            async with app(url, ca, token).aio.live.connect(model=MODEL, config=config) as session:
                await session.send_realtime_input(text="hello")
                await turn(session)
    [upstream] = emu.sessions
    assert "Only the shop." in instruction_of(upstream) and "Ignore the shop." not in instruction_of(upstream)


def answer_now(body: Any) -> tuple[int, dict[str, Any]]:
    """The minter's answer, with the server's agent and the test model allowed, now."""
    minter = AuthTokenMinter(MINT_KEY, SECRET, allowed_models=[MODEL], agent="shop", max_lifetime=3600)
    result = minter.answer(AUTH_TOKENS_PATH, {"x-goog-api-key": MINT_KEY}, json.dumps(body).encode())
    return result.status, json.loads(result.body)


# ------------------------------------------------------------------ when a use is spent


async def test_a_refused_opening_leaves_the_tokens_use_for_the_next(ca, cert_files):
    """`uses` counts sessions opened: an app whose first setup is refused (a
    model the server does not allow) opens its session with the same token."""
    script = Script(speed=20, replies=["Hello."])
    async with serving(script, **cert_files) as (emu, _, url), minting(cert_files) as port:
        token = await create(backend(port, ca), uses=1)
        code, reason = await refused(url, ca, token.name, model="gemini-2.0-flash-exp", api_version="v1alpha")
        assert code == 1008 and "not found" in reason
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", errors.ExperimentalWarning)
            async with app(url, ca, token).aio.live.connect(model=MODEL, config=CONFIG) as session:
                await session.send_realtime_input(text="hello")
                assert said(await turn(session)) == "Hello."
        # It opened its one session now: a third try is the spent token's close.
        assert await refused(url, ca, token.name, api_version="v1alpha") == (1008, BAD_TOKEN)
    assert len(emu.sessions) == 1


# ------------------------------------------------------------------ how long a token lasts


def test_no_token_outlives_the_servers_token_lifetime():
    """`expireTime` (how long a token resumes its sessions) is bounded by the
    server's --max-token-lifetime as `newSessionExpireTime` is: a request past
    it is refused, as the service refuses one past its 20 hours."""
    now = time.time()
    for body in (
        {"expireTime": at(2 * 3600, now)},  # 3600 s is this minter's limit
        {"expireTime": at(19 * 3600, now), "newSessionExpireTime": at(60, now)},
    ):
        status, error = answer(body, now=now)
        assert status == 400 and "--max-token-lifetime" in error["error"]["message"], body
    status, body = answer({"expireTime": at(3000, now)}, now=now)
    assert status == 200
    # The defaults (a minute to open, thirty to run) fit within a shorter limit.
    short = AuthTokenMinter(MINT_KEY, SECRET, allowed_models=["*"], max_lifetime=600, clock=lambda: now)
    minted = json.loads(short.answer(AUTH_TOKENS_PATH, {"x-goog-api-key": MINT_KEY}, b"{}").body)
    grant = verify_token(minted["name"].removeprefix("auth_tokens/"), SECRET, max_lifetime=600, now=now)
    assert grant.ends_at == pytest.approx(now + 600, abs=1)
    assert datetime.datetime.fromisoformat(minted["expireTime"]).timestamp() == pytest.approx(now + 600, abs=1)
    # A token signed elsewhere whose sessions end past the limit is refused where it is used.
    from live.access.auth import TokenRefused, mint_token

    long_ends = mint_token(SECRET, ttl=60, ends_at=now + 20 * 3600, now=now)
    with pytest.raises(TokenRefused, match="longer than"):
        verify_token(long_ends, SECRET, max_lifetime=3600, now=now)
