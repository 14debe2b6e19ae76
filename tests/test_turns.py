"""The server's own turn-taking without sockets: the turn controller, the voice
detector batched across sessions, Smart Turn's features, and the server's
batching and end-of-turn worker with stand-in models."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import time
from pathlib import Path

import anyio
import numpy as np
import pytest

from audio_fixtures import silence, speak
from live.agent import Agent, TurnSettings
from live.engine.turns.controller import (
    CheckEndOfTurn,
    EndActivity,
    Ignored,
    StartActivity,
    TurnController,
    UserSpeaking,
)
from live.engine.turns.models import SILERO, packaged_file
from live.engine.turns.smart_turn import last_seconds, log_mel
from live.engine.turns.vad import Silero, VoiceStream, next_batch
from live.extras import MissingExtra
from live.server.detection import EndOfTurnChecks, VoiceDetection

WINDOW = 0.032
RATE = 16_000


def drive(controller: TurnController, script: list[tuple[float, float, bool]]) -> list[tuple[float, object]]:
    """Feed (seconds, speech probability, agent speaking) spans window by window,
    with audio to match (a 32 ms frame per window); returns (time, action) pairs."""
    out = []
    frame = b"\x10\x00" * int(WINDOW * RATE)
    for seconds, probability, agent in script:
        for _ in range(round(seconds / WINDOW)):
            controller.audio(frame)
            for action in controller.scored(probability, agent_speaking=agent):
                out.append((round(controller.t, 3), action))
    return out


def kinds(actions) -> list[str]:
    return [type(a).__name__ + (f"({a.reason})" if hasattr(a, "reason") else "") for _, a in actions]


# ---------------------------------------------------------------------------- the controller


def test_a_pause_shorter_than_the_end_silence_keeps_the_turn_open():
    turns = TurnController(TurnSettings(end_silence=1.0), input_rate=RATE)
    actions = drive(turns, [(0.5, 0.0, False), (1.0, 0.9, False), (0.8, 0.05, False), (1.0, 0.9, False), (1.2, 0.05, False)])
    assert kinds(actions) == ["UserSpeaking", "StartActivity", "EndActivity(silence)"]
    (end_at, _), = [(t, a) for t, a in actions if isinstance(a, EndActivity)]
    assert end_at == pytest.approx(0.5 + 1.0 + 0.8 + 1.0 + 1.0, abs=0.05)  # a second after the speech
    assert turns.turns == 1 and not turns.in_turn


def test_the_turn_opens_with_the_audio_from_just_before_the_onset():
    """The first syllable is never lost: the preroll reaches back `preroll`
    seconds before the first window the detector heard as speech."""
    turns = TurnController(TurnSettings(preroll=0.3), input_rate=RATE)
    pcm = silence(1.0) + speak("Hello there")
    starts = []
    for window, offset in enumerate(range(0, len(pcm) - 1024, 1024)):  # a 32 ms frame per window
        turns.audio(pcm[offset : offset + 1024])
        speech = window * WINDOW >= 1.0  # the detector hears speech from 1.0 s on
        starts += [a for a in turns.scored(0.9 if speech else 0.0, agent_speaking=False) if isinstance(a, StartActivity)]
    (start,) = starts
    begins = pcm.find(start.preroll)
    assert begins == int((32 * WINDOW - 0.3) * RATE) * 2  # the onset window (1.024 s), less 0.3 s
    assert begins < int(1.0 * RATE) * 2 and len(start.preroll) > int(0.3 * RATE) * 2
    assert not start.barge_in


def test_a_backchannel_over_the_reply_is_left_alone():
    turns = TurnController(TurnSettings(barge_in=0.8), input_rate=RATE)
    actions = drive(turns, [(0.5, 0.0, True), (0.45, 0.9, True), (0.6, 0.0, True)])
    assert kinds(actions) == ["UserSpeaking", "Ignored(backchannel)"]
    assert actions[0][1] == UserSpeaking(over_reply=True)
    assert turns.turns == 0 and turns.ignored == 1


def test_sustained_speech_over_the_reply_interrupts_it_within_the_bound():
    turns = TurnController(TurnSettings(barge_in=0.8, onset_gap=0.25), input_rate=RATE)
    # Speech with a short gap in it (between words): still one onset.
    actions = drive(turns, [(0.5, 0.0, True), (0.4, 0.9, True), (0.16, 0.1, True), (1.0, 0.9, True)])
    (at, start), = [(t, a) for t, a in actions if isinstance(a, StartActivity)]
    assert start.barge_in
    assert at <= 0.5 + 0.4 + 0.16 + 0.4 + WINDOW  # 0.8 s of speech, counted from the onset
    # The preroll holds the interruption from its first word.
    assert len(start.preroll) >= int((0.4 + 0.16 + 0.4 + 0.3 - WINDOW) * RATE) * 2


def test_speech_begun_over_the_reply_becomes_a_turn_when_the_reply_ends():
    turns = TurnController(TurnSettings(barge_in=0.8), input_rate=RATE)
    actions = drive(turns, [(0.3, 0.9, True), (0.2, 0.9, False)])
    assert kinds(actions) == ["UserSpeaking", "StartActivity"]
    assert not actions[1][1].barge_in


def test_end_of_turn_model_ends_a_finished_sentence_early_and_waits_on_an_unfinished_one():
    settings = TurnSettings(end_of_turn="smart", end_silence=1.0, max_pause=2.0, smart_check_after=0.3)
    turns = TurnController(settings, input_rate=RATE)
    actions = drive(turns, [(1.2, 0.9, False), (0.32, 0.0, False)])
    checks = [a for _, a in actions if isinstance(a, CheckEndOfTurn)]
    assert len(checks) == 1 and checks[0].audio.size >= int(1.2 * RATE)
    assert turns.verdict(checks[0].pause, 0.97) == [EndActivity("complete")]

    turns = TurnController(settings, input_rate=RATE)
    actions = drive(turns, [(1.2, 0.9, False), (0.32, 0.0, False)])
    (check,) = [a for _, a in actions if isinstance(a, CheckEndOfTurn)]
    assert turns.verdict(check.pause, 0.03) == []
    later = drive(turns, [(1.7, 0.0, False)])  # past end_silence: the model said wait
    assert kinds(later) == ["EndActivity(max_wait)"]
    assert later[0][0] == pytest.approx(1.2 + 2.0, abs=0.05)

    # Unsure (between smart_hold_below and smart_threshold): silence decides.
    turns = TurnController(settings, input_rate=RATE)
    actions = drive(turns, [(1.2, 0.9, False), (0.32, 0.0, False)])
    (check,) = [a for _, a in actions if isinstance(a, CheckEndOfTurn)]
    assert turns.verdict(check.pause, 0.3) == []
    later = drive(turns, [(1.7, 0.0, False)])
    assert kinds(later) == ["EndActivity(silence)"]
    assert later[0][0] == pytest.approx(1.2 + 1.0, abs=0.05)


def test_without_an_answer_in_time_the_turn_ends_by_silence():
    settings = TurnSettings(end_of_turn="smart", end_silence=1.0, max_pause=2.5)
    turns = TurnController(settings, input_rate=RATE)
    actions = drive(turns, [(1.2, 0.9, False), (1.1, 0.0, False)])
    assert kinds(actions)[-1] == "EndActivity(silence)"
    check = next(a for _, a in actions if isinstance(a, CheckEndOfTurn))
    assert turns.verdict(check.pause, 0.99) == []  # late: that pause is over


def test_short_turns_are_not_asked_about_and_resumed_speech_makes_a_new_pause():
    settings = TurnSettings(end_of_turn="smart", smart_min_speech=1.0)
    turns = TurnController(settings, input_rate=RATE)
    actions = drive(turns, [(0.5, 0.9, False), (0.5, 0.0, False), (0.7, 0.9, False), (0.4, 0.0, False)])
    checks = [a for _, a in actions if isinstance(a, CheckEndOfTurn)]
    assert len(checks) == 1 and checks[0].pause == 2  # asked in the second pause only (1.2 s of speech by then)


def test_a_turn_always_ends():
    turns = TurnController(TurnSettings(max_turn=3.0), input_rate=RATE)
    actions = drive(turns, [(5.0, 0.9, False)])
    assert kinds(actions)[:3] == ["UserSpeaking", "StartActivity", "EndActivity(max_length)"]
    assert actions[2][0] == pytest.approx(3.0, abs=0.05)  # and speech that goes on is a new turn
    turns = TurnController(TurnSettings(), input_rate=RATE)
    drive(turns, [(1.0, 0.9, False)])
    assert turns.audio_ended() == [EndActivity("audio_end")]


def test_voice_state_says_whether_the_user_speaks_and_since_when():
    turns = TurnController(TurnSettings(), input_rate=RATE)
    drive(turns, [(0.64, 0.0, False), (1.0, 0.9, False)])
    assert turns.speaking and turns.changed_at == pytest.approx(0.64, abs=0.01)
    drive(turns, [(0.32, 0.0, False)])
    assert not turns.speaking and turns.changed_at == pytest.approx(1.64, abs=0.01)


def test_settings_refuse_what_cannot_work():
    with pytest.raises(ValueError, match="end_of_turn"):
        TurnSettings(end_of_turn="psychic")
    with pytest.raises(ValueError, match="max_pause"):
        TurnSettings(end_silence=3.0, max_pause=2.0)
    with pytest.raises(ValueError, match="turn_taking"):
        Agent("a", "m", turn_taking="sometimes")


# ---------------------------------------------------------------------------- the detector


def _scores(streams: list[VoiceStream], model: Silero, rate: int) -> list[list[float]]:
    out: list[list[float]] = [[] for _ in streams]
    index = {id(s): i for i, s in enumerate(streams)}
    while (batch := next_batch(streams, rate)) is not None:
        probabilities, state = model.run(rate, batch.inputs, batch.state) if batch.streams else ((), batch.state)
        batch.done(state)
        for stream, p in zip(batch.streams, probabilities):
            out[index[id(stream)]].append(float(p))
        for stream in batch.quiet:
            out[index[id(stream)]].append(0.0)
    return out


@pytest.mark.parametrize("rate", [16_000, 8_000])
def test_one_batched_run_scores_every_session_as_runs_of_their_own_would(rate):
    model = Silero()
    sentences = ["Hello there, can you hear me?", "I would like to book a flight.", "Yes.", "Set a timer for ten minutes."]
    pcm = [silence(0.3, rate) + speak(text, rate) + silence(0.3, rate) for text in sentences]
    together = [VoiceStream(rate, rate, floor_dbfs=-200) for _ in pcm]
    alone = [VoiceStream(rate, rate, floor_dbfs=-200) for _ in pcm]
    batched: list[list[float]] = [[] for _ in pcm]
    single: list[list[float]] = [[] for _ in pcm]
    for offset in range(0, max(map(len, pcm)), 640):
        for i, audio in enumerate(pcm):
            together[i].feed(audio[offset : offset + 640])
            alone[i].feed(audio[offset : offset + 640])
        for i, got in enumerate(_scores(together, model, rate)):
            batched[i] += got
        for i, stream in enumerate(alone):
            single[i] += _scores([stream], model, rate)[0]
    assert batched == single  # to the bit
    for scores in batched:
        assert max(scores) > 0.8 and scores[0] < 0.2  # it hears the speech, not the silence


def test_steady_noise_is_scored_without_the_model_and_speech_over_it_is_heard():
    """Speech at 10 dB over white noise: the noise alone costs no model run
    once its level is known; the speech over it is heard."""
    model = Silero()
    calls = []

    class Counting:
        def run(self, rate, inputs, state):
            calls.append(inputs.shape[0])
            return model.run(rate, inputs, state)

    rng = np.random.default_rng(1)
    speech = np.frombuffer(speak("Please send the invoice to my work email address."), "<i2").astype(np.float32)
    level = np.sqrt(np.mean(speech[np.abs(speech) > 100] ** 2))
    background = rng.normal(0, level / 10 ** (10 / 20), RATE * 4 + speech.size)
    mixed = background.copy()
    mixed[RATE * 3 : RATE * 3 + speech.size] += speech
    pcm = np.clip(mixed, -32768, 32767).astype("<i2").tobytes()
    stream = VoiceStream(RATE, RATE)
    scores: list[float] = []
    for offset in range(0, len(pcm), 640):
        stream.feed(pcm[offset : offset + 640])
        scores += _scores([stream], Counting(), RATE)[0]  # type: ignore[arg-type]
    noise_only = scores[5:90]  # 0.16 s to 2.9 s: the noise alone
    assert sum(1 for s in noise_only if s) < 5 and len(calls) < len(scores) * 0.7
    assert max(scores[94:]) > 0.8  # the speech over it


def test_quiet_audio_is_scored_without_the_model_and_speech_after_it_is_heard():
    model = Silero()
    stream = VoiceStream(RATE, RATE, floor_dbfs=-55)
    calls = []

    class Counting:
        def run(self, rate, inputs, state):
            calls.append(inputs.shape[0])
            return model.run(rate, inputs, state)

    pcm = silence(1.0) + speak("Good morning")
    scores: list[float] = []
    for offset in range(0, len(pcm), 640):
        stream.feed(pcm[offset : offset + 640])
        scores += _scores([stream], Counting(), RATE)[0]  # type: ignore[arg-type]
    assert scores[:30] == [0.0] * 30  # a second of silence: no model run
    assert len(calls) < len(scores) - 25
    assert max(scores) > 0.8


def test_the_detector_falls_behind_by_dropping_the_oldest_audio():
    stream = VoiceStream(RATE, RATE, max_backlog=0.5)
    stream.feed(silence(2.0))
    assert stream.ready * 512 <= 0.5 * RATE and stream.dropped > 0


def test_phone_audio_is_heard_at_its_line_rate():
    """A phone line's 16 kHz session audio is detected at 8 kHz (half the cost)."""
    stream = VoiceStream(16_000, 8_000)
    stream.feed(speak("Hello there", 16_000))
    assert stream.window == 256 and stream.ready >= int(0.5 * 8000 / 256)


