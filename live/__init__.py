"""Live, bidirectional audio sessions with an AI agent.

The contract (`BaseLlm`, `BaseLlmConnection`, `LlmRequest`, `LlmResponse`), the
model registry, the errors a caller can act on, and `Agent`. The server is
`live.server.port.LiveServer`; the command line is `live`.
"""

from live.agent import Agent, Clip, HoldSound, MuteUser, Say, Silence, TimeLimit, end_session, play_must_hear, tool
from live.errors import (
    AmbiguousModelError,
    ConfigurationError,
    ConnectionClosedError,
    InvalidArgumentError,
    LiveError,
    QuotaExhaustedError,
    RecoverableConnectionError,
    UnknownModelError,
)
from live.llm import (
    AUDIO_STREAM_END,
    AudioStreamEnd,
    BaseLlm,
    BaseLlmConnection,
    LlmRequest,
    LlmResponse,
    RealtimeInput,
)
from live.registry import LlmFactory, LlmRegistry, default_registry

__all__ = [
    "AUDIO_STREAM_END",
    "Agent",
    "Clip",
    "HoldSound",
    "MuteUser",
    "Say",
    "Silence",
    "TimeLimit",
    "end_session",
    "play_must_hear",
    "tool",
    "AmbiguousModelError",
    "AudioStreamEnd",
    "BaseLlm",
    "BaseLlmConnection",
    "ConfigurationError",
    "ConnectionClosedError",
    "InvalidArgumentError",
    "LiveError",
    "LlmFactory",
    "LlmRegistry",
    "LlmRequest",
    "LlmResponse",
    "QuotaExhaustedError",
    "RealtimeInput",
    "RecoverableConnectionError",
    "UnknownModelError",
    "default_registry",
]
