"""The registry, format detection and chunk_file."""

from __future__ import annotations

from pathlib import Path

import pytest

import herd.rag.chunkers as chunkers
from herd.errors import HerdError
from herd.rag.chunkers import (
    FORMATS,
    Chunker,
    ChunkError,
    UnknownFormat,
    chunk_file,
    detect_format,
    get_chunker,
)

GOLDEN = Path(__file__).parent / "golden"


def test_every_name_in_all_is_exported() -> None:
    assert all(hasattr(chunkers, name) for name in chunkers.__all__)


def test_get_chunker_knows_every_format_and_keeps_the_protocol() -> None:
    for name in FORMATS:
        chunker: Chunker = get_chunker(name)
        assert chunker.name == name and chunker.version


def test_an_unknown_format_or_option_is_a_clear_error() -> None:
    with pytest.raises(UnknownFormat, match="'pdf'; known: verse, pasal"):
        get_chunker("pdf")
    with pytest.raises(ChunkError, match="'verse'.*colour"):
        get_chunker("verse", colour="blue")
    assert issubclass(UnknownFormat, HerdError)


@pytest.mark.parametrize(
    ("path", "lines", "expected"),
    [
        ("notes.md", ["Genesis 1:1 a", "Genesis 1:2 b", "Genesis 1:3 c"], "markdown"),
        ("corpus.JSONL", [], "jsonl"),
        ("bible.txt", ["Title", "", "Genesis 1:1 a", "Genesis 1:2 b", "Genesis 1:3 c"], "verse"),
        ("gutenberg.txt", ["The Book", "1:1 a", "1:2 b", "1:3 c"], "verse"),
        ("bible.txt", ["Genesis", "Chapter 1", "1 a", "2 b", "[3] c"], "verse"),
        ("uu.txt", ["UNDANG-UNDANG REPUBLIK INDONESIA", "BAB I", "Pasal 1"], "pasal"),
        ("uu.txt", ["Pasal 1", "(1) Satu."], "pasal"),
        ("essay.txt", ["Pasal 1 is cited once."], "paragraph"),
        (
            "essay.txt",
            ["Meet me at 10:30 today.", "Chapter 1", "It was a dark night."],
            "paragraph",
        ),
        ("empty", [], "paragraph"),
    ],
)
def test_detect_format(path: str, lines: list[str], expected: str) -> None:
    assert detect_format(path, lines) == expected


def test_chunk_file_names_the_doc_after_the_file(tmp_path: Path) -> None:
    path = tmp_path / "UU_13_2003.txt"
    path.write_bytes("\ufeffBAB I\r\nKETENTUAN UMUM\r\nPasal 1\r\nIsi.\r\n".encode())
    (chunk,) = chunk_file(path)
    assert chunk.id == "uu-13-2003/bab-i/pasal-1" and chunk.text == "Isi."


def test_chunk_file_names_the_line_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes(b"one\r\n\rtwo\n" + b"caf\xe9\n" * 3)
    with pytest.raises(ChunkError, match=r"^bad, line 4: not UTF-8 text"):
        list(chunk_file(path))
