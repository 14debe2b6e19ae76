"""The emulator's protocol state machine, stepped with a fake clock (no sockets)."""

from __future__ import annotations

import base64
import json
import math

from audio_fixtures import silence, tone

from connections.emulator.core import (
    CloseConnection,
    DropConnection,
    EmulatorSession,
    Handshake,
    SendMessage,
    Settings,
    Shared,
)
from connections.emulator.script import Fault, Script, ToolCall

PATH = "/ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent"
MODEL = "models/gemini-live-2.5-flash-preview"


class Driver:
    """Steps one session: frames in, messages collected, time advanced by hand."""

    def __init__(self, script: Script | None = None, *, path: str = PATH, headers=None, shared=None, settings=None, index=0):
        self.now = 0.0
        self.session = EmulatorSession(
            Handshake(path, headers if headers is not None else {"x-goog-api-key": "k"}),
            script=script or Script(speed=math.inf),
            settings=settings,
            shared=shared,
            index=index,
        )
        self.out: list = []

    def send(self, message) -> list:
        frame = message if isinstance(message, str) else json.dumps(message)
        actions = self.session.receive(frame, self.now)
        self.out += actions
        return actions

    def run(self, seconds: float = 100.0) -> list:
        """Advance time in small steps, collecting actions."""
        end = self.now + seconds
        got = []
        while True:
            got += self.session.poll(self.now)
            deadline = self.session.next_deadline()
            if deadline is None or deadline > end or self.session.closed:
                break
            self.now = max(self.now, deadline)
        self.now = end
        self.out += got
        return got

    def setup(self, **setup) -> list:
        return self.send({"setup": {"model": MODEL, **setup}})

    def audio(self, pcm: bytes, chunk: int = 640, key: str = "realtime_input", urlsafe: bool = True) -> None:
        enc = base64.urlsafe_b64encode if urlsafe else base64.b64encode
        for i in range(0, len(pcm), chunk):
            self.send({key: {"audio": {"data": enc(pcm[i : i + chunk]).decode(), "mime_type": "audio/pcm;rate=16000"}}})

    def messages(self, key: str | None = None) -> list[dict]:
        msgs = [a.payload for a in self.out if isinstance(a, SendMessage)]
        return [m for m in msgs if key is None or key in m]

    def content(self, field: str) -> list:
        return [m["serverContent"][field] for m in self.messages("serverContent") if field in m["serverContent"]]

    def closes(self) -> list:
        return [a for a in self.out if isinstance(a, (CloseConnection, DropConnection))]


def test_setup_complete_and_a_handle_once_the_first_turn_completed():
    d = Driver()
    d.setup(sessionResumption={})
    assert d.messages() == [{"setupComplete": {}}]  # no handle yet, as the service does
    d.send({"realtimeInput": {"text": "hi"}})
    d.run()
    updates = [m["sessionResumptionUpdate"] for m in d.messages("sessionResumptionUpdate")]
    assert updates[0] == {"resumable": False}  # generating: no handle
    assert updates[-1]["resumable"] is True and updates[-1]["newHandle"]
    # The old emulator's handle right after setup, on request.
    d = Driver(Script(speed=math.inf, profile_overrides={"handle_after_setup": True}))
    d.setup(sessionResumption={})
    update = d.messages("sessionResumptionUpdate")[0]["sessionResumptionUpdate"]
    assert update["resumable"] is True and update["newHandle"]


def test_wrong_key_closes_1008():
    d = Driver(settings=Settings(api_key="right"), headers={"x-goog-api-key": "wrong"})
    d.setup()
    assert d.closes() == [CloseConnection(1008, "API key not valid. Please pass a valid API key.")]


def test_missing_key_closes_1008():
    d = Driver(headers={})
    d.setup()
    (close,) = d.closes()
    assert close.code == 1008 and "unregistered callers" in close.reason


