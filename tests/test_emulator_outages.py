"""A backend's bad days, as the emulator plays them (`Emulator.outage`,
`go_down`, `come_back`), seen through our `Gemini` over the SDK path and TLS:
each failure arrives in the service's own words and is typed as a caller acts
on it (python-genai#986, #760, #2935; adk-python#3692).

- A key whose quota is gone: the service refuses the connect with HTTP 429
  RESOURCE_EXHAUSTED, and closes an open session with 1011 RESOURCE_EXHAUSTED
  (tier-1 keys: 3 concurrent sessions; "more closes with 1011
  RESOURCE_EXHAUSTED").
- A backend down: connects refused, or 1011 "The service is currently
  unavailable." on every setup, resumes included (python-genai#986, #760).
- A model not served in a region: 1008 "models/NAME is not found for API
  version v1beta, or is not supported for bidiGenerateContent."
"""

from __future__ import annotations

import anyio
import pytest
from google.genai import types

from connections.emulator import QUOTA_REASON, Script, running_emulator
from emulated import MODEL, gemini_for
from live.errors import ModelUnavailableError, QuotaExhaustedError, RecoverableConnectionError, UnreachableError
from live.liveapi import UNAVAILABLE
from live.llm import LlmRequest

pytestmark = pytest.mark.anyio


def request(handle: str | None = None) -> LlmRequest:
    return LlmRequest(
        live_connect_config=types.LiveConnectConfig(
            response_modalities=[types.Modality.AUDIO],
            output_audio_transcription=types.AudioTranscriptionConfig(),
            session_resumption=types.SessionResumptionConfig(handle=handle),
        )
    )


def user(text: str) -> types.Content:
    return types.Content(role="user", parts=[types.Part(text=text)])


async def answered(conn) -> str | None:
    """The resumable handle the service gives once a turn completed."""
    completed = False
    with anyio.fail_after(10):
        async for response in conn.receive():
            completed = completed or response.turn_complete
            update = response.session_resumption_update
            if completed and update is not None and update.resumable and update.new_handle:
                return update.new_handle
    return None


async def test_a_key_out_of_quota_is_refused_at_connect_with_429_and_its_open_session_closes_1011():
    async with running_emulator(Script(speed=50)) as emu:
        spent, other = gemini_for(emu, api_key="key-a"), gemini_for(emu, api_key="key-b")
        async with spent.connect(request()) as conn:
            emu.outage.exhausted_keys.add("key-a")
            await conn.send_content(user("Hello?"))
            with pytest.raises(QuotaExhaustedError) as mid:
                with anyio.fail_after(10):
                    async for _ in conn.receive():
                        pass
        with pytest.raises(QuotaExhaustedError) as at_connect:
            async with spent.connect(request()):
                pass
        async with other.connect(request()) as conn:  # another key on the same backend is served
            await conn.send_content(user("Hello?"))
            assert await answered(conn)
    assert mid.value.close_code == 1011 and QUOTA_REASON in mid.value.message
    assert at_connect.value.close_code == 429
    assert emu.sessions[0].close == (1011, QUOTA_REASON)


async def test_a_backend_that_refuses_connects_drops_its_sessions_and_serves_again_on_the_same_port():
    async with running_emulator(Script(speed=50)) as emu:
        gemini = gemini_for(emu)
        port = emu.port
        async with gemini.connect(request()) as conn:
            await emu.go_down("refuse")
            with pytest.raises(RecoverableConnectionError):
                with anyio.fail_after(10):
                    async for _ in conn.receive():
                        pass
        with pytest.raises(UnreachableError):
            async with gemini.connect(request()):
                pass
        await emu.come_back()
        assert emu.port == port
        async with gemini.connect(request()) as conn:
            await conn.send_content(user("Back?"))
            assert await answered(conn)


async def test_a_backend_unavailable_closes_its_sessions_and_every_setup_resume_or_not_with_1011():
    async with running_emulator(Script(speed=50)) as emu:
        gemini = gemini_for(emu)
        async with gemini.connect(request()) as conn:
            await conn.send_content(user("Hello?"))
            handle = await answered(conn)
            await emu.go_down("unavailable")
            with pytest.raises(RecoverableConnectionError) as dropped:
                with anyio.fail_after(10):
                    async for _ in conn.receive():
                        pass
        for again in (request(handle), request()):
            with pytest.raises(RecoverableConnectionError) as refused:
                async with gemini.connect(again) as conn:
                    async for _ in conn.receive():
                        pass
            assert not isinstance(refused.value, UnreachableError)  # it answered: reachable, unwell
            assert refused.value.close_code == 1011 and UNAVAILABLE in refused.value.message
    assert dropped.value.close_code == 1011


async def test_a_model_this_region_does_not_serve_is_not_found_in_the_services_words():
    async with running_emulator(Script(speed=50)) as emu:
        emu.outage.missing_models.add(f"models/{MODEL}")
        with pytest.raises(ModelUnavailableError) as missing:
            async with gemini_for(emu).connect(request()) as conn:
                async for _ in conn.receive():
                    pass
        other = "gemini-2.5-flash-native-audio-preview-12-2025"
        async with gemini_for(emu, other).connect(request()) as conn:  # the others are served
            await conn.send_content(user("Hello?"))
            assert await answered(conn)
    assert missing.value.close_code == 1008
    assert f"models/{MODEL} is not found for API version v1beta" in missing.value.message
