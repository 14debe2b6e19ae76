"""A server with Twilio phone lines on loopback ports, and the carrier double that calls it."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import numpy as np

from clients.phone_double import TwilioDouble
from clients.telnyx_double import TelnyxDouble
from live.agent import Agent
from live.doors import NativeDoor
from live.llm import BaseLlm
from live.net.http_post import PostListener
from live.phone.audio import ulaw_encode
from live.phone.calls import CallTokens
from live.phone.lines import TWILIO_VOICE_PATH, PhoneLines
from live.server.port import LiveServer, ServerConfig

AUTH_TOKEN = "0123456789abcdef0123456789abcdef"  # a Twilio auth token's shape (32 hex)


@dataclasses.dataclass
class PhoneServer:
    server: LiveServer
    lines: PhoneLines
    webhook_url: str
    media_url: str
    double: TwilioDouble
    control: object = None  # the agent's call control (the double's REST API), when asked for

    def call(self, **kwargs):
        """A call from the double, its stream sent to the server's local port."""
        kwargs.setdefault("stream_url", self.media_url)
        return self.double.call(self.webhook_url, **kwargs)


@contextlib.asynccontextmanager
async def running_phone(agent: Agent, llm: BaseLlm, *, recorder=None, control=None, twilio_shared_key: str | None = None,
                        one_port: bool = False, trust: ssl.SSLContext | None = None,
                        **config) -> AsyncIterator[PhoneServer]:
    """A server with a Twilio line. The webhook on a listener of its own (as
    `--post-port` serves it), or with `one_port` on the WebSocket port itself
    (over TLS with `certfile`: Twilio's side then trusts `trust`'s authorities)."""
    config.setdefault("audio_lead", 0.2)
    config.setdefault("sockets", os.environ.get("LIVE_SOCKETS", "auto"))
    config.setdefault("call_drain_timeout", 0.0)
    double = TwilioDouble(AUTH_TOKEN, ssl_context=trust)
    if control == "double":  # the agent's call control through the double's REST API
        from live.phone.control import TwilioCallControl

        control = TwilioCallControl(double.account_sid, AUTH_TOKEN, http_client=double.rest)
    lines_scope = anyio.CancelScope()
    listener_scope = anyio.CancelScope()

    async def serve_lines(lines: PhoneLines, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        with lines_scope:
            await lines.run(task_status=task_status)

    async with anyio.create_task_group() as tg:
        lines = PhoneLines(tokens=CallTokens(config.get("token_secret"), agent=agent.name),
                           on_key_press=agent.on_key_press, key_entry=agent.key_entry)
        server = LiveServer(agent, llm, ServerConfig(port=0, **config), doors={"/live": NativeDoor},
                            recorder=recorder, posts={} if one_port else None)
        if one_port:
            port = await tg.start(server.serve)
            # The public URL is the server's own port (no tunnel).
            public = f"{'https' if config.get('certfile') else 'http'}://127.0.0.1:{port}"
        else:
            # The public URL is the webhook listener's own address here (no tunnel).
            listener = PostListener({}, "127.0.0.1", 0)

            async def serve_webhooks(*, task_status=anyio.TASK_STATUS_IGNORED) -> None:
                with listener_scope:
                    await listener.serve(task_status=task_status)

            public = f"http://127.0.0.1:{await tg.start(serve_webhooks)}"
        lines.add_twilio(AUTH_TOKEN, public, control=control, shared_key=twilio_shared_key)
        server.doors.update(lines.doors)
        (server.post_routes if one_port else listener).routes.update(lines.webhooks)
        lines.refuse_when(server.call_refusal)
        lines.count_with(server.metrics)
        await tg.start(serve_lines, lines)
        if not one_port:
            port = await tg.start(server.serve)
        try:
            yield PhoneServer(server, lines, public + TWILIO_VOICE_PATH, f"{'wss' if config.get('certfile') else 'ws'}://127.0.0.1:{port}/twilio/media",
                              double, control)
        finally:
            server.stop()
            listener_scope.cancel()
            lines_scope.cancel()


def spoken_ulaw(text: str, tmp: Path) -> bytes:
    """`text` spoken by espeak-ng (American voice, moderate rate) as 8 kHz μ-law, through sox."""
    wav, ul = tmp / "speech.wav", tmp / "speech.ul"
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "140", "-w", str(wav), text], check=True, capture_output=True)
    subprocess.run(["sox", str(wav), "-r", "8000", "-e", "u-law", "-c", "1", "-t", "ul", str(ul)], check=True, capture_output=True)
    return ul.read_bytes()


def synthetic_ulaw(seconds: float = 1.5) -> bytes:
    """Speech-like audio made in-process (a voiced buzz with syllables), for machines without espeak-ng."""
    rate = 8000
    t = np.arange(int(seconds * rate)) / rate
    voice = sum(np.sin(2 * np.pi * f * t) / k for k, f in enumerate((140, 280, 420, 700, 1100), 1))
    envelope = 0.55 + 0.45 * np.sin(2 * np.pi * 4 * t)
    return ulaw_encode((6000 * voice * envelope / 2).astype("<i2").tobytes())


@dataclasses.dataclass
class TelnyxServer:
    server: LiveServer
    lines: PhoneLines
    webhook_url: str
    media_url: str
    double: TelnyxDouble

    def call(self, **kwargs):
        kwargs.setdefault("stream_url", self.media_url)
        return self.double.call(self.webhook_url, **kwargs)


@contextlib.asynccontextmanager
async def running_telnyx(agent: Agent, llm: BaseLlm, *, codec: str = "PCMU", recorder=None,
                         **config) -> AsyncIterator[TelnyxServer]:
    """A server with a Telnyx line, and the Telnyx double (its REST API on a port of its own)."""
    from live.phone.lines import TELNYX_CALL_PATH

    config.setdefault("audio_lead", 0.2)
    config.setdefault("sockets", os.environ.get("LIVE_SOCKETS", "auto"))
    config.setdefault("call_drain_timeout", 0.0)
    double = TelnyxDouble()
    listener = PostListener({}, "127.0.0.1", 0)
    scope = anyio.CancelScope()
    async with anyio.create_task_group() as tg:
        lines: PhoneLines | None = None
        ready = anyio.Event()

        async def serve_all(*, task_status=anyio.TASK_STATUS_IGNORED) -> None:
            with scope:
                async with anyio.create_task_group() as inner:
                    await inner.start(double.serve_api)
                    port = await inner.start(listener.serve)
                    task_status.started(port)
                    await ready.wait()
                    assert lines is not None
                    await inner.start(lines.run)

        webhook_port = await tg.start(serve_all)
        public = f"http://127.0.0.1:{webhook_port}"
        lines = PhoneLines(tokens=CallTokens(agent=agent.name), on_key_press=agent.on_key_press,
                           key_entry=agent.key_entry).add_telnyx(
            double.public_key, double.api_key, public, api_base_url=double.api_base_url, codec=codec,
            connection_id="1234567890",
        )
        listener.routes.update(lines.webhooks)
        server = LiveServer(agent, llm, ServerConfig(port=0, **config), doors=lines.mounted_on({"/live": NativeDoor}),
                            recorder=recorder)
        lines.refuse_when(server.call_refusal)
        lines.count_with(server.metrics)
        ready.set()
        port = await tg.start(server.serve)
        media = f"ws://127.0.0.1:{port}/telnyx/media"
        lines.telnyx_webhook.stream_url = media
        try:
            yield TelnyxServer(server, lines, public + TELNYX_CALL_PATH, media, double)
        finally:
            server.stop()
            scope.cancel()