# ---------------------------------------------------------------------------- the models' files


def test_model_files_come_from_their_wheels_checked_against_the_record():
    path = packaged_file(*SILERO)
    assert path.name == "silero_vad.onnx" and path.stat().st_size > 1_000_000
    with pytest.raises(MissingExtra, match=r"live-sessions\[turns\]"):
        packaged_file("no-such-distribution-here", "x/y.onnx", "turns")


def test_a_model_file_that_is_not_the_wheels_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    real = packaged_file(*SILERO)
    fake = tmp_path / "silero_vad.onnx"
    fake.write_bytes(real.read_bytes()[:-1] + b"\x00")
    entry = next(f for f in importlib.metadata.distribution(SILERO[0]).files or () if f.as_posix() == SILERO[1])
    monkeypatch.setattr(type(entry), "locate", lambda self: fake)
    with pytest.raises(RuntimeError, match="hash does not match"):
        packaged_file(*SILERO)


def test_smart_turn_features_are_whispers():
    """Our numpy log-mel is the one pipecat ships (itself checked against
    transformers' WhisperFeatureExtractor)."""
    files = importlib.metadata.distribution("pipecat-ai").files or ()
    entry = next(f for f in files if f.as_posix() == "pipecat/audio/turn/smart_turn/_whisper_features.py")
    spec = importlib.util.spec_from_file_location("_whisper_features", str(entry.locate()))
    assert spec is not None and spec.loader is not None
    reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reference)
    audio = np.frombuffer(speak("Can you tell me the weather in Paris tomorrow?"), "<i2").astype(np.float32) / 32768
    ours = log_mel(last_seconds(audio))
    theirs = reference.compute_whisper_log_mel_features(last_seconds(audio))
    assert ours.shape == (80, 800)
    assert np.abs(ours - theirs).max() < 1e-5