def test_non_live_model_and_bad_version_close_1008():
    d = Driver()
    d.send({"setup": {"model": "models/gemini-2.5-flash"}})
    (close,) = d.closes()
    assert close.code == 1008 and "bidiGenerateContent" in close.reason
    d = Driver(settings=Settings(api_versions=frozenset({"v1alpha"})))
    d.setup()
    (close,) = d.closes()
    assert close.code == 1008 and "API version v1beta" in close.reason
    d = Driver()
    d.send({"setup": {}})
    assert d.closes()[0].code == 1008


def test_first_frame_must_be_setup_and_unknown_fields_rejected():
    d = Driver()
    d.send({"realtimeInput": {"text": "hi"}})
    assert d.closes()[0].code == 1007
    d = Driver()
    d.setup()
    d.send({"bogus": {}})
    (close,) = d.closes()
    assert close.code == 1007 and '"bogus"' in close.reason
    d = Driver()
    d.setup()
    d.send("not json")
    assert d.closes()[0].code == 1007


def test_spoken_turn_by_energy_with_transcripts_and_usage():
    d = Driver(Script(speed=math.inf, user_says=["hello emulator"]))
    d.setup(inputAudioTranscription={}, outputAudioTranscription={})
    d.audio(tone(0.4) + silence(0.6))
    d.run()
    assert "".join(t["text"] for t in d.content("inputTranscription")) == "hello emulator"
    assert "".join(t["text"] for t in d.content("outputTranscription")) == "You said: hello emulator."
    assert all(1 <= len(t["text"]) <= 4 for t in d.content("outputTranscription"))
    kinds = [next(iter(m["serverContent"])) for m in d.messages("serverContent")]
    assert kinds.index("generationComplete") < kinds.index("turnComplete")
    assert kinds.index("modelTurn") < kinds.index("generationComplete")
    (done,) = [m for m in d.messages() if "usageMetadata" in m]
    assert done["serverContent"] == {"turnComplete": True}
    assert done["usageMetadata"]["responseTokenCount"] > 0
    assert d.session.record.user_turns == ["hello emulator"]


def test_silence_duration_is_honoured():
    d = Driver()
    d.setup(realtimeInputConfig={"automaticActivityDetection": {"silenceDurationMs": 1000}})
    d.audio(tone(0.4) + silence(0.8))
    d.run()
    assert d.session.record.user_turns == []
    d.audio(silence(0.3))
    assert d.session.record.user_turns == ["user turn 1"]


def test_audio_stream_end_ends_the_turn():
    d = Driver()
    d.setup()
    d.audio(tone(0.4))
    assert d.session.record.user_turns == []
    d.send({"realtimeInput": {"audioStreamEnd": True}})
    assert d.session.record.user_turns == ["user turn 1"]


def test_manual_activity():
    d = Driver()
    d.setup(realtime_input_config={"automatic_activity_detection": {"disabled": True}})
    d.send({"realtime_input": {"activityStart": {}}})
    d.audio(silence(0.2))
    d.send({"realtime_input": {"activityEnd": {}}})
    d.run()
    assert d.session.record.model_turns == ["You said: user turn 1."]
    d2 = Driver()
    d2.setup()
    d2.send({"realtime_input": {"activityStart": {}}})
    assert d2.closes()[0].code == 1007


def test_reply_audio_is_paced_in_bursts():
    d = Driver(Script(speed=1.0, replies=["one two three four five six seven"]))
    d.setup()
    d.send({"realtimeInput": {"text": "hi"}})
    assert d.run(0.29) == []
    first = d.run(0.02)
    assert len(first) == 5  # one burst of 5 x 40 ms
    assert d.run(0.17) == []
    assert len(d.run(0.04)) == 5


def test_barge_in_interrupts_and_keeps_partial_history():
    d = Driver(Script(speed=1.0, replies=["a long answer with many words in it"]))
    d.setup()
    d.send({"realtimeInput": {"text": "hi"}})
    d.run(0.5)
    d.audio(tone(0.1))
    assert d.content("interrupted") == [True]
    assert d.session.record.model_turns and d.session.record.model_turns[0] != "a long answer with many words in it"
    before = len(d.messages("serverContent"))
    d.run(0.3)  # nothing more of the interrupted generation
    assert all("modelTurn" not in m["serverContent"] for m in d.messages("serverContent")[before:])


