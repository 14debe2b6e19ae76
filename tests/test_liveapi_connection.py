"""Conformance rows A (connection, URL, authentication, limits) of the Live API
endpoint (docs/gemini-endpoint.md, "Conformance"), driven by the unmodified
google-genai client: `app_client` changes nothing but its base URL (the CA it
trusts comes from `SSL_CERT_FILE`, as for any app)."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import warnings

import anyio
import pytest
from audio_fixtures import silence, tone
from emulated import MODEL
from gemini_serving import (
    CONFIG,
    app_client,
    said,
    sdk_client,
    serving,
    token,
    turn,
)
from google.genai import errors, types
from PIL import Image as PILImage
from websockets.asyncio.client import connect as ws_connect

from connections.emulator import Script
from live.doors.gemini_live import GEMINI_PATHS, MAX_MESSAGE_BYTES
from live.liveapi import DEADLINE_EXPIRED

pytestmark = pytest.mark.anyio


async def test_A1_an_app_that_changes_only_its_base_url_is_served_on_v1(trusted, cert_files):
    """google-genai's default API version is v1 (`_api_client.py`:
    GOOGLE_AI_API_DEFAULT_VERSION = 'v1'): an app that changes nothing else dials it."""
    script = Script(speed=20, replies=["Hello on v1."])
    async with serving(script, **cert_files) as (_, _, url):
        client = app_client(url, token())
        assert client._api_client._http_options.api_version == "v1"
        async with client.aio.live.connect(model=MODEL, config=CONFIG) as session:
            await session.send_realtime_input(text="hello")
            assert said(await turn(session)) == "Hello on v1."


@pytest.mark.parametrize("version", ["v1", "v1beta", "v1alpha"])
async def test_A2_A3_A4_A5_every_version_on_both_methods(trusted, cert_files, version):
    """BidiGenerateContent on each version, and BidiGenerateContentConstrained
    (an `auth_tokens/` key) on each: the SDK dials the Constrained method on its
    version and only warns when it is not v1alpha (`live.py`)."""
    script = Script(speed=20)  # "You said: ..."
    async with serving(script, **cert_files) as (_, _, url):
        async with app_client(url, token(), api_version=version).aio.live.connect(model=MODEL, config=CONFIG) as session:
            await session.send_realtime_input(text="one")
            assert said(await turn(session)) == "You said: one."
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", errors.ExperimentalWarning)
            ephemeral = app_client(url, "auth_tokens/" + token(), api_version=version)
            async with ephemeral.aio.live.connect(model=MODEL, config=CONFIG) as session:
                await session.send_realtime_input(text="two")
                assert said(await turn(session)) == "You said: two."


def test_A1_A6_the_endpoint_serves_every_path_the_sdks_dial():
    assert {path.split("/ws/")[1] for path in GEMINI_PATHS} == {
        f"google.ai.generativelanguage.{version}.GenerativeService.{method}"
        for version in ("v1", "v1beta", "v1alpha")
        for method in ("BidiGenerateContent", "BidiGenerateContentConstrained")
    } | {f"google.cloud.aiplatform.{version}.LlmBidiService/BidiGenerateContent" for version in ("v1beta1", "v1")}


def _jpeg(width: int, height: int) -> bytes:
    """A camera frame of noise: JPEG cannot shrink it, as it cannot a real scene much."""
    image = PILImage.frombytes("RGB", (width, height), os.urandom(width * height * 3))
    out = io.BytesIO()
    image.save(out, "JPEG", quality=85)
    return out.getvalue()


async def test_A14_a_whole_spoken_question_and_a_large_camera_frame_go_in_one_message_each(trusted, cert_files):
    """The guide sends a whole PCM file in one `send_realtime_input(audio=...)`
    and camera frames as JPEG: messages far past 64 KiB, taken as the service takes them."""
    script = Script(speed=20, user_says=["what is in the picture"], replies=["A picture of noise."])
    frame = _jpeg(768, 432)
    assert len(base64.b64encode(frame)) > 64 << 10
    async with serving(script, **cert_files) as (emu, _, url):
        async with app_client(url, token()).aio.live.connect(model=MODEL, config=CONFIG) as session:
            await session.send_realtime_input(video=types.Blob(data=frame, mime_type="image/jpeg"))
            speech = tone(4.0) + silence(1.0)  # 160 kB of PCM, 213 kB as base64, in one message
            await session.send_realtime_input(audio=types.Blob(data=speech, mime_type="audio/pcm;rate=16000"))
            assert said(await turn(session)) == "A picture of noise."
        [upstream] = emu.sessions
        assert len(upstream.audio) == len(speech)
        assert upstream.video[0].size == len(frame) and upstream.video[0].width == 768


async def test_A14_a_message_past_the_limit_closes_with_1009_and_the_server_goes_on(trusted, cert_files):
    async with serving(Script(speed=20, replies=["Still here."]), **cert_files) as (_, _, url):
        too_big = tone(MAX_MESSAGE_BYTES / 2 / 16_000 * 0.8)  # 0.8 MiB of PCM: over 1 MiB as base64
        with pytest.raises(errors.APIError) as caught:
            with anyio.fail_after(10):
                async with app_client(url, token()).aio.live.connect(model=MODEL, config=CONFIG) as session:
                    await session.send_realtime_input(audio=types.Blob(data=too_big, mime_type="audio/pcm;rate=16000"))
                    await turn(session)
        assert caught.value.code == 1009
        async with app_client(url, token()).aio.live.connect(model=MODEL, config=CONFIG) as session:
            await session.send_realtime_input(text="hello")
            assert said(await turn(session)) == "Still here."


async def test_A15_a_server_side_app_opens_more_sessions_than_an_address_may_with_tokens(trusted, cert_files):
    """One address (a bot server, a call at a time) with a signed token per
    session is not limited per address once each token is verified; sockets
    still waiting for their setup count against it as before."""
    script = Script(speed=20)
    async with serving(script, max_sessions_per_ip=2, forwarded_allow_ips=(), **cert_files) as (_, server, url):
        async with contextlib.AsyncExitStack() as stack:
            sessions = [
                await stack.enter_async_context(app_client(url, token()).aio.live.connect(model=MODEL, config=CONFIG))
                for _ in range(4)
            ]
            assert len(server.sessions) == 4 and not server.per_address
            for n, session in enumerate(sessions):
                await session.send_realtime_input(text=f"call {n}")
                assert said(await turn(session)) == f"You said: call {n}."


async def test_A17_an_idle_app_is_closed_in_the_services_words(trusted, cert_files):
    async with serving(Script(speed=20), idle_timeout=1.0, **cert_files) as (_, _, url):
        with pytest.raises(errors.APIError) as caught:
            with anyio.fail_after(10):
                async with app_client(url, token()).aio.live.connect(model=MODEL, config=CONFIG) as session:
                    await turn(session)
        assert (caught.value.code, caught.value.details) == (1011, DEADLINE_EXPIRED)


async def test_A17_a_socket_that_never_sends_its_setup_is_closed_in_the_services_words(cert_files, ca):
    import ssl

    async with serving(Script(speed=20), start_timeout=0.5, **cert_files) as (_, _, url):
        context = ssl.create_default_context()
        ca.configure_trust(context)
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        async with ws_connect(f"wss://127.0.0.1:{port}{GEMINI_PATHS[0]}", ssl=context,
                              additional_headers={"x-goog-api-key": token()}) as ws:
            with anyio.fail_after(5):
                await ws.wait_closed()
        assert (ws.close_code, ws.close_reason) == (1011, DEADLINE_EXPIRED)


async def test_A13_live_serve_says_where_the_endpoint_is_and_warns_without_tls():
    from test_phone_cli import env, free_port

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "live.cli", "serve", "--model", "local/echo", "--gemini-endpoint",
         "--gemini-model", "gemini-*-live-*", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(),
    )
    try:
        lines = [await anyio.to_thread.run_sync(proc.stdout.readline) for _ in range(3)]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    said_lines = "".join(lines)
    assert f"Live API endpoint: base URL http://127.0.0.1:{port} " in said_lines
    assert "(models: gemini-*-live-*)" in said_lines
    assert "without TLS" in said_lines and "wss://" in said_lines


async def test_A13_a_refused_model_is_logged_by_name_with_the_flag_that_allows_it(trusted, cert_files, caplog):
    caplog.set_level("WARNING", "live.server")
    async with serving(Script(speed=20), **cert_files) as (emu, _, url):
        with pytest.raises(errors.APIError) as caught:
            with anyio.fail_after(10):
                async with app_client(url, token()).aio.live.connect(model="gemini-2.5-flash-native-audio-latest", config=CONFIG):
                    pass
        assert caught.value.code == 1008
    assert "--gemini-model 'gemini-2.5-flash-native-audio-latest'" in caplog.text
    assert "not-shown" not in json.dumps(caught.value.details)  # the app hears the service's words only
    assert emu.sessions == []


async def test_A7_A8_A9_the_key_where_either_sdk_puts_it(ca, cert_files):
    """x-goog-api-key (google-genai), ?key= (@google/genai), an ephemeral token
    as ?access_token= or `Authorization: Token` (REF: "either by passing the
    token in an access_token query parameter, or in an HTTP Authorization
    header with "Token" prefixed to it")."""
    import ssl

    script = Script(speed=20, replies=["a.", "b.", "c.", "d."])
    async with serving(script, **cert_files) as (_, _, url):
        context = ssl.create_default_context()
        ca.configure_trust(context)
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        base = f"wss://127.0.0.1:{port}/ws/google.ai.generativelanguage.v1beta.GenerativeService."
        ways = [
            (base + "BidiGenerateContent", {"x-goog-api-key": token()}),
            (base + "BidiGenerateContent?key=" + token(), {}),
            (base + "BidiGenerateContentConstrained?access_token=auth_tokens/" + token(), {}),
            (base + "BidiGenerateContentConstrained", {"Authorization": "Token auth_tokens/" + token()}),
        ]
        for target, headers in ways:
            async with ws_connect(target, ssl=context, additional_headers=headers) as ws:
                await ws.send(json.dumps({"setup": {"model": f"models/{MODEL}"}}))
                assert "setupComplete" in json.loads(await ws.recv())
