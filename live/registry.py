"""Model names to model instances, through regular-expression patterns.

Unlike ADK's registry, where two matching patterns make the winner unspecified,
a name matching two patterns is an `AmbiguousModelError`, and a name matching
none is an `UnknownModelError` listing what is registered. `resolve_all` checks
every configured name at start-up, so a typo fails at boot rather than on the
first call.

A model on a backend of a pool (`live.backends`: another key, a Vertex
project and region, another endpoint) comes from a pattern's `placed`
factory, `placed(model, backend)`: `resolve_at` makes one instance per backend
and name. `local/*` models have none: they run here, not on a backend.
"""

from __future__ import annotations

import importlib
import re
import threading
from collections.abc import Callable, Iterable

from live.backends import Backend
from live.errors import AmbiguousModelError, UnknownModelError
from live.llm import BaseLlm

__all__ = ["LlmFactory", "LlmRegistry", "PlacedFactory", "default_registry"]

LlmFactory = Callable[[str], BaseLlm]
PlacedFactory = Callable[[str, Backend], BaseLlm]


def _lazy(target: str) -> Callable[..., BaseLlm]:
    """A factory for `module:Class` (or `module:Class.method`), imported on first use.

    Keeps `live` free of import-time dependencies on `connections`.
    """

    def factory(*args: object) -> BaseLlm:
        module_name, _, attr = target.partition(":")
        found: object = importlib.import_module(module_name)
        for name in attr.split("."):
            found = getattr(found, name)
        return found(*args)  # type: ignore[operator,no-any-return]

    factory.__qualname__ = f"lazy({target})"
    return factory


class LlmRegistry:
    """Patterns (matched against the whole name) to factories; one instance per name.

    Thread-safe; instances are created once and shared by every caller.
    """

    def __init__(self) -> None:
        self._factories: dict[str, tuple[re.Pattern[str], LlmFactory]] = {}
        self._placed: dict[str, PlacedFactory] = {}
        self._instances: dict[str, BaseLlm] = {}
        self._placed_instances: dict[tuple[str, str], BaseLlm] = {}
        self._lock = threading.Lock()

    def register(
        self, pattern: str, factory: LlmFactory, *, replace: bool = False, placed: PlacedFactory | None = None
    ) -> None:
        """Serve names matching `pattern` (a full match) with `factory(name)`,
        and on a backend of a pool with `placed(name, backend)` (None: such
        models run on no backend).

        Registering a pattern that is already registered raises `ValueError`
        unless `replace=True`, which also forgets instances it had created.
        """
        compiled = re.compile(pattern)
        with self._lock:
            if pattern in self._factories and not replace:
                raise ValueError(
                    f"pattern {pattern!r} is already registered; "
                    "pass replace=True to replace it"
                )
            self._factories[pattern] = (compiled, factory)
            self._placed.pop(pattern, None)
            if placed is not None:
                self._placed[pattern] = placed
            for name in [n for n in self._instances if compiled.fullmatch(n)]:
                del self._instances[name]
            for key in [k for k in self._placed_instances if compiled.fullmatch(k[1])]:
                del self._placed_instances[key]

    @property
    def patterns(self) -> list[str]:
        """The registered patterns, in registration order."""
        with self._lock:
            return list(self._factories)

    def _pattern_for(self, model: str) -> str:
        matches = [
            (pattern, factory)
            for pattern, (compiled, factory) in self._factories.items()
            if compiled.fullmatch(model)
        ]
        if not matches:
            registered = ", ".join(repr(p) for p in self._factories) or "nothing"
            raise UnknownModelError(
                f"no model registered for {model!r}; registered patterns: {registered}"
            )
        if len(matches) > 1:
            names = ", ".join(repr(p) for p, _ in matches)
            raise AmbiguousModelError(
                f"model {model!r} matches more than one registered pattern: {names}; "
                "make the patterns disjoint"
            )
        return matches[0][0]

    def _factory_for(self, model: str) -> LlmFactory:
        return self._factories[self._pattern_for(model)][1]

    def resolve(self, model: str) -> BaseLlm:
        """The shared instance for `model`, created on first use."""
        with self._lock:
            instance = self._instances.get(model)
            if instance is None:
                instance = self._factory_for(model)(model)
                self._instances[model] = instance
            return instance

    def resolve_at(self, model: str, backend: Backend) -> BaseLlm:
        """The shared instance for `model` on `backend`, created on first use.

        Raises `UnknownModelError` for a name that runs on no backend.
        """
        with self._lock:
            key = (backend.name, model)
            instance = self._placed_instances.get(key)
            if instance is None:
                pattern = self._pattern_for(model)
                placed = self._placed.get(pattern)
                if placed is None:
                    raise UnknownModelError(
                        f"{model!r} runs here, not on a backend: a pool's models are Gemini models"
                    )
                instance = placed(model, backend)
                self._placed_instances[key] = instance
            return instance

    def resolve_all(self, models: Iterable[str]) -> dict[str, BaseLlm]:
        """Resolve every name now; raises on the first name that cannot be served."""
        return {model: self.resolve(model) for model in models}


def default_registry() -> LlmRegistry:
    """A registry serving `gemini-.*` through Gemini, `local/echo` and `local/voice` locally."""
    registry = LlmRegistry()
    registry.register(
        r"gemini-.*", _lazy("connections.gemini:Gemini"), placed=_lazy("connections.gemini:Gemini.at_backend")
    )
    registry.register(r"local/echo", _lazy("connections.local_echo:LocalEcho"))
    registry.register(r"local/voice", _lazy("connections.local_voice:LocalVoice"))
    return registry