def test_no_interruption_mode_queues_the_turn():
    d = Driver(Script(speed=1.0))
    d.setup(realtimeInputConfig={"activityHandling": "NO_INTERRUPTION"})
    d.send({"realtimeInput": {"text": "one"}})
    d.run(0.4)
    d.send({"realtimeInput": {"text": "two"}})
    d.run(20)
    assert d.content("interrupted") == []
    assert d.session.record.model_turns == ["You said: one.", "You said: two."]


def test_tool_call_round_trip_and_cancellation():
    script = Script(speed=math.inf, tool_args={"get_weather": {"city": "Paris"}})
    tools = [{"functionDeclarations": [{"name": "get_weather"}]}]
    d = Driver(script)
    d.setup(tools=tools, sessionResumption={})
    d.send({"realtimeInput": {"text": "call get weather please"}})
    d.run()
    (call,) = d.messages("toolCall")[0]["toolCall"]["functionCalls"]
    assert call["name"] == "get_weather" and call["args"] == {"city": "Paris"}
    updates = [m["sessionResumptionUpdate"]["resumable"] for m in d.messages("sessionResumptionUpdate")]
    assert updates[-1] is False
    d.send({"tool_response": {"function_responses": [{"id": call["id"], "name": "get_weather", "response": {"temp": 21}}]}})
    d.run()
    assert d.session.record.model_turns == ['get_weather returned {"temp":21}.']
    # a pending call cancelled by barge-in
    d2 = Driver(Script(speed=math.inf, tool_calls={1: [ToolCall("lookup", {"q": 1})]}))
    d2.setup()
    d2.send({"realtimeInput": {"text": "anything"}})
    d2.run()
    call_id = d2.messages("toolCall")[0]["toolCall"]["functionCalls"][0]["id"]
    d2.audio(tone(0.1))
    assert d2.content("interrupted") == [True]
    assert d2.messages("toolCallCancellation") == [{"toolCallCancellation": {"ids": [call_id]}}]


def test_resume_restores_conversation_and_unknown_handle_fails():
    shared = Shared()
    d = Driver(shared=shared)
    d.setup(sessionResumption={})
    d.send({"realtimeInput": {"text": "remember me"}})
    d.run()
    handle = d.session.record.handles[-1]
    d.session.connection_lost(1000)  # the old socket closes before the resume
    seen = []
    script = Script(speed=math.inf, replies=lambda ctx: seen.append(ctx) or "ok")
    d2 = Driver(script, shared=shared, index=1)
    d2.setup(sessionResumption={"handle": handle})
    assert d2.messages()[0] == {"setupComplete": {}}
    d2.send({"realtimeInput": {"text": "again"}})
    d2.run()
    assert seen[0].turn == 2
    assert [h["parts"][0]["text"] for h in seen[0].history] == ["remember me", "You said: remember me.", "again"]
    # updates sent with resumable=false carry no handle; an unknown one is "not found"
    assert all("newHandle" not in m["sessionResumptionUpdate"] for m in d.messages("sessionResumptionUpdate") if not m["sessionResumptionUpdate"]["resumable"])
    d3 = Driver(shared=shared)
    d3.setup(sessionResumption={"handle": "emulator-handle-0-99"})
    assert d3.closes() == [CloseConnection(1008, "BidiGenerateContent session not found")]


def test_go_away_then_close():
    d = Driver(Script(speed=10, go_away_after=20, go_away_time_left=3))
    d.setup()
    d.run(1.9)
    assert d.messages("goAway") == []
    d.run(0.2)
    assert d.messages("goAway") == [{"goAway": {"timeLeft": "3s"}}]
    d.run(0.31)
    assert d.closes() == [CloseConnection(1011, "Deadline expired before operation could complete.")]
    d = Driver(Script(speed=10, go_away_after=20, go_away_time_left=3, profile_overrides={"deadline_close_1011": False}))
    d.setup()
    d.run(3)
    assert d.closes() == [CloseConnection(1000, "")]


