"""What an emulated connection hears: realtime input, client content, context
updates, their checks, and voice activity.

The `Listening` mixin of `EmulatorSession` (connections.emulator.core): realtime
audio, video and signals, client content and context updates are checked as
the service checks them (a field it does not know is its 1007 "Unknown name"),
audio goes through a simple energy detector that ends a spoken turn after
silence, and images are recorded and described. State lives on the session;
no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from connections.emulator import synth
from connections.emulator.script import VideoFrame
from connections.emulator.wire import AUDIO_TOKENS_PER_S, MAX_AUDIO, MAX_FRAMES, text_of, token_count
from live.families import family_named
from live.liveapi import (
    EXPLICIT_ACTIVITY,
    INVALID,
    NOT_IMPLEMENTED,
    b64decode,
    check_video,
    get_field,
    rate_of,
    tools_refusal,
    unknown_field,
)

# Realtime input keys as the SDK may write them, in the service's own casing.
_SNAKE_TO_CAMEL = {
    "media_chunks": "mediaChunks",
    "activity_start": "activityStart",
    "activity_end": "activityEnd",
    "audio_stream_end": "audioStreamEnd",
}


# The detector's noise floor follows steady noise upward with this time
# constant (and quieter audio at once); audio counts as speech when it is this
# much louder than the floor, as well as above the start threshold.
FLOOR_RISE_S = 5.0
ABOVE_FLOOR = 1.4  # about 3 dB
KIND_PREFIX_MS = 300.0  # speech needed to start a turn when not every sound barges in
INTERIM_MS = 200.0  # speech per word of an interim transcript


class Listening:
    """Realtime input for `EmulatorSession`."""

    _floor_rms = 0.0  # the room's noise as the detector hears it

    def _on_realtime(self, body: Any) -> None:
        if not isinstance(body, Mapping):
            self._close(1007, INVALID)
            return
        unknown = unknown_field("realtime_input", body, self.route)
        if unknown is not None:
            self._close(1007, unknown)
            return
        if self.profile.rejects_media_chunks and get_field(body, "mediaChunks") is not None:
            self._close(1007, INVALID)
            return
        if self.profile.realtime_during_call_closes and self._call_unanswered():
            self._close(1008, NOT_IMPLEMENTED)
            return
        if self._awaiting_history:
            # historyConfig.initialHistoryInClientContent: only client_content is
            # processed until one arrives with turnComplete=true.
            self.record.ignored_realtime += 1
            return
        for key, value in body.items():
            name = _SNAKE_TO_CAMEL.get(key, key)
            if self._phase != "open":
                return
            if name == "audio":
                self._on_blob(value, "realtime_input.audio")
            elif name == "mediaChunks":
                self._on_media_chunks(value)
            elif name == "video":
                self._on_video(value, "realtime_input.video")
            elif name == "text":
                self._barge_in()
                question = self._open_question() if not str(value).strip() else None
                if question is not None:
                    # A blank text only starts the model: it answers what the
                    # conversation asks (Pipecat seeds Gemini 3 this way, as the
                    # model "won't run inference without a realtime input").
                    self._user_turn(question, spoken=False, add_history=False)
                else:
                    self._user_turn(str(value), spoken=False)
            elif name in ("activityStart", "activityEnd"):
                if not self._vad_disabled:
                    self._close(1007, EXPLICIT_ACTIVITY)
                    return
                if name == "activityStart":
                    self._manual_active = True
                    self._turn_audio_ms = 0.0
                    self._barge_in()
                elif self._manual_active:
                    self._manual_active = False
                    self._end_spoken_turn()
            elif name == "audioStreamEnd":
                if value and not self._vad_disabled and self._speaking:
                    self._speaking = False
                    self._end_spoken_turn()
            else:
                self._close(1007, f'Invalid JSON payload received. Unknown name "{key}" at \'realtime_input\': Cannot find field.')

    def _on_media_chunks(self, chunks: Any) -> None:
        """The deprecated field: "Multiple `media_chunks` are not supported, all
        but the first will be ignored" (BidiGenerateContentRealtimeInput). The
        rest are parsed (their bytes must be base64), never heard; an image
        chunk is a frame, as `video` is now."""
        if not isinstance(chunks, list) or not all(isinstance(c, Mapping) for c in chunks):
            self._close(1007, INVALID)
            return
        for i, ignored in enumerate(chunks[1:], 1):
            try:
                b64decode(get_field(ignored, "data") or "")
            except ValueError:
                self._close(1007, f"Invalid value at 'realtime_input.media_chunks[{i}].data' (TYPE_BYTES), Base64 decoding failed.")
                return
        if not chunks:
            return
        first = chunks[0]
        if str(get_field(first, "mimeType") or "").startswith("image/"):
            self._on_video(first, "realtime_input.media_chunks[0]")
        else:
            self._on_blob(first, "realtime_input.media_chunks[0]")

    def _open_question(self) -> str | None:
        """The text of the history's last turn when the user said it and no one answered yet."""
        spoken = [t for t in self._history if text_of(t).strip()]
        if spoken and spoken[-1].get("role") == "user":
            return text_of(spoken[-1])
        return None

    def _on_client_content(self, body: Any) -> None:
        if not isinstance(body, Mapping):
            self._close(1007, INVALID)
            return
        unknown = unknown_field("client_content", body, self.route)
        if unknown is not None:
            self._close(1007, unknown)
            return
        if self.profile.client_content_after_history_closes and not self._awaiting_history:
            self._close(1007, INVALID)
            return
        seeding = self._awaiting_history
        turns = get_field(body, "turns") or []
        if not isinstance(turns, list):
            self._close(1007, INVALID)
            return
        for turn in turns:
            if not isinstance(turn, Mapping) or (get_field(turn, "role") or "user") not in ("user", "model"):
                self._close(1007, INVALID)
                return
            role = get_field(turn, "role") or "user"
            self._history.append({"role": role, "parts": list(get_field(turn, "parts") or [])})
            self._ctx_tokens["TEXT"] = self._ctx_tokens.get("TEXT", 0) + token_count(text_of(turn))
        if seeding:
            # The initial history: it may end with the model's turn and triggers no reply.
            if get_field(body, "turnComplete"):
                self._awaiting_history = False
                self._started = True
                if self.profile.handle_after_setup:
                    self._handle()
            return
        # "A message here will interrupt any current model generation"; all of it
        # is appended to the history, and with turnComplete the model answers.
        self._barge_in()
        if get_field(body, "turnComplete"):
            asked = [t for t in self._history if t.get("role") == "user" and text_of(t)]
            self._user_turn(text_of(asked[-1]) if asked else "", spoken=False, add_history=False)

    def _on_context_update(self, body: Any) -> None:
        unknown = unknown_field("context_update", body, self.route) if isinstance(body, Mapping) else INVALID
        if unknown is not None or not self.profile.context_update:
            self._close(1007, unknown or 'Invalid JSON payload received. Unknown name "contextUpdate": Cannot find field.')
            return
        refused = tools_refusal(get_field(get_field(body, "tools"), "tools"), family_named(self.profile.family).service_tools)
        if refused is not None:
            self._close(1007, refused)
            return
        instruction = get_field(body, "systemInstruction")
        if instruction is not None:
            self.record.instructions.append(instruction if isinstance(instruction, str) else text_of(instruction))
        tools = get_field(body, "tools")
        if isinstance(tools, Mapping):
            self._set_tools(get_field(tools, "tools"))

    def _on_video(self, blob: Any, where: str) -> None:
        """An image frame: checked as strictly as the service could, then counted."""
        checked = check_video(blob, where)
        if isinstance(checked, str):
            self._close(1007, checked)
            return
        data, mime, width, height = checked
        self._started = True
        record = self.record
        record.video_frames += 1
        record.last_video = data
        if len(record.video) < MAX_FRAMES:
            frame = VideoFrame(self._now, mime, len(data), width, height, hashlib.sha256(data).hexdigest())
            record.video.append(frame)

    def _on_blob(self, blob: Any, where: str) -> None:
        data_text = get_field(blob, "data")
        mime = str(get_field(blob, "mimeType") or "")
        try:
            data = b64decode(data_text)
        except ValueError:
            self._close(
                1007,
                f"Invalid value at '{where}.data' (TYPE_BYTES), Base64 decoding failed.",
            )
            return
        self._started = True
        if not mime.startswith("audio/"):
            return
        self.record.audio_chunks += 1
        self.heard_audio(data, rate_of(mime))
        if self._phase == "open":
            self._fault("after_audio_chunks", self.record.audio_chunks)

    def heard_audio(self, data: bytes, rate: int) -> None:
        """One realtime audio chunk, checked: kept in `record`, and heard by the
        activity detector (or counted toward a manual activity)."""
        room = MAX_AUDIO - len(self.record.audio)
        if room > 0:
            self.record.audio.extend(data[:room])
        if self._vad_disabled:
            if self._manual_active:
                self._turn_audio_ms += len(data) / 2 / rate * 1000
        else:
            self._detect(data, rate)

    def _detect(self, pcm: bytes, rate: int) -> None:
        """Energy-based activity detection, measured in audio time (deterministic):
        loud audio above the noise floor is speech; the profile says how long
        a silence ends the turn and how much sound starts one."""
        profile = self.profile
        end_ms = self._silence_ms_needed if profile.turn_end_silence is None else profile.turn_end_silence * 1000
        prefix_ms = self._prefix_ms if profile.barge_in_on_any_sound else max(self._prefix_ms, KIND_PREFIX_MS)
        floor = self._floor_rms
        for rms, ms in synth.frame_rms(pcm, rate):
            self._stream_ms += ms
            loud = rms >= self._threshold and rms >= ABOVE_FLOOR * floor
            floor = rms if rms < floor else floor + (rms - floor) * min(1.0, ms / (FLOOR_RISE_S * 1000))
            self._floor_rms = floor
            if not self._speaking:
                if loud:
                    self._voiced_ms += ms
                    if self._voiced_ms >= prefix_ms:
                        self._speaking = True
                        self._silence_ms = 0.0
                        self._turn_audio_ms = self._voiced_ms
                        self._interim_words = 0
                        self._voice_activity("ACTIVITY_START", self._stream_ms - self._voiced_ms)
                        self._barge_in()
                        self._interim()
                else:
                    self._voiced_ms = 0.0
                continue
            self._turn_audio_ms += ms
            self._silence_ms = 0.0 if loud else self._silence_ms + ms
            if loud:
                self._interim()
            if self._silence_ms >= end_ms:
                self._speaking = False
                self._voiced_ms = 0.0
                self._voice_activity("ACTIVITY_END", self._stream_ms - self._silence_ms)
                self._interim(whole=True)
                self._end_spoken_turn()
                if self._phase != "open":
                    return

    def _voice_activity(self, kind: str, at_ms: float) -> None:
        """A `voiceActivity` message, where the profile sends them; with the
        audio time it happened at (`audioOffset`) where the profile says."""
        if not self.profile.voice_activity_messages:
            return
        activity: dict[str, Any] = {"type": kind}
        if self.profile.voice_activity_audio_offset:
            activity["audioOffset"] = f"{max(0.0, at_ms) / 1000:.3f}s"
        self._send({"voiceActivity": activity})

    def _interim(self, whole: bool = False) -> None:
        """While the user speaks, one more word of the turn in an
        `interimInputTranscription` every INTERIM_MS of speech (all of them
        once the speech ends: `whole`), where the profile sends them and the
        client asked for input transcription."""
        if not (self.profile.interim_input_transcription and self._input_transcription):
            return
        words = self.script.transcript_for(self._turn + 1, self._spoken_turns).split()
        due = len(words) if whole else min(len(words), 1 + int(self._turn_audio_ms // INTERIM_MS))
        if due > self._interim_words:
            self._interim_words = due
            self._send({"serverContent": {"interimInputTranscription": {"text": " ".join(words[:due])}}})

    def _end_spoken_turn(self) -> None:
        text = self.script.transcript_for(self._turn + 1, self._spoken_turns)
        self._spoken_turns += 1
        if self._input_transcription:
            fields = self.script.transcription_fields.get("inputTranscription", {})
            pieces: list[dict[str, Any]] = [{**fields, "text": t} for t in synth.fragments(text, size=64)]
            late = pieces.pop() if pieces and self.profile.late_transcripts else None
            first = pieces[0] if pieces else late
            if first is not None and self.profile.input_transcription_finished_first:
                first["finished"] = True
            for piece in pieces:
                self._send({"serverContent": {"inputTranscription": piece}})
            if late is not None:
                self._late.append({"serverContent": {"inputTranscription": late}})
        seconds = self._turn_audio_ms / 1000
        self._ctx_tokens["AUDIO"] = self._ctx_tokens.get("AUDIO", 0) + max(
            1, round(seconds * AUDIO_TOKENS_PER_S)
        )
        self._user_turn(text, spoken=True)
