"""JSON lines: the record's own id, other fields as metadata, bad lines named."""

from __future__ import annotations

import pytest

from herd.errors import HerdError
from herd.rag.chunkers import ChunkError, JsonlChunker


def chunk(*lines: str) -> list[tuple[str, str]]:
    return [(c.id, c.text) for c in JsonlChunker().chunk("corpus", lines)]


def test_ids_are_kept_as_given_and_integers_become_strings() -> None:
    got = chunk('{"id": "Bukhari/1", "text": "a"}\n', '{"id": 7, "text": "b"}\n')
    assert got == [("Bukhari/1", "a"), ("7", "b")]


def test_fields_other_than_id_and_text_are_metadata_and_title_is_the_breadcrumb() -> None:
    (c,) = JsonlChunker().chunk("corpus", ['{"id": "x", "text": "t", "title": "Book I", "n": 1}'])
    assert c.metadata == {"title": "Book I", "n": 1, "start_line": 1, "end_line": 1}
    assert c.breadcrumb == "Book I"


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ('{"id": "a", "text": ', "not a JSON record"),
        ('["a", "b"]', "must be a JSON object, not list"),
        ('{"text": "no id"}', '"id"'),
        ('{"id": "", "text": "t"}', '"id"'),
        ('{"id": true, "text": "t"}', '"id"'),
        ('{"id": "a"}', '"text"'),
        ('{"id": "a", "text": null}', '"text"'),
        ('{"id": "a", "text": "t", "score": NaN}', "NaN is not JSON"),
        ('{"id": "a", "text": "t", "id": "b"}', "'id' appears twice"),
        ('{"id": "a", "text": "t", "start_line": 3}', "'start_line' is reserved"),
    ],
)
def test_a_bad_line_stops_the_run_naming_the_line(bad: str, message: str) -> None:
    lines = ['{"id": "ok", "text": "fine"}\n', "\n", bad + "\n"]
    with pytest.raises(ChunkError, match=message) as info:
        list(JsonlChunker().chunk("corpus", lines))
    assert info.value.line == 3
    assert str(info.value).startswith("corpus, line 3: ")
    assert isinstance(info.value, HerdError)


def test_text_is_normalized_but_metadata_strings_are_not() -> None:
    (c,) = JsonlChunker().chunk(
        "corpus", ['{"id": "e\\u0301", "text": "e\\u0301  \\r\\n", "k": "e\\u0301"}']
    )
    assert (c.id, c.text, c.metadata["k"]) == ("e\u0301", "\u00e9", "e\u0301")