def test_faults_fire_at_their_moment_and_only_once():
    shared = Shared()
    script = Script(speed=math.inf, faults=[Fault("after_audio_chunks", code=1008, n=3)])
    d = Driver(script, shared=shared)
    d.setup()
    d.audio(silence(0.1), chunk=640)
    assert d.session.record.audio_chunks == 3
    assert d.closes()[0].code == 1008
    d2 = Driver(script, shared=shared)
    d2.setup()
    d2.audio(silence(0.1))
    assert d2.closes() == []
    d3 = Driver(Script(speed=math.inf, faults=[Fault("mid_generation", code=1006, n=2)]))
    d3.setup()
    d3.send({"realtimeInput": {"text": "hi"}})
    d3.run()
    assert isinstance(d3.closes()[0], DropConnection)
    assert len(d3.content("modelTurn")) == 2
    d4 = Driver(Script(speed=math.inf, faults=[Fault.stall("after_setup")]))
    d4.setup()
    d4.send({"realtimeInput": {"text": "hi"}})
    d4.run()
    assert d4.session.stalled and d4.messages() == [{"setupComplete": {}}]


def test_quota_limit_on_concurrent_sessions():
    shared = Shared()
    script = Script(speed=math.inf, max_sessions=1)
    first = Driver(script, shared=shared)
    first.setup()
    second = Driver(script, shared=shared, index=1)
    second.setup()
    (close,) = second.closes()
    assert close.code == 1011 and "RESOURCE_EXHAUSTED" in close.reason
    first.session.connection_lost(1000)
    third = Driver(script, shared=shared, index=2)
    third.setup()
    assert third.closes() == []


def test_gemini_3_history_needs_history_config():
    model = "models/gemini-3.1-flash-live-preview"
    history = {"clientContent": {"turns": [{"role": "user", "parts": [{"text": "hi"}]}], "turnComplete": True}}
    d = Driver()
    d.send({"setup": {"model": model}})
    d.send(history)
    assert d.closes()[0].code == 1007
    d = Driver()
    d.send({"setup": {"model": model, "historyConfig": {"initialHistoryInClientContent": True}}})
    d.send(history)
    d.run()
    # The initial history is context: it triggers no reply, even ending with the user.
    assert d.closes() == [] and d.session.record.model_turns == []
    d.send({"realtimeInput": {"text": "and now?"}})
    d.run()
    assert d.session.record.model_turns == ["You said: and now."]
    d.send(history)  # not again, once the conversation started
    assert d.closes()[0].code == 1007


def test_under_the_history_flag_realtime_input_waits_for_a_complete_seed():
    model = "models/gemini-3.1-flash-live-preview"
    d = Driver()
    d.send({"setup": {"model": model, "historyConfig": {"initialHistoryInClientContent": True}}})
    d.send({"realtimeInput": {"text": "anyone?"}})  # before the seed: not processed
    d.send({"clientContent": {"turns": [{"role": "model", "parts": [{"text": "Hi."}]}], "turnComplete": False}})
    d.send({"realtimeInput": {"text": "still nobody?"}})  # the seed is not complete yet
    d.run()
    assert d.session.record.ignored_realtime == 2 and d.session.record.model_turns == []
    d.send({"clientContent": {"turnComplete": True}})
    d.send({"realtimeInput": {"text": "hello"}})
    d.run()
    assert d.session.record.model_turns == ["You said: hello."]


def test_the_history_flag_on_a_resumed_session_is_refused():
    model = "models/gemini-3.1-flash-live-preview"
    d = Driver()
    d.send({"setup": {"model": model, "sessionResumption": {"handle": "whatever"},
                      "historyConfig": {"initialHistoryInClientContent": True}}})
    assert d.closes()[0].code == 1007


def test_a_function_response_for_a_call_never_issued_is_refused():
    d = Driver()
    d.send({"setup": {"model": MODEL}})
    d.send({"toolResponse": {"functionResponses": [{"id": "made-up", "name": "f", "response": {}}]}})
    assert d.closes()[0].code == 1007


