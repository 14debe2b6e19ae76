"""A google-genai app that asked for session resumption, on a fleet of
`live serve --gemini-endpoint --redis` servers over TLS, with the Live emulator
playing Google behind them and a real `redis-server` between them: a server
that drains (SIGTERM) tells the app with the service's goAway, and the app
resumes with its handle on another server of the fleet, with its own setup."""

from __future__ import annotations

import contextlib
import json
import signal
import ssl
import time
import urllib.request
import warnings
from collections.abc import AsyncIterator

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
    turn,
)
from google.genai import errors, types
from test_fleet import LEASE, Serving
from test_gemini_tokens import MINT_KEY, app, backend, create
from test_phone_cli import free_port
from test_fleet import redis as redis  # noqa: PLC0414 (a fixture)
from test_store import RedisServer

from bench.balancer import round_robin as balancer
from connections.emulator import Script
from connections.emulator.server import running_emulator
from connections.emulator.wire import BAD_TOKEN

pytestmark = pytest.mark.anyio

INSTRUCTION = "Answer as a ship's cook would, in one short sentence."


def sessions(server: Serving, ca: trustme.CA) -> int:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    url = f"https://127.0.0.1:{server.port}/healthz"
    with urllib.request.urlopen(url, timeout=2, context=context) as response:
        return int(json.load(response)["sessions"])


@contextlib.asynccontextmanager
async def gemini_fleet(
    redis: RedisServer, cert_files: dict[str, str], count: int
) -> AsyncIterator[tuple[object, list[Serving], str]]:
    """`count` servers with the Live API's endpoint over TLS, without tokens
    (any key is accepted), behind a round-robin balancer."""
    # One turn is read up to its turnComplete: its transcript comes before it.
    script = Script(speed=20, profile_overrides={"late_transcripts": False})
    async with running_emulator(script) as emu:
        env = emu.environment()
        tls = ("--certfile", cert_files["certfile"], "--keyfile", cert_files["keyfile"])
        servers = [
            Serving(env, "--redis", redis.url, "--fleet-lease", str(LEASE), "--gemini-endpoint", *tls)
            for _ in range(count)
        ]
        try:
            async with balancer([s.port for s in servers]) as port:
                yield emu, servers, f"wss://127.0.0.1:{port}/"
        finally:
            for server in servers:
                server.stop()


def new_handles(messages: list[types.LiveServerMessage]) -> list[str]:
    return [
        m.session_resumption_update.new_handle
        for m in messages
        if m.session_resumption_update and m.session_resumption_update.new_handle
    ]


async def test_a_draining_server_sends_go_away_and_the_app_resumes_on_another_with_its_setup(redis, ca, cert_files):
    config = CONFIG.model_copy(
        update={
            "session_resumption": types.SessionResumptionConfig(),
            "system_instruction": types.Content(parts=[types.Part(text=INSTRUCTION)]),
        }
    )
    async with gemini_fleet(redis, cert_files, 2) as (emu, servers, url):
        client = sdk_client(url, ca, "any-key")
        async with client.aio.live.connect(model=MODEL, config=config) as session:
            await session.send_realtime_input(text="one")
            first_turn = await turn(session, timeout=30)
            assert said(first_turn) == "You said: one."
            handles = new_handles(first_turn)
            assert handles
            [first] = [s for s in servers if sessions(s, ca) > 0]
            drained = time.monotonic()
            first.proc.send_signal(signal.SIGTERM)
            # What the app hears of the drain: the service's goAway, then the
            # close (google-genai raises it, whatever its code).
            after = []
            with anyio.fail_after(20), pytest.raises(errors.APIError) as closed:
                while True:
                    async for message in session.receive():
                        after.append(message)
                        handles += new_handles([message])
        assert closed.value.code == 1012
        go_aways = [m.go_away for m in after if m.go_away]
        assert go_aways and go_aways[0].time_left is not None
        assert first.proc.wait(timeout=20) == 0  # drained, and gone: the balancer skips it now
        again = config.model_copy(update={"session_resumption": types.SessionResumptionConfig(handle=handles[-1])})
        async with client.aio.live.connect(model=MODEL, config=again) as session:
            await session.send_realtime_input(text="two")
            second_turn = await turn(session, timeout=30)
        took = time.monotonic() - drained
        print(f"\nfrom SIGTERM to the answer on another server: {took:.2f} s (lease {LEASE} s)")
        assert said(second_turn) == "You said: two."
        assert new_handles(second_turn)  # the next handle, from the server carrying it now
    # The server taking over resumed the same Gemini session, with the app's own setup.
    resumed = [s for s in emu.sessions if s.resumed_from]
    assert resumed and resumed[-1].resumed_from in emu.sessions[0].handles
    assert resumed[-1].user_turns == ["two"]
    assert INSTRUCTION in json.dumps(emu.sessions[0].setup)
    assert INSTRUCTION in json.dumps(resumed[-1].setup)


async def test_a_single_use_token_opens_one_session_in_the_whole_fleet_even_after_restarts(redis, ca, cert_files):
    """A backend mints a `uses=1` token on one server; its app opens a session
    with it on one server; no server of the fleet opens another with it, nor
    do servers started afresh on the same Redis."""
    async with running_emulator(Script(speed=20, profile_overrides={"late_transcripts": False})) as emu:
        env = emu.environment()
        tls = ("--certfile", cert_files["certfile"], "--keyfile", cert_files["keyfile"])
        minting = ("--token-secret", SECRET, "--mint-key", MINT_KEY)

        def start() -> tuple[Serving, int]:
            post_port = free_port()
            server = Serving(
                env, "--redis", redis.url, "--fleet-lease", str(LEASE), "--gemini-endpoint", *tls, *minting,
                "--post-port", str(post_port),
            )
            return server, post_port

        servers = [start(), start()]
        try:
            (a, a_post), (b, _) = servers
            token = await create(backend(a_post, ca), uses=1)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", errors.ExperimentalWarning)
                async with app(f"wss://127.0.0.1:{b.port}/", ca, token).aio.live.connect(model=MODEL, config=CONFIG) as session:
                    await session.send_realtime_input(text="one")
                    assert said(await turn(session, timeout=30)) == "You said: one."
            for server, _ in servers:  # the one that opened it, and the other
                assert await refused(f"wss://127.0.0.1:{server.port}/", ca, token.name, api_version="v1alpha") == (
                    1008, BAD_TOKEN,
                )
            for server, _ in servers:
                server.stop()
            servers = [start(), start()]
            for server, _ in servers:
                assert await refused(f"wss://127.0.0.1:{server.port}/", ca, token.name, api_version="v1alpha") == (
                    1008, BAD_TOKEN,
                )
        finally:
            for server, _ in servers:
                server.stop()
    assert len(emu.sessions) == 1