def test_smart_turn_computes_its_features_on_one_blas_thread_and_leaves_the_process_as_it_was(monkeypatch):
    """OpenBLAS's idle threads spin for milliseconds after each matrix product:
    on two cores that doubled each answer's CPU, unseen by the count of the
    thread that asked. The product runs on the caller's thread alone, for the
    call only."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from live.engine.turns import smart_turn

    def blas_threads() -> list[int]:
        return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]

    seen: list[list[int]] = []
    features = smart_turn.log_mel

    def log_mel(audio):
        seen.append(blas_threads())
        return features(audio)

    monkeypatch.setattr(smart_turn, "log_mel", log_mel)
    audio = np.frombuffer(speak("I'd like to book a flight."), "<i2").astype(np.float32) / 32768
    with threadpool_limits(limits=2, user_api="blas"):  # a process whose BLAS has threads
        assert blas_threads() and set(blas_threads()) == {2}
        probability = smart_turn.SmartTurn().complete(audio)
        assert set(blas_threads()) == {2}
    assert seen == [[1] * len(blas_threads())]
    assert 0.0 <= probability <= 1.0


# ---------------------------------------------------------------------------- the server's components


class FakeVad:
    """Speech where the window's mean is positive; records the batch sizes."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def run(self, rate, inputs, state):
        self.batches.append(inputs.shape[0])
        return (inputs[:, -512:].mean(axis=1) > 0).astype(np.float32), state + 1