def test_bundled_output_for_3x_models():
    d = Driver(Script(speed=math.inf, replies=["hi there"]))
    d.send({"setup": {"model": "models/gemini-3.1-flash-live-preview", "outputAudioTranscription": {}}})
    d.send({"realtimeInput": {"text": "x"}})
    d.run()
    contents = [m["serverContent"] for m in d.messages("serverContent")]
    assert any("modelTurn" in c and "outputTranscription" in c for c in contents)
    assert "generationComplete" in [c for c in contents if "modelTurn" in c][-1]


def test_both_alphabets_and_casings():
    pcm = bytes(range(256)) * 4  # has bytes that encode to + / - _
    for key, urlsafe in (("realtime_input", True), ("realtimeInput", False)):
        d = Driver()
        d.send({"setup": {"model": MODEL, "generation_config": {"response_modalities": ["TEXT"]}}})
        d.audio(pcm, chunk=len(pcm), key=key, urlsafe=urlsafe)
        assert bytes(d.session.record.audio) == pcm
    d = Driver()
    d.setup()
    d.send({"realtimeInput": {"audio": {"data": "!!!", "mimeType": "audio/pcm"}}})
    assert d.closes()[0].code == 1007


def test_text_modality_replies_with_text_parts():
    d = Driver(Script(speed=math.inf, replies=["plain text reply"]))
    d.send({"setup": {"model": MODEL, "generationConfig": {"responseModalities": ["TEXT"]}}})
    d.send({"client_content": {"turns": [{"role": "user", "parts": [{"text": "q"}]}], "turn_complete": True}})
    d.run()
    text = "".join(p["text"] for c in d.content("modelTurn") for p in c["parts"])
    assert text == "plain text reply"


def test_constrained_method_needs_an_ephemeral_token():
    constrained = PATH + "Constrained"
    d = Driver(path=constrained, headers={"authorization": "Token auth_tokens/abc"})
    d.setup()
    assert d.closes() == []
    d = Driver(path=constrained + "?access_token=auth_tokens/abc", headers={})
    d.setup()
    assert d.closes() == []
    d = Driver(path=constrained, headers={"x-goog-api-key": "k"})
    d.setup()
    assert d.closes()[0].code == 1008


# --- video input ---------------------------------------------------------------


def _jpeg(width: int, height: int) -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), (90, 20, 200)).save(out, "JPEG")
    return out.getvalue()


def _video(d: Driver, data: bytes, mime: str = "image/jpeg") -> list:
    return d.send({"realtime_input": {"video": {"data": base64.urlsafe_b64encode(data).decode(), "mime_type": mime}}})


def test_video_frames_are_counted_described_and_kept_small():
    d = Driver()
    d.setup()
    first, second = _jpeg(640, 480), _jpeg(768, 432)
    _video(d, first)
    d.now = 1.0
    _video(d, second)
    record = d.session.record
    assert record.video_frames == 2
    assert [(f.t, f.width, f.height, f.size) for f in record.video] == [(0.0, 640, 480, len(first)), (1.0, 768, 432, len(second))]
    assert record.last_video == second
    assert record.describe_video() == f"2 video frame(s); the newest: a 768x432 JPEG image of {len(second)} bytes"
    # The kept client frame says how much data came, not the data.
    assert record.frames[-1]["realtime_input"]["video"]["data"].endswith("base64 characters>")
    # Asked what it sees, the model describes the newest frame.
    d.send({"realtime_input": {"text": "What do you see?"}})
    d.run()
    assert record.model_turns[-1] == f"I see a 768x432 JPEG image of {len(second)} bytes, frame 2."


def test_video_that_is_not_an_image_of_its_type_closes_1007():
    for data, mime, says in [
        (_jpeg(8, 8), "audio/pcm;rate=16000", "Unsupported MIME type"),
        (_jpeg(8, 8)[:-10], "image/jpeg", "Invalid image"),
        (_jpeg(8, 8), "image/png", "Invalid image"),
    ]:
        d = Driver()
        d.setup()
        [close] = [a for a in _video(d, data, mime) if isinstance(a, CloseConnection)]
        assert close.code == 1007 and says in close.reason
        assert d.session.record.video_frames == 0
