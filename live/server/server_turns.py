"""A session's turns when this server takes them (`turn_taking="server"`).

`SessionRunner` (`live.server.runner`) chooses who ends the user's turns (the
model, the client, or this server) through this mixin; when it is the server,
the session's `TurnController` (`live.engine.turns`) is scored by the server's
voice detection, and what it decides is carried out here: activity signals and
the audio before the onset to the model, events for the client, questions for
the end-of-turn model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from live.engine.actions import ToUpstream
from live.engine.session_state import TurnState
from live.engine.turns.controller import (
    CheckEndOfTurn,
    EndActivity,
    Ignored,
    Phase,
    StartActivity,
    TurnAction,
    TurnController,
    UserSpeaking as SpeechHeard,
)
from live.engine.turns.vad import VoiceStream
from live.protocol import ErrorEvent, ServerEvent, SessionStart, UserSpeaking, UserStopped
from live.protocol.closes import CLOSE_POLICY

if TYPE_CHECKING:
    from live.doors.base import FrontDoor
    from live.engine.session import SessionCore
    from live.observe.watch import SessionObserver
    from live.server.queues import ClientOutbox, UpstreamQueue

__all__ = ["ServerTurns"]


def _heard_already(frame: bytes) -> None:
    """The turn controller's stream already takes the user's audio."""


class ServerTurns:
    """The runner's turn-taking glue (a mixin of `SessionRunner`)."""

    # What it uses of the runner.
    server: Any  # the SessionServer (`live.server.runner`)
    clock: Callable[[], float]
    door: FrontDoor
    core: SessionCore
    upstream: UpstreamQueue[Any]
    outbox: ClientOutbox
    obs: SessionObserver
    end_reason: str | None
    turn_taking: str
    manual_activity: bool
    turns: TurnController | None
    # The conversation policies' share of the voice detection (`voice_for_policies`).
    _policy_voice: Callable[[float], None] | None = None
    policy_voice_stream: VoiceStream | None = None

    if TYPE_CHECKING:

        def finish(self, reason: str, close_code: int = ..., error: ErrorEvent | None = None) -> None: ...
        def event(self, event: ServerEvent) -> None: ...
        def poke(self) -> None: ...

    def _choose_turn_taking(self, start: SessionStart) -> bool:
        """Who ends the user's turns: the session's choice, else the agent's.
        False (the session ends) when this server cannot take them itself."""
        agent = self.server.agent
        mode = start.turn_taking or agent.turn_taking
        own_detection = start.config is not None and start.config.realtime_input_config is not None
        if mode == "auto" and self.server.agent_manual_activity and not own_detection:
            # The agent's own config turned the model's detection off. Not for
            # a client whose own realtimeInputConfig replaces the agent's: the
            # model hears it as that says.
            mode = "manual"
        if mode == "server":
            missing = self.server.turn_models_missing(agent.turns.end_of_turn == "smart")
            if missing is not None:
                self.finish(missing, CLOSE_POLICY, ErrorEvent("turn_taking_unavailable", missing, True))
                return False
        self.turn_taking = mode
        self.manual_activity = mode != "auto"
        return True

    def _detector_rate(self, input_rate: int) -> int:
        """The rate the voice detector hears this session at: a phone line's 8 kHz, else 16 kHz."""
        line_rate = self.door.line_rate()
        return 8_000 if min(input_rate, line_rate or input_rate) <= 8_000 else 16_000

    def _take_turns(self, start: SessionStart) -> None:
        """This server decides the user's turns: a controller, scored by the server's voice detection."""
        settings = self.server.agent.turns
        rate = self._detector_rate(start.input_rate)
        noise_filter = None
        if settings.noise_filter:
            from live.engine.turns.noise import NoiseFilter

            noise_filter = NoiseFilter(rate)
        self.turns = TurnController(settings, input_rate=start.input_rate, detector_rate=rate, noise_filter=noise_filter)
        self.server.voice_detection.add(self.turns.stream, self._voice_scored)

    @property
    def agent_speaking(self) -> bool:
        """The agent is talking, about to, or its reply is still playing to the user."""
        core = self.core
        return (
            core.turn is TurnState.RESPONDING
            or core.awaiting_reply_since is not None
            or self.outbox.unplayed_seconds() > 0.0
        )

    def _voice_scored(self, probability: float) -> None:
        """The voice detector scored the next window of the user's audio."""
        turns = self.turns
        if turns is not None and self.end_reason is None:
            self._carry_turns(turns.scored(probability, agent_speaking=self.agent_speaking))
            if self._policy_voice is not None:
                self._policy_voice(probability)

    def voice_for_policies(
        self, input_rate: int, on_score: Callable[[float], None]
    ) -> tuple[Callable[[bytes], None], float] | None:
        """The server's voice detection for the conversation policies
        (`live.server.policies.PolicyHost`). A session that takes its own turns
        shares its controller's scores (its stream already hears the audio);
        another gets a stream of its own. None when the server has no detection
        (the `turns` extra is not installed)."""
        turns = self.turns
        if turns is not None:
            self._policy_voice = on_score
            return _heard_already, turns.stream.window_seconds
        if self.server.turn_models_missing(False) is not None:
            return None
        stream = VoiceStream(input_rate, self._detector_rate(input_rate))
        self.policy_voice_stream = stream
        self.server.voice_detection.add(stream, on_score)
        return stream.feed, stream.window_seconds

    def _carry_turns(self, actions: list[TurnAction]) -> None:
        """Carry out what the turn controller decided: activity signals and the
        audio before the onset to the model (in order with the audio that
        follows), events for the client, questions for the end-of-turn model."""
        core = self.core
        upstream = self.upstream
        for action in actions:
            if isinstance(action, StartActivity):
                upstream.put_signal(core.turn_started())
                if action.preroll:
                    blob = core.client_audio(action.preroll)
                    if upstream.put_audio(blob, len(action.preroll)):
                        self.obs.audio_overflow()
            elif isinstance(action, EndActivity):
                now = self.clock()
                end = core.turn_ended(now)
                self.obs.actions([ToUpstream(end)], now)  # the reply's latency is timed from here
                upstream.put_signal(end)
                self.event(UserStopped(action.reason))
                self.poke()
            elif isinstance(action, SpeechHeard):
                self.event(UserSpeaking(action.over_reply))
            elif isinstance(action, Ignored):
                self.event(UserStopped(action.reason))
            elif isinstance(action, CheckEndOfTurn):
                self._ask_end_of_turn(action)

    def _ask_end_of_turn(self, check: CheckEndOfTurn) -> None:
        turns = self.turns
        assert turns is not None
        pause = check.pause

        def answer(probability: float | None) -> None:
            if self.turns is turns and self.end_reason is None:
                self._carry_turns(turns.verdict(pause, probability))

        def wanted() -> bool:
            return self.end_reason is None and turns.phase is Phase.PAUSE and turns.pause == pause

        # Refused (the model is busy): the turn ends by silence timing.
        self.server.end_of_turn.ask(check.audio, answer, wanted)

    def reopen_turn(self) -> None:
        """A new model connection while the user's turn is open: it hears the
        activity start before the audio that waited for it."""
        turns = self.turns
        if turns is not None and turns.in_turn:
            self.upstream.put_signal(self.core.turn_started(), first=True)

    @property
    def user_voice(self) -> tuple[bool, float] | None:
        """Whether the user is speaking, and since when (seconds of their audio),
        as the server's voice detection hears it; None without it."""
        turns = self.turns
        return None if turns is None else (turns.speaking, turns.changed_at)
