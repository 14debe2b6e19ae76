"""The conversation policies as a state machine: what follows each thing that
happens in a session, without a socket or a clock (`live.engine.policies`)."""

from __future__ import annotations

import numpy as np
import pytest

from live.agent import Clip, HoldSound, MuteUser, Say, Silence, TimeLimit
from live.engine.actions import EndSession, PlayClip, Prompt, ThinkingSound, UserInput, WatchPlayback
from live.engine.policies import ConversationPolicies, PolicyPlan
from live.engine.voice import EnergyDetector, ScoredSpeech


class Run:
    """One session's policies, driven by a test: its clock moves only when told."""

    def __init__(self, plan: PolicyPlan, now: float = 0.0) -> None:
        self.now = now
        self.policies = ConversationPolicies(plan, now=now)
        self.log: list = []

    def __call__(self, actions: list) -> list:
        self.log.extend(actions)
        return actions

    def wait(self, seconds: float) -> list:
        """Let `seconds` pass, ticking at each deadline on the way, as the timer does."""
        end = self.now + seconds
        out: list = []
        while True:
            deadline = self.policies.next_deadline
            if deadline is None or deadline > end:
                break
            self.now = max(self.now, deadline)
            out += self(self.policies.tick(self.now))
        self.now = end
        return out

    def reply(self, seconds: float = 1.0) -> list:
        """The agent answers: speaks for `seconds`, then its audio has played."""
        p = self.policies
        out = self(p.agent(self.now, speaking=True, owed=False, plays_until=self.now))
        self.now += seconds
        out += self(p.agent(self.now, speaking=False, owed=False, plays_until=self.now))
        return out


def prompts(actions: list) -> list[str]:
    return [a.text for a in actions if isinstance(a, Prompt)]


def test_the_agent_speaks_first_once_and_not_in_a_conversation_that_goes_on():
    run = Run(PolicyPlan(speak_first=Say("Hello, this is Ada.")))
    [prompt] = prompts(run(run.policies.start(0.0)))
    assert '"Hello, this is Ada."' in prompt and "Not said by the user" in prompt
    run.reply()
    assert not prompts(run.wait(60))  # said once
    again = Run(PolicyPlan(speak_first=Say("Hello."), opened=True))
    assert again(again.policies.start(0.0)) == []


def test_must_hear_segments_play_whole_with_the_user_held_then_the_opening():
    clip = Clip(b"\x01\x00" * 24_000, "This call is recorded.")
    plan = PolicyPlan(must_hear=(Say(clip=clip), Say("Calls are kept for 30 days.")), speak_first=Say(instruction="Greet them."))
    run = Run(plan)
    first = run(run.policies.start(0.0))
    assert first[:3] == [PlayClip(clip), WatchPlayback(1), UserInput("held", "must_hear")]
    then = run(run.policies.played_out(1.0, 1))
    assert prompts(then) == ['[Not said by the user: Before anything else, the user must hear this in full. '
                             'Say exactly these words, and nothing else: "Calls are kept for 30 days."]']
    assert UserInput("open") not in then  # held till the second segment has played too
    run.now = 1.0
    assert run.reply(2.0) == [WatchPlayback(2)]
    opening = run(run.policies.played_out(3.0, 2))
    assert UserInput("open") in opening and prompts(opening) == ["[Not said by the user: The conversation begins now; "
                                                                 "the user has not spoken yet. Greet them.]"]


def test_a_user_who_speaks_over_a_segment_is_answered_in_place_of_the_opening():
    clip = Clip(b"\x01\x00" * 24_000)
    run = Run(PolicyPlan(must_hear=(Say(clip=clip),), speak_first=Say("Hello.")))
    p = run.policies
    run(p.start(0.0))
    # The user talks over it: the segment goes on (nothing new happens)...
    assert run(p.user_started(0.3)) == [] and run(p.user_stopped(0.6)) == []
    # ...and once it has played, their words go to the model: its reply comes before anything else.
    assert run(p.played_out(1.0, 1)) == [UserInput("open")]
    run.now = 1.0
    assert run.wait(2.9) == []
    assert run.reply(1.0) == []
    assert not prompts(run.wait(60))  # the opening was not said: the user opened


