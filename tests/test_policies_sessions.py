"""Conversation policies end to end: the Python client on `/live`, the server,
and the Live emulator as the model (google-genai over TLS), or `local/voice`.

What a user notices: the agent speaks first; a disclosure the user talks over
is still heard whole; a silent user is prompted, then let go; a session at its
limit wraps up and says goodbye; `end_session` closes only after the client
received every frame of the goodbye; a hold sound fills a slow tool's silence
and gives way to the model's first audio at once.
"""

from __future__ import annotations

import contextlib
import json
import time

import anyio
import numpy as np
import pytest

from audio_fixtures import noise, speak
from clients.client import AudioFrame, LiveClient
from connections.emulator import Script, running_emulator
from connections.emulator.synth import speak as emulator_speech
from emulated import gemini_for
from live import protocol as p
from live.access.auth import mint_token
from live.agent import Agent, Clip, HoldSound, MuteUser, Say, Silence, TimeLimit, end_session
from live.server.policies import THINKING
from serving import late_tail, replies, running

pytestmark = pytest.mark.anyio

FRAME_16K = 640  # 20 ms of PCM16 at 16 kHz
SILENCE = b"\0" * FRAME_16K
OUT_RATE = 2 * 24_000  # reply audio bytes a second


def voice(seconds: float) -> bytes:
    """`seconds` of a voice at 16 kHz (espeak-ng): speech to the server's voice
    detection, which a buzz or a tone is not."""
    words = speak("Hello, I would like to move my appointment to Thursday afternoon, please.")
    return words[: 2 * int(seconds * 16_000)].ljust(2 * int(seconds * 16_000), b"\0")


async def stream(client: LiveClient, pcm: bytes) -> None:
    """`pcm` as a microphone sends it: a 20 ms frame every 20 ms."""
    due = time.monotonic()
    for i in range(0, len(pcm), FRAME_16K):
        await client.send_audio(pcm[i : i + FRAME_16K].ljust(FRAME_16K, b"\0"))
        due += 0.02
        await anyio.sleep(max(0.0, due - time.monotonic()))


async def silence_until_closed(client: LiveClient) -> None:
    """The microphone of a user who says nothing: silent frames, 50 a second (as a phone line sends)."""
    with anyio.move_on_after(30):
        while client.closed_reason is None:
            try:
                await stream(client, SILENCE * 5)
            except Exception:
                return


async def timeline(client: LiveClient, *, timeout: float = 20.0) -> list[tuple[float, object]]:
    """Every event with its arrival time, up to `session.closed`."""
    seen: list[tuple[float, object]] = []
    with anyio.fail_after(timeout):
        async for event in client.events():
            seen.append((time.monotonic(), event))
    return seen


def said(events) -> list[str]:
    """What the agent said, a string per turn (with the late tail the service may send after it)."""
    return replies(events)


def emulator_frames(session, key: str) -> list:
    """The client messages of one kind the emulator received (camelCase or snake_case)."""
    snake = "".join("_" + c.lower() if c.isupper() else c for c in key)
    return [f.get(key) or f.get(snake) for f in session.frames if key in f or snake in f]


# ------------------------------------------------------------------ speak first


@pytest.mark.parametrize(("model", "channel"), [
    ("gemini-live-2.5-flash-preview", "clientContent"),  # 2.5: a typed turn is client content
    ("gemini-3.1-flash-live-preview", "realtimeInput"),  # 3.1 takes mid-session text only as realtime text
])
async def test_the_agent_speaks_first_on_each_model_familys_channel(model, channel):
    agent = Agent(name="desk", model=model, speak_first=Say("Hello, this is Ada at the clinic. How can I help?"))
    async with running_emulator(Script()) as emu, running(agent, gemini_for(emu, model)) as (_, url):
        async with LiveClient.connect(url) as client:
            events = []
            with anyio.fail_after(10):
                async for event in client.events():  # the user says nothing at all
                    events.append(event)
                    if isinstance(event, p.TurnComplete):
                        break
            events += await late_tail(client)
        [session] = emu.sessions
    assert said(events) == ["Hello, this is Ada at the clinic. How can I help?"]
    assert sum(len(e.data) for e in events if isinstance(e, AudioFrame)) > OUT_RATE  # spoken: seconds of it
    [sent] = emulator_frames(session, channel)
    assert "Hello, this is Ada at the clinic" in json.dumps(sent)
    assert session.model_turns == ["Hello, this is Ada at the clinic. How can I help?"]


