"""Conversation policies as a state machine (no I/O): the parts of a conversation
the Live API leaves to the application.

`ConversationPolicies` is fed what happens in a session: the agent's state (a
reply in progress, a reply owed, when its audio will have played), tool calls
running, the user starting and stopping speaking (`live.engine.voice`), the
client having played what it was sent, a tool asking to end or to play a
segment, and time. It answers with `PolicyAction`s (`live.engine.actions`),
which `live.server.policies` carries out. What it decides:

- **Utterances.** What the agent says for a policy (`live.agent.Say`) is an
  utterance; one plays at a time, in order, when the agent is idle (no reply
  in progress or owed, its last audio played). Words go to the model as a
  typed turn marked as not said by the user (`Prompt`); a recording is played
  by the server (`PlayClip`), even while a tool runs. A must-hear utterance
  keeps the user's voice from the model (`UserInput("held")`: it interrupts
  nothing, and reaches the model after) until the client has played all of
  it (`WatchPlayback`, then `played_out`).
- **Speak first, must-hear.** At the start of a conversation (not one that
  goes on: a reattach, a takeover, a client's history), the must-hear
  segments, then the opening. A user who speaks before the opening began
  (over a must-hear segment, say) is answered instead: the opening is
  dropped, and what they said while held reaches the model, whose reply is
  waited for before anything else is said.
- **Listening windows.** `UserInput("muted")` while a tool runs or a must-hear
  segment plays, when the agent asks (`MuteUser`).
- **Silence.** Counted from the later of the user's last speech and the agent
  falling idle, never while a tool runs or anything is said: a prompt after
  `prompt_after`, then a goodbye after `end_after` and the end. Any speech from
  the user starts over.
- **Time limit.** A wrap-up instruction before the end, then a goodbye and the
  end once it was heard (the server's hard limit ends it anyway at the end).
- **Ending well.** A goodbye utterance, or `end` (the `end_session` tool):
  the user's voice is held, the agent finishes what it says (the reply to
  the tool's result too), the client plays it all, then `EndSession`.
- **Hold sound.** `ThinkingSound(True)` once a tool has run `after` seconds
  with the agent silent, off when the agent speaks (the server also stops it
  itself at the first audio, before this machine hears of it).
"""

from __future__ import annotations

import collections
import dataclasses

from live.agent import HoldSound, MuteUser, Say, Silence, TimeLimit
from live.engine.actions import (
    EndSession,
    PlayClip,
    PolicyAction,
    Prompt,
    ThinkingSound,
    UserInput,
    WatchPlayback,
)

__all__ = ["ConversationPolicies", "PolicyPlan", "prompt_text"]

# A reply owed for longer than this is not waited for by a policy (the model
# answered nothing, e.g. to a silent tool result; a stall is the supervisor's).
OWED_PATIENCE = 3.0
# A prompt the model has not begun to answer within this long is given up.
ANSWER_TIMEOUT = 15.0
# The longest an end waits for the agent to fall silent and be heard.
END_PATIENCE = 20.0

NOT_THE_USER = "Not said by the user:"


def prompt_text(say: Say, situation: str) -> str:
    """What the model is told to make it say `say` (words or an instruction)."""
    if say.text is not None:
        return f'[{NOT_THE_USER} {situation} Say exactly these words, and nothing else: "{say.text}"]'
    return f"[{NOT_THE_USER} {situation} {say.instruction}]"


@dataclasses.dataclass(frozen=True)
class PolicyPlan:
    """The policies one session runs: the agent's, as its door and client allow.

    `silence` is None for a push-to-talk client; `time_limit` is the agent's,
    or `TimeLimit()` for a token's limit alone; `ends_at` is the session's
    end on the session's clock (None: no limit); `opened`: the conversation
    already began (a session taken over, or one with history): no opening.
    """

    speak_first: Say | None = None
    must_hear: tuple[Say, ...] = ()
    mute: MuteUser | None = None
    silence: Silence | None = None
    time_limit: TimeLimit | None = None
    hold: HoldSound | None = None
    ends_at: float | None = None
    opened: bool = False

    @property
    def any(self) -> bool:
        """Whether any policy runs (else the machine waits for a tool to ask)."""
        return bool(
            self.speak_first or self.must_hear or self.mute or self.silence or self.hold
            or (self.time_limit is not None and self.ends_at is not None)
        )


