"""Property: nothing a stranger sends before authentication makes a parser raise
anything but its documented error, or log a traceback; every input gets an
answer (a status, an error value). Each parser a stranger reaches is drawn
inputs by hypothesis, around the real messages of its wire, and checked by
its target in `bench.fuzz_targets` (which `python -m bench.fuzz` also drives,
coverage-guided, for longer)."""

from __future__ import annotations

import base64
import json
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bench import fuzz_targets as t

# A bounded run in the suite: this file takes well under a minute on two cores.
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------------- JSON around real messages

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
    st.sampled_from(["", "models/" + t.MODEL, "audio/pcm;rate=16000", "image/png", "inbound", "start", "media", "AAAA", "\ud800"]),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=6,
)


@st.composite
def around(draw: st.DrawFn, message: Any) -> Any:
    """`message` with a few of its parts (any depth) replaced by any JSON, or removed."""
    def paths(value: Any, prefix: tuple = ()) -> list[tuple]:
        out = [prefix]
        if isinstance(value, dict):
            for key, item in value.items():
                out += paths(item, (*prefix, key))
        elif isinstance(value, list):
            for index, item in enumerate(value):
                out += paths(item, (*prefix, index))
        return out

    message = json.loads(json.dumps(message))
    for _ in range(draw(st.integers(0, 2))):
        path = draw(st.sampled_from(paths(message)))
        if not path:
            message = draw(json_values)
            continue
        parent = message
        try:
            for step in path[:-1]:
                parent = parent[step]
            if isinstance(parent, dict) and draw(st.booleans()) and draw(st.booleans()):
                del parent[path[-1]]
            else:
                parent[path[-1]] = draw(json_values)
        except (KeyError, IndexError, TypeError):
            pass
    return message


def frames_of(*messages: Any) -> st.SearchStrategy[list[str | bytes]]:
    """Frames: the messages of a wire, each maybe changed, in any order, with text
    that is not JSON and binary frames among them."""
    one = st.one_of(
        *(around(m).map(lambda m: json.dumps(m, ensure_ascii=False, allow_nan=True)) for m in messages),
        st.text(max_size=60), st.binary(max_size=60),
    )
    return st.lists(one, min_size=1, max_size=6)


# ---------------------------------------------------------------------- the POST port

tokens_chars = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=30)
header_names = st.one_of(
    st.sampled_from(["Host", "Content-Length", "Transfer-Encoding", "Content-Type", "Expect", "Connection", "x-goog-api-key"]),
    tokens_chars,
)


@st.composite
def requests(draw: st.DrawFn) -> list[bytes]:
    """The bytes of a request (well-formed or nearly), cut anywhere."""
    method = draw(st.sampled_from([b"POST", b"GET", b"PUT", b"CONNECT", b"OPTIONS"]) | tokens_chars.map(str.encode))
    target = draw(st.one_of(
        st.sampled_from([b"/twilio/voice", b"/v1alpha/auth_tokens?key=k", b"http://[", b"//[x", b"*", b"http://a/b?c", b"a:1"]),
        st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=40).map(lambda s: ("/" + s).encode()),
        st.binary(max_size=20),
    ))
    version = draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2", b"HTTP/1.1x"]))
    headers = draw(st.lists(st.tuples(header_names.map(str.encode), st.binary(max_size=40)), max_size=6))
    body = draw(st.binary(max_size=200))
    if draw(st.booleans()):
        headers.append((b"Content-Length", draw(st.sampled_from([str(len(body)).encode(), b"0", b"1000000", b"9" * 5000, b"-1", b"1, 2"]))))
    data = method + b" " + target + b" " + version + b"\r\n" + b"".join(n + b": " + v + b"\r\n" for n, v in headers) + b"\r\n" + body
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=3)))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]


@FUZZ
@given(st.one_of(requests(), st.lists(st.binary(max_size=300), max_size=4)))
def test_the_post_port_reads_any_bytes_into_a_request_or_a_status(chunks):
    t.http_request(chunks)


def posted(body: st.SearchStrategy[bytes]) -> st.SearchStrategy[t.Posted]:
    return st.builds(
        t.Posted,
        query=st.one_of(st.just(""), st.text(max_size=30), st.just("key=" + t.MINT_KEY)),
        headers=st.dictionaries(header_names, st.text(max_size=30), max_size=3),
        body=body,
        signed=st.booleans(),
    )


twilio_form = st.dictionaries(
    st.sampled_from(["CallSid", "Direction", "From", "To", "AccountSid", "CallStatus"]) | st.text(max_size=10),
    st.text(max_size=40), max_size=6,
).map(lambda form: "&".join(f"{k}={v}" for k, v in form.items()).encode("utf-8", "surrogatepass"))