async def test_a_conversation_that_goes_on_is_not_greeted_again():
    from google.genai import types

    agent = Agent(name="desk", model="gemini-live-2.5-flash-preview", speak_first="Hello!")
    history = [types.Content(role="user", parts=[types.Part(text="Hi")]),
               types.Content(role="model", parts=[types.Part(text="Hello! What can I do?")])]
    async with running_emulator(Script()) as emu, running(agent, gemini_for(emu)) as (_, url):
        async with LiveClient.connect(url, history=history) as client:
            with anyio.move_on_after(1.5):
                async for event in client.events():
                    assert not isinstance(event, AudioFrame), "the agent greeted a conversation that goes on"
        [session] = emu.sessions
    assert session.model_turns == []


# ------------------------------------------------------------------ must hear


DISCLOSURE = "This call may be recorded for quality and training purposes."


async def test_a_disclosure_spoken_over_by_the_user_is_still_heard_whole():
    agent = Agent(name="desk", model="gemini-live-2.5-flash-preview", must_hear=[DISCLOSURE],
                  speak_first="How can I help?")
    script = Script(user_says=["I need to move my appointment."])
    async with running_emulator(script) as emu, running(agent, gemini_for(emu), audio_lead=0.5) as (_, url):
        async with LiveClient.connect(url) as client:
            events: list = []
            async with anyio.create_task_group() as tg:
                # The user talks over the disclosure from its first second.
                async def talk() -> None:
                    await anyio.sleep(1.0)
                    await stream(client, voice(1.2) + SILENCE * 60)

                tg.start_soon(talk)
                with anyio.fail_after(20):
                    async for event in client.events():
                        events.append(event)
                        if len(said(events)) == 2:
                            break
                events += await late_tail(client)
        [session] = emu.sessions
    assert not [e for e in events if isinstance(e, p.TurnInterrupted)]  # nothing cut it
    disclosure_turn = events[: next(i for i, e in enumerate(events) if isinstance(e, p.TurnComplete))]
    heard = b"".join(e.data for e in disclosure_turn if isinstance(e, AudioFrame))
    assert heard == emulator_speech(DISCLOSURE)  # every sample of it, in order
    # The user's words reached the model after the disclosure, not over it, and were answered
    # (in place of the opening: the user spoke first).
    assert said(events) == [DISCLOSURE, "You said: I need to move my appointment."]
    assert session.user_turns[-1] == "I need to move my appointment."


async def test_a_must_hear_clip_is_played_by_the_server_whole_and_the_user_muted_meanwhile():
    t = np.arange(48_000) / 24_000
    clip = Clip((3000 * np.sin(2 * np.pi * 330 * t)).astype("<i2").tobytes(), text="This call is recorded.")
    agent = Agent(name="desk", model="gemini-live-2.5-flash-preview", must_hear=[Say(clip=clip)],
                  mute_user=MuteUser(during_tools=False))
    async with running_emulator(Script()) as emu, running(agent, gemini_for(emu), audio_lead=0.5) as (_, url):
        async with LiveClient.connect(url) as client:
            events: list = []
            async with anyio.create_task_group() as tg:
                tg.start_soon(stream, client, voice(1.0) + SILENCE * 30)
                with anyio.fail_after(10):
                    async for event in client.events():
                        events.append(event)
                        if isinstance(event, p.UserMuted) and not event.muted:
                            break
        [session] = emu.sessions
    assert events[0] == p.UserMuted(True, "must_hear")  # a page can show the microphone muted
    assert b"".join(e.data for e in events if isinstance(e, AudioFrame)) == clip.pcm
    assert said(events) == ["This call is recorded."] and p.TurnComplete() in events
    assert session.model_turns == [] and session.user_turns == []  # the model heard nothing of it, nor of the user