@dataclasses.dataclass
class _Utterance:
    say: Say
    situation: str
    kind: str
    must_hear: bool = False
    then_end: str | None = None  # the session ends, for this reason, once it was heard
    step: str = "waiting"  # waiting -> asked -> speaking -> playing -> (done)
    since: float = 0.0


class ConversationPolicies:
    """The policies of one session (see the module's docstring). Every input
    returns the actions that follow; `next_deadline` is when to `tick` next."""

    def __init__(self, plan: PolicyPlan, *, now: float) -> None:
        self.plan = plan
        self.started_at = now
        self.active = plan.any  # the agent's state is needed (the driver feeds it)
        self._queue: collections.deque[_Utterance] = collections.deque()
        self._current: _Utterance | None = None
        # The agent
        self._speaking = False
        self._owed_since: float | None = None
        self._plays_until = now
        self._quiet_since = now  # when the agent last fell idle (its audio played)
        self._tools_since: float | None = None
        # The user
        self._user_speaking = False
        self._heard_at = now  # when the user last started or stopped speaking
        self._spoke_held = False  # the user spoke while held: their words reach the model after
        self._user_turn_since: float | None = None  # ...from then: the model owes them a reply
        # Silence: 0 nothing said yet, 1 prompted
        self._silence_stage = 0
        # Time limit
        self._wrap_up_at: float | None = None
        self._goodbye_at: float | None = None
        if plan.time_limit is not None and plan.ends_at is not None:
            limit, total = plan.time_limit, plan.ends_at - now
            if total > limit.wrap_up_before > 0 and limit.wrap_up_before > limit.goodbye_before:
                self._wrap_up_at = plan.ends_at - limit.wrap_up_before
            if total > limit.goodbye_before > 0:
                self._goodbye_at = plan.ends_at - limit.goodbye_before
        # Ending
        self.ending: str | None = None
        self._end_requested_at = 0.0
        self._ended = False
        # Playback watches and what the driver was told
        self._watches = 0
        self._watching: int | None = None
        self._input = ("open", None)
        self._hold_on = False
        self.next_deadline: float | None = None

    # ------------------------------------------------------------------ inputs

    def start(self, now: float) -> list[PolicyAction]:
        """The session is open (its model connection too): the opening, unless the
        conversation goes on. Silence counts from now."""
        self.started_at = self._heard_at = self._quiet_since = now
        plan = self.plan
        if not plan.opened:
            for say in plan.must_hear:
                self._queue.append(_Utterance(say, "Before anything else, the user must hear this in full.",
                                              "must_hear", must_hear=True))
            if plan.speak_first is not None:
                self._queue.append(_Utterance(plan.speak_first,
                                              "The conversation begins now; the user has not spoken yet.",
                                              "speak_first"))
        return self._step(now)

    def agent(self, now: float, *, speaking: bool, owed: bool, plays_until: float) -> list[PolicyAction]:
        """The agent's state changed: a reply in progress (`speaking`), a reply
        owed to the user or a tool's result (`owed`), and when the audio sent
        or queued so far will have played at the client (`plays_until`)."""
        actions: list[PolicyAction] = []
        was = self._speaking
        self._speaking = speaking
        self._plays_until = max(self._plays_until, plays_until) if speaking else plays_until
        if owed and self._owed_since is None:
            self._owed_since = now
        elif not owed:
            self._owed_since = None
        current = self._current
        if speaking and not was:
            self._user_turn_since = None
            if self._hold_on:
                self._hold_on = False
                actions.append(ThinkingSound(False))
            if current is not None and current.step == "asked":
                current.step = "speaking"
        elif was and not speaking:
            self._quiet_since = max(now, plays_until)
            if current is not None and current.step == "speaking":
                actions.extend(self._spoken(current, now))
        return actions + self._step(now)

    def tools(self, now: float, *, running: bool) -> list[PolicyAction]:
        """Tool calls are running (`running`), or none is any more."""
        if running and self._tools_since is None:
            self._tools_since = now
        elif not running and self._tools_since is not None:
            self._tools_since = None
            self._quiet_since = max(self._quiet_since, now)
        return self._step(now)

    def user_started(self, now: float) -> list[PolicyAction]:
        self._user_speaking = True
        self._heard_at = now
        if self._input[0] == "held":
            self._spoke_held = True
        self._user_spoke(now)
        return self._step(now)

    def user_stopped(self, now: float) -> list[PolicyAction]:
        self._user_speaking = False
        self._heard_at = now
        self._user_spoke(now)
        return self._step(now)

    def played_out(self, now: float, number: int) -> list[PolicyAction]:
        """The client played everything queued before `WatchPlayback(number)`."""
        if number != self._watching:
            return []
        self._watching = None
        current = self._current
        if current is not None and current.step == "playing":
            self._current = None
            self._quiet_since = max(self._quiet_since, now)
            if current.kind == "silence_prompt":
                self._heard_at = max(self._heard_at, now)
            if current.then_end is not None:
                return self._end_now(current.then_end)
        elif self.ending is not None and self._current is None and not self._queue and not self._speaking:
            return self._end_now(self.ending)
        return self._step(now)  # (the agent spoke again meanwhile: watched again once it is done)

    def end(self, now: float, reason: str) -> list[PolicyAction]:
        """End the session once what the agent says has been heard (`end_session`)."""
        self.active = True
        if self.ending is None and not self._ended:
            self.ending = reason
            self._end_requested_at = now
            self._queue.clear()
        return self._step(now)

    def must_hear(self, now: float, say: Say) -> list[PolicyAction]:
        """A tool asks for a must-hear segment, at the next moment the agent is silent."""
        self.active = True
        if self.ending is None:
            self._queue.append(_Utterance(say, "The user must hear this in full now.", "must_hear", must_hear=True))
        return self._step(now)

    def tick(self, now: float) -> list[PolicyAction]:
        """Time passed (called at `next_deadline`)."""
        return self._step(now)

    # ------------------------------------------------------------------ rules

    def _user_spoke(self, now: float) -> None:
        """Speech starts the silence over: a prompt or goodbye not yet begun is dropped."""
        self._silence_stage = 0
        kept = [u for u in self._queue if u.kind not in ("silence_prompt", "silence_goodbye", "speak_first")]
        if len(kept) != len(self._queue):
            self._queue = collections.deque(kept)
            if self.ending is not None and self.ending.startswith("the user said nothing"):
                self.ending = None

    def _idle(self, now: float, deadlines: list[float], *, tools_ok: bool = False) -> bool:
        """The agent says nothing and owes nothing, and what it said has played."""
        if self._speaking or (self._tools_since is not None and not tools_ok):
            return False
        for since in (self._owed_since, self._user_turn_since):
            if since is not None and now < since + OWED_PATIENCE:
                deadlines.append(since + OWED_PATIENCE)
                return False
        if now < self._plays_until:
            deadlines.append(self._plays_until)
            return False
        return True

    def _step(self, now: float) -> list[PolicyAction]:
        """Everything that follows from the state at `now`; sets `next_deadline`."""
        actions: list[PolicyAction] = []
        deadlines: list[float] = []
        if self._ended:
            self.next_deadline = None
            return actions
        self._time_limit(now, deadlines)
        self._silence(now, deadlines)
        current = self._current
        if current is not None and current.step == "asked":
            if now >= current.since + ANSWER_TIMEOUT:
                self._current = current = None  # the model never began it
            else:
                deadlines.append(current.since + ANSWER_TIMEOUT)
        if current is None and self._queue:
            head = self._queue[0]
            clip = head.say.clip is not None
            if self._idle(now, deadlines, tools_ok=clip):
                self._queue.popleft()
                self._current = head
                head.since = now
                if clip:
                    assert head.say.clip is not None
                    head.step = "playing"
                    actions.append(PlayClip(head.say.clip))
                    actions.append(self._watch())
                else:
                    head.step = "asked"
                    actions.append(Prompt(prompt_text(head.say, head.situation)))
        if self.ending is not None and self._current is None and not self._queue and self._watching is None:
            give_up = self._end_requested_at + END_PATIENCE
            if now >= give_up:
                return actions + self._end_now(self.ending)
            deadlines.append(give_up)
            if self._idle(now, deadlines):
                actions.append(self._watch())
        actions.extend(self._hold_sound(now, deadlines))
        actions.extend(self._user_input(now))
        self.next_deadline = min(deadlines) if deadlines else None
        return actions

    def _spoken(self, utterance: _Utterance, now: float) -> list[PolicyAction]:
        """The model's reply that said `utterance` ended."""
        if utterance.must_hear or utterance.then_end is not None:
            utterance.step = "playing"
            return [self._watch()]
        self._current = None
        if utterance.kind == "silence_prompt":
            self._heard_at = max(self._heard_at, self._plays_until)
        return []

    def _watch(self) -> WatchPlayback:
        self._watches += 1
        self._watching = self._watches
        return WatchPlayback(self._watches)

    def _end_now(self, reason: str) -> list[PolicyAction]:
        self._ended = True
        self.next_deadline = None
        actions: list[PolicyAction] = []
        if self._hold_on:
            self._hold_on = False
            actions.append(ThinkingSound(False))
        return [*actions, EndSession(reason)]

    def _begin_ending(self, now: float, say: Say, situation: str, kind: str, reason: str) -> None:
        """The last utterance: a goodbye, after which the session ends."""
        self.active = True
        self.ending = reason
        self._end_requested_at = now
        self._queue = collections.deque([_Utterance(say, situation, kind, must_hear=True, then_end=reason)])

    def _time_limit(self, now: float, deadlines: list[float]) -> None:
        limit = self.plan.time_limit
        if limit is None:
            return
        if self._wrap_up_at is not None:
            if now >= self._wrap_up_at:
                self._wrap_up_at = None
                if self.ending is None:
                    seconds = round(limit.wrap_up_before)
                    self._queue.append(_Utterance(
                        limit.wrap_up, f"About {seconds} seconds of this conversation remain.", "wrap_up"))
            else:
                deadlines.append(self._wrap_up_at)
        if self._goodbye_at is not None:
            if now >= self._goodbye_at:
                self._goodbye_at = None
                if self.ending is None or self.ending.startswith("the user said nothing"):
                    self._begin_ending(now, limit.goodbye, "The conversation's time is up: it ends after this.",
                                       "time_goodbye", "the session reached its time limit (ended with a goodbye)")
            else:
                deadlines.append(self._goodbye_at)

    def _silence(self, now: float, deadlines: list[float]) -> None:
        silence = self.plan.silence
        if silence is None or self.ending is not None or self._user_speaking:
            return
        if self._current is not None or self._queue or self._speaking or self._tools_since is not None:
            return
        if self._owed_since is not None:
            if now < self._owed_since + OWED_PATIENCE:
                deadlines.append(self._owed_since + OWED_PATIENCE)
                return
        quiet_from = max(self._heard_at, self._quiet_since, self._plays_until)
        wait = silence.prompt_after if self._silence_stage == 0 else silence.end_after
        due = quiet_from + wait
        if now < due:
            deadlines.append(due)
            return
        if self._silence_stage == 0:
            self._silence_stage = 1
            self._queue.append(_Utterance(
                silence.prompt, f"The user has said nothing for {silence.prompt_after:g} seconds.", "silence_prompt"))
        else:
            seconds = silence.prompt_after + silence.end_after
            self._begin_ending(now, silence.goodbye, "The user has still said nothing: the conversation ends after this.",
                               "silence_goodbye", f"the user said nothing for {seconds:g} seconds (ended with a goodbye)")

    def _hold_sound(self, now: float, deadlines: list[float]) -> list[PolicyAction]:
        hold = self.plan.hold
        if hold is None:
            return []
        want = False
        if not self._speaking and self._current is None and self.ending is None:
            if self._tools_since is not None:
                due = self._tools_since + hold.after
                want = now >= due
                if not want:
                    deadlines.append(due)
            elif self._hold_on and self._owed_since is not None:
                # The result is back and the answer is on its way: keep the line alive till it starts.
                until = self._owed_since + OWED_PATIENCE
                want = now < until
                if want:
                    deadlines.append(until)
        if want == self._hold_on:
            return []
        self._hold_on = want
        return [ThinkingSound(want)]

    def _user_input(self, now: float) -> list[PolicyAction]:
        mute = self.plan.mute
        current = self._current
        segment = current is not None and current.must_hear and current.step != "waiting"
        state: tuple[str, str | None] = ("open", None)
        if mute is not None and mute.during_tools and self._tools_since is not None:
            state = ("muted", "tool")
        elif segment and mute is not None and mute.during_must_hear:
            state = ("muted", "must_hear")
        elif self.ending is not None:
            state = ("held", "ending")
        elif segment:
            state = ("held", "must_hear")
        if state == self._input:
            return []
        if self._input[0] == "held" and self._spoke_held:
            self._spoke_held = False
            self._user_turn_since = now  # their held words go to the model now
        self._input = state
        return [UserInput(*state)]
