"""Our `Gemini` pointed at a running Live emulator, over the SDK path and TLS."""

from __future__ import annotations

from typing import Any

from connections.emulator import Emulator
from connections.gemini import Gemini

MODEL = "gemini-live-2.5-flash-preview"


def gemini_for(emulator: Emulator, model: str = MODEL, *, api_key: str | None = None, **kwargs: Any) -> Gemini:
    """A `Gemini` that talks to `emulator` (its key unless `api_key`, its CA, the documented API version)."""
    return Gemini(
        model,
        api_key=api_key or emulator.api_key,
        base_url=emulator.base_url,
        api_version="v1beta",
        ssl_context=emulator.ssl_context(),
        **kwargs,
    )
