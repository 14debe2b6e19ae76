"""docs/gemini-endpoint.md's conformance tables checked against google-genai's
own types for the Live API: every field an app or the service puts on the wire
has a row, every test a row cites exists, and the count line is the tables'.

The field list is google-genai's: its pydantic types for the messages an app
sends (`LiveClientMessage`, and `LiveConnectConfig`, which google-genai turns
into `setup`), the messages the service sends (`LiveServerMessage`) and the
ephemeral tokens' `auth_tokens` call (`CreateAuthTokenConfig`, `AuthToken`),
walked through `model_fields` by their aliases (camelCase, as on the wire).
A new google-genai that adds a field fails here until a row names it.
"""

from __future__ import annotations

import os
import re
import sys
import typing
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pydantic
import pytest
from google.genai import types

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "gemini-endpoint.md"

MARKS = ("carried", "refused as the service", "documented difference", "not yet")

# Where each message's fields are in the tables (the letters of their rows).
ROOTS: tuple[tuple[str, type[pydantic.BaseModel], str], ...] = (
    ("", types.LiveClientMessage, "ABCDEFG"),
    ("setup", types.LiveConnectConfig, "C"),
    ("", types.LiveServerMessage, "HI"),
    ("auth_tokens", types.CreateAuthTokenConfig, "J"),
    ("auth_tokens", types.AuthToken, "J"),
)
# Each client message's fields are in its own table.
LETTERS_OF = {
    "setup": "C",
    "clientContent": "D",
    "realtimeInput": "E",
    "toolResponse": "F",
    "contextUpdate": "CG",  # tools are read as setup's are (C13-C21)
}

# Fields google-genai keeps for itself: never sent.
NOT_SENT = {
    (types.LiveConnectConfig, "http_options"): "the client's own HTTP settings",
    (types.CreateAuthTokenConfig, "http_options"): "the client's own HTTP settings",
}

# Fields google-genai types loosely (a validator turns what is given into Tools).
LOOSE = {
    (types.LiveClientSetup, "tools"): types.Tool,
    (types.LiveConnectConfig, "tools"): types.Tool,
    (types.LiveClientContextUpdateTools, "tools"): types.Tool,
}

# Types not walked into, each for its reason: the rows name the field that
# holds one and say what happens to it whole.
NOT_WALKED: dict[type, str] = {
    types.Part: "the content model all of Gemini shares; the rows name the kinds of part a turn carries (D1, D3, F5, H4-H7)",
    types.File: "a Files API object: google-genai sends it as a part's fileData, never as itself",
    types.Schema: "JSON Schema's own vocabulary: a function's parameters go to the model whole (C13), responseSchema is refused whole (C11)",
    types.FunctionDeclaration: "declared to the model whole (C13)",
    types.GroundingMetadata: "passed to the app whole, as the model sent it (H11)",
    types.UrlContextMetadata: "passed to the app whole, as the model sent it (H16)",
    types.ResponseFormat: "dropped whole (C41)",
    types.MultiSpeakerVoiceConfig: "refused whole (C37)",
    types.GenerationConfigRoutingConfig: "refused whole (C11)",
    types.LiveConnectConfig: "a token's locked setup is a setup: its fields are the C rows (walked from LiveConnectConfig itself)",
}
# Types whose fields the rows name, but not what each field holds.
FIELDS_ONLY: dict[type, str] = {
    types.Tool: "each kind of tool goes to the model with its own settings as declared, or is refused whole (C13-C21, C43)",
    types.FunctionResponsePart: "each kind of part reaches the model whole, as the app sent it (F5, F9)",
}