# ------------------------------------------------------------------ silence


async def test_a_silent_user_is_prompted_then_let_go_though_their_line_sends_50_frames_a_second():
    agent = Agent(name="desk", model="gemini-live-2.5-flash-preview",
                  silence=Silence(prompt_after=1.5, end_after=1.5))
    async with running_emulator(Script()) as emu, running(agent, gemini_for(emu), audio_lead=0.5) as (_, url):
        async with LiveClient.connect(url) as client:
            started = time.monotonic()
            async with anyio.create_task_group() as tg:
                tg.start_soon(silence_until_closed, client)
                seen = await timeline(client)
            code = await client.wait_closed()
    events = [e for _, e in seen]
    prompt_at = next(t for t, e in seen if isinstance(e, AudioFrame)) - started
    assert said(events) == ["Are you still there?", "I haven't heard from you, so I'll say goodbye for now. Goodbye!"]
    assert 1.4 <= prompt_at <= 2.5
    closed = events[-1]
    assert isinstance(closed, p.SessionClosed) and "said nothing for 3 seconds" in closed.reason and code == 1000
    goodbye = emulator_speech("I haven't heard from you, so I'll say goodbye for now. Goodbye!")
    assert b"".join(e.data for e in events if isinstance(e, AudioFrame)).endswith(goodbye)  # heard whole


@pytest.mark.parametrize("turn_taking", ["auto", "server"])
async def test_a_silent_user_on_a_noisy_line_is_prompted_all_the_same(turn_taking):
    """Hiss as loud as a voice (-30 dBFS, steady) is not speech: the user who
    says nothing over it is prompted, then let go. A level detector would take
    the hiss for a user who never stops talking. (With the server taking the
    turns, the policies hear its detector's scores.)"""
    agent = Agent(name="desk", model="gemini-live-2.5-flash-preview", turn_taking=turn_taking,
                  silence=Silence(prompt_after=1.5, end_after=1.5))
    hiss = noise(30.0, dbfs=-30.0)
    async with running_emulator(Script()) as emu, running(agent, gemini_for(emu), audio_lead=0.5) as (_, url):
        async with LiveClient.connect(url) as client:
            async def noisy_line() -> None:
                with anyio.move_on_after(30), contextlib.suppress(Exception):
                    await stream(client, hiss)

            async with anyio.create_task_group() as tg:
                tg.start_soon(noisy_line)
                seen = await timeline(client)
                tg.cancel_scope.cancel()
    events = [e for _, e in seen]
    assert said(events) == ["Are you still there?", "I haven't heard from you, so I'll say goodbye for now. Goodbye!"]
    closed = events[-1]
    assert isinstance(closed, p.SessionClosed) and "said nothing for 3 seconds" in closed.reason


async def test_a_push_to_talk_client_is_never_prompted_for_its_silence():
    agent = Agent(name="desk", model="gemini-live-2.5-flash-preview", silence=Silence(prompt_after=0.5, end_after=0.5))
    async with running_emulator(Script()) as emu, running(agent, gemini_for(emu)) as (_, url):
        async with LiveClient.connect(url, turn_taking="manual") as client:
            with anyio.move_on_after(2.5):
                async for event in client.events():
                    assert not isinstance(event, (AudioFrame, p.SessionClosed)), event


async def test_speech_starts_the_silence_over():
    agent = Agent(name="desk", model="gemini-live-2.5-flash-preview", silence=Silence(prompt_after=1.2, end_after=5))
    async with running_emulator(Script(user_says=["Hello."])) as emu, running(agent, gemini_for(emu)) as (_, url):
        async with LiveClient.connect(url) as client:
            events: list = []
            async with anyio.create_task_group() as tg:
                async def talk() -> None:
                    await stream(client, SILENCE * 40 + voice(0.8) + SILENCE * 200)

                tg.start_soon(talk)
                with anyio.fail_after(10):
                    async for event in client.events():
                        events.append(event)
                        if len(said(events)) == 2:
                            break
                events += await late_tail(client)
                tg.cancel_scope.cancel()
    # The user spoke at 0.8 s, before the prompt was due: their turn was answered, and only
    # 1.2 s after that answer did the prompt come.
    assert said(events) == ["You said: Hello.", "Are you still there?"]


