"""A document into pieces by its structure: pages, Markdown headings, numbered sections,
a statute's BAB/Pasal/ayat and scripture's book/chapter/verse (herd's own chunkers,
herd.rag.chunkers, grouped to a depth); windows of tokens (with overlap, never cutting
inside a word) where the structure gives one piece only, and for any piece longer than
a window.

Each piece keeps where it came from (``loc``): its page, its section (title and the
slug herd's chunkers give), and its character range in the normalized document that
the pipeline stores, so an answer can be traced back to the text it read.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from herd.cache.keys import normalize_document
from herd.limits.tokens import ASCII_PER_TOKEN
from herd.llm.documents import DocumentError, read_document
from herd.llm.eval.pipeline import SplitStage
from herd.rag.chunkers import get_chunker
from herd.rag.chunkers.base import Chunk, slugify
from herd.rag.chunkers.markdown import FENCE, HEADING

# 1. Scope / 2.3 Registers / 4.1.2) Reset: a numbered heading line.
NUMBERED = re.compile(r"[ \t]{0,3}(?P<num>\d{1,3}(?:\.\d{1,3})*)[.)]?[ \t]+(?P<title>\S.{0,200})")


@dataclass(frozen=True)
class Piece:
    text: str
    loc: dict[str, Any]


def read_pages(path: Path) -> list[str]:
    """The document's pages, each normalized: a PDF's pages, a text's form-feed pages."""
    if path.suffix.lower() == ".pdf":
        from pypdf import PdfReader  # only when a PDF is read, as herd.llm.documents does
        from pypdf.errors import PdfReadError

        try:
            pages = [p.extract_text() or "" for p in PdfReader(path).pages]
        except (PdfReadError, ValueError, KeyError, OSError) as exc:
            raise DocumentError(f"{path}: not a readable PDF ({exc})") from None
    else:
        pages = read_document(path).split("\f")
    out = [normalize_document(p) for p in pages]
    if not any(p.strip() for p in out):
        raise DocumentError(f"{path}: the document is empty")
    return out


def join_pages(pages: list[str]) -> tuple[str, list[tuple[int, int]]]:
    """The stored document (pages joined by a blank line) and each page's range in it."""
    ranges: list[tuple[int, int]] = []
    at = 0
    for page in pages:
        ranges.append((at, at + len(page)))
        at += len(page) + 2
    return "\n\n".join(pages), ranges


def windows(text: str, start: int, size: int, overlap: int) -> Iterator[tuple[int, int]]:
    """(start, end) ranges of ``text`` at most ``size`` characters, ``overlap`` shared by
    neighbours; a cut falls on whitespace (a word longer than a window is cut)."""
    end_all = len(text)
    at = start
    while at < end_all:
        end = min(end_all, at + size)
        if end < end_all:
            space = max(text.rfind(" ", at + 1, end + 1), text.rfind("\n", at + 1, end + 1))
            if space > at:
                end = space
        yield at, end
        if end >= end_all:
            return
        nxt = max(at + 1, end - overlap)
        # The next window starts at a word's start, not inside it.
        while nxt < end and not text[nxt - 1].isspace():
            nxt += 1
        while nxt < end_all and text[nxt].isspace():
            nxt += 1
        at = nxt if nxt < end else end


def _headings(text: str, depth: int) -> list[tuple[int, str]]:
    """(offset, title path) where a Markdown heading of level <= depth starts."""
    out: list[tuple[int, str]] = []
    stack: list[str] = []
    fence = ""
    at = 0
    for line in text.split("\n"):
        opened = FENCE.fullmatch(line)
        if fence:
            if opened and opened.group("fence")[0] == fence[0] and not opened.group("info").strip():
                fence = ""
        elif opened:
            fence = opened.group("fence")
        else:
            m = HEADING.fullmatch(line)
            if m and len(m.group("marks")) <= depth:
                level = len(m.group("marks"))
                del stack[level - 1 :]
                stack += [""] * (level - 1 - len(stack)) + [(m.group("title") or "").strip()]
                out.append((at, " › ".join(s for s in stack if s)))
        at += len(line) + 1
    return out


def _numbered(text: str, depth: int) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    at = 0
    for line in text.split("\n"):
        m = NUMBERED.fullmatch(line)
        if m and m.group("num").count(".") < depth and len(line) < 120:
            out.append((at, f"{m.group('num')} {m.group('title').strip()}"))
        at += len(line) + 1
    return out


