"""Live, bidirectional audio sessions with an AI agent.

What a program calls: `Agent` and `tool` (an agent and its tools), `LiveServer`
and `ServerConfig` (serving it from your own program), the contract
(`BaseLlm`, `BaseLlmConnection`, `LlmRequest`, `LlmResponse`), the model
registry and the errors a caller can act on. The command line is `live`.

`LiveServer` and `ServerConfig` are imported when first named
(`live.LiveServer`, `from live import LiveServer`): `import live` alone loads
the contract and the agent, not the server.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from live.agent import Agent, Clip, HoldSound, MuteUser, Say, Silence, TimeLimit, end_session, play_must_hear, tool
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

if TYPE_CHECKING:
    from live.server.config import ServerConfig
    from live.server.port import LiveServer

# Names offered here whose modules load on first use: the server's, which
# `import live` for an agent or a model implementation does not need.
_LAZY = {"LiveServer": "live.server.port", "ServerConfig": "live.server.config"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'live' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})

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
    "Backend",
    "BackendPool",
    "BaseLlm",
    "BaseLlmConnection",
    "ConfigurationError",
    "ConnectionClosedError",
    "FailoverPolicy",
    "InvalidArgumentError",
    "LiveError",
    "LiveServer",
    "LlmFactory",
    "LlmRegistry",
    "LlmRequest",
    "LlmResponse",
    "ModelUnavailableError",
    "QuotaExhaustedError",
    "RealtimeInput",
    "RecoverableConnectionError",
    "ServerConfig",
    "UnknownModelError",
    "UnreachableError",
    "default_registry",
]