def test_nothing_is_said_over_the_agent_or_a_reply_it_owes():
    run = Run(PolicyPlan())
    run(run.policies.start(0.0))
    run(run.policies.agent(0.0, speaking=True, owed=False, plays_until=0.0))
    assert prompts(run(run.policies.must_hear(0.1, Say("Terms apply.")))) == []
    # The reply ended, but its audio plays till 2.0: still nothing.
    assert prompts(run(run.policies.agent(1.0, speaking=False, owed=False, plays_until=2.0))) == []
    run.now = 1.0
    [prompt] = prompts(run.wait(1.5))
    assert '"Terms apply."' in prompt and run.now >= 2.0


def test_listening_windows_mute_the_user_during_tools_and_must_hear_segments():
    run = Run(PolicyPlan(mute=MuteUser()))
    run(run.policies.start(0.0))
    assert run(run.policies.tools(1.0, running=True)) == [UserInput("muted", "tool")]
    assert run(run.policies.tools(2.0, running=False)) == [UserInput("open")]
    clip = Clip(b"\x00\x01" * 2400)
    assert UserInput("muted", "must_hear") in run(run.policies.must_hear(3.0, Say(clip=clip)))
    only_held = Run(PolicyPlan(mute=MuteUser(during_must_hear=False)))
    assert UserInput("held", "must_hear") in only_held(only_held.policies.must_hear(0.0, Say(clip=clip)))


def test_a_silent_user_is_prompted_then_let_go_and_speech_starts_the_count_over():
    run = Run(PolicyPlan(silence=Silence(prompt_after=10, end_after=5)))
    run(run.policies.start(0.0))
    assert run.wait(9.9) == []
    run(run.policies.user_started(9.9))  # speech just in time
    run(run.policies.user_stopped(11.0))
    run.now = 11.0
    assert run.wait(9.9) == []
    [prompt] = prompts(run.wait(0.2))
    assert "said nothing for 10 seconds" in prompt and '"Are you still there?"' in prompt
    assert run.reply(1.5) == []  # the prompt said; 5 s more from when it played
    assert run.wait(4.9) == []
    goodbye = run.wait(0.2)
    assert UserInput("held", "ending") in goodbye and "I haven't heard from you" in prompts(goodbye)[0]
    assert run.reply(2.0) == [WatchPlayback(1)]
    assert run(run.policies.played_out(run.now, 1)) == [EndSession("the user said nothing for 15 seconds (ended with a goodbye)")]


def test_silence_is_not_counted_while_a_tool_runs_or_the_agent_talks():
    run = Run(PolicyPlan(silence=Silence(prompt_after=5, end_after=5)))
    run(run.policies.start(0.0))
    run(run.policies.tools(1.0, running=True))
    assert run.wait(30) == []
    run(run.policies.tools(31.0, running=False))
    run.reply(10.0)
    assert run.wait(4.9) == []
    assert prompts(run.wait(0.2))


def test_a_session_at_its_limit_wraps_up_then_says_goodbye_and_ends_once_it_was_heard():
    limit = TimeLimit(max_duration=300, wrap_up_before=60, goodbye_before=15)
    run = Run(PolicyPlan(time_limit=limit, ends_at=300.0))
    run(run.policies.start(0.0))
    assert run.wait(239.9) == []
    [wrap] = prompts(run.wait(0.2))
    assert "About 60 seconds of this conversation remain" in wrap and "start wrapping up" in wrap
    run.reply(3.0)
    assert run.wait(40) == []
    goodbye = run.wait(20)
    assert '"We\'re out of time for today. Thank you, and goodbye!"' in prompts(goodbye)[0]
    assert UserInput("held", "ending") in goodbye
    assert run.reply(2.0) == [WatchPlayback(1)]
    assert run(run.policies.played_out(run.now, 1)) == [EndSession("the session reached its time limit (ended with a goodbye)")]


def test_a_short_limit_gets_no_wrap_up_and_a_tiny_one_no_goodbye():
    run = Run(PolicyPlan(time_limit=TimeLimit(), ends_at=30.0))
    run(run.policies.start(0.0))
    said = run.wait(30)
    assert len(prompts(said)) == 1 and "time is up" in prompts(said)[0]
    tiny = Run(PolicyPlan(time_limit=TimeLimit(), ends_at=2.0))
    assert tiny(tiny.policies.start(0.0)) == [] and tiny.wait(5) == []


