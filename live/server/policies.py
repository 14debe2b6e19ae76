"""A session's conversation policies, carried out: the I/O half of `live.engine.policies`.

`SessionPolicies` feeds the engine's state machine what the session does and
performs what it answers. The session runner calls it at four places, each a
line: every batch of the session core's actions (`seen`: the agent's state,
tools, the first audio of a reply), every frame of the user's audio while a
policy listens (`user_audio`: voice detection, listening windows), typed input
(`defers`: nothing interrupts a must-hear segment), and a door's `PlayedOut`.
Tools reach it through `live.agent.session_control` (`end_session`,
`play_must_hear`).

It owns at most three tasks, in a task group of its own inside the session's:
the speaker (prompts to the model, clips, playback watches: in order, one at
a time), the timer (the engine's next deadline), and the hold sound while it
plays. None of them starts for a session whose agent has no policy, until a
tool asks for one: such a session pays one attribute check per batch of
actions and nothing per audio frame.

The user's speech is heard by the server's voice detection (Silero, the
`turns` extra: the same scores a session that takes its own turns uses, so a
noisy line's hiss or hum is not speech), through `live.engine.voice.ScoredSpeech`;
without that extra, by `live.engine.voice.EnergyDetector` (RMS over 20 ms with
a hangover), which takes loud steady noise for speech.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import numpy as np

from live.agent import CLIP_RATE, Agent, Clip, Say, TimeLimit
from live.doors.base import FrontDoor
from live.engine.actions import (
    AwaitClientTool,
    CancelTool,
    EndSession,
    PlayClip,
    PolicyAction,
    Prompt,
    RunTool,
    SendAudio,
    ThinkingSound,
    ToUpstream,
    UserInput,
    WatchPlayback,
)
from live.engine.policies import ConversationPolicies, PolicyPlan
from live.engine.session_state import TurnState
from live.engine.voice import EnergyDetector, ScoredSpeech
from live.protocol import (
    ClientMessage,
    GenerationComplete,
    ServerEvent,
    SessionStart,
    Text,
    TranscriptOutput,
    TurnComplete,
    UserMuted,
)

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from live.engine.heard import HeardTracker
    from live.engine.session import SessionCore
    from live.server.queues import ClientOutbox

__all__ = ["PolicyHost", "SessionPolicies", "thinking_sound"]

log = logging.getLogger("live.server")

BYTES_PER_SECOND = 2 * CLIP_RATE
CLIP_CHUNK = BYTES_PER_SECOND // 25  # a clip goes out in 40 ms pieces, paced like a reply
HOLD_CHUNK = BYTES_PER_SECOND // 50  # the hold sound, 20 ms at a time...
HOLD_AHEAD = 0.04  # ...never more than this ahead of the client's playback: it stops at once
PLAYBACK_GRACE = 3.0  # a carrier's mark may take this long past the estimate before it is not waited for
MAX_DEFERRED = 32  # typed turns kept while the user is held (the oldest dropped first)


def thinking_sound() -> Clip:
    """The built-in hold sound: two soft notes over a faint hum, 1.6 s, looped.

    Made here (no file, no download); about -30 dBFS, quiet enough to sit
    under a line without sounding like speech."""
    rate = CLIP_RATE
    t = np.arange(int(1.6 * rate)) / rate
    hum = 0.004 * np.sin(2 * np.pi * 110 * t)
    notes = np.zeros_like(t)
    for start, pitch in ((0.0, 523.25), (0.4, 659.25)):
        length = int(0.18 * rate)
        begin = int(start * rate)
        span = np.arange(length) / rate
        envelope = np.sin(np.pi * span / 0.18) ** 2
        notes[begin : begin + length] += 0.03 * envelope * np.sin(2 * np.pi * pitch * span)
    return Clip(np.round((hum + notes) * 32767).astype("<i2").tobytes(), None)


THINKING = thinking_sound()


class PolicyHost(Protocol):
    """What a session's policies need of their session."""

    id: str
    agent: Agent
    door: FrontDoor
    core: SessionCore
    tg: TaskGroup
    outbox: ClientOutbox
    heard: HeardTracker
    clock: Callable[[], float]
    input_held: bool
    hears: Callable[[bytes], bool] | None
    end_reason: str | None

    async def apply(self, actions: list[Any]) -> None: ...

    def event(self, event: ServerEvent) -> None: ...

    def poke(self) -> None: ...

    def finish(self, reason: str, close_code: int = ..., error: Any = None) -> None: ...

    def sync_hold(self) -> None: ...

    def voice_for_policies(
        self, input_rate: int, on_score: Callable[[float], None]
    ) -> tuple[Callable[[bytes], None], float] | None:
        """The server's voice detection for this session: where to feed the user's
        audio (PCM16 at `input_rate`) and the seconds each score covers
        (`on_score` gets the scores), or None when the server has none."""
        ...


