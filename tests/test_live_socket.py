"""google-genai on a `live.net.websocket` socket (`connections.live_socket`): the lean wire
dials it, the SDK's own wire and other users of the SDK keep websockets', and
closes and refusals read as they read on websockets."""

from __future__ import annotations

import anyio
import pytest
import websockets
from google.genai import types

from connections import live_socket
from connections.emulator import Emulator, Fault, Script
from emulated import gemini_for
from live.errors import ConfigurationError, RecoverableConnectionError
from live.llm import LlmRequest
from live.net.websocket import WebSocket

pytestmark = pytest.mark.anyio


def _request() -> LlmRequest:
    return LlmRequest(live_connect_config=types.LiveConnectConfig(response_modalities=[types.Modality.AUDIO]))


@pytest.mark.parametrize("wire, socket_type", [("lean", WebSocket), ("sdk", websockets.ClientConnection)])
async def test_the_lean_wire_runs_on_a_live_socket_and_the_sdk_wire_on_websockets(
    live_emulator: Emulator, wire: str, socket_type: type
):
    async with gemini_for(live_emulator, wire=wire).connect(_request()) as connection:
        ws = getattr(connection._session, "_ws", None)
        assert type(ws) is socket_type
        await connection.send_realtime(types.Blob(data=b"\0\0" * 320, mime_type="audio/pcm;rate=16000"))
    assert live_emulator.sessions[-1].audio == b"\0\0" * 320


async def test_closes_and_refusals_reach_the_connection_as_typed_errors(live_emulator: Emulator):
    """What the SDK makes of a WebSocket's exceptions: the same typed errors as on websockets."""
    live_emulator.script = Script(speed=20, faults=[Fault("after_setup", code=1011, reason="Internal error")])
    async with gemini_for(live_emulator, wire="lean").connect(_request()) as connection:
        with pytest.raises(RecoverableConnectionError) as caught:
            async for _ in connection.receive():
                pass
    assert caught.value.close_code == 1011
    live_emulator.settings.api_key = "the-key"
    with pytest.raises(ConfigurationError):
        async with gemini_for(live_emulator, wire="lean", api_key="not-the-key").connect(_request()):
            pass


async def test_outside_dialing_the_sdk_dials_websockets(live_emulator: Emulator):
    """Another user of google-genai in the process keeps the SDK's own socket."""
    from connections.emulator.client import emulator_client

    with live_socket.dialing():
        pass  # installed
    client = emulator_client(live_emulator)
    async with client.aio.live.connect(model="gemini-live-2.5-flash-preview", config={}) as session:
        assert type(session._ws) is websockets.ClientConnection


@pytest.mark.parametrize("wire", ["lean", "sdk"])
async def test_audio_goes_out_without_waiting_only_on_the_lean_wire(live_emulator: Emulator, wire: str):
    """`send_realtime_nowait` sends an audio frame at once on the lean wire's
    socket; the SDK's own path cannot, and says so; a closed connection takes
    nothing and raises nothing."""
    frame = types.Blob(data=b"\x01\x00" * 320, mime_type="audio/pcm;rate=16000")
    async with gemini_for(live_emulator, wire=wire).connect(_request()) as connection:
        sent = connection.send_realtime_nowait(frame)
        assert sent is (wire == "lean")
        assert not connection.send_realtime_nowait(types.Blob(data=b"\xff\xd8", mime_type="image/jpeg"))
        await connection.send_realtime(frame)  # and the awaited send after it
        with anyio.fail_after(5):
            while len(live_emulator.sessions[-1].audio) < (2 if sent else 1) * 640:
                await anyio.sleep(0.01)
    assert not connection.send_realtime_nowait(frame)
    assert live_emulator.sessions[-1].audio == frame.data * (2 if sent else 1)


