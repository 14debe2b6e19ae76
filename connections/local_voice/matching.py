"""How `local/voice` turns what it heard into a reply: simple, documented word matching.

No language model: a few rules a user can predict.

- **Which tool.** A tool's *keywords* are the words of its name, less the
  generic verbs in `GENERIC_NAME_WORDS` (`get_weather` -> `weather`,
  `cancel_order` -> `cancel order`). A tool is named when every keyword is in
  the sentence (a trailing "s" is ignored: "orders" names `order`). When
  several are named, the one with most keywords wins, then the first declared.
- **Its arguments**, from the declaration's parameter schema:
  - an `enum` parameter takes the first of its values found in the sentence;
  - an integer or number parameter takes the first number said ("three", "3");
  - the first string parameter takes a name the agent knows (`known_values`:
    enum values and capitalised names in the tools' descriptions and the
    instruction) said anywhere in the sentence; failing that, the words after
    the parameter's own name ("order 1234"), after a preposition ("in", "for",
    "at", "of", "about", "named", "called", "from", "to"), or after the tool's
    keyword, up to a word that ends a name (`_STOP`), in title case:
    "weather in sao paulo today" -> `city="Sao Paulo"`.
  A tool whose required parameters are not all found is not called: the reply
  then says what it heard and which argument it missed.
- **The reply** is "You said: <sentence>." without a tool, and the tool's
  result read back after one (`describe_result`). A typed turn that asks it
  to say exactly some quoted words (`... say exactly these words: "Hello."`,
  as the server's conversation policies do) is answered with those words.

Everything here is pure functions over strings and declarations.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from google.genai import types

__all__ = [
    "GENERIC_NAME_WORDS",
    "SLOT_LEAD",
    "SLOT_TAIL",
    "ToolMatch",
    "corpus_for",
    "example_phrases",
    "known_values",
    "describe_result",
    "keywords",
    "match_tool",
    "number_words",
    "reply_to",
    "same_word",
    "words",
    "words_to_say",
]

GENERIC_NAME_WORDS = frozenset(
    {"get", "set", "show", "list", "find", "fetch", "lookup", "look", "up", "do", "make", "run", "query", "check"}
)

_PREPOSITIONS = ("in", "for", "at", "of", "about", "named", "called", "from", "to")
SLOT_LEAD = (*_PREPOSITIONS, "the", "a")
"""Words heard before a tool's argument ("weather *in the* ...")."""
SLOT_TAIL = ("today", "tonight", "tomorrow", "now", "please")
"""Words heard after it ("... Paris *today*")."""
_STOP = frozenset(
    {
        "today", "tonight", "tomorrow", "now", "please", "right", "this", "next", "for", "in", "on",
        "at", "and", "the", "a", "an", "like", "is", "be", "will", "days", "day", "weather",
        "forecast", "over", "during", "thanks", "thank",
    }
)
_NUMBERS = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13,
    "fourteen": 14, "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18,
    "nineteen": 19, "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60,
    "seventy": 70, "eighty": 80, "ninety": 90, "hundred": 100,
}


def number_words() -> Iterable[str]:
    return _NUMBERS.keys()


def words(text: str) -> list[str]:
    """Lower-case words of `text`, apostrophes kept ("what's"), punctuation dropped."""
    return re.findall(r"[a-z0-9]+(?:'[a-z]+)?", text.lower())


def keywords(tool_name: str) -> list[str]:
    """The words of a tool's name that say what it is about (see the module docstring)."""
    parts = [w for w in re.split(r"[_\W]+|(?<=[a-z])(?=[A-Z])", tool_name) if w]
    named = [w.lower() for w in parts if w.lower() not in GENERIC_NAME_WORDS]
    return named or [w.lower() for w in parts]


@dataclasses.dataclass(frozen=True, slots=True)
class ToolMatch:
    """A tool named in a sentence: the call to make, or what was missing for it."""

    name: str
    args: dict[str, Any]
    missing: tuple[str, ...] = ()


def same_word(word: str, keyword: str) -> bool:
    """`word` is `keyword`, a trailing "s" aside ("orders" for `order`)."""
    return word == keyword or word.rstrip("s") == keyword.rstrip("s")


def _schema(decl: types.FunctionDeclaration) -> tuple[dict[str, types.Schema], list[str]]:
    params = decl.parameters
    if params is None or not params.properties:
        return {}, []
    return dict(params.properties), list(params.required or [])


def _type_name(schema: types.Schema) -> str:
    t = schema.type
    return (t.value if isinstance(t, types.Type) else str(t or "")).upper()