@pytest.mark.anyio
async def test_the_server_scores_every_session_in_one_batch_per_tick():
    model = FakeVad()
    detection = VoiceDetection(model=lambda: model, tick=0.01)
    heard: dict[int, list[float]] = {0: [], 1: [], 2: []}
    streams = [VoiceStream(RATE, RATE, floor_dbfs=-200) for _ in heard]
    for i, stream in enumerate(streams):
        detection.add(stream, heard[i].append)
    def loud(first: int) -> bytes:  # windows each louder than the last: never the background
        return np.concatenate([np.full(512, 100 * 1.7 ** k, "<i2") for k in range(first, first + 5)]).tobytes()

    async with anyio.create_task_group() as tg:
        tg.start_soon(detection.run)
        for stream in streams:
            stream.feed(loud(0))
        with anyio.fail_after(5):
            while any(len(h) < 5 for h in heard.values()):
                await anyio.sleep(0.01)
        detection.remove(streams[2])
        streams[0].feed(loud(5))
        streams[2].feed(loud(5))
        with anyio.fail_after(5):
            while len(heard[0]) < 10:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert heard[1] == [1.0] * 5 and heard[2] == [1.0] * 5  # the one removed heard nothing more
    assert max(model.batches) == 3 and sum(model.batches) == 15 + 5
    assert all(s.state.max() >= 5 for s in streams[:2])  # each kept its own row of state


