"""Conversation policies on a phone call: the carrier double calls the server as
Twilio does (its side written from Twilio's Media Streams documentation), the
Live emulator answers. The caller-silence timeout, the maximum call length and
the hang-up after the goodbye are the same policies as on `/live`.

Twilio, "Media Streams - WebSocket Messages": a `mark` message sent after media
"is returned by Twilio when the media before it has been played"; the REST API's
`calls(sid).update(twiml="<Response><Hangup/></Response>")` ends the call.
"""

from __future__ import annotations

import json
import shutil
import time

import anyio
import numpy as np
import pytest

from connections.emulator import Script, running_emulator
from connections.emulator.synth import speak as emulator_speech
from emulated import gemini_for
from live.agent import Agent, HoldSound, Say, Silence, TimeLimit
from live.phone.audio import ulaw_decode
from live.phone.control import end_call
from phone_serving import running_phone, spoken_ulaw, synthetic_ulaw

pytestmark = pytest.mark.anyio

MODEL = "gemini-live-2.5-flash-preview"
DISCLOSURE = "This call may be recorded for quality and training purposes."


@pytest.fixture
def question(tmp_path) -> bytes:
    if shutil.which("espeak-ng") and shutil.which("sox"):
        return spoken_ulaw("Hello? Is anybody there? I would like to book a table.", tmp_path)
    return synthetic_ulaw(3.0)


def with_call_control(phone) -> list[tuple[int, int]]:
    """The server's call control (`running_phone(..., control="double")`) reaches
    the double's REST API; returns a list that gets, at each REST request,
    (bytes the handset played, bytes it received)."""
    at_request: list[tuple[int, int]] = []
    rest = phone.double.rest
    handle = rest.request

    def request(method, uri, *args, **kwargs):
        for call in phone.double.calls.values():
            at_request.append((len(call.played()), len(call.received())))
        return handle(method, uri, *args, **kwargs)

    rest.request = request
    return at_request


async def until_hung_up(call, timeout: float = 20.0) -> None:
    with anyio.fail_after(timeout):
        while call.closed is None:
            await anyio.sleep(0.05)


def seconds_of(ulaw: bytes) -> float:
    return len(ulaw) / 8000


async def test_the_agent_greets_a_caller_who_says_nothing():
    agent = Agent(name="desk", model=MODEL, speak_first=Say("Thanks for calling Ada's clinic. How can I help?"))
    async with running_emulator(Script()) as emu, running_phone(agent, gemini_for(emu)) as phone:
        async with phone.call() as call:
            await call.wait_quiet(0.6, timeout=15)
        [session] = emu.sessions
    assert session.model_turns == ["Thanks for calling Ada's clinic. How can I help?"]
    greeting = emulator_speech("Thanks for calling Ada's clinic. How can I help?")
    assert abs(seconds_of(call.played()) - len(greeting) / 48_000) < 0.05  # the caller heard all of it


async def test_a_disclosure_the_caller_talks_over_is_played_to_them_whole(question):
    agent = Agent(name="desk", model=MODEL, must_hear=[DISCLOSURE])
    script = Script(user_says=["I would like to book a table."])
    async with running_emulator(script) as emu, running_phone(agent, gemini_for(emu)) as phone:
        async with phone.call() as call:
            await call.wait_for_audio(timeout=10)
            await call.speak(question, silence_after=0.3)  # over the disclosure
            [session] = emu.sessions
            with anyio.fail_after(20):
                while len(session.model_turns) < 2:  # the disclosure, then the answer to what was held
                    await anyio.sleep(0.1)
            await call.wait_quiet(1.0, timeout=20)
    assert not call.heard.clears  # nothing was cut: no barge-in reached the model while it spoke
    assert session.model_turns == [DISCLOSURE, "You said: I would like to book a table."]
    disclosure = len(emulator_speech(DISCLOSURE)) / 48_000
    reply = len(emulator_speech("You said: I would like to book a table.")) / 48_000
    played = seconds_of(call.played())
    assert abs(played - (disclosure + reply)) < 0.1  # both whole, one after the other


async def test_a_silent_caller_is_prompted_then_hung_up_on_after_the_goodbye_played():
    agent = Agent(name="desk", model=MODEL, silence=Silence(prompt_after=1.5, end_after=1.5))
    async with running_emulator(Script()) as emu, running_phone(agent, gemini_for(emu), control="double") as phone:
        at_request = with_call_control(phone)
        async with phone.call() as call:  # the line sends 50 frames of silence a second
            await until_hung_up(call)
        [session] = emu.sessions
    goodbye = "I haven't heard from you, so I'll say goodbye for now. Goodbye!"
    assert session.model_turns == ["Are you still there?", goodbye]
    assert "<Hangup />" in (call.new_twiml or "")
    [(played, received)] = at_request
    # Hung up only once the handset had played every frame it received: the goodbye whole.
    assert played == received
    expected = len(emulator_speech("Are you still there?") + emulator_speech(goodbye)) / 48_000
    assert abs(seconds_of(call.played()) - expected) < 0.1


