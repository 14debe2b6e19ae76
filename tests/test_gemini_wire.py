"""The lean wire path gives what the SDK's own path gives, frame by frame and conversation by conversation."""

from __future__ import annotations

import base64
import json
import logging
import random

import anyio
import pytest
from audio_fixtures import silence, tone
from google import genai
from google.genai import _common, types
from google.genai import live as genai_live

from connections import gemini_wire
from connections.emulator import Emulator, Script, ToolCall
from emulated import gemini_for
from connections.gemini import Gemini
from connections.gemini_mapping import ServerMessageMapper
from connections.gemini_wire import LeanSession, calibrate, decode_frame
from live.errors import ConfigurationError, InvalidArgumentError
from live.llm import AUDIO_STREAM_END, LlmRequest, LlmResponse

pytestmark = pytest.mark.anyio

MODEL = "gemini-live-2.5-flash-preview"


@pytest.fixture
def fresh_calibration(monkeypatch: pytest.MonkeyPatch):
    """Each test calibrates anew (the result is cached per process)."""
    monkeypatch.setattr(gemini_wire, "_calibrated", {})


def api_client(vertex: bool = False):
    if vertex:
        return genai.Client(vertexai=True, project="p", location="us-central1")._api_client
    return genai.Client(api_key="k")._api_client


async def sdk_decoding(client, raw: bytes):
    """What the SDK's own receive() makes of one frame (or the error it raises)."""
    try:
        return await gemini_wire._sdk_receive_one(client, raw)
    except Exception as exc:  # noqa: BLE001
        return exc


def random_frame(rng: random.Random) -> bytes:
    """A server frame: often a bare audio chunk in any casing and alphabet, sometimes something else."""
    pcm = rng.randbytes(rng.choice([0, 1, 2, 3, 480, 1920]))
    encode = rng.choice([base64.b64encode, base64.urlsafe_b64encode])
    data = encode(pcm).decode()
    if rng.random() < 0.15 and data.endswith("="):
        data = data.rstrip("=")  # unpadded: the SDK decides what that means
    blob_key, mime_key = rng.choice([("inlineData", "mimeType"), ("inline_data", "mime_type")])
    mime = rng.choice(["audio/pcm;rate=24000", "audio/pcm", "image/jpeg", "text/plain"])
    part: dict = {blob_key: {mime_key: mime, "data": data}}
    kind = rng.random()
    if kind < 0.1:
        part = {"text": "hello"}
    elif kind < 0.15:
        part[blob_key]["displayName"] = "x"
    elif kind < 0.2:
        part = {blob_key: {"data": data}}
    elif kind < 0.25:
        part[blob_key]["data"] = data[:-1] + "!"
    elif kind < 0.3 and len(data) >= 4:
        part[blob_key]["data"] = "+-" + data[2:]  # both alphabets at once
    elif kind < 0.35:
        part[blob_key]["data"] = rng.choice(
            [data + "=", data + "==", " " + data, data[:3] + "\n" + data[3:], data[:-2] + "R="]
        )
    parts = [part] * rng.choice([1, 1, 1, 2])
    turn: dict = {"parts": parts}
    if rng.random() < 0.3:
        turn["role"] = rng.choice(["model", "model", None])
    content: dict = {"modelTurn": turn} if rng.random() < 0.6 else {}
    for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
        key, value = random_signal(rng)
        content[key] = value
    frame: dict = {"serverContent": content}
    if rng.random() < 0.05:
        frame["usageMetadata"] = {"totalTokenCount": 3}
    if rng.random() < 0.05:
        frame = {"server_content": content}
    return json.dumps(frame).encode()


def random_signal(rng: random.Random) -> tuple[str, object]:
    """A serverContent field beside the audio: usually well formed, sometimes not quite."""
    common = ["turnComplete", "generationComplete", "interrupted", "outputTranscription", "inputTranscription"]
    rare = ["turn_complete", "output_transcription", "waitingForInput", "interactionStatus", "turnCompleteReason"]
    key = rng.choice(common) if rng.random() < 0.85 else rng.choice(rare)
    if "ranscription" in key:
        value: object = {}
        if rng.random() < 0.8:
            value["text"] = rng.choice(["hi", "", "Grüße 🙂", "hi", 3, None, "\ud800"])
        if rng.random() < 0.5:
            value["finished"] = rng.choice([True, False, True, False, "true", 1, None])
        if rng.random() < 0.05:
            value["languageCode"] = "en"
        return key, value
    if key == "interactionStatus":
        return key, rng.choice(["IDLE", "INTERACTION_STATUS_UNSPECIFIED"])
    if key == "turnCompleteReason":
        return key, "NEED_MORE_INPUT"
    return key, rng.choice([True, True, False, False, True, "true", 1, None])


def sdk_base64(text: str) -> bytes | Exception:
    """What the SDK's models make of a base64 string (pydantic's decoder)."""
    try:
        return types.Blob.model_validate({"data": text}).data
    except Exception as exc:  # noqa: BLE001
        return exc


