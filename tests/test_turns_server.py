"""The server taking the user's turns (`turn_taking="server"`), end to end: a
`LiveClient` talks to `LiveServer`, which drives the Live emulator (google-genai
over TLS) in manual activity mode, as the real service takes it."""

from __future__ import annotations

import anyio
import pytest

from audio_fixtures import chunked, silence, speak
from clients.client import AudioFrame, LiveClient
from connections.emulator import Fault, Script, running_emulator
from emulated import gemini_for
from live import protocol as p
from live.agent import Agent, TurnSettings
from live.engine.turns.controller import EndActivity, StartActivity, TurnController
from live.engine.turns.vad import Silero, next_batch
from live.liveapi import get_field
from live.observe.record import Recorder, load
from serving import running

pytestmark = pytest.mark.anyio

MODEL = "gemini-3.1-flash-live-preview"  # its detector closes a turn at a 1 s pause (the emulator's profile)
LONG_REPLY = (
    "Certainly. Flights to Boston next Friday morning leave at seven, at nine and at "
    "eleven, and the nine o'clock one still has window seats."
)
PATIENT = TurnSettings(end_silence=1.6)


def detection_off(setup) -> bool:
    """The setup turned the model's own voice detection off (keys in either casing)."""
    detection = get_field(get_field(setup, "realtimeInputConfig") or {}, "automaticActivityDetection") or {}
    return get_field(detection, "disabled") is True


def paused_sentence() -> bytes:
    """A sentence with a 1.2 s pause in the middle (the 3.1 detector cuts it)."""
    return speak("I would like to book a flight to") + silence(1.2) + speak("Boston next Friday morning.")


async def talk(client: LiveClient, pcm: bytes) -> None:
    """Say `pcm` as a microphone does: 20 ms frames in real time."""
    for frame in chunked(pcm):
        await client.send_audio(frame)
        await anyio.sleep(0.02)


async def conversation(url: str, events: list, *, turn_taking: str | None = None) -> None:
    """A paused sentence; 1 s into the reply, "mm-hm"; then silence until the reply is over."""
    async with LiveClient.connect(url, turn_taking=turn_taking) as client:
        replying = anyio.Event()

        async def read() -> None:
            async for event in client.events():
                events.append(event)
                if isinstance(event, AudioFrame):
                    replying.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            await talk(client, silence(0.4) + paused_sentence())
            async with anyio.create_task_group() as quiet:
                quiet.start_soon(talk, client, silence(30))  # the microphone stays on

                with anyio.fail_after(10):
                    await replying.wait()
                await anyio.sleep(1.0)
                quiet.cancel_scope.cancel()
            await talk(client, speak("mm-hm", wpm=220) + silence(8.0))
            tg.cancel_scope.cancel()


async def test_a_paused_sentence_is_answered_whole_and_mm_hm_does_not_cut_the_reply():
    agent = Agent("booking", MODEL, turn_taking="server", turns=PATIENT)
    events: list = []
    async with running_emulator(Script(replies=[LONG_REPLY, "Yes?"], speed=1)) as emu:
        async with running(agent, gemini_for(emu)) as (server, url):
            await conversation(url, events)
            [model] = emu.sessions
            detection_cpu = server.metrics.value("live_turn_taking_cpu_seconds_total", {"part": "voice_detection"})
    # What the server's turn-taking cost is counted for its operator.
    assert detection_cpu > 0
    # The model heard one turn: the whole sentence, pause and all.
    assert len(model.user_turns) == 1
    assert detection_off(model.setup)
    # The reply was never cut: the model said all of it, and the client heard it all.
    assert model.model_turns == [LONG_REPLY]
    assert not any(isinstance(e, p.TurnInterrupted) for e in events)
    said = "".join(e.text for e in events if isinstance(e, p.TranscriptOutput) and not e.heard)
    assert said.replace(" ", "") .endswith(LONG_REPLY.replace(" ", "")[-30:])
    # The client was told what the server heard: the turn, why it ended, and
    # the backchannel it left alone.
    heard = [(type(e).__name__, getattr(e, "reason", getattr(e, "over_reply", None)))
             for e in events if isinstance(e, (p.UserSpeaking, p.UserStopped))]
    assert heard == [("UserSpeaking", False), ("UserStopped", "silence"),
                     ("UserSpeaking", True), ("UserStopped", "backchannel")]


async def test_the_same_conversation_with_the_models_own_detection_is_cut_twice():
    """What the server's turn-taking spares the user: with `auto`, the 3.1
    detector ends the turn in the pause, and "mm-hm" cuts the reply."""
    agent = Agent("booking", MODEL, turn_taking="server", turns=PATIENT)
    events: list = []
    async with running_emulator(Script(replies=[LONG_REPLY] * 3, speed=1)) as emu:
        async with running(agent, gemini_for(emu)) as (server, url):
            await conversation(url, events, turn_taking="auto")  # the session's choice wins
            [model] = emu.sessions
            detection_cpu = server.metrics.value("live_turn_taking_cpu_seconds_total", {"part": "voice_detection"})
    assert detection_cpu == 0  # no session asked the server to listen
    assert len(model.user_turns) >= 2
    assert any(isinstance(e, p.TurnInterrupted) for e in events)
    assert not any(isinstance(e, (p.UserSpeaking, p.UserStopped)) for e in events)


