"""`live.unchecked` makes what `model_copy(update=...)` of an empty instance makes."""

from __future__ import annotations

import pytest
from google.genai import types

from live.unchecked import unchecked

CASES = [
    (types.Blob, {"data": b"\x01\x02", "mime_type": "audio/pcm;rate=24000"}),
    (types.Part, {"inline_data": types.Blob(data=b"\x00", mime_type="audio/pcm")}),
    (types.Content, {"parts": [types.Part(text="hi")], "role": "model"}),
    (types.LiveServerContent, {"model_turn": types.Content(parts=[])}),
    (types.LiveServerMessage, {"server_content": types.LiveServerContent(turn_complete=True)}),
]


@pytest.mark.parametrize(("cls", "values"), CASES, ids=[c.__name__ for c, _ in CASES])
def test_the_same_instance_model_copy_makes(cls, values) -> None:
    empty = cls.model_construct()
    made = unchecked(empty, frozenset(values), values)
    copied = empty.model_copy(update=values)
    assert type(made) is cls
    assert made == copied
    assert made.model_fields_set == copied.model_fields_set == set(values)
    assert made.model_dump() == copied.model_dump()
    assert made.model_dump_json() == copied.model_dump_json()


def test_instances_share_nothing_mutable() -> None:
    empty = types.Content.model_construct()
    first = unchecked(empty, frozenset({"parts"}), {"parts": []})
    second = unchecked(empty, frozenset({"parts"}), {"parts": []})
    first.role = "model"  # what the mapper does when it merges parts
    assert first.model_fields_set == {"parts", "role"}
    assert second.role is None and second.model_fields_set == {"parts"}
    assert empty.role is None and empty.model_fields_set == set()


def test_a_template_with_defaults_keeps_them() -> None:
    template = types.Blob.model_construct(data=b"", mime_type="audio/pcm;rate=16000")
    made = unchecked(template, frozenset({"data", "mime_type"}), {"data": b"\x00\x01"})
    assert made == types.Blob(data=b"\x00\x01", mime_type="audio/pcm;rate=16000")


def test_decoded_frames_share_nothing_mutable() -> None:
    from connections.gemini_wire import decode_frame

    raw = b'{"serverContent": {"outputTranscription": {"text": "hi"}, "turnComplete": true}}'
    first, second = decode_frame(raw), decode_frame(raw)
    assert first is not None and second is not None
    first.server_content.output_transcription.finished = True
    assert second.server_content.output_transcription.finished is None
    assert second.server_content.output_transcription.model_fields_set == {"text"}
    assert second.server_content.model_fields_set == {"output_transcription", "turn_complete"}


def test_a_model_with_extra_fields_gets_its_own_copy_of_them() -> None:
    from pydantic import BaseModel, ConfigDict

    class Loose(BaseModel):
        model_config = ConfigDict(extra="allow")
        a: int | None = None

    template = Loose.model_construct(note="kept")
    made = unchecked(template, frozenset({"a", "note"}), {"a": 1})
    assert made == Loose(a=1, note="kept") and made.model_extra == {"note": "kept"}
    made.model_extra["note"] = "changed"
    assert template.model_extra == {"note": "kept"}
