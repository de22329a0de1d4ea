"""Properties every chunker keeps on any input, found by hypothesis.

"No text is silently dropped" is checked exactly: the multiset of
whitespace-separated tokens of the normalized input equals the tokens of all
chunk texts plus the tokens of all markers (the source text a chunker turned
into structure: ``Genesis 1:1``, ``Pasal 5``, ``##``, a BAB title). And a marker
is never taken from the middle of a line: its tokens are the first tokens of the
line it names, so a chunker cannot hide a dropped sentence by calling it a marker.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from collections.abc import Callable, Iterable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from herd.rag.chunkers import (
    BaseChunker,
    Chunk,
    ChunkError,
    JsonlChunker,
    MarkdownChunker,
    Marker,
    ParagraphChunker,
    PasalChunker,
    VerseChunker,
    normalize_text,
)
from herd.rag.chunkers.base import chunk_hash, split_lines

STRUCTURAL = [
    # scripture
    "Genesis 1:1 In the beginning",
    "Genesis 1:1",
    "1 Samuel 3:4 Here am I",
    "Song of Solomon 2:1 rose",
    "Romans 16:25-27 glory",
    "1:1 text",
    "2:3",
    "Chapter 1",
    "CHAPTER 2",
    "Psalm 23",
    "ch. 4",
    "1 verse",
    "2 verse",
    "7 verse",
    "[2] verse",
    "[3]",
    "3",
    "Genesis",
    "The Book of Ruth",
    "and the earth",
    # legislation
    "BAB I",
    "BAB IV HUBUNGAN KERJA",
    "KETENTUAN UMUM",
    "Bagian Kesatu",
    "Bagian Kedua Puluh Satu",
    "Paragraf 2",
    "Pasal 5",
    "Pasal 5A",
    "PASAL 7",
    "(1) ayat",
    "(2)",
    "(1a) sisipan",
    "a. huruf",
    "b)",
    "1. angka",
    "Ayat (1)",
    "Huruf a",
    "PENJELASAN",
    "I. UMUM",
    "II. PASAL DEMI PASAL",
    "Menimbang : a. bahwa",
    "MEMUTUSKAN:",
    "Disahkan di Jakarta",
    "LEMBARAN NEGARA",
    # markdown
    "# h",
    "## Install ##",
    "####### seven",
    "   # indented",
    "    # code",
    "#",
    "# #",
    "#tag",
    "```",
    "```py",
    "~~~",
    "````",
    "``` a`b",
    # whitespace and odd characters
    "",
    " ",
    "\t",
    "\u00a0",
    "\u2028",
    "\ufeff",
    "e\u0301",
]

FREE = st.text(st.characters(exclude_categories=["Cs"]), max_size=25)
LINE = st.one_of(
    st.sampled_from(STRUCTURAL),
    FREE,
    st.builds(lambda a, b: f"{a} {b}", st.sampled_from(STRUCTURAL), FREE),
)
DOCUMENT = st.lists(st.tuples(LINE, st.sampled_from(["\n", "\r\n", "\r"])), max_size=30).map(
    lambda pairs: "".join(line + end for line, end in pairs)
)

CHUNKERS: dict[str, Callable[[], BaseChunker]] = {
    "verse": VerseChunker,
    "pasal": PasalChunker,
    "pasal-huruf": lambda: PasalChunker(granularity="huruf"),
    "markdown": MarkdownChunker,
    "paragraph": ParagraphChunker,
    "paragraph-small": lambda: ParagraphChunker(max_chars=20),
    "verse-small": lambda: VerseChunker(max_chars=20),
}
SETTINGS = settings(
    max_examples=150,
    deadline=None,
    database=None,  # no .hypothesis/ folder in the work tree
    suppress_health_check=[HealthCheck.too_slow],
)


def tokens(texts: Iterable[str]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(text.split())
    return counts


def check(chunker: BaseChunker, raw: str) -> list[Chunk]:
    events = list(chunker.events("doc", [raw]))
    chunks = [e for e in events if isinstance(e, Chunk)]
    markers = [e for e in events if isinstance(e, Marker)]
    source = list(split_lines([raw]))

    assert tokens(source) == tokens(c.text for c in chunks) + tokens(m.text for m in markers)
    # Structure is never left without a chunk to carry it: the last event is a chunk.
    assert not events or isinstance(events[-1], Chunk)
    for m in markers:
        words = m.text.split()
        assert words, m
        assert source[m.line - 1].split()[: len(words)] == words, m

    ids = [c.id for c in chunks]
    assert len(ids) == len(set(ids))
    for c in chunks:
        assert c.id == c.id.lower() and c.id.startswith("doc")
        assert c.text == normalize_text(c.text)
        assert c.hash == chunk_hash(c.text, c.metadata, chunker.name, chunker.version)
        json.dumps(c.metadata, allow_nan=False)
        assert 1 <= c.metadata["start_line"] <= c.metadata["end_line"] <= len(source)

    # Streaming: the same document fed line by line gives the same events.
    assert list(chunker.events("doc", io.StringIO(raw, newline=""))) == events
    return chunks


@pytest.mark.parametrize("name", sorted(CHUNKERS))
@SETTINGS
@given(raw=DOCUMENT)
def test_no_text_dropped_ids_unique_hashes_deterministic(name: str, raw: str) -> None:
    chunker = CHUNKERS[name]()
    first = check(chunker, raw)
    again = list(CHUNKERS[name]().chunk("doc", [raw]))
    assert [(c.id, c.hash) for c in again] == [(c.id, c.hash) for c in first]


@pytest.mark.parametrize("name", sorted(CHUNKERS))
@SETTINGS
@given(raw=FREE)
def test_any_text_on_one_line(name: str, raw: str) -> None:
    check(CHUNKERS[name](), raw)


# What a store keeps: no lone surrogate, no NUL (a record with one is refused, below).
STORABLE = st.characters(exclude_categories=["Cs"], exclude_characters="\x00")
RECORD_TEXT = st.text(STORABLE, max_size=40)
RECORD_ID = st.one_of(
    st.text(STORABLE, min_size=1, max_size=8), st.integers(min_value=0, max_value=5)
)
RECORDS = st.lists(
    st.fixed_dictionaries(
        {"id": RECORD_ID, "text": RECORD_TEXT},
        optional={"source": st.text(STORABLE, max_size=5), "n": st.integers()},
    ),
    max_size=20,
)


@SETTINGS
@given(records=RECORDS, end=st.sampled_from(["\n", "\r\n"]))
def test_jsonl_keeps_every_record(records: list[dict[str, object]], end: str) -> None:
    lines = [json.dumps(r, ensure_ascii=bool(len(r) % 2)) + end for r in records]
    chunks = list(JsonlChunker().chunk("doc", lines))
    assert [c.text for c in chunks] == [normalize_text(str(r["text"])) for r in records]
    assert len({c.id for c in chunks}) == len(chunks)
    for c, r in zip(chunks, records, strict=True):
        assert c.id == str(r["id"]) or c.id.startswith(f"{r['id']}~")
        assert {k: v for k, v in c.metadata.items() if k not in ("start_line", "end_line")} == {
            k: v for k, v in r.items() if k not in ("id", "text")
        }


@SETTINGS
@given(records=RECORDS, at=st.integers(min_value=0), bad=st.sampled_from(["\x00", "\ud800"]))
def test_jsonl_refuses_a_record_no_store_keeps_naming_its_line(
    records: list[dict[str, object]], at: int, bad: str
) -> None:
    records = [*records, {"id": "x", "text": f"before {bad} after"}]
    i = at % len(records)
    records[i], records[-1] = records[-1], records[i]
    lines = [json.dumps(r) + "\n" for r in records]
    with pytest.raises(ChunkError, match=f"line {i + 1}: the record.text contains a"):
        list(JsonlChunker().chunk("doc", lines))


@SETTINGS
@given(raw=DOCUMENT)
def test_jsonl_on_anything_either_chunks_or_names_the_line(raw: str) -> None:
    try:
        list(JsonlChunker().chunk("doc", [raw]))
    except ChunkError as exc:
        assert exc.line is not None and f"line {exc.line}" in str(exc)