def test_base64_is_decoded_only_as_the_sdk_decodes_it():
    """On text built to find where decoders part (padding, trailing bits, both alphabets,
    whitespace), the lean path either declines or gives exactly the SDK's bytes."""
    rng = random.Random(3)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
    odd = "+/-_= \n\r\t.\x00é"
    decoded = 0
    for _ in range(50_000):
        text = "".join(
            rng.choice(alphabet) if rng.random() < 0.85 else rng.choice(odd) for _ in range(rng.randrange(24))
        )
        if rng.random() < 0.3:
            text += "=" * rng.randrange(4)
        fast = gemini_wire._b64decode(text)
        if fast is not None:
            assert sdk_base64(text) == fast, repr(text)
            decoded += 1
    assert decoded > 2_000  # canonical base64 in both alphabets was among them
    for canonical in (base64.b64encode, base64.urlsafe_b64encode):
        for size in range(7):
            data = rng.randbytes(size)
            assert gemini_wire._b64decode(canonical(data).decode()) == data


@pytest.mark.parametrize("vertex", [False, True])
async def test_every_frame_decodes_as_the_sdk_decodes_it(fresh_calibration, vertex: bool):
    client = api_client(vertex)
    assert (await calibrate(client)) is not None
    rng = random.Random(7)
    taken = signals = 0
    for _ in range(2000):
        raw = random_frame(rng)
        fast = decode_frame(raw)
        expected = await sdk_decoding(client, raw)
        if fast is None:
            continue  # the SDK's path decodes it
        taken += 1
        assert not isinstance(expected, Exception), (raw, expected)
        assert gemini_wire._same(fast, expected), raw
        # The turn's iteration ends on the frame the SDK's receive() ends it on.
        assert bool(fast.server_content.turn_complete) == genai_live._is_interaction_complete(
            expected.server_content
        ), raw
        signals += fast.server_content.model_turn is None
        # The connection reads a frame of reply audio alone as its Content, and
        # makes of it what the mapper makes of the whole message.
        lean = gemini_wire.decode_lean(raw)
        bare = fast.server_content.model_fields_set == {"model_turn"}
        assert (type(lean) is types.Content) == bare, raw
        if bare:
            assert ServerMessageMapper().feed(fast) == [LlmResponse(content=lean, partial=True)], raw
        else:
            assert gemini_wire._same(lean, fast), raw
    # The random frames exercise the fast path, audio and signals, not only the fallback.
    assert taken > 250 and signals > 100, (taken, signals)


async def test_every_audio_frame_is_written_as_the_sdk_writes_it(fresh_calibration):
    client = api_client()
    codec = await calibrate(client)
    assert codec is not None
    rng = random.Random(11)
    for _ in range(200):
        data = rng.randbytes(rng.choice([0, 1, 2, 320, 640, 3200]))
        mime = rng.choice(["audio/pcm;rate=16000", "audio/pcm;rate=8000", "audio/pcm"])
        assert codec.encode_audio(data, mime) == await gemini_wire._sdk_send_text(client, data, mime)
    assert codec.encode_audio(b"\x00", 'audio/pcm;x="y"') is None  # would need escaping: the SDK writes it


async def test_an_sdk_that_writes_audio_differently_keeps_the_sdk_path(fresh_calibration, monkeypatch, caplog):
    original = _common.encode_unserializable_types

    def encode(data):
        out = original(data)
        audio = out.get("audio")
        if isinstance(audio, dict) and "data" in audio:
            audio["byteCount"] = len(base64.urlsafe_b64decode(audio["data"]))  # not a template's work
        return out

    monkeypatch.setattr(_common, "encode_unserializable_types", encode)
    with caplog.at_level(logging.WARNING, logger="connections.gemini_wire"):
        assert await calibrate(api_client()) is None
    assert "differs from the SDK's own" in caplog.text and "google-genai" in caplog.text


async def test_an_sdk_that_decodes_audio_differently_keeps_its_own_decoding(fresh_calibration, monkeypatch, caplog):
    original = types.LiveServerMessage._from_response.__func__

    def from_response(cls, *, response, kwargs):
        message = original(cls, response=response, kwargs=kwargs)
        if message.server_content and message.server_content.model_turn:
            message.server_content.model_turn.role = "model"  # a newer SDK filling in the role
        return message

    monkeypatch.setattr(types.LiveServerMessage, "_from_response", classmethod(from_response))
    with caplog.at_level(logging.WARNING, logger="connections.gemini_wire"):
        codec = await calibrate(api_client())
    assert codec is not None and not codec.decode_frames  # audio still goes up lean; frames down use the SDK
    assert codec.decode(json.dumps({"serverContent": {"modelTurn": {"parts": []}}})) is None
    assert "differs from the SDK's decoding" in caplog.text


def test_the_wire_path_is_chosen_in_code_or_by_environment(monkeypatch):
    assert Gemini(MODEL, api_key="k").wire == "lean"
    assert Gemini(MODEL, api_key="k", wire="sdk").wire == "sdk"
    monkeypatch.setenv("LIVE_GEMINI_WIRE", "sdk")
    assert Gemini(MODEL, api_key="k").wire == "sdk"
    monkeypatch.setenv("LIVE_GEMINI_WIRE", "fast")
    with pytest.raises(ConfigurationError, match="'lean' or 'sdk'"):
        Gemini(MODEL, api_key="k")


