"""Reading a corpus file as text: one reader per kind of file, chosen by a small registry.

``kind_of`` picks the kind from the suffix (``.pdf``; ``.html``, ``.htm``, ``.xhtml``),
else from the first bytes (``%PDF-``, ``<!doctype html``, ``<html``; several NUL bytes:
``binary``, refused with that reason), else ``text``.
``chunk_source`` then streams the file's chunks through the structural chunkers, as
``herd.rag.chunkers.chunk_file`` does for text:

* **text** (UTF-8: plain, Markdown, JSONL, scripture, statutes): read by the
  chunkers themselves, line by line, in bounded memory.
* **pdf**: the text layer of each page through pypdf (already a dependency, pure
  Python, maintained). Layout extraction keeps the vertical gaps between
  paragraphs as blank lines, which the chunkers split on; a running header or
  footer (a bare page number, a line repeated at the top or bottom of most pages)
  is dropped. A PDF whose outline (bookmarks) names sections has its section
  titles turned into headings, so a manual is chunked by section like Markdown;
  a statute is recognised by its ``BAB``/``Pasal`` lines as in a text file. Each
  chunk's metadata gets ``page`` and ``page_end`` (1-based), which query answers
  show. Like line numbers they say where a unit sits, not what it is: they are
  added after the chunk's hash, so text that moves to another page is not
  embedded again.
* **html**: the standard library's ``html.parser`` (tolerant of broken markup, no
  dependency to add for text extraction): ``h1``-``h6`` become Markdown headings,
  block elements paragraphs, ``pre`` a fenced block, scripts and styles dropped;
  the Markdown chunker then cuts it by section.

A file that cannot be read raises ``SourceError`` (a ``ChunkError``) naming what is
wrong; ``herd ingest`` reports it with the file's name and indexes the rest.
``herd eval submit`` reads documents through ``document_text`` here too.
"""

from __future__ import annotations

import bisect
import dataclasses
import html
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

from pypdf import PdfReader
from pypdf.errors import PdfReadError

from herd.rag.chunkers import SNIFF_LINES, Chunk, ChunkError, chunk_file, detect_format, get_chunker
from herd.rag.chunkers import format_of as text_format_of
from herd.rag.chunkers.base import slugify


class SourceError(ChunkError):
    """The file cannot be read."""


@dataclass(frozen=True)
class Extracted:
    """A document's text as lines (no line endings), and where its pages start."""

    lines: list[str]
    format: str | None = None  # the chunker format the kind implies (HTML: markdown)
    pages: Sequence[int] = ()  # the line number (1-based) each page starts at


class Reader(Protocol):
    """Turns one kind of file into text lines; raises SourceError when it cannot."""

    def extract(self, path: Path) -> Extracted: ...


# -- PDF

_PAGE_NUMBER = re.compile(
    r"(?i)[-–—(\s]*(?:page|halaman|hal\.)?\s*\d{1,4}(?:\s*(?:of|/|dari)\s*\d{1,4})?[-–—)\s]*"
)
_SPACES = re.compile(r"[ \t\u00a0]{2,}")