@pytest.mark.anyio
async def test_the_detectors_cpu_time_is_counted_model_runs_and_all():
    class Busy(FakeVad):
        def run(self, rate, inputs, state):  # 5 ms of CPU per run, on the worker thread
            until = time.thread_time() + 0.005
            while time.thread_time() < until:
                pass
            return super().run(rate, inputs, state)

    counted: list[float] = []
    detection = VoiceDetection(model=Busy, tick=0.01, on_cpu=counted.append)
    stream = VoiceStream(RATE, RATE, floor_dbfs=-200)
    detection.add(stream, lambda probability: None)
    async with anyio.create_task_group() as tg:
        tg.start_soon(detection.run)
        stream.feed(np.concatenate([np.full(512, 100 * 1.7 ** k, "<i2") for k in range(6)]).tobytes())
        with anyio.fail_after(5):
            while detection.runs < 6:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert detection.cpu_seconds >= 6 * 0.005
    assert sum(counted) == pytest.approx(detection.cpu_seconds)


@pytest.mark.anyio
async def test_the_end_of_turn_worker_refuses_when_full_and_skips_what_is_no_longer_wanted():
    started = anyio.Event()
    release = anyio.Event()

    class Slow:
        def complete(self, audio):
            anyio.from_thread.run_sync(started.set)
            anyio.from_thread.run(release.wait)
            return float(audio[0])

    checks = EndOfTurnChecks(model=Slow, max_waiting=1)
    answers: list[float | None] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(checks.run)
        assert checks.ask(np.array([0.9]), answers.append, lambda: True)
        await started.wait()  # the first is being answered; one may wait
        assert checks.ask(np.array([0.2]), answers.append, lambda: False)
        assert not checks.ask(np.array([0.5]), answers.append, lambda: True)  # full: refused at once
        release.set()
        with anyio.fail_after(5):
            while checks.skipped < 1:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert answers == [0.9] and checks.refused == 1 and checks.skipped == 1



def test_the_noise_filter_quiets_a_hiss_before_the_detector_hears_it():
    """Speex's suppressor on the detector's copy: steady hiss comes out much
    quieter; the frames come out whole and in step (10 ms at a time)."""
    from live.engine.turns.noise import NoiseFilter

    rng = np.random.default_rng(3)
    hiss = (rng.normal(0, 600, RATE * 3)).astype("<i2").tobytes()
    denoise = NoiseFilter(RATE)
    out = b"".join(denoise(hiss[i : i + 640]) for i in range(0, len(hiss), 640))
    assert len(out) == len(hiss) // 320 * 320
    before = np.frombuffer(hiss[RATE:], "<i2").astype(float)
    after = np.frombuffer(out[RATE:], "<i2").astype(float)
    assert np.sqrt(np.mean(after**2)) < 0.3 * np.sqrt(np.mean(before**2))
