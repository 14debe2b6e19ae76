"""The sans-I/O audio core: mime parsing, resampling, voice activity, turn tracking."""

from __future__ import annotations

import numpy as np
import pytest
from audio_fixtures import best_correlation, chunked, noise, reference_24k, silence, speak, tone

from connections.audio import (
    StreamResampler,
    parse_pcm_mime,
    pcm16_to_float,
    resample_pcm16,
)
from connections.vad import (
    EnergyVad,
    TurnEnded,
    TurnStarted,
    TurnTracker,
    VadConfig,
    VadEventKind,
)

SENTENCE = "The quick brown fox jumps over the lazy dog."


def mix(a: bytes, b: bytes) -> bytes:
    x = np.frombuffer(a, "<i2").astype(np.int32)
    y = np.frombuffer(b, "<i2").astype(np.int32)
    n = min(x.size, y.size)
    return np.clip(x[:n] + y[:n], -32768, 32767).astype("<i2").tobytes()


def speech_bounds(pcm: bytes, rate: int = 16000) -> tuple[float, float]:
    """First and last moment the signal is clearly not silent."""
    loud = np.flatnonzero(np.abs(np.frombuffer(pcm, "<i2")) > 300)
    return loud[0] / rate, loud[-1] / rate


def run_vad(vad: EnergyVad, pcm: bytes, rate: int = 16000) -> list:
    events = []
    for chunk in chunked(pcm, rate, 20):
        events += vad.feed(chunk, rate)
    return events


def run_turns(tracker: TurnTracker, pcm: bytes, rate: int = 16000) -> list:
    events = []
    for chunk in chunked(pcm, rate, 20):
        events += tracker.feed(chunk, rate)
    return events


# -- mime and resampling ------------------------------------------------------


def test_pcm_mime_rate_defaults_to_16k_and_parses_rate():
    assert parse_pcm_mime("audio/pcm") == 16000
    assert parse_pcm_mime("audio/pcm;rate=48000") == 48000
    assert parse_pcm_mime("Audio/PCM; rate=8000") == 8000


@pytest.mark.parametrize(
    "mime", [None, "", "audio/opus", "image/jpeg", "audio/pcm;rate=abc", "audio/pcm;rate=100"]
)
def test_pcm_mime_rejects_what_is_not_raw_pcm(mime):
    with pytest.raises(ValueError):
        parse_pcm_mime(mime)


def test_resample_16k_to_24k_keeps_a_tone():
    src = tone(0.5, 16000, freq=440.0)
    out = np.frombuffer(resample_pcm16(src, 16000, 24000), "<i2").astype(np.float64)
    assert out.size == 12000
    t = np.arange(out.size) / 24000
    expected = np.sin(2 * np.pi * 440.0 * t) * 0.3 * 32767
    # The very last sample lies past the input's end and holds its final value.
    assert np.max(np.abs(out - expected)[:-1]) < 0.01 * 32767


def test_streamed_resampling_has_no_seams():
    """Chunk by chunk (20 ms, odd sizes too) equals resampling the whole buffer."""
    samples = pcm16_to_float(speak(SENTENCE))
    whole = StreamResampler(16000, 24000).process(samples)
    r = StreamResampler(16000, 24000)
    sizes = [320, 77, 320, 1, 500]
    parts, i, k = [], 0, 0
    while i < samples.size:
        n = sizes[k % len(sizes)]
        parts.append(r.process(samples[i : i + n]))
        i, k = i + n, k + 1
    streamed = np.concatenate(parts)
    assert streamed.size == whole.size
    assert np.max(np.abs(streamed - whole)) < 1e-5


def test_downsampling_suppresses_aliases():
    """A 15 kHz tone at 48 kHz has no place at 24 kHz; it must not fold back as 9 kHz."""
    out = pcm16_to_float(resample_pcm16(tone(0.5, 48000, freq=15000.0), 48000, 24000))
    kept = pcm16_to_float(resample_pcm16(tone(0.5, 48000, freq=1000.0), 48000, 24000))
    ratio_db = 20 * np.log10(np.std(out[100:]) / np.std(kept[100:]))
    assert ratio_db < -20


# -- EnergyVad -----------------------------------------------------------------


def test_vad_finds_the_spoken_turn_with_silence_around_it():
    speech = speak(SENTENCE)
    pcm = silence(1.0) + speech + silence(1.0)
    onset, offset = speech_bounds(pcm)
    events = run_vad(EnergyVad(), pcm)
    assert [e.kind for e in events] == [VadEventKind.SPEECH_STARTED, VadEventKind.SPEECH_ENDED]
    assert abs(events[0].time_s - onset) < 0.06
    assert abs(events[1].time_s - offset) < 0.1