def test_end_waits_for_the_tool_and_the_reply_to_its_result_then_for_playback():
    run = Run(PolicyPlan())
    p = run.policies
    run(p.tools(0.0, running=True))  # end_session is the running call
    assert run(p.end(0.1, "the agent ended the conversation")) == [UserInput("held", "ending")]
    # It returned: its result owes a reply (the session tells both at once, the reply owed first).
    assert run(p.agent(0.2, speaking=False, owed=True, plays_until=0.2)) == []
    assert run(p.tools(0.2, running=False)) == []
    run.now = 0.5
    assert run.reply(1.0) == [WatchPlayback(1)]
    assert run(p.played_out(2.0, 1)) == [EndSession("the agent ended the conversation")]


def test_end_without_a_reply_to_its_result_waits_only_so_long():
    run = Run(PolicyPlan())
    p = run.policies
    run(p.agent(0.0, speaking=False, owed=True, plays_until=0.0))
    run(p.end(0.0, "bye"))
    assert run.wait(2.9) == []
    assert run.wait(0.2) == [WatchPlayback(1)]
    run(p.agent(3.5, speaking=True, owed=False, plays_until=3.5))  # a stray reply is waited for
    assert run(p.played_out(3.6, 1)) == []
    run.now = 3.6
    # ...but never past END_PATIENCE.
    assert EndSession("bye") in run.wait(30)


def test_the_hold_sound_starts_after_a_slow_tool_and_stops_when_the_agent_speaks():
    run = Run(PolicyPlan(hold=HoldSound(after=0.5)))
    p = run.policies
    run(p.start(0.0))
    run(p.tools(1.0, running=True))
    run.now = 1.0
    assert run.wait(0.49) == []
    assert run.wait(0.02) == [ThinkingSound(True)]
    assert run(p.agent(3.0, speaking=False, owed=True, plays_until=3.0)) == []  # the result: on till the answer begins
    assert run(p.tools(3.0, running=False)) == []
    assert run(p.agent(3.4, speaking=True, owed=False, plays_until=3.4)) == [ThinkingSound(False)]
    # A quick tool: none.
    run(p.agent(4.0, speaking=False, owed=False, plays_until=4.0))
    run(p.tools(5.0, running=True))
    assert run(p.tools(5.3, running=False)) == []


def test_the_energy_detector_hears_speech_by_level_with_attack_and_hangover():
    rate = 16_000
    detector = EnergyDetector(rate)
    t = np.arange(rate // 50) / rate
    loud = (3000 * np.sin(2 * np.pi * 200 * t)).astype("<i2").tobytes()  # about -21 dBFS
    hiss = (np.random.default_rng(1).normal(0, 60, rate // 50)).astype("<i2").tobytes()  # about -55 dBFS
    assert [detector.feed(hiss) for _ in range(100)] == [None] * 100  # a phone line's silence: 50 frames a second
    assert [detector.feed(loud) for _ in range(5)] == [None, None, None, None, True]  # 100 ms of speech
    assert [detector.feed(hiss) for _ in range(24)] == [None] * 24  # a pause between words
    assert detector.feed(hiss) is False  # 500 ms of quiet
    assert [detector.feed(loud) for _ in range(2)] + [detector.feed(hiss)] == [None, None, None]  # a click is not speech
    big = EnergyDetector(rate)
    assert big.feed(loud * 10) is True and big.feed(loud[:100]) is None  # frames of any size


@pytest.mark.parametrize("bad", [dict(), dict(text="a", clip=Clip(b"\0\0"))])
def test_a_say_takes_exactly_one_thing_to_say(bad):
    with pytest.raises(ValueError, match="one of text, instruction or clip"):
        Say(**bad)


def test_scored_speech_needs_a_tenth_of_a_second_of_speech_and_half_a_second_of_quiet():
    detector = ScoredSpeech(0.032)  # Silero's 32 ms windows
    # A single loud window (a click the model half believes) is not speech.
    assert [detector.scored(p) for p in (0.9, 0.1, 0.9, 0.2)] == [None] * 4
    # Four windows in a row (128 ms >= 100 ms) are.
    assert [detector.scored(0.8) for _ in range(4)] == [None, None, None, True]
    # Between words the score dips, not below threshold - 0.15: still speech.
    assert [detector.scored(p) for p in (0.4, 0.36, 0.7)] == [None, None, None]
    # Quiet for 16 windows (512 ms >= 500 ms) ends it; not one window sooner.
    assert [detector.scored(0.05) for _ in range(15)] == [None] * 15
    assert detector.scored(0.05) is False and not detector.speaking
