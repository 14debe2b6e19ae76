"""A `genai.Client` pointed at an emulator, without touching os.environ.

The SDK reads `SSL_CERT_FILE` once, when the client is built; passing the
emulator's SSL context through `HttpOptions.async_client_args["ssl"]` is the
SDK's own in-code way and keeps parallel tests independent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from google import genai
from google.genai import types

if TYPE_CHECKING:
    from connections.emulator.server import Emulator

__all__ = ["emulator_client", "emulator_http_options"]


def emulator_http_options(emulator: Emulator, api_version: str = "v1beta") -> types.HttpOptions:
    """HttpOptions with the emulator's base URL, `api_version` and trust."""
    return types.HttpOptions(
        base_url=emulator.base_url,
        api_version=api_version,
        async_client_args={"ssl": emulator.ssl_context()},
    )


def emulator_client(
    emulator: Emulator,
    *,
    api_version: str = "v1beta",
    api_key: str | None = None,
) -> genai.Client:
    """A Gemini API (not Vertex) client for `emulator`, with a key it accepts."""
    return genai.Client(
        vertexai=False,
        api_key=api_key or emulator.api_key,
        http_options=emulator_http_options(emulator, api_version),
    )
