"""The fallback: blank-line separated paragraphs, ``<doc>/p12``.

A run of lines with no blank line between them longer than ``max_chars`` is cut
at a line boundary into several paragraphs, so a file of one sentence per line
streams in bounded chunks instead of becoming one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from herd.rag.chunkers.base import (
    DEFAULT_MAX_CHARS,
    BaseChunker,
    Chunk,
    Emitter,
    Marker,
    Node,
    Outline,
    split_lines,
)


def _crumb(stack: Sequence[Node], paragraph: int | None) -> str:
    return f"{stack[0].path} ¶{paragraph}"


class ParagraphChunker(BaseChunker):
    name = "paragraph"
    names_itself = False
    version = "1"

    def __init__(self, *, max_chars: int = DEFAULT_MAX_CHARS) -> None:
        self.max_chars = max_chars

    def events(self, doc_id: str, lines: Iterable[str]) -> Iterator[Chunk | Marker]:
        outline = Outline(Emitter(self, doc_id), _crumb, max_chars=self.max_chars)
        for number, line in enumerate(split_lines(lines), 1):
            yield from outline.text(number, line)
        yield from outline.finish()