def plan_for(agent: Agent, door: FrontDoor, start: SessionStart, *, ends_at: float | None, opened: bool,
             push_to_talk: bool) -> PolicyPlan:
    """The policies a session runs: the agent's, as its door and client allow.
    `ends_at` is the session's end on its own clock (the agent's limit or its
    token's); a token's limit alone gets `TimeLimit()`'s grace."""
    if not door.capabilities.policies:
        return PolicyPlan(opened=True)
    limit = agent.time_limit
    if limit is None and ends_at is not None:
        limit = TimeLimit()
    return PolicyPlan(
        speak_first=agent.speak_first,  # type: ignore[arg-type]  (a Say: the agent makes it one)
        must_hear=tuple(agent.must_hear),  # type: ignore[arg-type]
        mute=agent.mute_user,
        silence=None if push_to_talk else agent.silence,
        time_limit=limit,
        hold=agent.hold_sound,
        ends_at=ends_at,
        opened=opened or bool(start.history),
    )


class SessionPolicies:
    """One session's policies at work (see the module's docstring); the
    `live.agent.SessionControl` its tools reach."""

    def __init__(self, runner: PolicyHost, plan: PolicyPlan, *, input_rate: int) -> None:
        self._runner = runner
        self.engine = ConversationPolicies(plan, now=runner.clock())
        self.tracking = False  # the engine is fed the agent's state (`seen`)
        self._running = False
        self._input_rate = input_rate
        self._detector: EnergyDetector | None = None
        self._scored: ScoredSpeech | None = None  # the server's voice detection, when it has one
        self._voice_feed: Callable[[bytes], None] | None = None
        self._muted = False
        self._input = "open"
        self._deferred: collections.deque[Text] = collections.deque(maxlen=MAX_DEFERRED)
        # The speaker's work, in order: at most one utterance's (a prompt; or a
        # clip and its watch), a playback watch, typed turns released after a hold.
        self._work: collections.deque[PolicyAction | Text] = collections.deque()
        self._work_ready = anyio.Event()
        self._deadline_moved = anyio.Event()
        self._deadline: float | None = None
        self._hold_scope: anyio.CancelScope | None = None
        self._hold_wanted = False
        self._tg: TaskGroup | None = None
        # The agent's state as the engine last heard it
        self._speaking = False
        self._owed = False
        self._tools = False
        # A door's `PlayedOut` signals, and the reply audio sent when the last came
        self._played_outs = 0
        self._played_event = anyio.Event()
        self._sent_at_played_out = -1

    # ------------------------------------------------------------------ starting

    def start(self) -> None:
        """The session is open: run its policies, if the agent has any."""
        if self.engine.active:
            self._activate()

    def _activate(self) -> None:
        """From now on the engine hears what the session does, and acts."""
        runner = self._runner
        if not self.tracking:
            self.tracking = True
            plan = self.engine.plan
            if plan.silence is not None or plan.must_hear:
                self._listen()
            if plan.mute is not None:
                runner.hears = self.user_audio
            self._sample(runner.clock(), runner.core, tools=True)
        if not self._running:
            self._running = True
            runner.tg.start_soon(self._run)

    def _listen(self) -> None:
        """Hear the user's voice from now on (silence, or speech over a must-hear segment)."""
        if self._detector is not None or self._scored is not None:
            return
        voice = self._runner.voice_for_policies(self._input_rate, self._voice_scored)
        if voice is None:
            self._detector = EnergyDetector(self._input_rate)
        else:
            self._voice_feed, window = voice
            self._scored = ScoredSpeech(window)
        self._runner.hears = self.user_audio

    async def _run(self) -> None:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self._speaker)
            tg.start_soon(self._timer)
            if self._hold_wanted:
                self._start_hold()
            self._act(self.engine.start(self._runner.clock()))

    # ------------------------------------------------------------------ what the session tells

    def seen(self, actions: list[Any]) -> None:
        """A batch of the session core's actions, before it is carried out (the
        core's state already says what it did). The hold sound stops before
        the first audio of a reply is queued."""
        audio = 0
        tools = False
        for action in actions:
            if type(action) is SendAudio:
                audio += len(action.data)
            elif isinstance(action, (RunTool, AwaitClientTool, CancelTool, ToUpstream)):
                tools = True
        if audio and self._hold_scope is not None:
            self._stop_hold()
        core = self._runner.core
        speaking = core.turn is TurnState.RESPONDING
        owed = core.awaiting_reply_since is not None
        if tools or speaking is not self._speaking or owed is not self._owed:
            self._sample(self._runner.clock(), core, tools=tools, audio=audio)

    def _sample(self, now: float, core: SessionCore, *, tools: bool, audio: int = 0) -> None:
        speaking = core.turn is TurnState.RESPONDING
        owed = core.awaiting_reply_since is not None
        if speaking is not self._speaking or owed is not self._owed:
            self._speaking, self._owed = speaking, owed
            outbox = self._runner.outbox
            ahead = outbox.audio_waiting_seconds() + outbox.unplayed_seconds() + audio / BYTES_PER_SECOND
            self._act(self.engine.agent(now, speaking=speaking, owed=owed, plays_until=now + ahead))
        if tools:
            running = bool(core.pending_tool_calls)
            if running is not self._tools:
                self._tools = running
                self._act(self.engine.tools(now, running=running))

    def user_audio(self, frame: bytes) -> bool:
        """A frame of the user's audio: heard by the detector; False when it must
        not reach the model (a listening window)."""
        feed = self._voice_feed
        if feed is not None:
            feed(frame)  # scored by the server's detection: `_voice_scored`
        else:
            detector = self._detector
            if detector is not None:
                self._voice_changed(detector.feed(frame))
        return not self._muted

    def _voice_scored(self, probability: float) -> None:
        """The server's voice detection scored the next window of the user's audio."""
        scored = self._scored
        if scored is not None and self._runner.end_reason is None:
            self._voice_changed(scored.scored(probability))

    def _voice_changed(self, change: bool | None) -> None:
        if change is not None:
            self.user_started(self._runner.clock()) if change else self.user_stopped(self._runner.clock())

    def user_started(self, now: float) -> None:
        """The user began speaking (this module's detector, or the server's turn controller)."""
        if self.tracking:
            self._act(self.engine.user_started(now))

    def user_stopped(self, now: float) -> None:
        if self.tracking:
            self._act(self.engine.user_stopped(now))

    def defers(self, message: ClientMessage) -> bool:
        """Whether a typed turn waits (the user is held: it would interrupt a
        must-hear segment) or is dropped (the user is muted)."""
        if self._input == "open" or type(message) is not Text:
            return False
        if self._input == "held":
            self._deferred.append(message)  # the oldest goes when full
        return True

    def played_out(self) -> None:
        """The door says the client played everything sent so far (`PlayedOut`)."""
        self._played_outs += 1
        self._sent_at_played_out = self._runner.heard.sent
        self._played_event.set()
        self._played_event = anyio.Event()

    # ------------------------------------------------------------------ what tools ask (SessionControl)

    def end(self, reason: str) -> None:
        self._activate()
        self._act(self.engine.end(self._runner.clock(), reason))

    def must_hear(self, say: Say) -> None:
        self._activate()
        self._listen()
        self._act(self.engine.must_hear(self._runner.clock(), say))

    # ------------------------------------------------------------------ carrying out

    def _act(self, actions: list[PolicyAction]) -> None:
        runner = self._runner
        for action in actions:
            if type(action) is UserInput:
                self._user_input(action)
            elif type(action) is ThinkingSound:
                if action.on:
                    self._start_hold()
                else:
                    self._stop_hold()
            elif type(action) is EndSession:
                log.info("session %s ending: %s", runner.id, action.reason)
                runner.finish(action.reason)
            else:
                self._work.append(action)
                self._work_ready.set()
        deadline = self.engine.next_deadline
        if deadline != self._deadline:
            self._deadline = deadline
            self._deadline_moved.set()

    def _user_input(self, action: UserInput) -> None:
        runner = self._runner
        was = self._input
        self._input = action.mode
        muted = action.mode == "muted"
        if muted != self._muted:
            self._muted = muted
            if runner.door.capabilities.shows_mute:
                runner.event(UserMuted(muted, action.reason if muted else None))
        runner.input_held = action.mode == "held"
        runner.sync_hold()
        if was == "held" and action.mode == "open" and self._deferred:
            self._work.extend(self._deferred)  # what the user typed meanwhile, now
            self._deferred.clear()
            self._work_ready.set()

    async def _speaker(self) -> None:
        runner = self._runner
        work = self._work
        while True:
            while not work:
                self._work_ready = anyio.Event()
                await self._work_ready.wait()
            action = work.popleft()
            if type(action) is Prompt:
                await runner.apply(runner.core.client_message(Text(action.text), runner.clock()))
                runner.poke()
            elif type(action) is Text:
                await runner.apply(runner.core.client_message(action, runner.clock()))
                runner.poke()
            elif type(action) is PlayClip:
                await self._play(action.clip)
            elif type(action) is WatchPlayback:
                await self._until_played()
                self._act(self.engine.played_out(runner.clock(), action.number))

    async def _play(self, clip: Clip) -> None:
        """A recording as the agent's turn: its words, its audio (paced like a
        reply), then its end, which a carrier marks."""
        runner = self._runner
        heard, outbox = runner.heard, runner.outbox
        heard.reply_ended()
        if clip.text:
            heard.fragment(clip.text)
            runner.event(TranscriptOutput(clip.text, False))
        pcm = clip.pcm
        for offset in range(0, len(pcm), CLIP_CHUNK):
            piece = pcm[offset : offset + CLIP_CHUNK]
            heard.audio_queued(len(piece))
            await outbox.put_audio(piece)
        if clip.text:
            runner.event(TranscriptOutput(clip.text, True))
        runner.event(GenerationComplete())
        runner.event(TurnComplete())
        heard.reply_ended()

    async def _until_played(self) -> None:
        """Until the client has played everything queued so far: what waits here
        has left, then the door's `PlayedOut` (when nothing was sent since the
        last one, at once), or the pacing's estimate. Bounded: a client that
        never says is not waited for past the estimate and `PLAYBACK_GRACE`."""
        runner = self._runner
        outbox, heard = runner.outbox, runner.heard
        bound = outbox.audio_waiting_seconds() + outbox.unplayed_seconds() + PLAYBACK_GRACE
        with anyio.move_on_after(bound):
            while not outbox.empty:
                await anyio.sleep(max(0.02, outbox.audio_waiting_seconds()))
            if runner.door.capabilities.reports_played_out:
                while heard.sent != self._sent_at_played_out:
                    await self._played_event.wait()
            else:
                await anyio.sleep(outbox.unplayed_seconds())

    async def _timer(self) -> None:
        clock = self._runner.clock
        while True:
            self._deadline_moved = anyio.Event()
            deadline = self._deadline
            if deadline is None:
                await self._deadline_moved.wait()
                continue
            with anyio.move_on_after(max(0.0, deadline - clock())):
                await self._deadline_moved.wait()
            if self._deadline == deadline and clock() >= deadline:
                self._act(self.engine.tick(clock()))

    # ------------------------------------------------------------------ the hold sound

    def _start_hold(self) -> None:
        self._hold_wanted = True
        if self._hold_scope is not None or self._tg is None:
            return
        hold = self.engine.plan.hold
        clip = hold.clip if hold is not None and hold.clip is not None else THINKING
        self._hold_scope = scope = anyio.CancelScope()
        self._tg.start_soon(self._hold_sound, clip.pcm, scope)

    def _stop_hold(self) -> None:
        self._hold_wanted = False
        scope, self._hold_scope = self._hold_scope, None
        if scope is not None:
            scope.cancel()

    async def _hold_sound(self, pcm: bytes, scope: anyio.CancelScope) -> None:
        """The hold sound, looped, 20 ms at a time and never more than
        `HOLD_AHEAD` ahead of playback: when the agent speaks, it is at once
        what the user hears."""
        runner = self._runner
        outbox, heard = runner.outbox, runner.heard
        loop = pcm + pcm[: HOLD_CHUNK - len(pcm) % HOLD_CHUNK] if len(pcm) % HOLD_CHUNK else pcm
        position = 0
        with scope:
            while True:
                if outbox.audio_waiting_seconds() == 0 and outbox.unplayed_seconds() < HOLD_AHEAD:
                    piece = loop[position : position + HOLD_CHUNK]
                    position = (position + HOLD_CHUNK) % len(loop)
                    heard.filler_queued(len(piece))
                    await outbox.put_audio(piece)
                await anyio.sleep(HOLD_CHUNK / BYTES_PER_SECOND)


def session_ends_at(agent: Agent, door: FrontDoor, token_ends_at: float | None) -> float | None:
    """The wall-clock end of a session starting now: its token's, or the
    agent's own `time_limit.max_duration` where its policies apply, whichever first."""
    limit = agent.time_limit
    if not door.capabilities.policies or limit is None or limit.max_duration is None:
        return token_ends_at
    own = time.time() + limit.max_duration
    return own if token_ends_at is None else min(own, token_ends_at)
