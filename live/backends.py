"""Where a session may run: an ordered pool of backends, as configuration.

A backend is one place the Live API is served from with one credential: an AI
Studio key, or a Vertex AI project in a region (or any endpoint speaking the
same protocol, `base_url`), with the model names it serves there. A pool is
their order of preference: a session starts on the healthiest, and moves down
the pool when its backend fails in a way resumption cannot fix (quota, a
region down, a model not served there: `live.engine.failover`). Today's single
backend is a pool of one.

Secrets never live here: a backend names the environment variable that holds
its key (`api_key_env`), read when the server starts; a file that holds a key
is refused. Vertex AI uses Application Default Credentials.

In an agent::

    Agent(name="shop", model=MODEL, backends=BackendPool((
        Backend("studio-1", api_key_env="GEMINI_KEY_1"),
        Backend("vertex-eu", project="my-project", location="europe-west4",
                models=("gemini-live-2.5-flash-native-audio",)),
    )))

or in a TOML file (`live serve --backends FILE`, `BackendPool.load`)::

    [failover]
    allow_family_change = false

    [[backend]]
    name = "studio-1"
    api_key_env = "GEMINI_KEY_1"

    [[backend]]
    name = "vertex-eu"
    project = "my-project"
    location = "europe-west4"
    models = ["gemini-live-2.5-flash-native-audio"]

No I/O beyond reading the file and the environment.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from live.families import family_of

__all__ = ["Backend", "BackendPool", "FailoverPolicy", "PoolError", "Target"]

_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}")
_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Fields that would put a secret in the configuration: refused, with the way to do it.
_SECRET_FIELDS: Final = frozenset({"api_key", "key", "apikey", "token", "credentials", "secret"})


class PoolError(ValueError):
    """A pool that cannot be used as written; the message says what to change."""


@dataclasses.dataclass(frozen=True, slots=True)
class Backend:
    """One place a session may run.

    - `name`: how logs and metrics name it (letters, digits, `_.-`, up to 40).
    - `models`: the model names it serves, in order of preference (empty: the
      agent's model).
    - `api_key_env`: the environment variable holding its AI Studio key (none:
      GOOGLE_API_KEY, as without a pool).
    - `project`, `location`: a Vertex AI project and region instead.
    - `base_url`, `api_version`: another endpoint (a proxy, an emulator) and
      its API version.
    - `voice`: the voice to use here when the agent's is not one this
      backend's model family has (after a move to another family).
    - `connect_timeout`: seconds a connect may take here before the session
      moves on (default: the model's own, 15 s for Gemini).
    """

    name: str
    models: tuple[str, ...] = ()
    api_key_env: str | None = None
    project: str | None = None
    location: str | None = None
    base_url: str | None = None
    api_version: str | None = None
    voice: str | None = None
    connect_timeout: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise PoolError(
                f"backend name {self.name!r}: letters, digits, '_', '.' or '-', at most 40 "
                "(it labels metrics)"
            )
        models = (self.models,) if isinstance(self.models, str) else tuple(self.models)
        object.__setattr__(self, "models", models)
        for model in models:
            if not isinstance(model, str) or not model.strip():
                raise PoolError(f"backend {self.name!r}: model names are non-empty strings, not {model!r}")
        if len(set(models)) != len(models):
            raise PoolError(f"backend {self.name!r}: a model is listed twice")
        if self.api_key_env is not None and not _ENV_NAME.fullmatch(self.api_key_env):
            raise PoolError(
                f"backend {self.name!r}: api_key_env names an environment variable "
                f"(e.g. GEMINI_KEY_1), not {self.api_key_env[:3]!r}..."  # never echo what may be a key
            )
        if (self.project is None) != (self.location is None):
            raise PoolError(f"backend {self.name!r}: Vertex AI needs both project and location")
        if self.project is not None and self.api_key_env is not None:
            raise PoolError(f"backend {self.name!r}: either a Vertex project or an AI Studio key, not both")
        if self.connect_timeout is not None and not (0 < self.connect_timeout < math.inf):
            raise PoolError(f"backend {self.name!r}: connect_timeout is a positive number of seconds")

    @property
    def kind(self) -> str:
        """`vertex` or `ai-studio`."""
        return "vertex" if self.project is not None else "ai-studio"

    def api_key(self) -> str | None:
        """Its key, read from the environment now (None: no `api_key_env`).

        Raises `PoolError` naming the variable (never its value) when it is unset.
        """
        if self.api_key_env is None:
            return None
        value = (os.environ.get(self.api_key_env) or "").strip()
        if not value:
            raise PoolError(f"the environment variable {self.api_key_env} (its key) is not set")
        return value

    def __repr__(self) -> str:
        where = f"{self.project}/{self.location}" if self.project else f"key from ${self.api_key_env or 'GOOGLE_API_KEY'}"
        return f"Backend({self.name!r}, {where}, models={list(self.models)!r})"


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
    """A backend and one model it serves: where one model connection goes."""

    backend: Backend
    model: str

    @property
    def name(self) -> str:
        return self.backend.name

    @property
    def model_key(self) -> str:
        """What a breaker for this model at this backend is called."""
        return f"{self.backend.name}/{self.model.removeprefix('models/')}"

    def __str__(self) -> str:
        return f"{self.backend.name} ({self.model})"


@dataclasses.dataclass(frozen=True, slots=True)
class FailoverPolicy:
    """When a session moves, and how the pool learns a backend is unwell.

    - `allow_family_change`: the pool may hold models of several families
      (`live.families`); a session then moves across them, its history, tools
      and voice fitted to the new one. Off, every model must be of one family.
    - `retries_here`: reconnects that failed on one backend (1011 on every
      resume, a drop after a drop) before the session moves to the next.
    - `breaker_failures`: failures in a row, fleet-wide, that open a backend's
      breaker (new sessions start elsewhere; one probe after the cooldown).
      Quota, a refused key and a missing model open it at once.
    - `breaker_cooldown`: seconds a breaker stays open before a probe.
    - `model_missing_cooldown`: seconds a model found missing at a backend is
      not tried there again.
    """

    allow_family_change: bool = False
    retries_here: int = 2
    breaker_failures: int = 3
    breaker_cooldown: float = 30.0
    model_missing_cooldown: float = 600.0

    def __post_init__(self) -> None:
        for name in ("retries_here", "breaker_failures"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PoolError(f"failover {name} is a whole number, 1 or more, not {value!r}")
        for name in ("breaker_cooldown", "model_missing_cooldown"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise PoolError(f"failover {name} is a positive number of seconds, not {value!r}")
        if not isinstance(self.allow_family_change, bool):
            raise PoolError("failover allow_family_change is true or false")


@dataclasses.dataclass(frozen=True, slots=True)
class BackendPool:
    """Backends in order of preference, and the failover policy."""

    backends: tuple[Backend, ...]
    failover: FailoverPolicy = FailoverPolicy()

    def __post_init__(self) -> None:
        backends = tuple(self.backends)
        object.__setattr__(self, "backends", backends)
        if not backends:
            raise PoolError("a pool needs at least one backend")
        names = [b.name for b in backends]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise PoolError(f"backend names must be unique: {', '.join(twice)}")

    def targets(self, default_model: str) -> tuple[Target, ...]:
        """Every (backend, model), in order of preference; raises `PoolError`
        when models of several families meet without `allow_family_change`."""
        targets = tuple(
            Target(backend, model) for backend in self.backends for model in (backend.models or (default_model,))
        )
        if not self.failover.allow_family_change:
            first = family_of(targets[0].model).name
            for target in targets[1:]:
                family = family_of(target.model).name
                if family != first:
                    raise PoolError(
                        f"backend {target.name!r} serves {target.model} ({family}); the pool's first model is "
                        f"{targets[0].model} ({first}): a move would change the model family. Set "
                        "allow_family_change = true under [failover], or keep one family"
                    )
        return targets

    # ------------------------------------------------------------------ files

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> BackendPool:
        """The pool a TOML file describes; `PoolError` names what is wrong."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise PoolError(f"{path}: {exc.strerror or exc}") from None
        return cls.parse(text, source=str(path))

    @classmethod
    def parse(cls, text: str, *, source: str = "backends") -> BackendPool:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise PoolError(f"{source}: not TOML: {exc}") from None
        try:
            return cls.from_mapping(data)
        except PoolError as exc:
            raise PoolError(f"{source}: {exc}") from None

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> BackendPool:
        unknown = sorted(set(data) - {"backend", "failover"})
        if unknown:
            raise PoolError(f"unknown table(s) {', '.join(unknown)}: a pool has [failover] and [[backend]]")
        entries = data.get("backend")
        if not isinstance(entries, list) or not entries:
            raise PoolError("no [[backend]] entries")
        backends = tuple(_backend(entry, index) for index, entry in enumerate(entries, start=1))
        failover = data.get("failover", {})
        if not isinstance(failover, Mapping):
            raise PoolError("[failover] is a table")
        known = {f.name for f in dataclasses.fields(FailoverPolicy)}
        unknown = sorted(set(failover) - known)
        if unknown:
            raise PoolError(f"[failover] has no {', '.join(unknown)} (it takes {', '.join(sorted(known))})")
        return cls(backends, FailoverPolicy(**failover))


def _backend(entry: Any, index: int) -> Backend:
    if not isinstance(entry, Mapping):
        raise PoolError(f"backend {index} is not a table")
    secret = sorted(k for k in entry if k.lower() in _SECRET_FIELDS)
    if secret:
        raise PoolError(
            f"backend {index} has {', '.join(secret)}: a secret never goes in this file; put the key in an "
            "environment variable and name it with api_key_env (Vertex: Application Default Credentials)"
        )
    known = {f.name for f in dataclasses.fields(Backend)}
    unknown = sorted(set(entry) - known)
    if unknown:
        raise PoolError(f"backend {index} has no {', '.join(unknown)} (it takes {', '.join(sorted(known))})")
    if "name" not in entry:
        raise PoolError(f"backend {index} has no name")
    fields = dict(entry)
    models = fields.get("models", ())
    if isinstance(models, str) or not isinstance(models, Sequence):
        raise PoolError(f"backend {index}: models is a list of model names")
    fields["models"] = tuple(models)
    for name in ("name", "api_key_env", "project", "location", "base_url", "api_version", "voice"):
        if name in fields and not isinstance(fields[name], str):
            raise PoolError(f"backend {index}: {name} is a string")
    timeout = fields.get("connect_timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))):
        raise PoolError(f"backend {index}: connect_timeout is a number of seconds")
    return Backend(**fields)
