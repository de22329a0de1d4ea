"""Chunkers by canonical unit: a verse, an ayat, a paragraph under its headings.

``get_chunker(name)`` gives one by format name (``FORMATS``), ``detect_format``
picks the name from a file's extension and first lines, and ``chunk_file``
streams a file through the right one::

    for chunk in chunk_file("corpora/kjv.txt", doc_id="kjv"):
        chunk.id, chunk.hash  # "kjv/genesis/1/1", "5f0c..."
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from herd.rag.chunkers import pasal, verse
from herd.rag.chunkers.base import (
    LINE_BREAK,
    BaseChunker,
    Chunk,
    Chunker,
    ChunkError,
    Marker,
    UnknownFormat,
    normalize_text,
    slugify,
    split_lines,
)
from herd.rag.chunkers.jsonl import JsonlChunker
from herd.rag.chunkers.markdown import MarkdownChunker
from herd.rag.chunkers.paragraph import ParagraphChunker
from herd.rag.chunkers.pasal import PasalChunker
from herd.rag.chunkers.verse import VerseChunker

__all__ = [
    "FORMATS",
    "BaseChunker",
    "Chunk",
    "ChunkError",
    "Chunker",
    "JsonlChunker",
    "MarkdownChunker",
    "Marker",
    "ParagraphChunker",
    "PasalChunker",
    "UnknownFormat",
    "VerseChunker",
    "chunk_file",
    "detect_format",
    "format_of",
    "get_chunker",
    "normalize_text",
    "place_of",
]

FORMATS: MappingProxyType[str, Callable[..., BaseChunker]] = MappingProxyType(
    {
        "verse": VerseChunker,
        "pasal": PasalChunker,
        "markdown": MarkdownChunker,
        "paragraph": ParagraphChunker,
        "jsonl": JsonlChunker,
    }
)

_EXTENSIONS = {".md": "markdown", ".markdown": "markdown", ".jsonl": "jsonl", ".ndjson": "jsonl"}
SNIFF_LINES = 200
"""How many first lines ``chunk_file`` shows ``detect_format``."""


def get_chunker(name: str, **options: Any) -> BaseChunker:
    """The chunker for format ``name``; ``options`` go to its constructor (``max_chars``...)."""
    try:
        factory = FORMATS[name]
    except KeyError:
        known = ", ".join(FORMATS)
        raise UnknownFormat(f"no chunker is named {name!r}; known: {known}") from None
    try:
        return factory(**options)
    except TypeError as exc:
        raise ChunkError(f"chunker {name!r}: {exc}") from None


def detect_format(path: str | os.PathLike[str], first_lines: Sequence[str]) -> str:
    """The format of a file, by extension (``.md``, ``.jsonl``), else by its first lines.

    Verse references (``Genesis 1:1 ...``) on three lines or more mean scripture;
    a ``BAB``/``Pasal`` header with one more sign of a law (another header, an ayat
    ``(1)``, ``Menimbang``) means legislation; a chapter header followed by
    numbered verses means scripture too; anything else is paragraphs.
    """
    by_extension = _EXTENSIONS.get(Path(path).suffix.lower())
    if by_extension:
        return by_extension
    references = headers = numbered = law = law_headers = 0
    for line in split_lines(first_lines):
        s = line.strip()
        if verse.reference(s) or verse.CHAPTER_VERSE.match(s):
            references += 1
        elif verse.HEADER.fullmatch(s):
            headers += 1
        elif verse.BRACKETED.match(s) or verse.NUMBERED.match(s):
            numbered += 1
        if pasal.BAB.fullmatch(s) or pasal.PASAL.fullmatch(s):
            law_headers += 1
        elif pasal.AYAT.match(s) or pasal.CLAUSE.match(s) or s.startswith("UNDANG-UNDANG"):
            law += 1
    if references >= 3:
        return "verse"
    if law_headers and law_headers + law >= 2:
        return "pasal"
    if headers and numbered >= 3:
        return "verse"
    return "paragraph"


def chunk_file(
    path: str | os.PathLike[str],
    *,
    doc_id: str | None = None,
    format: str | None = None,
    place: str | None = None,
    **options: Any,
) -> Iterator[Chunk]:
    """Stream a UTF-8 file through the chunker of its format (detected unless given).

    ``doc_id`` defaults to the file name without extension, slugged
    (``UU_13_2003.txt`` -> ``uu-13-2003``). ``place`` is the doc id instead for a
    chunker whose ids do not name themselves (markdown, paragraph): where the file
    sits (``place_of``), so that ``a/notes.txt`` and ``b/notes.txt`` differ.
    """
    path = Path(path)
    doc = doc_id or slugify(path.stem, fallback="doc")
    with path.open("rb") as file:
        lines = _decoded(file, doc)
        head = list(itertools.islice(lines, SNIFF_LINES))
        chunker = get_chunker(format or detect_format(path, head), **options)
        if place is not None and not chunker.names_itself:
            doc = place
        yield from chunker.chunk(doc, itertools.chain(head, lines))


def format_of(path: str | os.PathLike[str], format: str | None = None) -> str:
    """The format ``chunk_file`` reads a file as: ``format`` if given, else detected."""
    if format is not None:
        return format
    with Path(path).open("rb") as file:
        head = [raw.decode("utf-8", "replace") for raw in itertools.islice(file, SNIFF_LINES)]
    return detect_format(path, head)


def place_of(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> str:
    """A file's path under ``root`` without its extension, slugged part by part.

    ``root/Guides/Set up.md`` -> ``guides/set-up``; a file given by itself (its
    own folder as root) keeps the plain doc id, ``set-up``.
    """
    relative = Path(path).relative_to(root).with_suffix("")
    return "/".join(slugify(part, fallback="doc") for part in relative.parts)


def _decoded(file: Iterable[bytes], doc: str) -> Iterator[str]:
    """Decode line by line, so that bad bytes are reported at their own line."""
    breaks = consumed = 0
    for raw in file:
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            where = breaks + 1 + len(LINE_BREAK.findall(raw[: exc.start].decode("utf-8")))
            raise ChunkError(
                f"not UTF-8 text at byte {consumed + exc.start} ({exc.reason})", doc=doc, line=where
            ) from None
        if (nul := raw.find(b"\x00")) >= 0:
            # PostgreSQL text cannot hold a NUL: the file is refused here, where the
            # place is known, rather than by the database with no place at all.
            where = breaks + 1 + len(LINE_BREAK.findall(raw[:nul].decode("utf-8")))
            raise ChunkError(f"a NUL byte at byte {consumed + nul}", doc=doc, line=where)
        breaks += len(LINE_BREAK.findall(line))
        consumed += len(raw)
        yield line