async def test_a_dial_the_sdk_awaits_instead_of_entering_is_a_live_socket_too(live_emulator: Emulator):
    """A google-genai that writes `ws = await ws_connect(...)` dials the same socket."""
    from google.genai import live as genai_live

    from connections.emulator.client import emulator_http_options

    options = emulator_http_options(live_emulator)
    base = options.base_url.replace("https://", "wss://")
    uri = f"{base}/ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent"
    with live_socket.dialing():
        ws = await genai_live.ws_connect(uri, ssl=options.async_client_args["ssl"], compression=None)
    assert type(ws) is WebSocket
    await ws.close()


async def test_a_lean_session_not_on_the_live_socket_says_so_once(live_emulator: Emulator, monkeypatch, caplog):
    """A google-genai update that stops dialing through `ws_connect` leaves the
    lean wire on the SDK's socket: visible in the log, not silently slower."""
    from google.genai import live as genai_live
    from websockets.asyncio.client import connect as websockets_connect

    from connections import gemini_wire

    with live_socket.dialing():
        pass  # installed
    monkeypatch.setattr(genai_live, "ws_connect", websockets_connect)
    monkeypatch.setattr(gemini_wire, "_warned_not_dialed", False)
    for _ in range(2):
        async with gemini_for(live_emulator, wire="lean").connect(_request()) as connection:
            assert type(connection._session._ws) is websockets.ClientConnection
            await connection.send_realtime(types.Blob(data=b"\0\0" * 320, mime_type="audio/pcm;rate=16000"))
    said = [r for r in caplog.records if "did not dial through live.net.websocket" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "WARNING"


@pytest.mark.parametrize("wire", ["lean", "sdk"])
async def test_a_redirecting_endpoint_is_a_configuration_error_and_is_not_followed(wire: str):
    """The Live API never redirects; a base URL that does gets a clear error, and
    the key is not sent to where the redirect points (websockets, under the SDK's
    own socket, strips Authorization on a cross-origin redirect but not
    google-genai's x-goog-api-key)."""
    import ssl

    import anyio.abc
    import trustme
    from anyio.streams.tls import TLSListener
    from google.genai import Client
    from google.genai import types as genai_types

    from connections.gemini import Gemini

    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    requests: dict[str, list[bytes]] = {"redirecting": [], "elsewhere": []}

    def answering(name: str, answer: bytes):
        async def handle(stream: anyio.abc.ByteStream) -> None:
            async with stream:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += await stream.receive()
                requests[name].append(data)
                await stream.send(answer)
        return handle

    elsewhere = TLSListener(await anyio.create_tcp_listener(local_host="127.0.0.1"), server_context)
    elsewhere_port = elsewhere.listener.extra(anyio.abc.SocketAttribute.local_port)
    redirecting = TLSListener(await anyio.create_tcp_listener(local_host="127.0.0.1"), server_context)
    port = redirecting.listener.extra(anyio.abc.SocketAttribute.local_port)
    location = f"wss://127.0.0.1:{elsewhere_port}/ws/stolen"
    client = Client(
        vertexai=False,
        api_key="the-key",
        http_options=genai_types.HttpOptions(
            base_url=f"https://127.0.0.1:{port}", api_version="v1beta", async_client_args={"ssl": client_context}
        ),
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(elsewhere.serve, answering("elsewhere", b"HTTP/1.1 500 No\r\nContent-Length: 0\r\n\r\n"))
        tg.start_soon(redirecting.serve, answering(
            "redirecting", f"HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n".encode()
        ))
        with pytest.raises(ConfigurationError) as caught:
            async with Gemini("gemini-live-2.5-flash-preview", client=client, wire=wire).connect(_request()):
                pass
        await anyio.sleep(0.2)
        tg.cancel_scope.cancel()
    assert "redirect (HTTP 302" in str(caught.value) and "GOOGLE_GEMINI_BASE_URL" in (caught.value.hint or "")
    assert len(requests["redirecting"]) == 1 and b"the-key" in requests["redirecting"][0]
    assert requests["elsewhere"] == []  # the key went nowhere else
