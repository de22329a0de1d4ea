"""What a chunk is, what a chunker promises, and the helpers every format shares.

A chunk is one canonical unit of a document (a verse, an ayat, a paragraph under
its headings), addressed by a path that stays the same as long as the unit does.
Its hash covers what the unit *is* (text, canonical fields, chunker version) and
not where it sits in the file, so the ingest ledger re-embeds changed units only.

Chunkers stream: they see one line at a time and hold one unit, never the file.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from abc import ABC, abstractmethod
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from herd.errors import HerdError
from herd.jsonvalue import JSON, canonical

LINE_KEYS = frozenset({"start_line", "end_line"})
"""Metadata that says where a unit sits, not what it is: left out of the hash."""

DEFAULT_MAX_CHARS = 8000
"""Longest run of unnumbered text kept as one paragraph (see ``Outline.text``)."""


class ChunkError(HerdError):
    """The document cannot be chunked."""

    def __init__(
        self, message: str | None = None, *, doc: str | None = None, line: int | None = None
    ) -> None:
        where = ", ".join(p for p in (doc, None if line is None else f"line {line}") if p)
        base = message or (self.__doc__ or "").strip().splitlines()[0]
        super().__init__(f"{where}: {base}" if where else base)
        self.doc = doc
        self.line = line


class UnknownFormat(ChunkError):
    """No chunker has that name."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """One canonical unit of a document, ready to embed and to record in the ledger."""

    id: str
    text: str
    breadcrumb: str
    metadata: dict[str, JSON]
    hash: str

    @classmethod
    def create(
        cls,
        *,
        chunker: str,
        version: str,
        id: str,
        text: str,
        breadcrumb: str,
        metadata: dict[str, JSON],
    ) -> Chunk:
        return cls(id, text, breadcrumb, metadata, chunk_hash(text, metadata, chunker, version))


@dataclass(frozen=True, slots=True)
class Marker:
    """Source text turned into structure (a verse reference, a ``Pasal 5`` line, ``##``).

    It lives on in ids, breadcrumbs and metadata instead of chunk text; chunkers
    report it so that "no text is dropped" can be checked: every token of the
    input is in some chunk's text or in some marker.
    """

    line: int
    kind: str
    text: str


class Chunker(Protocol):
    """Turns one document into chunks, streaming: memory is bounded by the largest unit."""

    @property
    def name(self) -> str: ...

    @property
    def version(self) -> str: ...

    def chunk(self, doc_id: str, lines: Iterable[str]) -> Iterator[Chunk]: ...


class BaseChunker(ABC):
    """The built-in chunkers: ``events`` yields chunks and markers in document order."""

    name: str
    version: str
    names_itself = True
    """Whether the text gives the ids (a verse, a Pasal, a record's id): False when
    they are only positions (``p12``) under the document's, which must then say
    where the file is (see ``chunk_file``'s ``place``)."""
    language = "simple"
    """The PostgreSQL text-search configuration a collection of these chunks gets for
    lexical search unless ``herd ingest --language`` says otherwise: ``simple``
    (lowercased words, no stemming) where the text can be in any language."""

    def chunk(self, doc_id: str, lines: Iterable[str]) -> Iterator[Chunk]:
        for event in self.events(doc_id, lines):
            if isinstance(event, Chunk):
                yield event

    @abstractmethod
    def events(self, doc_id: str, lines: Iterable[str]) -> Iterator[Chunk | Marker]:
        """Chunks, and the markers of the source text they consumed as structure."""


def chunk_hash(text: str, metadata: dict[str, JSON], chunker: str, version: str) -> str:
    content = {k: v for k, v in metadata.items() if k not in LINE_KEYS}
    payload = canonical({"chunker": chunker, "version": version, "text": text, "meta": content})
    # surrogatepass: a lone surrogate from a careless decoder must not crash the hash.
    return hashlib.sha256(payload.encode("utf-8", "surrogatepass")).hexdigest()


LINE_BREAK = re.compile(r"\r\n|\r|\n")


def normalize_line(line: str) -> str:
    return unicodedata.normalize("NFC", line.rstrip())


def raw_lines(lines: Iterable[str], *, file_start: bool = True) -> Iterator[str]:
    """The lines of ``lines`` as they are: each item may hold one line, with or without
    its ending, or several. Only ``\\r\\n``, ``\\r`` and ``\\n`` break lines, as in
    Python's text files, so line numbers match what an editor shows.
    """
    first = file_start  # a byte order mark means something only at the start of a file
    for item in lines:
        pieces = LINE_BREAK.split(item)
        if len(pieces) > 1 and not pieces[-1]:
            pieces.pop()
        if first and pieces:
            pieces[0] = pieces[0].removeprefix("\ufeff")
            first = False
        yield from pieces


def split_lines(lines: Iterable[str], *, file_start: bool = True) -> Iterator[str]:
    """Normalized lines: NFC, no trailing whitespace."""
    return map(normalize_line, raw_lines(lines, file_start=file_start))


def normalize_text(text: str) -> str:
    """NFC, ``\\n`` endings, no trailing spaces, no blank lines at either end."""
    return "\n".join(split_lines([text], file_start=False)).strip("\n")


def slugify(text: str, fallback: str = "untitled") -> str:
    slug = re.sub(r"[\W_]+", "-", unicodedata.normalize("NFC", text).lower()).strip("-")
    return slug or fallback


def check_doc_id(doc_id: str) -> str:
    if not doc_id or doc_id != doc_id.lower() or re.search(r"\s", doc_id) or doc_id[0] == "/":
        raise ChunkError(f"doc id {doc_id!r} must be lowercase, non-empty, without spaces")
    return doc_id


class UniqueIds:
    """Hands out ids unique within a document, in memory that grows with gaps, not with ids.

    Ids ending in a number (``kjv/genesis/1/31``, ``doc/p12``) are kept as runs of
    numbers per prefix, so a well-ordered 200 MB corpus costs one run per chapter.
    """

    def __init__(self) -> None:
        self._runs: dict[str, tuple[list[int], list[int]]] = {}
        self._other: set[str] = set()
        self._next_suffix: dict[str, int] = {}

    def claim(self, wanted: str) -> str:
        """``wanted``, or ``wanted~2``, ``~3``... when the source repeats an address."""
        if self._add(wanted):
            return wanted
        n = self._next_suffix.get(wanted, 2)
        while not self._add(f"{wanted}~{n}"):
            n += 1
        self._next_suffix[wanted] = n + 1
        return f"{wanted}~{n}"

    def _add(self, key: str) -> bool:
        m = _TRAILING_NUMBER.fullmatch(key)
        if m is None:
            if key in self._other:
                return False
            self._other.add(key)
            return True
        starts, ends = self._runs.setdefault(m[1], ([], []))
        n = int(m[2])
        i = bisect_right(starts, n)
        if i and ends[i - 1] >= n:
            return False
        joins_left = i > 0 and ends[i - 1] == n - 1
        joins_right = i < len(starts) and starts[i] == n + 1
        if joins_left and joins_right:
            ends[i - 1] = ends[i]
            del starts[i], ends[i]
        elif joins_left:
            ends[i - 1] = n
        elif joins_right:
            starts[i] = n
        else:
            starts.insert(i, n)
            ends.insert(i, n)
        return True


# The prefix is lazy so the number is the longest canonical one ("p012" -> "p0", 12):
# any split works as long as it is a function of the id.
_TRAILING_NUMBER = re.compile(r"(.*?)(0|[1-9][0-9]{0,17})")


class Block:
    """The lines of one unit as they arrive; blank lines at its edges are not kept."""

    __slots__ = ("lines", "start", "end", "size")

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.start = 0
        self.end = 0
        self.size = 0

    def add(self, number: int, line: str) -> None:
        if not line:
            if self.lines:
                self.lines.append("")
            return
        if not self.lines:
            self.start = number
        self.lines.append(line)
        self.end = number
        self.size += len(line) + 1

    def __bool__(self) -> bool:
        return bool(self.lines)

    def text(self) -> str:
        while self.lines and not self.lines[-1]:
            self.lines.pop()
        return "\n".join(self.lines)


class Emitter:
    """Makes the chunks of one run: unique ids, line numbers, hash."""

    def __init__(self, chunker: BaseChunker, doc_id: str) -> None:
        self.doc_id = check_doc_id(doc_id)
        self.name = chunker.name
        self.version = chunker.version
        self.ids = UniqueIds()

    def make(
        self, id: str, text: str, breadcrumb: str, meta: dict[str, JSON], start: int, end: int
    ) -> Chunk:
        return Chunk.create(
            chunker=self.name,
            version=self.version,
            id=self.ids.claim(id),
            text=text,
            breadcrumb=breadcrumb,
            metadata={**meta, "start_line": start, "end_line": end},
        )


@dataclass(slots=True, eq=False)
class Node:
    """An open structural node: a heading, a BAB, a chapter; or a unit (verse, pasal, ayat)."""

    level: int
    path: str
    label: str
    meta: dict[str, JSON]
    unit: bool = False
    line: int = 0
    extra: dict[str, JSON] = field(default_factory=dict)  # the unit's own chunk only
    block: Block = field(default_factory=Block)
    chunks: int = 0
    paragraphs: int = 0
    base: str = ""  # what the ids of its children start with: its path, unless transparent


Crumb = Callable[[Sequence[Node], int | None], str]


class Outline:
    """The open path of structural nodes, and where each line of text goes.

    A unit node's text is one chunk at the node's own id. A container's text (a
    preamble, a section) is split into paragraphs ``<path>/p1``, ``p2``... A node
    that ends without any chunk under it still yields one, with empty text, so a
    heading or a ``Pasal`` line is never lost even when nothing follows it.
    """

    def __init__(self, emitter: Emitter, crumb: Crumb, *, max_chars: int) -> None:
        self.emitter = emitter
        self.stack = [Node(0, emitter.doc_id, "", {}, base=emitter.doc_id)]
        self.crumb = crumb
        self.max_chars = max_chars
        self.paragraph_meta: dict[str, JSON] = {}

    @property
    def top(self) -> Node:
        return self.stack[-1]

    def open(
        self,
        level: int,
        segment: str,
        label: str,
        meta: dict[str, JSON],
        line: int,
        unit: bool,
        *,
        transparent: bool = False,
    ) -> Iterator[Chunk]:
        """Open a node under the deepest one above ``level``.

        A transparent node (a Bagian) is in breadcrumbs and metadata but not in the
        ids of its children, so that adding one does not move every id under it.
        """
        yield from self.close_to(level)
        parent = self.top
        yield from self.flush()  # a unit's own text comes before its children
        path = f"{parent.base}/{segment}"
        node = Node(level, path, label, meta, unit, line)
        node.base = parent.base if transparent else path
        self.stack.append(node)

    def close_to(self, level: int) -> Iterator[Chunk]:
        """Close every open node at ``level`` or deeper (the root stays)."""
        while len(self.stack) > 1 and self.top.level >= level:
            node = self.top
            yield from self.flush()
            if not node.chunks:
                yield self._emit(node, "", node.line, node.line, None)
            self.stack.pop()
            self.top.chunks += 1

    def text(self, number: int, line: str) -> Iterator[Chunk]:
        node = self.top
        if node.unit:
            node.block.add(number, line)
            return
        if not line or (node.block and node.block.size + len(line) > self.max_chars):
            # A run of lines with no blank between them is a paragraph only up to max_chars,
            # so a file without blank lines still streams in bounded chunks.
            yield from self.flush()
        node.block.add(number, line)

    def flush(self) -> Iterator[Chunk]:
        """End the paragraph under construction (for a unit: emit its text so far)."""
        node = self.top
        if not node.block:
            return
        block, node.block = node.block, Block()
        yield from self.paragraph(block, {})

    def paragraph(self, block: Block, meta: dict[str, JSON]) -> Iterator[Chunk]:
        node = self.top
        text = block.text()
        if node.unit:
            yield self._emit(node, text, node.line, max(node.line, block.end), None)
            return
        node.paragraphs += 1
        yield self._emit(node, text, block.start, block.end, node.paragraphs, meta)

    def _emit(
        self,
        node: Node,
        text: str,
        start: int,
        end: int,
        paragraph: int | None,
        meta: dict[str, JSON] | None = None,
    ) -> Chunk:
        merged: dict[str, JSON] = {}
        for n in self.stack:
            merged.update(n.meta)
        if paragraph is None:
            merged.update(node.extra)
            chunk_id = node.path
        else:
            merged.update(self.paragraph_meta)
            merged.update(meta or {})
            merged["paragraph"] = paragraph
            chunk_id = f"{node.path}/p{paragraph}"
        node.chunks += 1
        crumb = self.crumb(self.stack, paragraph)
        return self.emitter.make(chunk_id, text, crumb, merged, start, end)

    def finish(self) -> Iterator[Chunk]:
        yield from self.close_to(1)
        yield from self.flush()
