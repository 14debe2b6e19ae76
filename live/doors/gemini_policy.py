"""What the server lets a Live API app ask, from the operator's policy file.

`live serve --gemini-endpoint --gemini-policy policy.toml`:

    # Model names an app may give in its setup (fnmatch, without "models/").
    models = ["gemini-*-live-*"]
    # Said to the model before the app's own instruction (after the agent's).
    instruction = "Never give medical or legal advice."
    # The app's function declarations with these names (fnmatch) are not declared;
    # case, and `-` `.` `:` against `_`, make no difference.
    remove_tools = ["delete_*", "transfer_money"]
    # The kinds of tools the service runs itself an app may declare
    # (google_search, code_execution, url_context, google_maps, ...; by
    # default all of them); the others are removed.
    builtin_tools = ["google_search"]

Every key is optional. What the policy removes is removed quietly, as the
app's setup is read; a model it does not allow is the service's "not found".

Function names are case-sensitive to the API, but not to the model that reads
them: `Transfer-Money` is the tool `transfer_money` to it. So `remove_tools`
compares names as the model reads them (`name_key`): case, and the separators
a name may hold (`-`, `.`, `:`) against `_`, make no difference. A name the
API would refuse (spaces, other characters) never gets this far: the endpoint
refuses it as the service does (`valid_function_name`).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["BUILTIN_TOOL_KINDS", "GeminiPolicy", "PolicyError", "name_key", "valid_function_name"]

# The kinds of tools the service runs itself (google-genai's Tool fields other
# than function declarations): the Gemini API's, and Vertex AI's own.
BUILTIN_TOOL_KINDS = (
    "google_search", "code_execution", "url_context", "google_search_retrieval", "google_maps",
    "computer_use", "file_search", "mcp_servers", "retrieval", "enterprise_web_search",
    "parallel_ai_search", "exa_ai_search",
)
# The API's rule for a function's name (google-genai's FunctionDeclaration.name):
# "Must start with a letter or an underscore. Must be a-z, A-Z, 0-9, or contain
# underscores, dots, colons and dashes, with a maximum length of 128."
_FUNCTION_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]{0,127}")
_SEPARATORS = str.maketrans("-.:", "___")


class PolicyError(ValueError):
    """A policy file that cannot be used; the message says where and why."""


@dataclasses.dataclass(frozen=True)
class GeminiPolicy:
    """The operator's rules for Live API apps (see the module's docstring)."""

    models: tuple[str, ...] = ()
    instruction: str | None = None
    remove_tools: tuple[str, ...] = ()
    builtin_tools: tuple[str, ...] = BUILTIN_TOOL_KINDS

    def allows_model(self, name: str) -> bool:
        """`name` without "models/"."""
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.models)

    def keeps_function(self, name: str) -> bool:
        """Whether an app's function `name` is declared to the model (see `name_key`)."""
        key = name_key(name)
        return not any(fnmatch.fnmatchcase(key, _pattern_key(pattern)) for pattern in self.remove_tools)

    def keeps_builtin(self, kind: str) -> bool:
        return kind in self.builtin_tools

    def with_models(self, models: Iterable[str]) -> GeminiPolicy:
        return dataclasses.replace(self, models=(*self.models, *models))

    @classmethod
    def load(cls, path: str | Path) -> GeminiPolicy:
        try:
            with open(path, "rb") as file:
                table = tomllib.load(file)
        except OSError as exc:
            raise PolicyError(f"{path}: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise PolicyError(f"{path}: not TOML: {exc}") from None
        return cls.from_table(table, str(path))

    @classmethod
    def from_table(cls, table: dict[str, Any], where: str = "the policy") -> GeminiPolicy:
        unknown = set(table) - {"models", "instruction", "remove_tools", "builtin_tools"}
        if unknown:
            raise PolicyError(f"{where}: unknown key {sorted(unknown)[0]!r} (known: models, instruction, remove_tools, builtin_tools)")
        instruction = table.get("instruction")
        if instruction is not None and (not isinstance(instruction, str) or not instruction.strip()):
            raise PolicyError(f"{where}: instruction must be text")
        builtin = _names(table, "builtin_tools", where, default=BUILTIN_TOOL_KINDS)
        strange = [kind for kind in builtin if kind not in BUILTIN_TOOL_KINDS]
        if strange:
            raise PolicyError(f"{where}: builtin_tools: {strange[0]!r} is not one of {', '.join(BUILTIN_TOOL_KINDS)}")
        models = tuple(name.removeprefix("models/") for name in _names(table, "models", where))
        return cls(
            models=models,
            instruction=instruction,
            remove_tools=_names(table, "remove_tools", where),
            builtin_tools=builtin,
        )


def _names(table: dict[str, Any], key: str, where: str, default: tuple[str, ...] = ()) -> tuple[str, ...]:
    value = table.get(key)
    if value is None:
        return default
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise PolicyError(f"{where}: {key} must be a list of names, e.g. {key} = [\"a\", \"b*\"]")
    return tuple(value)


def valid_function_name(name: object) -> bool:
    """A function's name the API accepts (`_FUNCTION_NAME`)."""
    return isinstance(name, str) and _FUNCTION_NAME.fullmatch(name) is not None


def name_key(name: str) -> str:
    """A function's name as the model reads it: lower case, `-` `.` `:` as `_`."""
    return name.strip().lower().translate(_SEPARATORS)


def _pattern_key(pattern: str) -> str:
    """An fnmatch pattern of names, as `name_key` reads names (a `[...]` set
    keeps its separators, so that a range such as `[a-c]` stays one)."""
    out = []
    in_set = False
    for char in pattern.strip().lower():
        if char == "[" and not in_set:
            in_set = True
        elif char == "]" and in_set:
            in_set = False
        elif not in_set:
            char = char.translate(_SEPARATORS)
        out.append(char)
    return "".join(out)