def _first_number(ws: Sequence[str]) -> int | None:
    for i, w in enumerate(ws):
        if w.isdigit():
            return int(w)
        if w in _NUMBERS:
            value = _NUMBERS[w]
            nxt = ws[i + 1] if i + 1 < len(ws) else ""
            if 20 <= value < 100 and nxt in _NUMBERS and _NUMBERS[nxt] < 10:
                value += _NUMBERS[nxt]
            return value
    return None


def _phrase_after(ws: Sequence[str], markers: Iterable[str], skip: frozenset[str]) -> str | None:
    markers = tuple(markers)
    for i, w in enumerate(ws):
        if w not in markers:
            continue
        taken: list[str] = []
        for nxt in ws[i + 1 :]:
            if nxt in ("the", "a", "an") and not taken:
                continue
            if nxt in _STOP or nxt in skip or nxt in _NUMBERS:
                break
            taken.append(nxt)
        if taken:
            return " ".join(t if t.isdigit() else t.title() for t in taken)
    return None


def _known_value(ws: Sequence[str], values: Sequence[str]) -> str | None:
    joined = f" {' '.join(ws)} "
    for value in values:
        if f" {' '.join(words(value))} " in joined:
            return value
    return None


def _arguments(
    decl: types.FunctionDeclaration, ws: list[str], kws: list[str], values: Sequence[str]
) -> ToolMatch:
    properties, required = _schema(decl)
    args: dict[str, Any] = {}
    text_taken = False
    skip = frozenset(kws)
    for name, schema in properties.items():
        kind = _type_name(schema)
        if schema.enum:
            joined = " ".join(ws)
            for value in schema.enum:
                if " ".join(words(value)) and f" {' '.join(words(value))} " in f" {joined} ":
                    args[name] = value
                    break
        elif kind in ("INTEGER", "NUMBER"):
            value = _first_number(ws)
            if value is not None:
                args[name] = value
        elif kind == "STRING" and not text_taken:
            own = words(name.replace("_", " "))
            phrase = _known_value(ws, values)
            phrase = phrase or (_phrase_after(ws, own[-1:], skip) if own else None)
            phrase = phrase or _phrase_after(ws, _PREPOSITIONS, skip)
            phrase = phrase or _phrase_after(ws, kws[-1:], frozenset())
            if phrase:
                args[name] = phrase
                text_taken = True
    missing = tuple(r for r in required if r not in args)
    return ToolMatch(decl.name or "", args, missing)


def match_tool(
    text: str, declarations: Sequence[types.FunctionDeclaration], values: Sequence[str] = ()
) -> ToolMatch | None:
    """The tool `text` names, with the arguments found in it, or None.

    `values` are the names the agent knows (`known_values`): one said anywhere
    in the sentence is the first string argument.
    """
    ws = words(text)
    best: tuple[int, int, types.FunctionDeclaration, list[str]] | None = None
    for order, decl in enumerate(declarations):
        if not decl.name:
            continue
        kws = keywords(decl.name)
        if kws and all(any(same_word(w, k) for w in ws) for k in kws):
            rank = (len(kws), -order)
            if best is None or rank > (best[0], best[1]):
                best = (rank[0], rank[1], decl, kws)
    if best is None:
        return None
    return _arguments(best[2], ws, best[3], values)


def _spoken_key(key: str) -> str:
    units = {"c": "degrees", "f": "degrees Fahrenheit", "pct": "percent", "kmh": "kilometres per hour", "mph": "miles per hour"}
    parts = key.split("_")
    if len(parts) > 1 and parts[-1] in units:
        return " ".join(parts[:-1]) + f" ({units[parts[-1]]})"
    return " ".join(parts)


