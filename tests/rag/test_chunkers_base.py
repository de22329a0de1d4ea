"""The shared parts: normalization, hashing, unique ids."""

from __future__ import annotations

import tracemalloc

import pytest

from herd.rag.chunkers import ChunkError, VerseChunker, normalize_text
from herd.rag.chunkers.base import UniqueIds, chunk_hash, slugify


def test_normalize_text() -> None:
    assert normalize_text("\n  \r\n Cafe\u0301 \t\r\n\r\n  x  \n\n") == " Caf\u00e9\n\n  x"
    assert normalize_text("") == ""


def test_the_hash_leaves_out_line_numbers_but_not_the_chunker_or_its_version() -> None:
    meta = {"book": "Genesis", "start_line": 1, "end_line": 2}
    same = chunk_hash("t", {**meta, "start_line": 40, "end_line": 41}, "verse", "1")
    assert chunk_hash("t", meta, "verse", "1") == same
    assert chunk_hash("t", meta, "verse", "2") != same
    assert chunk_hash("t", meta, "pasal", "1") != same
    assert chunk_hash("t", {**meta, "book": "Exodus"}, "verse", "1") != same
    assert chunk_hash("t.", meta, "verse", "1") != same


def test_unique_ids_suffix_repeats_in_order() -> None:
    ids = UniqueIds()
    claimed = [ids.claim(i) for i in ["a/1", "a/2", "a/1", "a/1", "a/1~2", "p01", "p1", "p1"]]
    assert claimed == ["a/1", "a/2", "a/1~2", "a/1~3", "a/1~2~2", "p01", "p1", "p1~2"]


def test_unique_ids_accept_numbers_in_any_order() -> None:
    ids = UniqueIds()
    order = [5, 3, 4, 1, 9, 2, 8, 6, 7, 10, 0]
    assert [ids.claim(f"x/{n}") for n in order] == [f"x/{n}" for n in order]
    assert [ids.claim(f"x/{n}") for n in order] == [f"x/{n}~2" for n in order]


def test_unique_ids_of_an_ordered_corpus_take_little_memory() -> None:
    tracemalloc.start()
    try:
        ids = UniqueIds()
        for chapter in range(1, 1001):
            for verse in range(1, 101):
                ids.claim(f"kjv/book/{chapter}/{verse}")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000  # a set of these 100,000 ids takes over 10 MB


def test_slugify() -> None:
    assert slugify("Song of Solomon") == "song-of-solomon"
    assert slugify("Bagian Kedua Belas") == "bagian-kedua-belas"
    assert slugify("`herd` & CLI_tools!") == "herd-cli-tools"
    assert slugify("Ésaïe") == "ésaïe"
    assert slugify("!!!") == "untitled"


@pytest.mark.parametrize("doc_id", ["", "KJV", "my doc", "/kjv"])
def test_a_doc_id_must_be_lowercase_without_spaces(doc_id: str) -> None:
    with pytest.raises(ChunkError, match="doc id"):
        list(VerseChunker().chunk(doc_id, ["Genesis 1:1 x"]))
