"""Queries that name a unit: ``John 3:16``, ``Pasal 5 ayat (2)``, ``kjv/genesis/1/1``.

``patterns(query)`` turns such a query into SQL LIKE patterns over chunk ids, in
the order their matches should come (``RagStore.units`` finds them), so that the
unit a reader cites comes first whatever the ranking. Ids are the chunkers'
(``herd.rag.chunkers.verse`` and ``.pasal``): a verse is ``DOC/BOOK/C/V`` under any
document, an ayat ``DOC[/bab-N]/pasal-N/ayat-N[/huruf-x]``; the elucidation
(``…/penjelasan/…``) of a Pasal is left out unless the query asks for it.
"""

from __future__ import annotations

import re

from herd.rag.chunkers import verse
from herd.rag.chunkers.base import slugify

_ID = re.compile(r"[^\s/%_\\]+(?:/[^\s/%_\\]+)+")
_PASAL = re.compile(
    r"(?P<penjelasan>penjelasan\s+)?pasal\s+(?P<pasal>\d+\s*[a-z]?)"
    r"(?:\s+ayat\s*\(?\s*(?P<ayat>\d+[a-z]?)\s*\)?)?"
    r"(?:\s+huruf\s+(?P<huruf>[a-z])\b)?"
    r"(?:\s+(?:uu|undang-undang)\s*(?:no\.?|nomor)?\s*(?P<no>\d+[a-z]?)"
    r"\s*(?:/|tahun)\s*(?P<year>\d{4}))?",
    re.IGNORECASE,
)
_TRAILING = " \t.,;!?"


def patterns(query: str) -> list[str]:
    """LIKE patterns of the units the query names, best first; [] for any other query."""
    text = query.strip().rstrip(_TRAILING)
    if _ID.fullmatch(text):
        return [text.lower()]
    if (m := verse.REFERENCE.fullmatch(text)) and not text[:1].islower():
        book = slugify(" ".join(m["book"].split()))
        unit = f"{m['chapter']}/{m['verse']}" + (f"-{m['last']}" if m["last"] else "")
        return [f"%/{book}/{unit}"]
    if m := _PASAL.fullmatch(text):
        doc = f"uu-{m['no'].lower()}-{m['year']}" if m["no"] else "%"
        unit = "pasal-" + re.sub(r"\s+", "", m["pasal"]).lower()
        tail = [unit]
        if m["ayat"]:
            tail.append(f"ayat-{m['ayat'].lower()}")
        if m["huruf"]:
            tail.append(f"huruf-{m['huruf'].lower()}")
        suffix = "/".join(tail)
        if m["penjelasan"]:
            return [f"{doc}/penjelasan/pasal-demi-pasal/{suffix}"]
        found = [f"{doc}/bab-%/{suffix}", f"{doc}/{suffix}"]
        if not m["ayat"]:  # a Pasal with ayat has no unit of its own: its first ayat
            found += [f"{doc}/bab-%/{suffix}/ayat-1", f"{doc}/{suffix}/ayat-1"]
        return found
    return []


def is_elucidation(chunk_id: str) -> bool:
    return "/penjelasan/" in chunk_id
