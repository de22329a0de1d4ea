"""Scripture by verse: ``kjv/genesis/1/1``, breadcrumb ``Genesis 1:1``.

Two layouts, mixable within one file:

* reference lines, ``Genesis 1:1 In the beginning...`` (``1 Samuel 3:4``,
  ``Song of Solomon 2:1``, a range ``Romans 16:25-27``), or ``1:1 In the...`` under
  a book title line (the Project Gutenberg layout);
* chapter-headed text: a book title line, ``Chapter 1`` / ``CHAPTER 1`` /
  ``Psalm 23`` headers, then verses ``1 In the beginning...`` or ``[1] ...``.

Lines that follow a verse with no blank line between wrap that verse. Other text
(a preface, a section heading like "The Creation", a Psalm's superscription) is
kept as paragraphs of the node it sits in: ``kjv/p1`` before any book,
``kjv/genesis/p1`` before chapter 1, ``kjv/psalms/23/p1`` in a chapter, with
``after_verse`` in the metadata. A book title is a short line, alone in its
paragraph, right before a chapter header or a ``1:1`` line.

A bare ``N text`` line under a chapter header is a verse when it is the first of
the chapter or N is a little above the last verse (within 5, as translations skip
disputed verses): a wrapped line that starts with a number ("187 years") then
stays in its verse. ``[N]`` and ``C:V`` are always verses.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence

from herd.jsonvalue import JSON
from herd.rag.chunkers.base import (
    DEFAULT_MAX_CHARS,
    BaseChunker,
    Block,
    Chunk,
    Emitter,
    Marker,
    Node,
    Outline,
    slugify,
    split_lines,
)

_WORD = r"[^\W\d_][\w'’.-]*"
_VERSE = r"(?P<chapter>\d+):(?P<verse>\d+)(?:[-–](?P<last>\d+))?(?=\s|$)"
REFERENCE = re.compile(rf"(?P<book>(?:[1-4] ?)?{_WORD}(?:[ \t]+{_WORD}){{0,5}})[ \t]+{_VERSE}")
CHAPTER_VERSE = re.compile(_VERSE)
BRACKETED = re.compile(r"\[(?P<verse>\d+)\](?=\s|$)")
NUMBERED = re.compile(r"(?P<verse>\d+)(?=\s+\S)")
HEADER = re.compile(r"(?P<word>chapter|psalm|ch\.)[ \t]+(?P<chapter>\d+)\.?", re.IGNORECASE)

BOOK, CHAPTER, VERSE = 1, 2, 3
_NUMBERED_STEP = 5
_TITLE_WORDS = 8


def reference(line: str) -> re.Match[str] | None:
    """A ``Book C:V`` match whose book starts like a name (not a lowercase word)."""
    if line[:1].islower():
        return None
    return REFERENCE.match(line)


def _crumb(stack: Sequence[Node], paragraph: int | None) -> str:
    labels = {n.level: n.label for n in stack}
    place = labels.get(CHAPTER, "")
    if VERSE in labels:
        place = f"{place}:{labels[VERSE]}" if place else labels[VERSE]
    crumb = " ".join(p for p in (labels.get(BOOK), place) if p) or stack[0].path
    return crumb if paragraph is None else f"{crumb} ¶{paragraph}"


class VerseChunker(BaseChunker):
    name = "verse"
    version = "1"
    language = "english"  # the scripture of the public-domain corpora herd ships with

    def __init__(self, *, max_chars: int = DEFAULT_MAX_CHARS) -> None:
        self.max_chars = max_chars

    def events(self, doc_id: str, lines: Iterable[str]) -> Iterator[Chunk | Marker]:
        run = _Run(Outline(Emitter(self, doc_id), _crumb, max_chars=self.max_chars))
        for number, line in enumerate(split_lines(lines), 1):
            yield from run.feed(number, line)
        yield from run.finish()


class _Run:
    def __init__(self, outline: Outline) -> None:
        self.outline = outline
        self.held: Block | None = None  # a finished one-line paragraph that may be a book title
        self.numbered = False  # bare "N text" lines are verses only under a chapter header
        self.last_verse = 0

    def feed(self, number: int, line: str) -> Iterator[Chunk | Marker]:
        s = line.strip()
        if not s:
            yield from self.outline.close_to(VERSE)
            yield from self._end_paragraph()
            return
        if m := HEADER.fullmatch(s):
            yield from self._structure(title_follows=True)
            yield from self._title()
            book = self._book()
            if book is None and m["word"].lower() == "psalm":
                book = "Psalms"  # a "Psalm 23" header without a title can only be in Psalms
            yield from self._enter(book, int(m["chapter"]), number, new_chapter=True)
            self.numbered = True
            yield Marker(number, "chapter", s)
            return
        if (m := reference(s)) is not None:
            yield from self._structure(title_follows=False)
            book = " ".join(m["book"].split())
            yield from self._verse(number, s, m, book)
            return
        if m := CHAPTER_VERSE.match(s):
            first = m["chapter"] == "1" and m["verse"] == "1"
            yield from self._structure(title_follows=first)
            yield from self._title()
            yield from self._verse(number, s, m, self._book())
            return
        m = BRACKETED.match(s) or NUMBERED.match(s)
        if m and self.numbered and self._is_next_verse(m):
            yield from self._structure(title_follows=False)
            yield from self._open_verse(number, s, m, int(m["verse"]), None)
            return
        if self.held is not None:
            yield from self._emit_held()
        yield from self.outline.text(number, line)

    def finish(self) -> Iterator[Chunk | Marker]:
        yield from self._structure(title_follows=False)
        yield from self.outline.finish()

    def _is_next_verse(self, m: re.Match[str]) -> bool:
        verse = int(m["verse"])
        if m.re is BRACKETED or not self.last_verse:
            return True
        return self.last_verse < verse <= self.last_verse + _NUMBERED_STEP

    def _book(self) -> str | None:
        return next((n.label for n in self.outline.stack if n.level == BOOK), None)

    def _chapter(self) -> int | None:
        return next((n.meta["chapter"] for n in self.outline.stack if n.level == CHAPTER), None)

    def _structure(self, *, title_follows: bool) -> Iterator[Chunk]:
        """Before a structural line: end the open verse and paragraph, settle a held title."""
        yield from self.outline.close_to(VERSE)
        yield from self._end_paragraph()
        if not title_follows and self.held is not None:
            yield from self._emit_held()

    def _end_paragraph(self) -> Iterator[Chunk]:
        node = self.outline.top
        if node.unit or not node.block:
            return
        if self.held is not None:
            yield from self._emit_held()
        block = node.block
        words = block.text().split()
        if len(block.lines) == 1 and len(words) <= _TITLE_WORDS and not words[0][0].islower():
            node.block = Block()
            self.held = block
        else:
            yield from self.outline.flush()

    def _emit_held(self) -> Iterator[Chunk]:
        held, self.held = self.held, None
        if held is not None:
            yield from self.outline.paragraph(held, {})

    def _title(self) -> Iterator[Chunk | Marker]:
        held, self.held = self.held, None
        if held is None:
            return
        title = " ".join(held.text().split())
        yield from self.outline.close_to(BOOK)
        yield from self.outline.open(
            BOOK, slugify(title), title, {"book": title}, held.start, False
        )
        yield Marker(held.start, "title", held.text())

    def _verse(
        self, number: int, s: str, m: re.Match[str], book: str | None
    ) -> Iterator[Chunk | Marker]:
        yield from self._enter(book, int(m["chapter"]), number, new_chapter=False)
        self.numbered = False
        last = int(m["last"]) if m["last"] else None
        yield from self._open_verse(number, s, m, int(m["verse"]), last)

    def _enter(
        self, book: str | None, chapter: int, number: int, *, new_chapter: bool
    ) -> Iterator[Chunk]:
        outline = self.outline
        current = self._book()
        if book is not None and book != current and slugify(book) != slugify(current or ""):
            yield from outline.close_to(BOOK)
            yield from outline.open(BOOK, slugify(book), book, {"book": book}, number, False)
        if new_chapter or chapter != self._chapter():
            label = str(chapter)
            yield from outline.open(CHAPTER, label, label, {"chapter": chapter}, number, False)
            outline.paragraph_meta = {}
            self.last_verse = 0

    def _open_verse(
        self, number: int, s: str, m: re.Match[str], verse: int, last: int | None
    ) -> Iterator[Chunk | Marker]:
        label = f"{verse}-{last}" if last is not None else str(verse)
        meta: dict[str, JSON] = {"verse": verse}
        if last is not None:
            meta["verse_end"] = last
        yield from self.outline.open(VERSE, label, label, meta, number, True)
        self.last_verse = last or verse
        self.outline.paragraph_meta = {"after_verse": self.last_verse}
        yield Marker(number, "verse", m[0])
        yield from self.outline.text(number, s[m.end() :].lstrip())
