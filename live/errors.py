"""Errors a caller can act on.

A live connection ends in one of a few ways, and each asks for a different
reaction. The classes say which, so callers branch on type, never on message text:

- normal end (close code 1000, also after go-away): not an error at all;
- `RecoverableConnectionError` (1006, 1011, a stall): reconnect, ideally with a
  session-resumption handle;
- `InvalidArgumentError` (1007): the request or context was rejected; replaying
  the same context fails again;
- `ConfigurationError` (1008): model, API version, key or policy; retrying is
  pointless until the configuration changes. `hint` names the likely cause;
- `QuotaExhaustedError` (1011 RESOURCE_EXHAUSTED, 429): too many sessions or
  tokens; retry later, not now.

Two of them say more, for a caller that can go elsewhere (another key, region
or model: `live.backends`): `ModelUnavailableError`, a `ConfigurationError`
for a model this endpoint does not serve (retired, or not in this region), and
`UnreachableError`, a `RecoverableConnectionError` for an endpoint that could
not be reached or did not answer the connect in time.
"""

from __future__ import annotations

__all__ = [
    "AmbiguousModelError",
    "ConfigurationError",
    "ConnectionClosedError",
    "InvalidArgumentError",
    "LiveError",
    "ModelUnavailableError",
    "QuotaExhaustedError",
    "RecoverableConnectionError",
    "UnknownModelError",
    "UnreachableError",
]


class LiveError(Exception):
    """Base of every error raised by a live connection.

    `close_code` is the WebSocket close code when one caused the error,
    `recoverable` says whether reconnecting (with a resumption handle) may help,
    and `hint` is a sentence a person can act on, or None.
    """

    recoverable: bool = False

    def __init__(
        self,
        message: str,
        *,
        close_code: int | None = None,
        hint: str | None = None,
    ) -> None:
        self.message = message
        self.close_code = close_code
        self.hint = hint
        text = message if close_code is None else f"[{close_code}] {message}"
        if hint:
            text = f"{text} (hint: {hint})"
        super().__init__(text)


class RecoverableConnectionError(LiveError):
    """The connection dropped (1006, 1011) or stalled; reconnecting may help."""

    recoverable = True


class UnreachableError(RecoverableConnectionError):
    """The endpoint could not be reached (refused, no route) or did not answer
    the connect in time: nothing of the conversation is there."""


class InvalidArgumentError(LiveError):
    """The server rejected the request or context (1007); do not replay it as is."""


class ConfigurationError(LiveError):
    """Wrong model, API version, key or a policy violation (1008); fix, then retry."""


class ModelUnavailableError(ConfigurationError):
    """The endpoint does not serve this model (retired, not yet, or not in this
    region): 1008 "models/NAME is not found for API version ..."."""


class QuotaExhaustedError(LiveError):
    """Quota or concurrent-session limit reached (1011 RESOURCE_EXHAUSTED, 429)."""


class ConnectionClosedError(LiveError):
    """A send or receive on a connection that has already ended.

    `cause` is how the connection ended, classified as `receive()` classifies
    it (a `RecoverableConnectionError` for 1006/1011, say), or None for a normal
    close or one of our own: what a caller does must not depend on whether a
    send or the receive saw the close first.
    """

    def __init__(
        self,
        message: str,
        *,
        close_code: int | None = None,
        hint: str | None = None,
        cause: LiveError | None = None,
    ) -> None:
        super().__init__(message, close_code=close_code, hint=hint)
        self.cause = cause


class UnknownModelError(LookupError):
    """No registered pattern matches the model name."""


class AmbiguousModelError(LookupError):
    """More than one registered pattern matches the model name."""