# ------------------------------------------------------------------ time limit


async def test_a_session_at_its_limit_wraps_up_says_goodbye_and_ends_before_it():
    limit = TimeLimit(max_duration=10, wrap_up_before=8, wrap_up=Say("We have a couple of minutes left."),
                      goodbye_before=5, goodbye=Say("That is all the time we have. Goodbye!"))
    agent = Agent(name="desk", model="gemini-live-2.5-flash-preview", time_limit=limit)
    async with running_emulator(Script()) as emu, running(agent, gemini_for(emu), audio_lead=0.5) as (_, url):
        async with LiveClient.connect(url) as client:
            started = time.monotonic()
            async with anyio.create_task_group() as tg:
                tg.start_soon(silence_until_closed, client)
                seen = await timeline(client)
    events = [e for _, e in seen]
    assert said(events) == ["We have a couple of minutes left.", "That is all the time we have. Goodbye!"]
    closed_at = seen[-1][0] - started
    assert isinstance(events[-1], p.SessionClosed) and "time limit" in events[-1].reason
    assert 5.0 < closed_at < 10.0  # the goodbye was heard, and the session ended before its limit
    assert not [e for e in events if isinstance(e, p.ErrorEvent)]  # ended with a word, not cut off
    audio = b"".join(e.data for e in events if isinstance(e, AudioFrame))
    assert audio.endswith(emulator_speech("That is all the time we have. Goodbye!"))


async def test_a_tokens_max_duration_gets_the_agents_wrap_up_and_goodbye():
    secret = "s" * 32
    limit = TimeLimit(wrap_up_before=4, wrap_up=Say("Four seconds left."), goodbye_before=2.5, goodbye=Say("Bye now!"))
    agent = Agent(name="desk", model="gemini-live-2.5-flash-preview", time_limit=limit)
    async with running_emulator(Script()) as emu, running(agent, gemini_for(emu), token_secret=secret) as (_, url):
        async with LiveClient.connect(url, token=mint_token(secret, max_duration=6.0)) as client:
            async with anyio.create_task_group() as tg:
                tg.start_soon(silence_until_closed, client)
                seen = await timeline(client)
    events = [e for _, e in seen]
    assert said(events) == ["Four seconds left.", "Bye now!"]
    assert "time limit" in events[-1].reason


# ------------------------------------------------------------------ ending well


GOODBYE = "Thank you for calling, and have a lovely day. Goodbye!"


def goodbye_after_the_tool(ctx) -> str:
    return GOODBYE if ctx.tool_results else "One moment."


async def test_end_session_closes_only_after_the_client_received_every_frame_of_the_goodbye():
    agent = Agent(name="desk", model="gemini-live-2.5-flash-preview", tools=[end_session])
    script = Script(replies=goodbye_after_the_tool)
    async with running_emulator(script) as emu, running(agent, gemini_for(emu), audio_lead=0.5) as (_, url):
        async with LiveClient.connect(url) as client:
            await client.send_text("Thanks, that's all: end_session please.")
            seen = await timeline(client)
            code = await client.wait_closed()
        [session] = emu.sessions
    events = [e for _, e in seen]
    assert [c["name"] for c in session.tool_calls] == ["end_session"]
    call_at = next(i for i, e in enumerate(events) if isinstance(e, p.ToolCallEvent))
    audio = b"".join(e.data for e in events[call_at:] if isinstance(e, AudioFrame))
    assert audio == emulator_speech(GOODBYE)  # every frame of the goodbye came before the close
    assert isinstance(events[-1], p.SessionClosed) and events[-1].reason == "the agent ended the conversation"
    assert code == 1000
    # ...and the close waited for it to play: not before the last frame's audio could have played.
    last_audio = max(t for t, e in seen if isinstance(e, AudioFrame))
    first_goodbye = min(t for t, e in seen[call_at:] if isinstance(e, AudioFrame))
    assert seen[-1][0] - first_goodbye >= len(audio) / OUT_RATE - 0.1
    assert seen[-1][0] >= last_audio