# ---------------------------------------------------------------------------- against the emulator


def request() -> LlmRequest:
    tools = [types.Tool(function_declarations=[types.FunctionDeclaration(name="lookup")])]
    return LlmRequest(
        live_connect_config=types.LiveConnectConfig(
            response_modalities=[types.Modality.AUDIO],
            input_audio_transcription=types.AudioTranscriptionConfig(),
            output_audio_transcription=types.AudioTranscriptionConfig(),
            tools=tools,
        )
    )


def summary(response: LlmResponse) -> tuple:
    """Everything a response tells its consumer, in comparable form."""
    content = response.content.model_dump(exclude_none=True) if response.content else None
    if content:
        for part in content.get("parts", []):
            call = part.get("function_call")
            if call:
                call["id"] = "<the call's id>"  # the emulator numbers calls across sessions
    return (
        content,
        response.partial,
        response.turn_complete,
        response.interrupted,
        response.generation_complete,
        response.input_transcription and response.input_transcription.model_dump(exclude_none=True),
        response.output_transcription and response.output_transcription.model_dump(exclude_none=True),
        response.usage_metadata is not None,
    )


async def conversation(emulator: Emulator, wire: str) -> tuple[list[tuple], bytes, type]:
    """A spoken turn, a tool round trip, and an error; returns what the caller saw."""
    seen: list[tuple] = []
    async with gemini_for(emulator, wire=wire).connect(request()) as connection:
        assert isinstance(connection._session, LeanSession) == (wire == "lean")
        stream = connection.receive()

        async def until(stop) -> list[LlmResponse]:
            got = []
            with anyio.fail_after(10):
                async for response in stream:
                    got.append(response)
                    seen.append(summary(response))
                    if stop(response):
                        return got
            raise AssertionError("the connection ended early")

        pcm = tone(0.4) + silence(0.3)
        for i in range(0, len(pcm), 640):
            await connection.send_realtime(types.Blob(data=pcm[i : i + 640], mime_type="audio/pcm;rate=16000"))
        await connection.send_realtime(AUDIO_STREAM_END)
        await until(lambda r: r.turn_complete)
        await connection.send_content(types.Content(role="user", parts=[types.Part(text="look it up")]))
        got = await until(lambda r: bool(r.function_calls))
        (call,) = got[-1].function_calls
        answer = types.FunctionResponse(id=call.id, name=call.name, response={"found": 1})
        await connection.send_content(types.Content(role="user", parts=[types.Part(function_response=answer)]))
        await until(lambda r: r.turn_complete)
        # An answer to a call that was never made: the service closes 1007, on either path alike.
        stray = types.FunctionResponse(id="nope", name="lookup", response={})
        await connection.send_content(types.Content(role="user", parts=[types.Part(function_response=stray)]))
        with pytest.raises(Exception) as ended:  # noqa: PT011 - the type is compared across paths below
            await until(lambda r: False)
    record = emulator.sessions[-1]
    return seen, bytes(record.audio), type(ended.value)


@pytest.mark.parametrize("keys", ["camel", "snake"])
@pytest.mark.parametrize("alphabet", ["standard", "urlsafe"])
async def test_lean_and_sdk_paths_give_the_same_conversation(live_emulator: Emulator, keys: str, alphabet: str):
    live_emulator.script = Script(
        speed=20.0,
        user_says=["good morning"],
        tool_calls={2: [ToolCall("lookup", {"q": "x"})]},
        audio_keys=keys,  # type: ignore[arg-type]
        audio_base64=alphabet,  # type: ignore[arg-type]
    )
    lean = await conversation(live_emulator, "lean")
    sdk = await conversation(live_emulator, "sdk")
    assert lean[0] == sdk[0]
    assert lean[1] == sdk[1] and len(lean[1]) == 2 * 16000 * 7 // 10  # the model heard every sample
    assert lean[2] is sdk[2] is InvalidArgumentError
    audio = [s for s in lean[0] if s[0] and "inline_data" in s[0]["parts"][0]]
    assert len(audio) > 10  # the reply's audio came through the fast path's decoder


async def test_the_live_socket_does_not_offer_compression(live_emulator: Emulator):
    """Deflate would cost a zlib pass per audio frame each way and its state per session, to save a fifth of the bytes."""
    live_emulator.script = Script(speed=20.0, user_says=["hello"])
    async with gemini_for(live_emulator, wire="lean").connect(request()) as connection:
        pcm = tone(0.3) + silence(0.3)
        for i in range(0, len(pcm), 640):
            await connection.send_realtime(types.Blob(data=pcm[i : i + 640], mime_type="audio/pcm;rate=16000"))
        await connection.send_realtime(AUDIO_STREAM_END)
        with anyio.fail_after(10):
            async for response in connection.receive():
                if response.turn_complete:
                    break
    headers = {k.lower(): v for k, v in live_emulator.sessions[-1].headers.items()}
    assert "sec-websocket-extensions" not in headers, headers
    assert len(live_emulator.sessions[-1].audio) == len(pcm)