async def test_end_call_hangs_up_after_the_goodbye_has_played(question):
    farewell = "You're welcome. Goodbye, and have a lovely evening!"
    agent = Agent(name="desk", model=MODEL, tools=[end_call])
    script = Script(user_says=["thanks, that is all, end_call"],
                    replies=lambda ctx: farewell if ctx.tool_results else "Sure.")
    async with running_emulator(script) as emu, running_phone(agent, gemini_for(emu), control="double") as phone:
        at_request = with_call_control(phone)
        async with phone.call() as call:
            await call.speak(question, silence_after=0.2)
            await until_hung_up(call)
        [session] = emu.sessions
    assert [c["name"] for c in session.tool_calls] == ["end_call"]
    assert session.model_turns[-1] == farewell
    [(played, received)] = at_request
    assert played == received  # not while the goodbye was still queued at the carrier
    assert seconds_of(call.played()) >= len(emulator_speech(farewell)) / 48_000 - 0.05
    # The mark after the goodbye's last frame came back before the hang-up.
    last_mark = [m["mark"]["name"] for m in call.heard.frames if m["event"] == "mark"][-1]
    assert last_mark.startswith("end:") and last_mark in call.heard.marks_echoed


async def test_a_call_at_its_maximum_length_wraps_up_says_goodbye_and_is_hung_up():
    limit = TimeLimit(max_duration=9, wrap_up_before=7, wrap_up=Say("We are nearly out of time."),
                      goodbye_before=4.5, goodbye=Say("Our time is up. Goodbye!"))
    agent = Agent(name="desk", model=MODEL, time_limit=limit)
    async with running_emulator(Script()) as emu, running_phone(agent, gemini_for(emu), control="double") as phone:
        at_request = with_call_control(phone)
        async with phone.call() as call:
            await until_hung_up(call)
        [session] = emu.sessions
    assert session.model_turns == ["We are nearly out of time.", "Our time is up. Goodbye!"]
    [(played, received)] = at_request
    assert played == received
    assert call.now() < 9.5  # within the call's maximum length
    sent = json.dumps(call.heard.frames)
    assert '"clear"' not in sent
    assert ulaw_decode(call.played())  # the caller heard it, decoded as μ-law


async def test_a_slow_tool_fills_the_line_with_the_hold_sound_which_gives_way_to_the_reply(question):
    """A caller waiting on a slow tool hears the hold sound, not a dead line; the
    reply is not queued behind it at the carrier (Twilio plays media "in the order
    received", so whatever was sent ahead of the reply plays first)."""
    ran: list[float] = []

    async def look_up_order(order: str) -> dict:
        """Look an order up (slow)."""
        ran.append(time.monotonic())
        await anyio.sleep(1.5)
        ran.append(time.monotonic())
        return {"order": order, "status": "shipped"}

    reply = "Your order has shipped."
    agent = Agent(name="desk", model=MODEL, tools=[look_up_order], hold_sound=HoldSound(after=0.4))
    script = Script(user_says=["where is my order, look_up_order"], tool_args={"look_up_order": {"order": "A17"}},
                    replies=lambda ctx: reply)
    async with running_emulator(script) as emu, running_phone(agent, gemini_for(emu)) as phone:
        async with phone.call() as call:
            await call.speak(question, silence_after=0.2)
            [session] = emu.sessions
            with anyio.fail_after(20):
                while reply not in session.model_turns:
                    await anyio.sleep(0.05)
            await call.wait_quiet(0.8, timeout=20)
    started, ended = (at - call.started for at in ran)
    media = call.heard.media
    answer = len(emulator_speech(reply)) // 6  # 24 kHz PCM16 -> 8 kHz μ-law: a sixth of the bytes
    received = call.received()
    hold = len(received) - answer
    # Before the answer, a second or more of sound: the tool ran 1.5 s, the sound
    # began 0.4 s into it and lasted until the model spoke.
    assert 8000 * 0.9 <= hold <= 8000 * 3.0, hold / 8000
    held = ulaw_decode(received[:hold])
    level = float(np.sqrt(np.mean(np.frombuffer(held, "<i2").astype(np.float64) ** 2)))
    assert level > 100  # audible, not the line's silence
    # It began at the threshold (plus a 20 ms piece and a timer's slack), not before.
    assert started + 0.35 <= media[0][0] <= started + 0.4 + 0.15, (media[0][0], started)
    during = [at for at, _ in media if started + 0.4 <= at <= ended]
    assert len(during) >= 40  # frames reached the caller while the tool ran: the line was not dead
    # When did the answer's first frame arrive, and when did the handset play it? Played in
    # order, each 20 ms frame at its arrival or when the one before it ended.
    playing, offset = 0.0, 0
    for arrived, frame in media:
        start = max(arrived, playing)
        if offset >= hold:
            assert start - arrived <= 0.1  # the hold sound gave way within 100 ms
            break
        playing = start + len(frame) / 8000
        offset += len(frame)
    else:
        raise AssertionError("the answer never reached the caller")
    assert not call.heard.clears  # nothing of the reply was cut