@FUZZ
@given(posted(st.one_of(twilio_form, st.binary(max_size=200))))
def test_twilios_webhook_answers_any_post_with_a_status(request):
    t.twilio_webhook(request)


telnyx_event = {"data": {"event_type": "call.initiated", "id": "e1", "payload": {
    "direction": "incoming", "call_control_id": "v3:1", "from": "+1555", "to": "+1666"}}}


@FUZZ
@given(posted(st.one_of(around(telnyx_event).map(lambda m: json.dumps(m).encode()), st.binary(max_size=200))))
def test_telnyxs_webhook_answers_any_post_with_a_status(request):
    t.telnyx_webhook(request)


token_request = {
    "uses": 1, "expireTime": "2030-01-01T00:00:00Z", "newSessionExpireTime": "2030-01-01T00:00:00Z",
    "bidiGenerateContentSetup": {"model": "models/" + t.MODEL, "generationConfig": {"temperature": 0.5, "responseModalities": ["AUDIO"]},
                                 "systemInstruction": {"parts": [{"text": "be brief"}]}, "sessionResumption": {}},
    "fieldMask": "generationConfig.temperature,systemInstruction",
}


@FUZZ
@given(posted(st.one_of(around(token_request).map(lambda m: json.dumps(m, allow_nan=True).encode()), st.binary(max_size=200))))
def test_auth_tokens_answers_any_post_with_a_status(request):
    t.auth_tokens(request)


# ---------------------------------------------------------------------- the WebSocket port

paths = st.one_of(
    st.sampled_from(["/live", "/", "/healthz", "/livez", "/metrics", "/client/app.js", "/twilio/media", "//[", "/client/\x00",
                     "/ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent?key=k"]),
    st.text(max_size=40).map(lambda s: "/" + s),
    st.text(max_size=40),
)
header_values = st.one_of(
    st.sampled_from(["127.0.0.1", "localhost:8765", "[::1]:1", "[", "http://[", "https://app.example", "null",
                     "10.1.2.3, 127.0.0.1", "Token abc", "Bearer x", "1" * 5000]),
    st.text(max_size=40),
)
# Mostly one good Host, so that what is checked after it is reached too.
good_host = st.sampled_from([[("Host", "127.0.0.1")], [("Host", "localhost:8765")], [("Host", "[::1]")], []])
port_headers = st.tuples(good_host, st.lists(st.tuples(
    st.sampled_from(["Host", "Origin", "Origin", "X-Forwarded-For", "Authorization", "x-goog-api-key", "Upgrade"]) | tokens_chars,
    header_values,
), max_size=5)).map(lambda parts: parts[0] + parts[1])


@FUZZ
@given(st.builds(t.PortRequest, path=paths, headers=port_headers, peer=st.sampled_from(["127.0.0.1", "10.0.0.9", "203.0.113.5", "::1", "?"])))
def test_the_serving_and_metrics_ports_answer_any_request_with_a_status(request):
    t.port_request(request)


# ---------------------------------------------------------------------- doors

native_messages = (
    {"type": "session.start", "token": "t", "input_audio": {"rate": 16000}, "turn_taking": "manual",
     "history": [{"role": "user", "parts": [{"text": "hi"}]}]},
    {"type": "session.resume", "session_id": "s", "resume_token": "r", "last_seq": 3, "token": "t"},
    {"type": "text", "text": "hello"}, {"type": "tool.result", "id": "c1", "name": "f", "response": {"a": 1}},
    {"type": "image", "mime_type": "image/png", "data": base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()},
    {"type": "playback", "played": 1.5}, {"type": "activity.start"}, {"type": "audio.end"}, {"type": "session.close"},
)


@FUZZ
@given(frames_of(*native_messages))
def test_the_native_door_answers_any_frame_with_an_error_value(frames):
    t.native_door(frames)


