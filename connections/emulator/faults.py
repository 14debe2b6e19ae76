"""Faults the real service throws at random, at rates, replayable from a seed.

`Script.fault_rates` says how often each happens; every draw comes from one
`random.Random` per seed that all connections of an emulator share
(`Shared.random`), so a run with the same seed and the same traffic replays
the same faults. A rate of 0 draws nothing, so a script without rates never
touches the generator. The scripted, deterministic `Fault`s of
`connections.emulator.script` work beside these.

`Outage` is a backend's bad day switched on and off while the emulator runs
(`Emulator.outage`, `Emulator.go_down`): a key whose quota is gone, the whole
backend down, a model this region does not serve.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Literal

__all__ = ["EarlyDrop", "FaultDice", "FaultRates", "Outage"]


@dataclasses.dataclass(frozen=True, slots=True)
class FaultRates:
    """Probabilities (0 to 1) of the service's random faults; all 0 by default."""

    internal_error_mid_turn: float = 0.0
    """Per model turn: the connection closes with 1011 "Internal error
    encountered." after a random chunk of the turn, while generating (forum
    #167186, #171560)."""

    not_found_after_tool_response: float = 0.0
    """Per toolResponse: the connection closes with 1008 "Requested entity was
    not found." right after it arrives, before the model answers (forum
    #109319; 1011 is also reported there, the emulator says 1008)."""

    drop_before_first_handle: float = 0.0
    """Per connection: it ends before its first resumable handle was issued,
    either right after setupComplete or at the moment that handle would have
    gone out (after the first completed turn), half each; with 1011 "The
    service is currently unavailable." or without a close frame (1006), half
    each (forum #167186, #171560; pipecat-ai/docs PR 768;
    pydantic/pydantic-ai#7188; kazunori279/adk-streaming-guide#11)."""

    stale_handle_on_resume: float = 0.0
    """Per resume attempt with a handle that is still valid: the service no
    longer knows it and closes with 1008 "BidiGenerateContent session not found"
    (forum #186392; yeyu2/Youtube_demos#5)."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{field.name} must be a probability between 0 and 1, not {value!r}")

    @classmethod
    def realistic(cls) -> FaultRates:
        """Rates of an ordinary day.

        No report gives a rate except forum #167186: about 1% of turns closed
        with 1011 over some 1,500 turns on a normal day (80-90% on its bad
        day). The other three have no measured rate; they are set at the same
        low single-digit order, a little higher where a single event costs a
        whole connection's start (an early drop) or a resume, so that a
        one-hour soak (some 300 model turns, a few dozen tool responses, six or
        seven connections and resumes) meets the mid-turn error a few times and
        each of the others with a fair chance, while most conversations run
        clean. Raise them for a bad day (forum #167186: 0.8 per turn).
        """
        return cls(
            internal_error_mid_turn=0.01,
            not_found_after_tool_response=0.01,
            drop_before_first_handle=0.02,
            stale_handle_on_resume=0.02,
        )

    @property
    def any(self) -> bool:
        return any(getattr(self, f.name) > 0 for f in dataclasses.fields(self))


@dataclasses.dataclass(frozen=True, slots=True)
class EarlyDrop:
    """A connection drawn to end before its first handle: when, and how."""

    at_setup: bool  # right after setupComplete; else when the first handle would go out
    code: int  # 1011 or 1006


class FaultDice:
    """One connection's draws, from the emulator's shared generator."""

    def __init__(self, rates: FaultRates, rng: random.Random) -> None:
        self.rates = rates
        self._rng = rng

    def _hit(self, p: float) -> bool:
        return p > 0 and self._rng.random() < p

    def mid_turn(self, chunks: int) -> int | None:
        """The chunk (1-based) after which this model turn fails, or None."""
        if chunks < 1 or not self._hit(self.rates.internal_error_mid_turn):
            return None
        return self._rng.randint(1, chunks)

    def after_tool_response(self) -> bool:
        return self._hit(self.rates.not_found_after_tool_response)

    def early_drop(self) -> EarlyDrop | None:
        if not self._hit(self.rates.drop_before_first_handle):
            return None
        at_setup = self._rng.random() < 0.5
        return EarlyDrop(at_setup, 1011 if self._rng.random() < 0.5 else 1006)

    def stale_handle(self) -> bool:
        return self._hit(self.rates.stale_handle_on_resume)


@dataclasses.dataclass(slots=True)
class Outage:
    """What this backend cannot do now, as the service says it; switched on and
    off by a test while the emulator runs (every emulator is one backend: a key,
    a region).

    - `exhausted_keys`: keys whose quota is gone (`"*"`: every key). A connect
      with one is refused at the handshake with HTTP 429 RESOURCE_EXHAUSTED; a
      session already open with one closes with 1011 RESOURCE_EXHAUSTED when
      the model would next generate.
    - `down`: the backend is down. `"refuse"`: connections are refused (the
      port stops listening; open ones drop, 1006). `"unavailable"`: every
      setup, fresh or resuming, closes with 1011 "The service is currently
      unavailable." (open ones too).
    - `missing_models`: models (`models/NAME`) this region does not serve: a
      setup for one closes with 1008 "models/NAME is not found for API
      version ...", as for a name that never existed.
    """

    exhausted_keys: set[str] = dataclasses.field(default_factory=set)
    down: Literal["refuse", "unavailable"] | None = None
    missing_models: set[str] = dataclasses.field(default_factory=set)

    def quota_gone(self, key: str | None) -> bool:
        return bool(self.exhausted_keys) and ("*" in self.exhausted_keys or key in self.exhausted_keys)

    def serves(self, model: str) -> bool:
        return model not in self.missing_models