def _spoken_value(value: Any) -> str:
    if isinstance(value, Mapping):
        return ", ".join(f"{_spoken_key(str(k))} {_spoken_value(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return "; ".join(_spoken_value(v) for v in value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def describe_result(name: str, result: Mapping[str, Any]) -> str:
    """A tool's result as a sentence: every field, units spelled out.

    `{"city": "Paris", "temperature_c": 12}` -> "get weather: city Paris,
    temperature 12 degrees."; an error is said as one.
    """
    spoken_name = " ".join(name.split("_"))
    if set(result) == {"error"} or ("error" in result and len(result) <= 2):
        return f"{spoken_name} failed: {_spoken_value(result['error'])}."
    if set(result) == {"result"}:
        return f"{spoken_name}: {_spoken_value(result['result'])}."
    fields = []
    for key, value in result.items():
        spoken = _spoken_key(str(key))
        if "(" in spoken:  # a unit: "temperature 12 degrees"
            base, unit = spoken[:-1].split(" (")
            fields.append(f"{base} {_spoken_value(value)} {unit}")
        else:
            fields.append(f"{spoken} {_spoken_value(value)}")
    return f"{spoken_name}: {', '.join(fields)}."


_SAY_EXACTLY = re.compile(r'\bsay exactly\b[^"]*"(.+)"', re.IGNORECASE | re.DOTALL)


def words_to_say(text: str) -> str | None:
    """The quoted words a turn asks to be said exactly, if it asks that."""
    found = _SAY_EXACTLY.search(text)
    return found.group(1).strip() or None if found else None


def reply_to(text: str) -> str:
    """The reply to a sentence that names no tool."""
    text = text.strip()
    return f"You said: {text}." if text else "Sorry, I did not catch that."


# -- vocabulary bias ------------------------------------------------------------

_TEMPLATES = (
    "{kw}",
    "what is the {kw}",
    "what's the {kw}",
    "the {kw} in {v}",
    "{kw} in {v}",
    "{kw} for {v}",
    "what is the {kw} in {v}",
    "what is the {kw} like in {v}",
    "what is the {kw} like in {v} today",
    "what's the {kw} in {v}",
    "what is the {kw} for {v}",
    "how is the {kw} in {v}",
    "tell me the {kw} in {v}",
    "tell me the {kw} for {v}",
    "please {kw} {v}",
    "can you {kw} {v}",
    "{kw} {v}",
    "the {kw} for {v} for the next {n} days",
    "{kw} for {v} for {n} days",
    "what is the {kw} for {v} tomorrow",
)


def proper_nouns(text: str) -> list[str]:
    """Runs of capitalised words not at a sentence start ("Sao Paulo", "Paris")."""
    found: list[str] = []
    for sentence in re.split(r"[.!?;]\s+", text):
        run: list[str] = []
        for i, match in enumerate(re.finditer(r"[A-Za-z][A-Za-z']*|[^\sA-Za-z]", sentence)):
            tok = match.group()
            if tok[0].isupper() and i > 0 and tok != "I":
                run.append(tok)
                continue
            if run:
                found.append(" ".join(run))
            run = []
        if run:
            found.append(" ".join(run))
    return list(dict.fromkeys(found))


def known_values(declarations: Sequence[types.FunctionDeclaration], instruction: str = "") -> list[str]:
    """Names the agent knows: its parameters' enums, and the capitalised names in
    its tools' descriptions and its instruction (so an agent that names the
    cities it knows gets them recognised and matched)."""
    texts = [instruction] + [decl.description or "" for decl in declarations]
    values: list[str] = []
    for decl in declarations:
        properties, _ = _schema(decl)
        for schema in properties.values():
            values.extend(str(v) for v in schema.enum or [])
            texts.append(schema.description or "")
    for text in texts:
        values.extend(proper_nouns(text))
    return list(dict.fromkeys(v for v in values if words(v)))


def example_phrases(text: str) -> list[str]:
    """What a text quotes ("Ask \u201cWhat is the weather in Paris?\u201d"): phrases users may say."""
    return [m.strip() for m in re.findall(r'["\u201c]([^"\u201c\u201d]{3,})["\u201d]', text) if words(m)]


def corpus_for(
    declarations: Sequence[types.FunctionDeclaration], values: Sequence[str], instruction: str = ""
) -> list[str]:
    """Sentences a user of these tools might say, for the recogniser's language model:
    templates (`_TEMPLATES`) filled with each tool's keywords and the known values;
    each tool's name, parameter names ("weather city paris") and enum values; the
    sentences of its description, of its parameters' descriptions and of the
    instruction; and the phrases they quote."""
    values = list(dict.fromkeys(" ".join(words(v)) for v in values))
    sentences: list[str] = []
    texts = [instruction]
    for decl in declarations:
        if not decl.name:
            continue
        kw = " ".join(keywords(decl.name))
        for template in _TEMPLATES:
            for v in values or [""]:
                if "{v}" in template and not v:
                    continue
                for n in ("one", "two", "three") if "{n}" in template else ("",):
                    sentences.append(template.format(kw=kw, v=v, n=n))
        sentences.append(" ".join(words(decl.name.replace("_", " "))))
        texts.append(decl.description or "")
        properties, _ = _schema(decl)
        for name, schema in properties.items():
            param = " ".join(words(name.replace("_", " ")))
            sentences.append(param)
            if _type_name(schema) == "STRING" and not schema.enum:
                sentences.extend(f"{kw} {param} {v}" for v in values)
            sentences.extend(" ".join(words(str(e))) for e in schema.enum or [])
            texts.append(schema.description or "")
    for text in texts:
        sentences.extend(" ".join(words(s)) for s in re.split(r"[.!?;:]\s+|\n", text))
        sentences.extend(" ".join(words(p)) for p in example_phrases(text))
    return [s for s in sentences if s]
