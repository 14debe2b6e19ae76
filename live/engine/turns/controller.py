"""The user's turns, decided by the server: a plain state machine (no I/O).

`TurnController` is fed the user's audio (`audio`), the voice detector's score
for each window of it (`scored`, with whether the agent is speaking), the
end-of-turn model's answers (`verdict`) and the end of the audio stream
(`audio_ended`). It answers with actions for its session to carry out:

- `UserSpeaking`: speech was heard (`user.speaking` for the client);
- `StartActivity`: the user's turn begins: the model gets `activityStart`,
  then `preroll`, the audio from just before the speech's onset, so no first
  syllable is lost; `barge_in` when it interrupts the agent;
- `EndActivity`: the turn is over (`activityEnd`), and why;
- `Ignored`: speech over the agent's reply that was not taken as a turn (a
  backchannel, a cough): the reply goes on, and the model never hears it;
- `CheckEndOfTurn`: ask the end-of-turn model whether the turn sounds finished.

Phases: `QUIET -> ONSET -> TURN <-> PAUSE -> QUIET`. Speech opens a turn once
it lasted `min_speech` while the agent is silent, or `barge_in` (sustained)
while the agent speaks; shorter speech over a reply is left alone. A turn ends
after `end_silence` of silence, or sooner when the end-of-turn model says the
sentence is complete, or after `max_pause` when it is sure it is not; a turn
always ends (`max_pause`, `max_turn`). Time is the user's audio time, counted
in detector windows, so a record's audio replays to the same decisions.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import TypeAlias

import numpy as np

from live.agent import TurnSettings
from live.engine.turns.vad import VoiceStream

__all__ = [
    "CheckEndOfTurn",
    "EndActivity",
    "Ignored",
    "Phase",
    "StartActivity",
    "TurnAction",
    "TurnController",
    "UserSpeaking",
]

RING_SECONDS = 2.0  # audio kept for a preroll: a barge-in's speech, its gaps and the preroll itself
EARLIER_ONSET = 1.0  # speech left alone this recently before a barge-in belongs to it (its first words)
HYSTERESIS = 0.15  # once speech, it stays speech down to threshold - this


class Phase(enum.Enum):
    QUIET = "quiet"  # no speech
    ONSET = "onset"  # speech heard, not (yet) a turn
    TURN = "turn"  # the user's turn, speaking
    PAUSE = "pause"  # the user's turn, silent: it ends, or speech resumes


@dataclasses.dataclass(frozen=True, slots=True)
class UserSpeaking:
    """Speech was heard; `over_reply`: while the agent was speaking."""

    over_reply: bool


@dataclasses.dataclass(frozen=True, slots=True)
class StartActivity:
    """The user's turn starts: `activityStart`, then `preroll` (PCM16 at the session's rate)."""

    preroll: bytes
    barge_in: bool


@dataclasses.dataclass(frozen=True, slots=True)
class EndActivity:
    """The user's turn is over (`activityEnd`). `reason`: `complete` (the
    end-of-turn model heard a finished sentence), `silence`, `max_wait` (the
    longest pause a turn survives), `max_length`, or `audio_end`."""

    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class Ignored:
    """Speech over the agent's reply, too short to take the turn: left alone."""

    reason: str = "backchannel"


@dataclasses.dataclass(frozen=True, slots=True)
class CheckEndOfTurn:
    """Ask whether the turn sounds finished: `audio` is the turn so far (16 kHz
    float); the answer goes to `verdict(pause, probability)`."""

    pause: int
    audio: np.ndarray = dataclasses.field(repr=False)


TurnAction: TypeAlias = UserSpeaking | StartActivity | EndActivity | Ignored | CheckEndOfTurn