class PdfSource:
    """The text layer of a PDF, page by page (see the module's docstring)."""

    def extract(self, path: Path) -> Extracted:
        pages = [_tidy(text.splitlines()) for text in self.page_texts(path)]
        pages = _without_furniture(pages)
        titles = self._titles(path)
        if titles:
            # Read as Markdown when a title is found: text that looks like Markdown (a
            # shell comment in a listing, a fence) must stay text.
            escaped = [[_literal(line) for line in page] for page in pages]
        lines: list[str] = []
        starts: list[int] = []
        headed = 0
        for number, page in enumerate(escaped if titles else pages):
            starts.append(len(lines) + 1)
            for title, depth in titles.get(number, []):
                headed += _head(page, title, depth)
            lines += page
        if not any(line.strip() for line in lines):
            raise SourceError("the PDF has no text layer (a scan?); nothing to index")
        if titles and not headed:
            return Extracted([line for page in pages for line in page], None, starts)
        return Extracted(lines, "markdown" if headed else None, starts)

    def page_texts(self, path: Path, *, layout: bool = True) -> list[str]:
        """Each page's text; in layout mode with blank lines where the page has vertical
        gaps, else as pypdf's plain extraction runs the lines together."""
        try:
            reader = PdfReader(path)
            if reader.is_encrypted and not reader.decrypt(""):
                raise SourceError("the PDF is encrypted with a password")
            if layout:
                return [p.extract_text(extraction_mode="layout") or "" for p in reader.pages]
            return [p.extract_text() or "" for p in reader.pages]
        except SourceError:
            raise
        except (PdfReadError, OSError) as exc:
            raise SourceError(f"not a readable PDF ({exc})") from None
        except Exception as exc:  # noqa: BLE001 - a damaged file trips pypdf in many ways
            raise SourceError(f"not a readable PDF ({type(exc).__name__}: {exc})") from None

    def _titles(self, path: Path) -> dict[int, list[tuple[str, int]]]:
        """Outline entries by page index: (title, depth from 1)."""
        try:
            reader = PdfReader(path)
            found: dict[int, list[tuple[str, int]]] = {}

            def walk(items: list[Any], depth: int) -> None:
                for item in items:
                    if isinstance(item, list):
                        walk(item, depth + 1)
                        continue
                    page = reader.get_destination_page_number(item)
                    title = " ".join(str(item.title or "").split())
                    if page is not None and page >= 0 and title:
                        found.setdefault(page, []).append((title, min(depth, 6)))

            walk(reader.outline, 1)
            return found
        except Exception:  # noqa: BLE001 - an unreadable outline only loses the headings
            return {}


def _literal(line: str) -> str:
    """A line of text that Markdown would read as structure, escaped (``\\#``)."""
    return "\\" + line if line[:1] == "#" or line[:3] in ("```", "~~~") else line


def _tidy(lines: list[str]) -> list[str]:
    """Layout text without its column padding; runs of blank lines kept as one."""
    out: list[str] = []
    for line in lines:
        s = _SPACES.sub(" ", line).strip()
        if s or (out and out[-1]):
            out.append(s)
    while out and not out[-1]:
        out.pop()
    return out


def _without_furniture(pages: list[list[str]]) -> list[list[str]]:
    """Drop page numbers and running headers/footers: a first or last line that is a bare
    number, or that (digits aside) starts or ends most pages of a document of 3 or more."""

    def key(line: str) -> str:
        return re.sub(r"\d+", "#", line.lower())

    common: set[str] = set()
    if len(pages) >= 3:
        edges = Counter(key(p[i]) for p in pages if p for i in {0, len(p) - 1})
        common = {k for k, n in edges.items() if n * 2 >= len(pages)}
    out = []
    for page in pages:
        page = list(page)
        for end in (0, -1):
            for _ in range(2):  # a running header and a page number, at most
                if page and (_PAGE_NUMBER.fullmatch(page[end]) or key(page[end]) in common):
                    page.pop(end)
                    while page and not page[end]:
                        page.pop(end)
        out.append(page)
    return out


def _head(page: list[str], title: str, depth: int) -> int:
    """Turn the page's line that starts with ``title`` into a Markdown heading (1 if found)."""
    wanted = " ".join(title.lower().split())
    for i, line in enumerate(page):
        if " ".join(line.lower().split()).startswith(wanted) and not line.startswith("#"):
            rest = line.strip()[len(title) :].strip() if line.strip().startswith(title) else ""
            page[i] = f"{'#' * depth} {title}"
            if rest:  # the title ran into the first words of its text
                page.insert(i + 1, rest)
            return 1
    return 0


# -- HTML

