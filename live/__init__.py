"""Live, bidirectional audio sessions with an AI agent.

The contract (`BaseLlm`, `BaseLlmConnection`, `LlmRequest`, `LlmResponse`), the
model registry, the errors a caller can act on, and `Agent`. The server is
`live.server.port.LiveServer`; the command line is `live`.
"""

from live.agent import Agent, tool
from live.backends import Backend, BackendPool, FailoverPolicy
from live.errors import (
    AmbiguousModelError,
    ConfigurationError,
    ConnectionClosedError,
    InvalidArgumentError,
    LiveError,
    ModelUnavailableError,
    QuotaExhaustedError,
    RecoverableConnectionError,
    UnknownModelError,
    UnreachableError,
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
    "tool",
    "AmbiguousModelError",
    "AudioStreamEnd",
    "Backend",
    "BackendPool",
    "BaseLlm",
    "BaseLlmConnection",
    "ConfigurationError",
    "ConnectionClosedError",
    "FailoverPolicy",
    "InvalidArgumentError",
    "LiveError",
    "LlmFactory",
    "LlmRegistry",
    "LlmRequest",
    "LlmResponse",
    "ModelUnavailableError",
    "QuotaExhaustedError",
    "RealtimeInput",
    "RecoverableConnectionError",
    "UnknownModelError",
    "UnreachableError",
    "default_registry",
]