class TurnController:
    """One session's turns (see the module's docstring).

    `input_rate` is the rate of the session's audio; `detector_rate` the rate
    the voice detector runs at (8 kHz on a phone line, else 16 kHz);
    `smart`: the end-of-turn model is asked at pauses.
    """

    def __init__(
        self,
        settings: TurnSettings,
        *,
        input_rate: int,
        detector_rate: int = 16_000,
        noise_filter: object = None,
    ) -> None:
        self.settings = settings
        self.input_rate = input_rate
        self.smart = settings.end_of_turn == "smart"
        self.stream = VoiceStream(
            input_rate, detector_rate, floor_dbfs=settings.energy_floor_dbfs, noise_filter=noise_filter
        )
        self.window = self.stream.window_seconds
        self.phase = Phase.QUIET
        self.t = 0.0  # the user's audio time the detector has scored, in seconds
        self._bytes_per_second = 2 * input_rate
        self._ring = bytearray()
        self._ring_cap = int(RING_SECONDS * input_rate) * 2
        self._received = 0  # bytes of audio received, all told
        self._turn_audio: bytearray | None = None  # the turn so far, for the end-of-turn model
        self._turn_cap = 8 * self._bytes_per_second
        # ONSET
        self._onset_at = 0.0
        self._voiced = 0.0
        self._gap = 0.0
        self._announced = False
        self._left_alone_at: float | None = None  # the onset of speech last left alone
        # TURN / PAUSE
        self._turn_at = 0.0
        self._turn_speech = 0.0
        self._silence = 0.0
        self.pause = 0  # numbers pauses: a verdict answers one
        self._asked = False
        self._incomplete = False
        # What the next work reads: is the user speaking, and since when.
        self.speaking = False
        self.changed_at = 0.0  # audio time of the last change of `speaking`
        self.turns = 0
        self.ignored = 0
        self.checks = 0

    # ------------------------------------------------------------------ input

    @property
    def in_turn(self) -> bool:
        """The user's activity is open: their audio goes to the model as it comes."""
        return self.phase is Phase.TURN or self.phase is Phase.PAUSE

    def audio(self, pcm: bytes) -> bool:
        """One frame of the user's audio; True when it goes to the model now (in a turn)."""
        self.stream.feed(pcm)
        ring = self._ring
        ring += pcm
        if len(ring) > 2 * self._ring_cap:  # trimmed now and then, not at every frame
            del ring[: len(ring) - self._ring_cap]
        self._received += len(pcm)
        turn = self._turn_audio
        if turn is not None:
            turn += pcm
            if len(turn) > self._turn_cap:
                del turn[: len(turn) - self._turn_cap]
        return self.phase is Phase.TURN or self.phase is Phase.PAUSE

    def scored(self, probability: float, *, agent_speaking: bool) -> list[TurnAction]:
        """The detector's speech probability for the next window of audio."""
        start = self.t
        self.t = start + self.window
        window = self.window
        settings = self.settings
        phase = self.phase
        actions: list[TurnAction] = []
        if phase is Phase.QUIET:
            if probability < settings.threshold:
                return actions
            self.phase = Phase.ONSET
            self._onset_at = start
            self._voiced = window
            self._gap = 0.0
            self._announced = False
            self._onset(agent_speaking, actions)
        elif phase is Phase.ONSET:
            if probability >= settings.threshold - HYSTERESIS:
                self._voiced += window
                self._gap = 0.0
            else:
                self._gap += window
                if self._gap >= settings.onset_gap - 1e-9:
                    self._leave_alone(actions)
                    return actions
            self._onset(agent_speaking, actions)
        elif phase is Phase.TURN:
            if probability >= settings.threshold - HYSTERESIS:
                self._turn_speech += window
            else:
                self.phase = Phase.PAUSE
                self.pause += 1
                self._silence = window
                self._asked = False
                self._incomplete = False
                self._set_speaking(False, start)
            self._limit_length(actions)
        else:  # PAUSE
            if probability >= settings.threshold:
                self.phase = Phase.TURN
                self._turn_speech += window
                self._set_speaking(True, start)
            else:
                self._silence += window
                self._pausing(actions)
            if self.in_turn:
                self._limit_length(actions)
        return actions

    def verdict(self, pause: int, probability: float | None) -> list[TurnAction]:
        """The end-of-turn model's answer for `pause` (None: no answer, e.g. it was busy)."""
        if self.phase is not Phase.PAUSE or pause != self.pause or probability is None:
            return []
        if probability >= self.settings.smart_threshold:
            return self._end("complete")
        # Unsure: the silence rule decides. Sure the sentence goes on: hold.
        self._incomplete = probability < self.settings.smart_hold_below
        return []

    def audio_ended(self) -> list[TurnAction]:
        """The client's microphone stopped (`audio.end`): a turn in progress ends now."""
        if self.in_turn:
            return self._end("audio_end")
        if self.phase is Phase.ONSET:
            actions: list[TurnAction] = []
            self._leave_alone(actions)
            return actions
        return []

    # ------------------------------------------------------------------ rules

    def _onset(self, agent_speaking: bool, actions: list[TurnAction]) -> None:
        """Speech not yet a turn: say so once it is speech, open the turn once it is enough."""
        settings = self.settings
        if not self._announced and self._voiced >= settings.min_speech - 1e-9:
            self._announced = True
            self._set_speaking(True, self._onset_at)
            actions.append(UserSpeaking(over_reply=agent_speaking))
        needed = settings.barge_in if agent_speaking else settings.min_speech
        if self._voiced >= needed - 1e-9:
            self._open(agent_speaking, actions)

    def _open(self, barge_in: bool, actions: list[TurnAction]) -> None:
        settings = self.settings
        since = self._onset_at
        earlier = self._left_alone_at
        if barge_in and earlier is not None and since - earlier <= EARLIER_ONSET:
            since = earlier  # the first words of an interruption, left alone a moment ago
        self._left_alone_at = None
        ring_start = self._received - len(self._ring)
        # The audio received lines up with the detector's windows (both count from the start).
        offset = int(max(0.0, since - settings.preroll) * self.input_rate) * 2
        preroll = bytes(self._ring[max(0, offset - ring_start) :])
        self.phase = Phase.TURN
        self._turn_at = since
        self._turn_speech = self._voiced
        self.turns += 1
        if self.smart:
            self._turn_audio = bytearray(preroll)
        actions.append(StartActivity(preroll, barge_in))

    def _leave_alone(self, actions: list[TurnAction]) -> None:
        """Speech that did not become a turn ends."""
        self.phase = Phase.QUIET
        self._left_alone_at = self._onset_at
        if self._announced:
            self.ignored += 1
            self._set_speaking(False, self.t - self._gap)
            actions.append(Ignored())

    def _pausing(self, actions: list[TurnAction]) -> None:
        settings = self.settings
        silence = self._silence
        if (
            self.smart
            and not self._asked
            and silence >= settings.smart_check_after - 1e-9
            and self._turn_speech >= settings.smart_min_speech - 1e-9
        ):
            self._asked = True
            self.checks += 1
            actions.append(CheckEndOfTurn(self.pause, self._turn_16k()))
        if silence >= settings.max_pause - 1e-9:
            actions.extend(self._end("max_wait"))
        elif silence >= settings.end_silence - 1e-9 and not self._incomplete:
            actions.extend(self._end("silence"))

    def _limit_length(self, actions: list[TurnAction]) -> None:
        if self.in_turn and self.t - self._turn_at >= self.settings.max_turn - 1e-9:
            actions.extend(self._end("max_length"))

    def _end(self, reason: str) -> list[TurnAction]:
        if self.phase is Phase.TURN:
            self._set_speaking(False, self.t)
        self.phase = Phase.QUIET
        self._turn_audio = None
        return [EndActivity(reason)]

    def _set_speaking(self, speaking: bool, at: float) -> None:
        if speaking != self.speaking:
            self.speaking = speaking
            self.changed_at = at

    def _turn_16k(self) -> np.ndarray:
        """The turn so far as the end-of-turn model takes it: float, 16 kHz."""
        pcm = bytes(self._turn_audio or b"")
        samples = np.frombuffer(pcm, "<i2").astype(np.float32) / 32768
        if self.input_rate != 16_000 and samples.size:
            import soxr

            samples = soxr.resample(samples, self.input_rate, 16_000).astype(np.float32)
        return samples