_SKIPPED = frozenset({"script", "style", "head", "noscript", "template", "svg", "iframe"})
_BLOCKS = frozenset(
    {"address", "article", "aside", "blockquote", "dd", "div", "dl", "dt", "fieldset"}
    | {"figcaption", "figure", "footer", "form", "header", "hr", "li", "main", "nav", "ol"}
    | {"p", "section", "table", "tbody", "thead", "tfoot", "tr", "ul"}
)
_HEADINGS = {f"h{n}": n for n in range(1, 7)}


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.lines: list[str] = []
        self.words: list[str] = []  # the text of the line being read, as it came
        self.skip = 0
        self.heading = 0
        self.pre = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIPPED:
            self.skip += 1
        elif tag in _HEADINGS:
            self.block()
            self.heading = _HEADINGS[tag]
        elif tag == "pre":
            self.block()
            self.pre += 1
            self.lines += ["```", ""]  # the text's first line replaces the empty one
        elif tag == "br":
            self.line()
        elif tag in _BLOCKS:
            self.block()
            if tag == "li":
                self.words.append("- ")
        elif tag in ("td", "th") and self.words:
            self.words.append(" | ")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIPPED:
            self.skip = max(0, self.skip - 1)
        elif tag in _HEADINGS and self.heading:
            title = " ".join("".join(self.words).split())
            self.words = []
            if title:
                self.lines += [f"{'#' * self.heading} {title}", ""]
            self.heading = 0
        elif tag == "pre" and self.pre:
            self.pre -= 1
            if self.lines and not self.lines[-1]:
                self.lines.pop()
            self.lines += ["```", ""]
        elif tag in _BLOCKS:
            self.block()

    def handle_data(self, data: str) -> None:
        if self.skip:
            return
        if self.pre:
            first, *rest = data.split("\n")
            self.lines[-1] += first
            self.lines += rest
            return
        self.words.append(data)

    def line(self) -> None:
        text = " ".join("".join(self.words).split())
        self.words = []
        if text:
            self.lines.append(_literal(text))  # text, never Markdown structure

    def block(self) -> None:
        self.line()
        if self.lines and self.lines[-1]:
            self.lines.append("")


_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?([\w.:-]+)""", re.I)


class HtmlSource:
    """An HTML page's text, its headings as Markdown headings."""

    def extract(self, path: Path) -> Extracted:
        data = _read(path)
        declared = _CHARSET.search(data[:4096])
        encoding = "utf-8-sig"
        if declared and declared[1].lower() not in (b"utf-8", b"utf8"):
            encoding = declared[1].decode("ascii")
        try:
            text = data.decode(encoding)
        except LookupError:
            raise SourceError(f"unknown charset {encoding!r} declared") from None
        except UnicodeDecodeError as exc:
            raise SourceError(f"not {encoding} text at byte {exc.start} ({exc.reason})") from None
        parser = _Text()
        parser.feed(text)
        parser.close()
        parser.block()
        lines = [html.unescape(line) if "&" in line else line for line in parser.lines]
        if not any(line.strip() for line in lines):
            raise SourceError("the HTML page has no text")
        return Extracted(lines, "markdown")


class BinarySource:
    """A file none of the readers can make text of: refused with a reason, never indexed."""

    def extract(self, path: Path) -> Extracted:
        raise SourceError("a binary file, not text, PDF or HTML")


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SourceError(exc.strerror or str(exc)) from None


# -- the registry

READERS: MappingProxyType[str, Reader] = MappingProxyType(
    {"pdf": PdfSource(), "html": HtmlSource(), "binary": BinarySource()}
)
"""Readers by kind; ``text`` files are read by the chunkers themselves, streaming."""
SUFFIXES = MappingProxyType({".pdf": "pdf", ".html": "html", ".htm": "html", ".xhtml": "html"})
BINARY_NULS = 4
"""NUL bytes in a file's first KB that make it binary."""
_SNIFFS: tuple[tuple[Callable[[bytes], bool], str], ...] = (
    (lambda head: head.startswith(b"%PDF-"), "pdf"),
    (lambda head: head.lstrip().lower().startswith((b"<!doctype html", b"<html")), "html"),
    # Several NULs: an executable, an image, an archive. One is a text file's flaw,
    # reported at its line by the text reader.
    (lambda head: head.count(b"\x00") >= BINARY_NULS, "binary"),
)