def test_vad_end_of_turn_after_configured_silence():
    """The end is reported once `end_silence_ms` of silence follows the speech, not before."""
    speech = speak(SENTENCE)
    _, last = speech_bounds(speech)
    speech = speech[: int(last * 16000) * 2]  # no trailing silence of its own
    for end_ms in (300, 700):
        vad = EnergyVad(VadConfig(end_silence_ms=end_ms))
        run_vad(vad, silence(0.5) + speech)
        assert vad.speaking
        fed, ended_at = 0.0, None
        for chunk in chunked(silence(1.5)):
            fed += 0.02
            if vad.feed(chunk, 16000):
                ended_at = fed
                break
        assert ended_at is not None
        assert end_ms / 1000 - 0.04 <= ended_at <= end_ms / 1000 + 0.06


def test_vad_ignores_silence_and_low_noise():
    assert run_vad(EnergyVad(), silence(5.0)) == []
    assert run_vad(EnergyVad(), noise(5.0, dbfs=-45.0)) == []
    assert run_vad(EnergyVad(), noise(5.0, dbfs=-65.0)) == []


def test_vad_hears_speech_over_background_noise():
    clean = silence(1.0) + speak(SENTENCE) + silence(1.0)
    noisy = mix(clean, noise(len(clean) / 32000, dbfs=-40.0, seed=3))
    vad = EnergyVad()
    events = run_vad(vad, noisy)
    assert [e.kind for e in events] == [VadEventKind.SPEECH_STARTED, VadEventKind.SPEECH_ENDED]
    assert -43 < vad.noise_floor_dbfs < -37  # the floor found the room, not the speech


def test_vad_ignores_short_blips_but_not_short_words():
    blip = silence(1.0) + tone(0.1) + silence(1.0)
    assert run_vad(EnergyVad(), blip) == []
    word = silence(1.0) + tone(0.25) + silence(1.0)
    kinds = [e.kind for e in run_vad(EnergyVad(), word)]
    assert kinds == [VadEventKind.SPEECH_STARTED, VadEventKind.SPEECH_ENDED]


def test_vad_works_at_other_rates():
    pcm = silence(1.0, 48000) + speak(SENTENCE, 48000) + silence(1.0, 48000)
    kinds = [e.kind for e in run_vad(EnergyVad(), pcm, 48000)]
    assert kinds == [VadEventKind.SPEECH_STARTED, VadEventKind.SPEECH_ENDED]


# -- TurnTracker ---------------------------------------------------------------


def test_tracker_returns_the_utterance_at_24k():
    speech = speak(SENTENCE)
    pcm = silence(1.0) + speech + silence(1.0)
    events = run_turns(TurnTracker(), pcm)
    assert [type(e) for e in events] == [TurnStarted, TurnEnded]
    end = events[1]
    assert end.rate == 24000 and end.reason == "silence" and not end.truncated
    onset, offset = speech_bounds(pcm)
    duration = len(end.audio) / 2 / 24000
    # The spoken part plus at most the preroll and tail, none of the silence around it.
    assert offset - onset <= duration <= offset - onset + 0.35
    got = np.frombuffer(end.audio, "<i2").astype(np.float64)
    assert best_correlation(got, reference_24k(speech)) > 0.95


def test_tracker_two_sentences_apart_are_two_turns():
    pcm = silence(0.5) + speak("Hello there.") + silence(1.0) + speak("Goodbye now.") + silence(1.0)
    events = run_turns(TurnTracker(), pcm)
    assert [type(e) for e in events] == [TurnStarted, TurnEnded, TurnStarted, TurnEnded]


def test_tracker_manual_activity_bypasses_the_detector():
    """Between activity start and end everything is one turn, pauses included."""
    tracker = TurnTracker()
    first, second = speak("Hello there."), speak("Goodbye now.")
    assert run_turns(tracker, silence(0.5)) == []
    assert tracker.activity_start() == [TurnStarted(manual=True)]
    inside = first + silence(1.0) + second
    assert run_turns(tracker, inside) == []  # no automatic end despite the pause
    (end,) = tracker.activity_end()
    assert end.reason == "activity_end"
    assert abs(len(end.audio) / 48000 - len(inside) / 32000) < 0.01
    assert tracker.activity_end() == []  # nothing in progress any more


def test_tracker_automatic_detection_can_be_disabled():
    tracker = TurnTracker(automatic=False)
    assert run_turns(tracker, silence(0.5) + speak("Hello there.") + silence(1.0)) == []


def test_tracker_audio_stream_end_ends_the_turn_in_progress():
    tracker = TurnTracker()
    speech = speak("Hello there.")
    events = run_turns(tracker, silence(0.5) + speech)
    assert [type(e) for e in events] == [TurnStarted]
    (end,) = tracker.audio_stream_end()
    assert end.reason == "audio_stream_end"
    assert len(end.audio) / 48000 > 0.5 * len(speech) / 32000
    assert tracker.audio_stream_end() == []


def test_tracker_bounds_a_long_turn():
    tracker = TurnTracker(max_turn_s=1.0)
    long_speech = speak(SENTENCE + " " + SENTENCE)
    events = run_turns(tracker, silence(0.5) + long_speech + silence(1.0))
    ends = [e for e in events if isinstance(e, TurnEnded)]
    assert len(ends) == 1 and ends[0].truncated
    assert len(ends[0].audio) == 24000 * 2  # exactly the first second is kept