def _sections(text: str, starts: list[tuple[int, str]]) -> list[tuple[int, int, dict[str, Any]]]:
    found: list[tuple[int, int, dict[str, Any]]] = []
    if starts and starts[0][0] > 0 and text[: starts[0][0]].strip():
        found.append((0, starts[0][0], {"section": "(before the first)"}))
    for i, (at, title) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(text)
        found.append((at, end, {"section": title, "id": slugify(title) or f"s{i + 1}"}))
    return found


# The doc id the structural chunkers are given; cut off their ids and breadcrumbs.
_DOC = "doc"
PARAGRAPH = re.compile(r"p\d+")
CRUMB_PARAGRAPH = re.compile(r" ¶\d+$")


def _units(text: str, chunker: str, depth: int) -> list[tuple[int, int, dict[str, Any]]]:
    """A herd chunker's units (a statute's ayat, a verse), consecutive ones grouped by
    the first ``depth`` segments of their id (pasal: 1 BAB, 2 Pasal, 3 ayat; verse: 1
    book, 2 chapter, 3 verse), each as its range of whole lines in ``text``."""
    starts = [0] + [m.end() for m in re.finditer("\n", text)]
    groups: list[tuple[str, list[Chunk]]] = []
    for chunk in get_chunker(chunker).chunk(_DOC, [text]):
        if not chunk.text.strip():
            continue  # a heading's line only: it is in the range of what follows it
        # A paragraph (p1, p2: a preamble's) is not structure: it stays with its part.
        segments = [s for s in chunk.id.split("/")[1:] if not PARAGRAPH.fullmatch(s)]
        key = "/".join(segments[:depth]) or "front"
        if groups and groups[-1][0] == key:
            groups[-1][1].append(chunk)
        else:
            groups.append((key, [chunk]))
    found: list[tuple[int, int, dict[str, Any]]] = []
    at = 0
    for key, chunks in groups:
        last = chunks[-1].metadata["end_line"]
        assert isinstance(last, int)
        # From where the previous group ended: the heading lines before a unit (BAB I,
        # its title, Pasal 5; a book's title) go with it.
        a = at
        b = starts[last] - 1 if last < len(starts) else len(text)
        found.append((a, max(a, b), {"section": _section(chunks), "id": key}))
        at = max(a, b)
    return found


def _section(chunks: list[Chunk]) -> str:
    """A group's title: what its units' breadcrumbs share (BAB I › Pasal 2), else its
    first and last unit's (Genesis 1:1 – Genesis 1:31)."""
    crumbs = [[CRUMB_PARAGRAPH.sub("", p) for p in c.breadcrumb.split(" › ")] for c in chunks]
    common = []
    for i, part in enumerate(crumbs[0]):
        if not all(i < len(c) and c[i] == part for c in crumbs):
            break
        if part != _DOC:
            common.append(part)
    if common or len(chunks) == 1:
        return " › ".join(common) or "(before the first)"
    return " – ".join(c.breadcrumb for c in (chunks[0], chunks[-1]))


def split(
    text: str, stage: SplitStage | None, window_tokens: int, pages: list[tuple[int, int]]
) -> list[Piece]:
    """``text`` (normalized) into pieces by ``stage`` (None: one piece, the document)."""
    if stage is None:
        return [Piece(text, {"chars": [0, len(text)]})]
    parts: list[tuple[int, int, dict[str, Any]]]
    if stage.by == "pages":
        parts = [(a, b, {"page": i + 1}) for i, (a, b) in enumerate(pages)]
    elif stage.by == "headings":
        parts = _sections(text, _headings(text, stage.depth))
    elif stage.by == "sections":
        parts = _sections(text, _numbered(text, stage.depth))
    elif stage.by in ("pasal", "verse"):
        parts = _units(text, stage.by, stage.depth)
    else:
        parts = []
    if len(parts) < 2:
        parts = [(0, len(text), {})]
    size = max(16, window_tokens * ASCII_PER_TOKEN)
    overlap = int(size * stage.overlap)
    pieces: list[Piece] = []
    for a, b, loc in parts:
        body = text[a:b]
        lead = len(body) - len(body.lstrip())
        a, b = a + lead, a + len(body.rstrip())
        if a >= b:
            continue
        if b - a <= size:
            pieces.append(Piece(text[a:b], {**loc, "chars": [a, b]}))
            continue
        for n, (wa, wb) in enumerate(windows(text[:b], a, size, overlap), 1):
            piece = text[wa:wb].strip()
            if piece:
                pieces.append(Piece(piece, {**loc, "window": n, "chars": [wa, wb]}))
    return pieces or [Piece(text, {"chars": [0, len(text)]})]
