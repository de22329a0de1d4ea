"""Indonesian legislation by ayat: ``uu-13-2003/bab-iv/pasal-5/ayat-2``.

The body is BAB (Roman numeral, title on the next line) › Bagian (``Kesatu``...,
title) › Paragraf (``1``, title) › Pasal (``5``, or ``5A`` when inserted by an
amendment) › ayat ``(1)`` › huruf ``a.``. Ids name BAB, Pasal, ayat and huruf only:
Pasal numbers run through the whole law, and an id must not change when a
Bagian is added. Bagian and Paragraf are in the breadcrumb and the metadata.

Granularity (``granularity=``):

* ``"ayat"`` (default): the unit is the ayat, or the Pasal when it has none.
  Huruf ``a.`` and angka ``1.`` items stay in their ayat's text, since "b.
  kemampuan..." means nothing without the sentence that introduces it; their
  letters and numbers are listed in the metadata (``huruf``, ``angka``).
* ``"huruf"``: each huruf is its own chunk, ``.../ayat-1/huruf-a``, as legal
  citations ("Pasal 52 ayat (1) huruf a") address it; the lead-in sentence is
  the ayat's own chunk, and lines after the last huruf stay with that huruf.

A unit's own number (``(2)``, ``a.``) is structure, not text; items inside it keep
theirs. Text before the first BAB or Pasal is the preamble, ``.../pembukaan/p1``
(a new paragraph at ``Menimbang``, ``Mengingat``, ``MEMUTUSKAN``...); the closing
formula from "Agar setiap orang mengetahuinya" or "Disahkan di" on is
``.../penutup/p1``. ``PENJELASAN`` opens the elucidation: ``.../penjelasan/umum/p1``
and ``.../penjelasan/pasal-demi-pasal/pasal-5/ayat-1`` (``Ayat (1)`` and ``Huruf a``
header lines there).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Literal

from herd.jsonvalue import JSON
from herd.rag.chunkers.base import (
    DEFAULT_MAX_CHARS,
    BaseChunker,
    Chunk,
    ChunkError,
    Emitter,
    Marker,
    Node,
    Outline,
    slugify,
    split_lines,
)

_I = re.IGNORECASE
BAB = re.compile(r"BAB[ \t]+(?P<n>[IVXLCDM]+)(?:[ \t]+(?P<title>\S.*))?")
BAGIAN = re.compile(r"Bagian[ \t]+(?P<n>Ke\w+(?:[ \t]+(?:Belas|Puluh(?:[ \t]+\w+)?))?)", _I)
PARAGRAF = re.compile(r"Paragraf[ \t]+(?P<n>\d+|Ke\w+)", _I)
PASAL = re.compile(r"Pasal[ \t]+(?P<n>\d+[ \t]*[A-Z]?)", _I)
PENJELASAN = re.compile(r"PENJELASAN")
UMUM = re.compile(r"(?:[IVX]+\.[ \t]*)?UMUM", _I)
PASAL_DEMI_PASAL = re.compile(r"(?:[IVX]+\.[ \t]*)?PASAL[ \t]+DEMI[ \t]+PASAL", _I)
AYAT = re.compile(r"\((?P<n>\d+[a-z]?)\)(?=\s|$)")
AYAT_HEADER = re.compile(r"Ayat[ \t]+\((?P<n>\d+[a-z]?)\)", _I)
HURUF = re.compile(r"(?P<n>[a-z])[.)](?=\s|$)")
HURUF_HEADER = re.compile(r"Huruf[ \t]+(?P<n>[a-z])", _I)
ANGKA = re.compile(r"(?P<n>\d+)\.(?=\s)")
CLAUSE = re.compile(
    r"(?P<n>Menimbang|Mengingat|Memperhatikan|Dengan[ \t]+Persetujuan[ \t]+Bersama"
    r"|Memutuskan|Menetapkan)\b",
    _I,
)
CLOSING = re.compile(
    r"Agar[ \t]+setiap[ \t]+orang[ \t]+mengetahuinya|(?:Disahkan|Diundangkan)[ \t]+di\b"
    r"|(?:TAMBAHAN[ \t]+)?LEMBARAN[ \t]+NEGARA\b"
)

PART, BAB_LEVEL, BAGIAN_LEVEL, PARAGRAF_LEVEL, PASAL_LEVEL, AYAT_LEVEL, HURUF_LEVEL = range(1, 8)
SECTION = 2  # umum / pasal demi pasal / penutup, inside the penjelasan

Granularity = Literal["ayat", "huruf"]


def doc_label(doc_id: str) -> str:
    """``uu-13-2003`` -> ``UU 13/2003``; any other id as it is."""
    m = re.fullmatch(r"([a-z]+)-(\d+[a-z]?)-(\d{4})", doc_id)
    return f"{m[1].upper()} {m[2].upper()}/{m[3]}" if m else doc_id


def _crumb(stack: Sequence[Node], paragraph: int | None) -> str:
    crumb = " › ".join([doc_label(stack[0].path)] + [n.label for n in stack[1:]])
    return crumb if paragraph is None else f"{crumb} ¶{paragraph}"


class PasalChunker(BaseChunker):
    name = "pasal"
    version = "1"
    language = "indonesian"

    def __init__(
        self, *, granularity: Granularity = "ayat", max_chars: int = DEFAULT_MAX_CHARS
    ) -> None:
        if granularity not in ("ayat", "huruf"):
            raise ChunkError(f"granularity must be 'ayat' or 'huruf', not {granularity!r}")
        self.granularity = granularity
        self.max_chars = max_chars

    def events(self, doc_id: str, lines: Iterable[str]) -> Iterator[Chunk | Marker]:
        outline = Outline(Emitter(self, doc_id), _crumb, max_chars=self.max_chars)
        run = _Run(outline, by_huruf=self.granularity == "huruf")
        for number, line in enumerate(split_lines(lines), 1):
            yield from run.feed(number, line)
        yield from outline.finish()


class _Run:
    def __init__(self, outline: Outline, *, by_huruf: bool) -> None:
        self.outline = outline
        self.by_huruf = by_huruf
        self.part = "pembukaan"  # then "body", "penutup", "penjelasan"
        self.titled: Node | None = None  # a BAB/Bagian/Paragraf whose title may follow
        self.title_key = ""
        self.title_lines: list[str] = []

    def feed(self, number: int, line: str) -> Iterator[Chunk | Marker]:
        s = line.strip()
        kind, m = self._classify(s)
        if self.titled is not None:
            if not s:
                if self.title_lines:
                    self.titled = None
            elif kind is None and self._continues_title(s):
                self.title_lines.append(s)
                self.titled.meta[self.title_key] = " ".join(self.title_lines)
                yield Marker(number, "title", s)
                return
            else:
                self.titled = None
        if kind is None or m is None:
            if s:
                yield from self._content(number, s)
            yield from self.outline.text(number, line)
            if s and self.outline.top.unit:
                self._list_items(s)
            return
        yield from self._structure(number, kind, m)
        if kind in ("ayat", "huruf"):
            yield Marker(number, kind, m[0])
            yield from self.outline.text(number, s[m.end() :].lstrip())
        else:
            yield Marker(number, kind, s)

    def _classify(self, s: str) -> tuple[str | None, re.Match[str] | None]:
        """What structure a stripped line opens, if any."""
        if not s:
            return None, None
        penjelasan = self.part == "penjelasan"
        tests: list[tuple[str, re.Match[str] | None]] = []
        if not penjelasan:
            tests += [("bab", BAB.fullmatch(s)), ("bagian", BAGIAN.fullmatch(s))]
            tests += [("paragraf", PARAGRAF.fullmatch(s))]
        tests += [("pasal", PASAL.fullmatch(s)), ("penjelasan", PENJELASAN.fullmatch(s))]
        if penjelasan:
            tests += [("umum", UMUM.fullmatch(s)), ("pdp", PASAL_DEMI_PASAL.fullmatch(s))]
        if any(n.level == PASAL_LEVEL for n in self.outline.stack):
            tests += [("ayat", AYAT.match(s) or AYAT_HEADER.fullmatch(s))]
            if self.by_huruf:
                tests += [("huruf", HURUF.match(s) or HURUF_HEADER.fullmatch(s))]
        return next(((k, m) for k, m in tests if m is not None), (None, None))

    def _structure(self, number: int, kind: str, m: re.Match[str]) -> Iterator[Chunk]:
        open_ = self.outline.open
        if kind in ("bab", "bagian", "paragraf"):
            level = {"bab": BAB_LEVEL, "bagian": BAGIAN_LEVEL, "paragraf": PARAGRAF_LEVEL}[kind]
            n = " ".join(m["n"].split())
            label = f"BAB {n}" if kind == "bab" else f"{kind.title()} {n}"
            yield from self._enter("body")
            yield from open_(
                level, slugify(label), label, {kind: n}, number, False, transparent=kind != "bab"
            )
            self.titled, self.title_key, self.title_lines = self.outline.top, f"{kind}_title", []
            if kind == "bab" and m["title"]:
                self.title_lines.append(m["title"])
                self.titled.meta[self.title_key] = m["title"]
        elif kind == "pasal":
            n = "".join(m["n"].split()).upper()
            if self.part == "penjelasan":
                yield from self._section("pasal-demi-pasal", number, again=False)
            else:
                yield from self._enter("body")
            meta: dict[str, JSON] = {"pasal": n}
            yield from open_(PASAL_LEVEL, f"pasal-{n.lower()}", f"Pasal {n}", meta, number, True)
        elif kind == "penjelasan":
            yield from self._enter("penjelasan")
            meta = {"part": "penjelasan"}
            yield from open_(PART, "penjelasan", "Penjelasan", meta, number, False)
        elif kind in ("umum", "pdp"):
            yield from self._section("umum" if kind == "umum" else "pasal-demi-pasal", number)
        elif kind == "ayat":
            n = m["n"]
            yield from open_(AYAT_LEVEL, f"ayat-{n}", f"Ayat ({n})", {"ayat": n}, number, True)
        else:
            n = m["n"]
            yield from open_(HURUF_LEVEL, f"huruf-{n}", f"Huruf {n}", {"huruf": n}, number, True)

    def _content(self, number: int, s: str) -> Iterator[Chunk]:
        """Text that starts the preamble, one of its clauses, or the closing formula."""
        if self.part in ("body", "penjelasan") and CLOSING.match(s):
            if self.part == "penjelasan":
                yield from self._section("penutup", number, again=False)
                return
            yield from self._enter("penutup")
            meta: dict[str, JSON] = {"part": "penutup"}
            yield from self.outline.open(PART, "penutup", "Penutup", meta, number, False)
        elif self.part == "pembukaan":
            if self.outline.top.level < PART:
                meta = {"part": "pembukaan"}
                yield from self.outline.open(PART, "pembukaan", "Pembukaan", meta, number, False)
            if m := CLAUSE.match(s):
                yield from self.outline.flush()
                self.outline.paragraph_meta = {"clause": slugify(m["n"])}

    def _enter(self, part: str) -> Iterator[Chunk]:
        if self.part != part or part == "penjelasan":
            self.part = part
            self.outline.paragraph_meta = {}
            yield from self.outline.close_to(PART)

    def _section(self, section: str, number: int, *, again: bool = True) -> Iterator[Chunk]:
        current = next((n for n in self.outline.stack if n.level == SECTION), None)
        if again or current is None or current.meta.get("section") != section:
            label = {"umum": "Umum", "penutup": "Penutup"}.get(section, "Pasal demi Pasal")
            meta: dict[str, JSON] = {"section": section}
            yield from self.outline.open(SECTION, section, label, meta, number, False)

    def _continues_title(self, s: str) -> bool:
        if not self.title_lines:
            return True
        return all(t.upper() == t for t in (*self.title_lines, s)) and any(c.isalpha() for c in s)

    def _list_items(self, s: str) -> None:
        m = HURUF.match(s) or HURUF_HEADER.fullmatch(s)
        key = "huruf"
        if m is None:
            m, key = ANGKA.match(s), "angka"
        if m is not None:
            items = self.outline.top.extra.setdefault(key, [])
            assert isinstance(items, list)
            items.append(m["n"] if key == "huruf" else int(m["n"]))