# ------------------------------------------------------------------ hold sound


async def test_a_thinking_sound_fills_a_slow_tool_and_gives_way_to_the_models_first_audio():
    async def look_up_order(order: str) -> dict:
        """Look an order up (slow)."""
        await anyio.sleep(1.5)
        return {"order": order, "status": "shipped"}

    agent = Agent(name="desk", model="gemini-live-2.5-flash-preview", tools=[look_up_order],
                  hold_sound=HoldSound(after=0.4))
    script = Script(tool_args={"look_up_order": {"order": "A17"}}, replies=lambda ctx: "Your order has shipped." if ctx.tool_results else "Sure.")
    async with running_emulator(script) as emu, running(agent, gemini_for(emu), audio_lead=0.5) as (_, url):
        async with LiveClient.connect(url) as client:
            await client.send_text("Where is my order? look_up_order")
            seen: list[tuple[float, object]] = []
            with anyio.fail_after(15):
                async for event in client.events():
                    seen.append((time.monotonic(), event))
                    if isinstance(event, p.TurnComplete):
                        break
    call_at = next(t for t, e in seen if isinstance(e, p.ToolCallEvent))
    frames = [(t, e.data) for t, e in seen if isinstance(e, AudioFrame)]
    stream_bytes = b"".join(data for _, data in frames)
    # The hold sound is the stream's beginning, the built-in loop, 20 ms pieces.
    loop = THINKING.pcm * 4
    hold = 0
    while hold + 960 <= len(stream_bytes) and stream_bytes[hold : hold + 960] == loop[hold : hold + 960]:
        hold += 960
    assert hold >= 960 * 40  # about a second of it: the tool ran 1.5 s, the sound began at 0.4 s
    assert stream_bytes[hold:] == emulator_speech("Your order has shipped.")
    # It began within the threshold of the call (plus one 20 ms piece and a timer's slack).
    assert 0.35 <= frames[0][0] - call_at <= 0.4 + 0.1
    # The model's first audio: when did it arrive, and when did it play? Played in order,
    # each frame at its arrival or when the one before it ended.
    playing = 0.0
    offset = 0
    for arrived, data in frames:
        start = max(arrived, playing)
        if offset <= hold < offset + len(data):
            model_plays_at = start + (hold - offset) / OUT_RATE
            model_arrived = arrived
            break
        playing = start + len(data) / OUT_RATE
        offset += len(data)
    print(f"hold sound began {frames[0][0] - call_at:.3f} s after the call; the model's first audio played {model_plays_at - model_arrived:.3f} s after it arrived")
    assert model_plays_at - model_arrived <= 0.1  # the hold sound gave way within 100 ms


# ------------------------------------------------------------------ local/voice


async def test_local_voice_greets_prompts_a_silent_user_and_lets_them_go():
    pytest.importorskip("pocketsphinx")
    from connections.local_voice import LocalVoice

    agent = Agent(name="desk", model="local/voice", speak_first="Hello, how can I help you today?",
                  silence=Silence(prompt_after=1.5, prompt=Say("Are you still there?"), end_after=1.5,
                                  goodbye=Say("Goodbye for now.")))
    async with running(agent, LocalVoice(), audio_lead=0.5) as (_, url):
        async with LiveClient.connect(url) as client:
            async with anyio.create_task_group() as tg:
                tg.start_soon(silence_until_closed, client)
                seen = await timeline(client, timeout=60)
    events = [e for _, e in seen]
    # Spoken by eSpeak NG, each line whole: the model said what it was told, word for word.
    assert said(events) == ["Hello, how can I help you today?", "Are you still there?", "Goodbye for now."]
    assert sum(len(e.data) for e in events if isinstance(e, AudioFrame)) > 3 * OUT_RATE
    assert "said nothing" in events[-1].reason