def kind_of(path: str | os.PathLike[str]) -> str:
    """``pdf``, ``html``, ``binary`` or ``text``: by suffix, else by the first bytes."""
    path = Path(path)
    if kind := SUFFIXES.get(path.suffix.lower()):
        return kind
    try:
        with path.open("rb") as file:
            head = file.read(1024).removeprefix(b"\xef\xbb\xbf")
    except OSError:
        return "text"  # reported when the file is read
    return next((kind for sniff, kind in _SNIFFS if sniff(head)), "text")


def extract(path: str | os.PathLike[str]) -> Extracted:
    """The text of a PDF or HTML file (SourceError for a text file: stream those)."""
    kind = kind_of(path)
    if kind not in READERS:
        raise SourceError(f"{path}: a {kind} file is read by the chunkers, not extracted")
    return READERS[kind].extract(Path(path))


def format_of(path: str | os.PathLike[str], format: str | None = None) -> str:
    """The chunker format ``chunk_source`` reads a file with: ``format`` if given, else
    the one its kind implies (HTML, a PDF with an outline: markdown), else detected."""
    if format is not None:
        return format
    if kind_of(path) == "text":
        return text_format_of(path)
    text = extract(path)
    return text.format or detect_format(Path(path).with_suffix(".txt"), text.lines[:SNIFF_LINES])


def chunk_source(
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    place: str | None = None,
    **options: Any,
) -> Iterator[Chunk]:
    """The chunks of any supported file (see ``chunk_file`` for ``place`` and ids)."""
    path = Path(path)
    if kind_of(path) == "text":
        yield from chunk_file(path, format=format, place=place, **options)
        return
    text = extract(path)
    doc = slugify(path.stem, fallback="doc")
    # A PDF's detection sees its text as a text file's would (the suffix picks nothing).
    fmt = format or text.format or detect_format(path.with_suffix(".txt"), text.lines[:SNIFF_LINES])
    chunker = get_chunker(fmt, **options)
    if place is not None and not chunker.names_itself:
        doc = place
    for chunk in chunker.chunk(doc, text.lines):
        yield _paged(chunk, text.pages) if text.pages else chunk


def _paged(chunk: Chunk, starts: Sequence[int]) -> Chunk:
    first = chunk.metadata.get("start_line")
    last = chunk.metadata.get("end_line", first)
    if not isinstance(first, int) or not isinstance(last, int):
        return chunk
    pages = {
        "page": bisect.bisect_right(starts, first),
        "page_end": bisect.bisect_right(starts, last),
    }
    # After the hash (see the module's docstring): where it sits, not what it is.
    return dataclasses.replace(chunk, metadata={**chunk.metadata, **pages})


def document_text(path: Path) -> str:
    """A whole document as one string (``herd eval submit``): pages joined by a blank line."""
    if kind_of(path) == "pdf":
        # Plain extraction, as before this module: a document's text is part of its
        # evaluation's cache key, and layout mode would change every PDF's.
        return "\n\n".join(PdfSource().page_texts(path, layout=False))
    return "\n".join(extract(path).lines)


def pages_of(chunk_metadata: dict[str, Any]) -> str:
    """``p. 3`` or ``pp. 3-4`` for a chunk that came from a PDF, else empty."""
    first, last = chunk_metadata.get("page"), chunk_metadata.get("page_end")
    if not isinstance(first, int):
        return ""
    return f"p. {first}" if not isinstance(last, int) or last == first else f"pp. {first}-{last}"


__all__ = [
    "READERS",
    "Extracted",
    "HtmlSource",
    "PdfSource",
    "Reader",
    "SourceError",
    "chunk_source",
    "document_text",
    "extract",
    "format_of",
    "kind_of",
    "pages_of",
]