def _models(annotation: typing.Any) -> Iterator[type[pydantic.BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        yield annotation
        return
    for arg in typing.get_args(annotation):
        yield from _models(arg)


def wire_fields() -> list[tuple[str, str, str]]:
    """(path, alias, letters) for every field google-genai puts on the wire."""
    found: list[tuple[str, str, str]] = []

    def walk(model: type[pydantic.BaseModel], path: str, letters: str, seen: tuple[type, ...], deep: bool) -> None:
        for name, field in model.model_fields.items():
            if (model, name) in NOT_SENT:
                continue
            alias = field.alias or name
            here = LETTERS_OF.get(alias, letters) if model is types.LiveClientMessage else letters
            found.append((f"{path}.{alias}".lstrip("."), alias, here))
            if not deep:
                continue
            loose = LOOSE.get((model, name))
            for sub in [loose] if loose else _models(field.annotation):
                if sub in NOT_WALKED or sub in seen:
                    continue
                walk(sub, f"{path}.{alias}".lstrip("."), here, (*seen, sub), sub not in FIELDS_ONLY)

    for path, root, letters in ROOTS:
        walk(root, path, letters, (root,), True)
    return found


def conformance() -> str:
    return PAGE.read_text().split("\n## Conformance\n", 1)[1].split("\n## ", 1)[0]


def rows() -> list[dict[str, typing.Any]]:
    """The tables' rows: ids (a range expanded), field, mark, shown by."""
    out = []
    for line in conformance().splitlines():
        if not re.match(r"\| [A-J]\d", line):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == 4, f"a row with {len(cells)} cells: {line[:80]}"
        label, field, here, shown = cells
        ids = []
        for part in re.split(r",\s*", label):
            match = re.fullmatch(r"([A-J])(\d+)(?:[–-]([A-J])(\d+))?", part)
            assert match, f"row id {part!r}"
            first, last = int(match[2]), int(match[4] or match[2])
            ids += [f"{match[1]}{n}" for n in range(first, last + 1)]
        mark = next((m for m in MARKS if here.startswith(m)), None)
        assert mark is not None, f"row {label}: its mark {here!r} is none of {MARKS}"
        out.append({"label": label, "ids": ids, "field": field, "mark": mark, "here": here, "shown": shown})
    return out


def _words(text: str) -> set[str]:
    """The names a cell writes as code (in backticks)."""
    return {word for span in re.findall(r"`([^`]*)`", text) for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", span)}


def test_every_live_api_field_has_a_row():
    named: dict[str, set[str]] = {}
    for row in rows():
        letter = row["ids"][0][0]
        named.setdefault(letter, set()).update(_words(row["field"] + " " + row["here"] + " " + row["shown"]))
    fields = wire_fields()
    assert len(fields) > 200  # the walk reached the nested types
    missing = [
        f"{path} (rows {letters})"
        for path, alias, letters in fields
        if not any(alias in named.get(letter, ()) for letter in letters)
    ]
    assert not missing, "fields no row names: " + ", ".join(missing)


def test_row_ids_are_unique():
    ids = Counter(i for row in rows() for i in row["ids"])
    assert [i for i, n in ids.items() if n > 1] == []


def _test_names() -> set[str]:
    names: set[str] = set()
    for folder, dirs, files in os.walk(ROOT / "tests"):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for file in files:
            if file.endswith(".py"):
                names |= set(re.findall(r"^\s*(?:async\s+)?def (test_\w+)", Path(folder, file).read_text(), re.M))
    return names


def test_every_test_a_row_cites_exists():
    defined = _test_names()
    wrong = []
    for row in rows():
        cited = re.findall(r"`(test_[^`]*)`( ×(\d+))?", row["shown"])
        if row["mark"] in ("carried", "refused as the service"):
            assert cited, f"row {row['label']} is {row['mark']} and names no test"
        for name, _, times in cited:
            name = name.split("[", 1)[0]
            if name.endswith("…"):
                matching = [d for d in defined if d.startswith(name[:-1])]
                if len(matching) < int(times or 1):
                    wrong.append(f"{row['label']}: {name} ({len(matching)} tests begin so)")
            elif name not in defined:
                wrong.append(f"{row['label']}: {name}")
    assert not wrong, "rows cite tests that do not exist: " + "; ".join(wrong)


def test_the_count_line_is_the_tables():
    counted = Counter()
    for row in rows():
        counted[row["mark"]] += len(row["ids"])
    text = re.sub(r"\s+", " ", conformance())
    line = re.search(
        r"Counted over the (\d+) rows above.*?: carried (\d+), refused as the service (\d+),"
        r" documented difference (\d+), not yet (\d+)\.",
        text,
    )
    assert line, "no count line"
    total, *numbers = (int(n) for n in line.groups())
    tables = (sum(counted.values()), *(counted[m] for m in MARKS))
    assert (total, *numbers) == tables, f"the count line says {(total, *numbers)}, the tables {tables}"


@pytest.mark.parametrize("cut", ["a row", "a cited test", "a count"])
def test_the_checks_fail_on_a_page_that_misses_something(cut, monkeypatch, tmp_path):
    """Each check above catches what it is for: a page with a row taken out,
    a test name misspelt, or a count off by one fails it."""
    page = PAGE.read_text()
    if cut == "a row":
        [row] = [line for line in page.splitlines() if line.startswith("| H24 |")]
        broken, check, says = page.replace(row + "\n", ""), test_every_live_api_field_has_a_row, "voiceActivityType"
    elif cut == "a cited test":
        broken, check, says = page.replace("`test_H24_", "`test_H42_", 1), test_every_test_a_row_cites_exists, "H24: test_H42_"
    else:
        broken = re.sub(r"(not yet )(\d+)\.", lambda m: f"{m[1]}{int(m[2]) + 1}.", page, count=1)
        check, says = test_the_count_line_is_the_tables, "the count line says"
    assert broken != page
    copy = tmp_path / "gemini-endpoint.md"
    copy.write_text(broken)
    monkeypatch.setattr(sys.modules[__name__], "PAGE", copy)
    with pytest.raises(AssertionError, match=says):
        check()
