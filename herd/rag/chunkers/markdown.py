"""Markdown by paragraph under its headings: ``guide/install/linux/p3``.

ATX headings (``#`` to ``######``) open sections; a section's id is its heading
path, slugged, and each paragraph (blank-line separated) in it is a chunk
``.../p1``, ``p2``... with the heading path as breadcrumb (``Guide › Install ›
Linux``). Paragraphs rather than whole sections: a section can be any length,
a paragraph is the unit an answer quotes.

A fenced code block (```` ``` ```` or ``~~~``, at any indent) is one chunk, fences
included, never split, and a ``#`` line inside it is code, not a heading; an
unclosed fence runs to the end of the file, as in CommonMark. Setext headings
(text underlined with ``===``) are not recognised and stay text. A heading with
nothing under it is a chunk of its own with empty text, so it is never lost.
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

HEADING = re.compile(r" {0,3}(?P<marks>#{1,6})(?:[ \t]+(?P<title>.*?))?(?:[ \t]+#+)?[ \t]*")
FENCE = re.compile(r"[ \t]*(?P<fence>`{3,}(?=[^`]*$)|~{3,})(?P<info>.*)")


def _crumb(stack: Sequence[Node], paragraph: int | None) -> str:
    return " › ".join(n.label for n in stack[1:]) or stack[0].path


class MarkdownChunker(BaseChunker):
    name = "markdown"
    names_itself = False
    version = "1"

    def __init__(self, *, max_chars: int = DEFAULT_MAX_CHARS) -> None:
        self.max_chars = max_chars

    def events(self, doc_id: str, lines: Iterable[str]) -> Iterator[Chunk | Marker]:
        outline = Outline(Emitter(self, doc_id), _crumb, max_chars=self.max_chars)
        outline.stack[0].meta["headings"] = []
        fence = ""
        code = Block()
        info: dict[str, JSON] = {}
        for number, line in enumerate(split_lines(lines), 1):
            if fence:
                code.add(number, line)
                if _closes(line, fence):
                    yield from outline.paragraph(code, info)
                    fence, code = "", Block()
                continue
            if m := FENCE.fullmatch(line):
                yield from outline.flush()
                fence = m["fence"]
                info = {"kind": "code"}
                if language := m["info"].split(maxsplit=1):
                    info["language"] = language[0]
                code.add(number, line)
                continue
            if m := HEADING.fullmatch(line):
                level = len(m["marks"])
                title = " ".join((m["title"] or "").split())
                yield from outline.close_to(level)
                headings = outline.top.meta["headings"]
                assert isinstance(headings, list)
                meta: dict[str, JSON] = {"headings": [*headings, title]}
                yield from outline.open(level, slugify(title), title, meta, number, False)
                yield Marker(number, "heading", line.strip())
                continue
            yield from outline.text(number, line)
        if fence:
            yield from outline.paragraph(code, info)
        yield from outline.finish()


def _closes(line: str, fence: str) -> bool:
    s = line.strip()
    return len(s) >= len(fence) and s == fence[0] * len(s)
