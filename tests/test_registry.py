"""Model names to instances: what a misconfigured deployment sees, at boot."""

from __future__ import annotations

import pytest

from connections.gemini import Gemini
from live import (
    AmbiguousModelError,
    BaseLlm,
    ConfigurationError,
    LlmRegistry,
    UnknownModelError,
    default_registry,
)


class Fake(BaseLlm):
    made = 0

    def __init__(self, model: str) -> None:
        super().__init__(model)
        Fake.made += 1

    def connect(self, request):  # type: ignore[no-untyped-def]
        raise NotImplementedError


@pytest.fixture(autouse=True)
def no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GOOGLE_API_KEY", "GEMINI_API_KEY", "GOOGLE_GENAI_USE_VERTEXAI"):
        monkeypatch.delenv(name, raising=False)


def test_unknown_name_lists_what_is_registered() -> None:
    registry = LlmRegistry()
    registry.register(r"fake-.*", Fake)
    registry.register(r"other/\w+", Fake)
    with pytest.raises(UnknownModelError) as info:
        registry.resolve("gpt-4o")
    message = str(info.value)
    assert "'gpt-4o'" in message and "'fake-.*'" in message and r"'other/\\w+'" in message


def test_ambiguous_name_is_an_error_not_a_coin_toss() -> None:
    registry = LlmRegistry()
    registry.register(r"gemini-.*", Fake)
    registry.register(r"gemini-2\..*", Fake)
    with pytest.raises(AmbiguousModelError, match="more than one"):
        registry.resolve("gemini-2.5-flash")
    assert isinstance(registry.resolve("gemini-3-pro"), Fake)


def test_one_cached_instance_per_name() -> None:
    registry = LlmRegistry()
    registry.register(r"fake-.*", Fake)
    before = Fake.made
    a, b, c = registry.resolve("fake-a"), registry.resolve("fake-a"), registry.resolve("fake-b")
    assert a is b and a is not c
    assert Fake.made - before == 2
    with pytest.raises(ValueError, match="already registered"):
        registry.register(r"fake-.*", Fake)
    registry.register(r"fake-.*", Fake, replace=True)
    assert registry.resolve("fake-a") is not a  # replacing forgets what the old factory made


def test_resolve_all_fails_at_boot_without_a_key() -> None:
    registry = default_registry()
    with pytest.raises(ConfigurationError, match="GOOGLE_API_KEY"):
        registry.resolve_all(["gemini-2.5-flash-native-audio-preview-09-2025"])
    with pytest.raises(UnknownModelError):
        registry.resolve_all(["gemni-2.5-flash"])  # a typo fails at boot too


def test_default_registry_serves_gemini_names_with_one_shared_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GOOGLE_API_KEY", "env-key")
    registry = default_registry()
    assert r"gemini-.*" in registry.patterns
    resolved = registry.resolve_all(["gemini-2.5-flash", "gemini-3.1-flash-live-preview"])
    llm = resolved["gemini-2.5-flash"]
    assert isinstance(llm, Gemini) and llm.backend == "gemini-api"
    assert registry.resolve("gemini-2.5-flash") is llm
    assert llm.client is registry.resolve("gemini-2.5-flash").client
    assert "env-key" not in repr(llm)
