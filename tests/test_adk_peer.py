"""ADK's `/run_live` as the benchmark's reference peer.

Without ADK installed (CI), the client adapter is checked against event frames
exactly as ADK 2.13's `/run_live` sends them, and the peer says it cannot run.
With `bench/.adk-venv` present (`python -m bench.adk_peer --install`), one
session also runs through a real ADK server to the Live emulator. No test
installs ADK: it takes minutes and the network.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from bench import adk_peer
from bench.stats import DOWN, MAGIC, down_chunk, up_frame
from clients.client import AudioFrame
from live.protocol import ErrorEvent, TurnComplete, TurnInterrupted

pytestmark = pytest.mark.anyio

# Frames as ADK 2.13's /run_live sends them: `Event.model_dump(exclude_none=True,
# by_alias=True, mode="json")`, so camelCase keys and pydantic's URL-safe base64.
ADK_AUDIO_EVENT = (
    '{"modelVersion":"gemini-live-2.5-flash-preview","content":{"parts":[{"inlineData":'
    '{"data":"AQL7_w==","mimeType":"audio/pcm;rate=24000"}}],"role":"model"},"partial":true,'
    '"invocationId":"e-1","author":"relay_peer","actions":{"stateDelta":{},"artifactDelta":{},'
    '"requestedAuthConfigs":{},"requestedToolConfirmations":{}},"nodeInfo":{"path":""},'
    '"id":"6733b17c-7c1e-40b3-8ae1-27ccfe3136f4","timestamp":1796098920.0401561}'
)
ADK_INTERRUPTED_EVENT = (
    '{"modelVersion":"gemini-live-2.5-flash-preview","interrupted":true,"invocationId":"e-1",'
    '"author":"relay_peer","actions":{"stateDelta":{},"artifactDelta":{},"requestedAuthConfigs":{},'
    '"requestedToolConfirmations":{}},"nodeInfo":{"path":""},"id":"981e","timestamp":1796098679.69}'
)
ADK_TRANSCRIPT_EVENT = (
    '{"partial":true,"outputTranscription":{"text":" is","finished":false},"invocationId":"e-1",'
    '"author":"relay_peer","actions":{"stateDelta":{}},"id":"ba2","timestamp":1796098678.7}'
)


def test_reply_audio_from_run_live_is_the_pcm_the_model_sent() -> None:
    assert adk_peer.parse_event(ADK_AUDIO_EVENT) == [("audio", b"\x01\x02\xfb\xff")]


def test_stamped_model_chunks_survive_both_base64_alphabets_and_key_casings() -> None:
    chunk = down_chunk(7, 3, 41, 123_456_789)
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        data = encode(chunk).decode()
        camel = {"content": {"parts": [{"inlineData": {"mimeType": "audio/pcm;rate=24000", "data": data}}]}}
        snake = {"content": {"parts": [{"inline_data": {"mime_type": "audio/pcm;rate=24000", "data": data}}]}}
        for event in (camel, snake):
            ((kind, pcm),) = adk_peer.parse_event(json.dumps(event))
            assert kind == "audio" and pcm == chunk
            assert DOWN.unpack_from(pcm) == (MAGIC, 7, 3, 41, 123_456_789)


def test_unpadded_base64_is_read_and_garbage_is_an_error_not_a_crash() -> None:
    unpadded = base64.b64encode(b"\x01\x02\x03\x04").decode().rstrip("=")
    event = {"content": {"parts": [{"inlineData": {"mimeType": "audio/pcm", "data": unpadded}}]}}
    assert adk_peer.parse_event(json.dumps(event)) == [("audio", b"\x01\x02\x03\x04")]
    event["content"]["parts"][0]["inlineData"]["data"] = "not base64 at all!"
    ((kind, code, _),) = adk_peer.parse_event(json.dumps(event))
    assert (kind, code) == ("error", "bad_event")
    for frame in ("{not json", "[1, 2]", b"\xff\xfe"):
        ((kind, code, _),) = adk_peer.parse_event(frame)
        assert (kind, code) == ("error", "bad_event")


def test_interruption_and_turn_end_follow_the_audio_of_their_event() -> None:
    assert adk_peer.parse_event(ADK_INTERRUPTED_EVENT) == [("interrupted",)]
    data = base64.b64encode(b"\x00\x01").decode()
    event = {
        "content": {"parts": [{"inlineData": {"mimeType": "audio/pcm;rate=24000", "data": data}}]},
        "interrupted": True,
        "turnComplete": True,
    }
    assert adk_peer.parse_event(json.dumps(event)) == [
        ("audio", b"\x00\x01"),
        ("interrupted",),
        ("turn_complete",),
    ]


def test_transcripts_text_and_images_are_not_audio() -> None:
    assert adk_peer.parse_event(ADK_TRANSCRIPT_EVENT) == []
    event = {
        "content": {
            "parts": [
                {"text": "hello"},
                {"inlineData": {"mimeType": "image/jpeg", "data": base64.b64encode(b"jpg").decode()}},
            ]
        }
    }
    assert adk_peer.parse_event(json.dumps(event)) == []


def test_an_adk_error_event_is_reported_with_its_code() -> None:
    event = {"errorCode": "RESOURCE_EXHAUSTED", "errorMessage": "quota", "author": "relay_peer"}
    assert adk_peer.parse_event(json.dumps(event)) == [("error", "RESOURCE_EXHAUSTED", "quota")]


def test_microphone_frames_go_up_as_a_live_request_blob_byte_for_byte() -> None:
    frame = up_frame(3, 9, time.monotonic_ns())
    request = json.loads(adk_peer.encode_audio(frame))
    assert request == {"blob": {"mime_type": "audio/pcm;rate=16000", "data": base64.b64encode(frame).decode()}}


def test_without_its_virtual_environment_the_peer_says_why_and_the_benchmark_goes_on(tmp_path: Path) -> None:
    venv = tmp_path / "no-adk"
    why = adk_peer.status(venv)
    assert why.startswith("not installed: ") and "--install" in why
    assert adk_peer.peer(venv) == why
    with pytest.raises(RuntimeError, match="not installed"):
        adk_peer.AdkServer.start(base_url="https://127.0.0.1:1", api_key="k", ca_file=None, venv=venv)


def test_the_real_path_benchmark_goes_on_without_adk_and_says_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from bench import real

    monkeypatch.setattr(adk_peer, "VENV", tmp_path / "no-adk")
    peers, skipped = real.reference_peers()
    assert [p.name for p in peers] == ["floor", "floor-websockets"]  # the verbatim relays need nothing installed
    assert skipped["bench.adk_peer"].startswith("not installed: ")


_ADK_INSTALLED = (adk_peer.VENV / "bin" / "adk").exists()
_NEEDS_ADK = pytest.mark.skipif(
    not _ADK_INSTALLED, reason="ADK is not installed (python -m bench.adk_peer --install)"
)


@_NEEDS_ADK
def test_installed_adk_joins_the_real_path_benchmark_as_a_peer() -> None:
    from bench import client_protocols, real

    peers, skipped = real.reference_peers()
    assert skipped == {}
    assert [p.name for p in peers] == ["floor", "floor-websockets", "adk"]
    peer = peers[2]
    assert Path(peer.command[0]).exists() and "{port}" in peer.command
    assert client_protocols.resolve(peer.client_protocol) is adk_peer.connect


class _Session:
    def __init__(self, events: list[tuple[Any, ...]]) -> None:
        self._events = events
        self.sent: list[bytes] = []

    async def send_audio(self, pcm: bytes) -> None:
        self.sent.append(pcm)

    async def events(self) -> AsyncIterator[tuple[Any, ...]]:
        for event in self._events:
            yield event

    async def close(self) -> None:
        pass


async def test_the_load_generator_reads_adk_sessions_as_it_reads_ours() -> None:
    chunk = down_chunk(1, 2, 3, 4)
    session = _Session(
        [("audio", chunk), ("interrupted",), ("turn_complete",), ("error", "closed_1011", "boom")]
    )
    client = adk_peer.GeneratorClient(session)  # type: ignore[arg-type]
    got = [event async for event in client.events()]
    assert got[0] == AudioFrame(chunk)
    assert isinstance(got[1], TurnInterrupted) and isinstance(got[2], TurnComplete)
    assert got[3] == ErrorEvent(code="closed_1011", message="boom", fatal=True)
    frame = up_frame(1, 0, 5)
    await client.send_audio(frame)
    assert session.sent == [frame]


@_NEEDS_ADK
async def test_a_session_through_adk_reaches_the_emulator_and_hears_its_reply() -> None:
    from connections.emulator import running_emulator
    from connections.emulator.script import Script

    if not adk_peer.installed():
        pytest.skip(adk_peer.status())
    async with running_emulator(Script(replies=["Hello there."])) as emulator:
        server = await anyio.to_thread.run_sync(
            lambda: adk_peer.AdkServer.start(
                base_url=emulator.base_url, api_key=emulator.api_key, ca_file=emulator.ca_file
            )
        )
        try:
            heard: list[Any] = []
            sent: list[bytes] = []
            async with adk_peer.connect(server.url) as client:

                async def speak() -> None:
                    for seq in range(150):  # 1.2 s of stamped noise, then silence: a turn
                        pcm = up_frame(5, seq, time.monotonic_ns()) if seq < 60 else bytes(640)
                        await client.send_audio(pcm)
                        sent.append(pcm)
                        await anyio.sleep(0.02)

                with anyio.fail_after(30):
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(speak)
                        async for event in client.events():
                            heard.append(event)
                            if isinstance(event, TurnComplete):
                                break
                        tg.cancel_scope.cancel()
        finally:
            await anyio.to_thread.run_sync(server.stop)
        (record,) = emulator.sessions
    assert record.model == f"models/{adk_peer.MODEL}"
    assert record.user_turns  # the emulator heard a spoken turn through ADK
    assert bytes(record.audio[: 640 * 10]) == b"".join(sent[:10])  # byte for byte, in order
    audio = b"".join(e.data for e in heard if isinstance(e, AudioFrame))
    assert len(audio) > 24_000  # over half a second of the reply's 24 kHz speech
    assert not [e for e in heard if isinstance(e, ErrorEvent)]


def _run(cpu: float | None, rss: float | None, realtime: bool) -> dict[str, Any]:
    return {"cpu_s_per_session_minute": cpu, "rss_per_session_bytes": rss, "realtime": realtime}


def _added(up: float, down: float) -> dict[str, Any]:
    return {k: {"p50_ms": 0.0, "p99_ms": v, "max_ms": v} for k, v in (("up", up), ("down", down), ("interrupt", 0.0))}


def test_the_real_path_run_prints_ours_against_adk_as_ratios() -> None:
    from bench.real import versus_references

    rows = [
        {
            "sessions": 10,
            "runs": {"direct": _run(None, None, True), "live": _run(0.8, 900 * 1024, True), "adk": _run(1.6, 1800 * 1024, True)},
            "added": {"live": _added(1.0, 2.0), "adk": _added(3.0, 4.5)},
        },
        {
            "sessions": 50,
            "runs": {"direct": _run(None, None, True), "live": _run(0.5, 800 * 1024, True), "adk": _run(0.6, 2500 * 1024, False)},
            "added": {"live": _added(1.5, 2.5), "adk": _added(900.0, 800.0)},
        },
        {"sessions": 100, "runs": {"live": _run(0.4, 700 * 1024, False)}, "added": {}},  # adk failed
    ]
    lines = versus_references(rows, ["adk"])
    assert lines[0] == (
        "N=10: live vs adk: CPU s per session-minute 0.800 vs 1.600 (0.50x), "
        "RSS KiB per session 900 vs 1800 (0.50x), added p99 up 1.00 vs 3.00 ms, added p99 down 2.00 vs 4.50 ms"
    )
    assert lines[1].startswith("N=50 (adk not real time): live vs adk: CPU s per session-minute 0.500 vs 0.600 (0.83x)")
    assert lines[2:] == [
        "most real-time sessions, live: 50 (of N = 10, 50, 100)",
        "most real-time sessions, adk: 10 (of N = 10, 50, 100)",
    ]
