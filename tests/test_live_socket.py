"""google-genai on a `live.websocket` socket (`connections.live_socket`): the lean wire
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
from live.websocket import WebSocket

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