async def test_a_model_connection_lost_mid_turn_is_set_up_the_same_and_hears_the_turn_start():
    """The new connection also has the model's detection off, and hears
    activityStart before the rest of the user's turn (no 1007, no lost turn)."""
    agent = Agent("booking", MODEL, turn_taking="server", turns=PATIENT)
    script = Script(replies=["Noted."], speed=1, faults=[Fault("after_audio_chunks", n=10, code=1011)])
    events: list = []
    async with running_emulator(script) as emu:
        async with running(agent, gemini_for(emu)) as (server, url):
            async with LiveClient.connect(url) as client:
                async def read() -> None:
                    async for event in client.events():
                        events.append(event)
                        if isinstance(event, p.TurnComplete):
                            return

                async with anyio.create_task_group() as tg:
                    tg.start_soon(read)
                    with anyio.fail_after(30):
                        await talk(client, silence(0.4) + speak("Please send the invoice to my work email address.") + silence(6))
                    tg.cancel_scope.cancel()
            first, second = emu.sessions[:2]
    assert first.close is not None and first.close[0] == 1011
    assert detection_off(second.setup)
    assert second.close is None or second.close[0] != 1007
    assert len(second.user_turns) == 1 and second.model_turns == ["Noted."]
    starts = [f for f in second.frames if "activityStart" in str(f)]
    assert starts, "the new connection was never told the user's activity had started"
    assert any(isinstance(e, p.SessionResumed) for e in events)


async def test_the_client_cannot_mark_turns_the_server_takes():
    agent = Agent("booking", MODEL, turn_taking="server")
    async with running_emulator(Script(speed=1)) as emu:
        async with running(agent, gemini_for(emu)) as (server, url):
            async with LiveClient.connect(url) as client:
                await client.activity_start()
                async for event in client.events():
                    if isinstance(event, p.ErrorEvent):
                        break
    assert event.code == "activity_not_enabled" and '"server"' in event.message and not event.fatal


async def test_a_record_replays_to_the_same_turns(tmp_path):
    """The turn decisions are a function of the user's audio: a session's
    record (its in.wav) fed to a controller with no sockets gives the turns
    the live session took."""
    agent = Agent("booking", MODEL, turn_taking="server", turns=PATIENT)
    events: list = []
    async with running_emulator(Script(replies=["Sure."] * 3, speed=1)) as emu:
        async with running(agent, gemini_for(emu), recorder=Recorder(str(tmp_path))) as (server, url):
            async with LiveClient.connect(url) as client:
                async def read() -> None:
                    async for event in client.events():
                        events.append(event)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(read)
                    await talk(client, silence(0.4) + paused_sentence() + silence(3.0) + speak("Thank you.") + silence(3.0))
                    tg.cancel_scope.cancel()
    [folder] = [f for f in tmp_path.iterdir() if f.is_dir()]
    record = load(folder)
    live_reasons = [e["event"]["reason"] for e in record.of("server") if e["event"]["type"] == "user.stopped"]
    assert live_reasons == ["silence", "silence"]

    turns = TurnController(PATIENT, input_rate=16_000)
    model = Silero()
    audio = record.audio("in")
    replayed = []
    for offset in range(0, len(audio), 640):
        turns.audio(audio[offset : offset + 640])
        while (batch := next_batch([turns.stream], 16_000)) is not None:
            probabilities, state = model.run(16_000, batch.inputs, batch.state) if batch.streams else ([0.0], batch.state)
            batch.done(state)
            replayed += turns.scored(float(probabilities[0]), agent_speaking=False)
    assert [a.reason for a in replayed if isinstance(a, EndActivity)] == live_reasons
    assert sum(isinstance(a, StartActivity) for a in replayed) == 2


async def test_a_real_interruption_stops_the_reply_and_the_heard_transcript_says_how_far_it_played():
    """Sustained speech over the reply interrupts it within the bound (0.8 s of
    speech); the reply played on until then, and `heard` says so."""
    agent = Agent("booking", MODEL, turn_taking="server", turns=PATIENT)
    events: list = []
    async with running_emulator(Script(replies=[LONG_REPLY, "Tuesday it is."], speed=1)) as emu:
        async with running(agent, gemini_for(emu)) as (server, url):
            async with LiveClient.connect(url) as client:
                replying = anyio.Event()

                async def read() -> None:
                    async for event in client.events():
                        events.append((anyio.current_time(), event))
                        if isinstance(event, AudioFrame):
                            replying.set()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(read)
                    await talk(client, silence(0.4) + speak("Book the Monday flight please."))
                    async with anyio.create_task_group() as quiet:
                        quiet.start_soon(talk, client, silence(30))
                        with anyio.fail_after(10):
                            await replying.wait()
                        await anyio.sleep(1.5)
                        quiet.cancel_scope.cancel()
                    words = speak("Wait, stop, I meant Tuesday, not Monday.")
                    started = anyio.current_time()
                    await talk(client, words + silence(4.0))
                    tg.cancel_scope.cancel()
    interrupted = [t for t, e in events if isinstance(e, p.TurnInterrupted)]
    # While the user is still speaking (it needs 0.8 s of it), not after they stopped.
    assert len(interrupted) == 1 and interrupted[0] - started < len(words) / 32_000
    [heard] = [e for _, e in events if isinstance(e, p.TranscriptOutput) and e.heard]
    assert heard.text and LONG_REPLY.startswith(heard.text.strip()) and len(heard.text) < len(LONG_REPLY)
    assert heard.played > 1.5 + 0.5  # it played on while the server made sure it was an interruption
    speaking = [e for _, e in events if isinstance(e, p.UserSpeaking)]
    assert speaking[-1].over_reply