gemini_messages = (
    {"setup": {"model": "models/" + t.MODEL, "generationConfig": {"responseModalities": ["AUDIO"], "temperature": 1,
               "speechConfig": {"voiceConfig": {"prebuiltVoiceConfig": {"voiceName": "Puck"}}}, "thinkingConfig": {"thinkingBudget": 0}},
               "systemInstruction": {"parts": [{"text": "x"}]}, "sessionResumption": {"handle": "s.r"},
               "tools": [{"functionDeclarations": [{"name": "f", "parameters": {"type": "OBJECT"}}]}, {"googleSearch": {}}],
               "realtimeInputConfig": {"automaticActivityDetection": {"disabled": True}},
               "inputAudioTranscription": {}, "outputAudioTranscription": {}}},
    {"realtimeInput": {"audio": {"mimeType": "audio/pcm;rate=16000", "data": "AAAA"}, "text": "hi", "activityStart": {},
                       "mediaChunks": [{"mimeType": "image/jpeg", "data": "/9j/"}], "video": {"mimeType": "image/png", "data": ""}}},
    {"clientContent": {"turns": [{"role": "user", "parts": [{"text": "hi"}]}], "turnComplete": True}},
    {"toolResponse": {"functionResponses": [{"id": "1", "name": "f", "response": {"ok": True}}]}},
    {"realtimeInput": {"audioStreamEnd": True, "activityEnd": {}}},
)
handshakes = st.builds(
    t.Handshake, path=st.integers(0, 3),
    query=st.one_of(st.just(""), st.sampled_from(["key=k", "access_token=auth_tokens/t", "key=a&key=b"]), st.text(max_size=20)),
    headers=st.lists(st.tuples(st.sampled_from(["x-goog-api-key", "Authorization"]), header_values), max_size=3),
)


@FUZZ
@given(handshakes, frames_of(*gemini_messages))
def test_the_live_api_door_answers_any_frame_with_the_services_error(handshake, frames):
    t.gemini_door(handshake, frames)


media = {"event": "media", "sequenceNumber": "3", "media": {"track": "inbound", "chunk": "2", "timestamp": "5",
                                                            "payload": base64.b64encode(b"\xff" * 160).decode()}}
twilio_messages = (
    {"event": "connected", "protocol": "Call", "version": "1.0.0"},
    {"event": "start", "sequenceNumber": "1", "streamSid": "MZ1", "start": {
        "streamSid": "MZ1", "callSid": "CA0123", "customParameters": {"token": "x"}, "tracks": ["inbound"],
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}},
    media, {"event": "dtmf", "dtmf": {"digit": "5", "track": "inbound_track"}},
    {"event": "mark", "mark": {"name": "1:160"}}, {"event": "stop", "stop": {"callSid": "CA0123"}},
)


@FUZZ
@given(frames_of(*twilio_messages))
# Found by this test once, each an AttributeError (1011) before the call's token was checked:
@example([json.dumps({"event": "start", "start": {"callSid": "CA0123", "mediaFormat": "PCMU"}})])
@example([json.dumps(next(m for m in twilio_messages if m.get("event") == "start")),
          json.dumps({"event": "mark", "mark": "1:160"}), json.dumps({"event": "dtmf", "dtmf": ["5"]})])
def test_the_twilio_door_answers_any_frame_with_an_error_value(frames):
    t.twilio_door(frames)


telnyx_messages = (
    {"event": "connected", "version": "1.0.0"},
    {"event": "start", "sequence_number": "1", "stream_id": "s1", "start": {
        "call_control_id": "v3:1", "client_state": base64.b64encode(b"x").decode(),
        "media_format": {"encoding": "L16", "sample_rate": 16000, "channels": 1}}},
    media, {"event": "dtmf", "dtmf": {"digit": "#"}}, {"event": "mark", "mark": {"name": "0:0"}},
    {"event": "error", "payload": {"code": 100002, "title": "t", "detail": "d"}}, {"event": "stop"},
)


@FUZZ
@given(frames_of(*telnyx_messages))
@example([json.dumps({"event": "start", "start": {"call_control_id": "v3:1", "media_format": "L16"}})])
@example([json.dumps({"event": "error", "payload": "not an object"})])
@example([json.dumps({"event": "start", "stream_id": "s1", "start": {"call_control_id": "v3:1", "client_state": "\x80",
                                                                     "media_format": {"encoding": "L16", "sample_rate": 16000}}})])
def test_the_telnyx_door_answers_any_frame_with_an_error_value(frames):
    t.telnyx_door(frames)


# ---------------------------------------------------------------------- tokens

claims = {"exp": 2_000_000_000, "iat": 1_999_999_000, "jti": "j", "sub": "s", "agent": t.AGENT, "uses": 2,
          "max_duration": 60, "ends_at": 2_000_000_100, "nbf": 1, "live": {"setup": {"model": "models/x"}, "lock": ["model"]}}


@FUZZ
@given(st.builds(
    t.TokenInput,
    text=st.one_of(st.text(max_size=80), around(claims).map(lambda c: json.dumps(c, allow_nan=True)),
                   st.sampled_from(["eyJhbGciOiJub25lIn0.e30.", "a.b.c", "\ud800"])),
    signed=st.booleans(), signature=st.one_of(st.text(max_size=90), st.just("")),
    timestamp=st.one_of(st.text(max_size=12), st.integers().map(str), st.just("9" * 5000)),
))
def test_tokens_and_signatures_are_accepted_or_refused_never_raised(token):
    t.tokens(token)
