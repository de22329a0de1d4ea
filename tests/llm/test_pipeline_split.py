"""A pipeline's split by a statute's structure (BAB, Pasal, ayat) and by scripture's
(book, chapter, verse): herd's own chunkers, grouped to a depth, each piece a range of
the document that a map reads."""

from __future__ import annotations

import pytest

from herd.cache.keys import normalize_document
from herd.errors import InvalidInput
from herd.llm.eval.pipeline import SplitStage, from_json
from herd.llm.eval.pipesubmit import submit_pipeline_texts
from herd.llm.eval.split import split
from herd.llm.eval.stageview import stage_rows
from herd.llm.eval.status import batch_status
from tests.llm.test_pipeline import NOTE, SUMMARY, app, drain  # noqa: F401

STATUTE = """UNDANG-UNDANG REPUBLIK INDONESIA
NOMOR 7 TAHUN 2025
TENTANG
PENGELOLAAN AIR BERSIH

Menimbang : bahwa air bersih adalah kebutuhan dasar;

MEMUTUSKAN:
Menetapkan : UNDANG-UNDANG TENTANG PENGELOLAAN AIR BERSIH.

BAB I
KETENTUAN UMUM

Pasal 1
Dalam Undang-Undang ini yang dimaksud dengan:
1. Air bersih adalah air yang layak diminum.
2. Pengelola adalah badan usaha milik daerah.

Pasal 2
(1) Setiap orang berhak atas air bersih.
(2) Pemerintah menjamin ketersediaan air bersih sebagaimana dimaksud pada ayat (1).

BAB II
PENGELOLAAN

Pasal 3
(1) Pengelola wajib:
a. menjaga mutu air; dan
b. melaporkan mutu air setiap bulan.
(2) Laporan sebagaimana dimaksud pada ayat (1) huruf b disampaikan kepada Menteri.

Pasal 3A
Pengelola dilarang menjual air yang tidak layak diminum.

Agar setiap orang mengetahuinya, memerintahkan pengundangan Undang-Undang ini.
"""

SCRIPTURE = """Genesis 1:1 In the beginning God created the heaven and the earth.
Genesis 1:2 And the earth was without form, and void.
Genesis 1:3 And God said, Let there be light: and there was light.
Genesis 2:1 Thus the heavens and the earth were finished.
Genesis 2:2 And on the seventh day God ended his work.
Exodus 1:1 Now these are the names of the children of Israel.
"""


def pieces(text: str, by: str, depth: int) -> list[tuple[str, str, str]]:
    """(id, section, text) of each piece; every piece is its range of the text."""
    text = normalize_document(text)
    out = split(text, SplitStage(name="s", by=by, depth=depth), 2000, [(0, len(text))])
    for p in out:
        a, b = p.loc["chars"]
        assert text[a:b] == p.text
    return [(p.loc["id"], p.loc["section"], p.text) for p in out]


def test_a_statute_splits_by_pasal_and_by_ayat():
    by_pasal = pieces(STATUTE, "pasal", 2)
    assert [(i, s) for i, s, _ in by_pasal] == [
        ("pembukaan", "Pembukaan"),
        ("bab-i/pasal-1", "BAB I › Pasal 1"),
        ("bab-i/pasal-2", "BAB I › Pasal 2"),
        ("bab-ii/pasal-3", "BAB II › Pasal 3"),
        ("bab-ii/pasal-3a", "BAB II › Pasal 3A"),
        ("penutup", "Penutup"),
    ]
    # A Pasal's piece holds its heading lines and all its ayat, huruf included.
    assert by_pasal[3][2].startswith("BAB II\nPENGELOLAAN\n\nPasal 3\n(1) Pengelola wajib:")
    assert by_pasal[3][2].endswith("huruf b disampaikan kepada Menteri.")
    # Nothing is lost: the pieces cover the whole law.
    assert "".join(t for *_, t in by_pasal).replace("\n", "") == normalize_document(
        STATUTE
    ).replace("\n", "")
    by_ayat = [i for i, *_ in pieces(STATUTE, "pasal", 3)]
    assert by_ayat[2:6] == ["bab-i/pasal-2/ayat-1", "bab-i/pasal-2/ayat-2",
                            "bab-ii/pasal-3/ayat-1", "bab-ii/pasal-3/ayat-2"]  # fmt: skip
    assert [i for i, *_ in pieces(STATUTE, "pasal", 1)] == ["pembukaan", "bab-i", "bab-ii",
                                                            "penutup"]  # fmt: skip


def test_scripture_splits_by_chapter_and_by_verse():
    chapters = pieces(SCRIPTURE, "verse", 2)
    assert [(i, s) for i, s, _ in chapters] == [
        ("genesis/1", "Genesis 1:1 – Genesis 1:3"),
        ("genesis/2", "Genesis 2:1 – Genesis 2:2"),
        ("exodus/1", "Exodus 1:1"),
    ]
    assert len(pieces(SCRIPTURE, "verse", 3)) == 6
    assert [i for i, *_ in pieces(SCRIPTURE, "verse", 1)] == ["genesis", "exodus"]


def test_a_split_kind_that_does_not_exist_is_refused_naming_the_choices():
    with pytest.raises(InvalidInput, match=r"stages\.0\.split\.by: Input should be .*'pasal'"):
        from_json({"defaults": {"model": "m"},
                   "stages": [{"name": "s", "kind": "split", "by": "ayat"},
                              {"name": "m", "kind": "map", "prompt": "x"}]})  # fmt: skip


async def test_a_statute_is_mapped_per_pasal_and_reduced(app, sim):  # noqa: F811
    pipe = from_json({
        "defaults": {"model": "sim-1"},
        "stages": [
            {"name": "pasal", "kind": "split", "by": "pasal"},
            {"name": "duties", "kind": "map", "prompt": "The duty it sets.", "schema": NOTE},
            {"name": "law", "kind": "reduce", "prompt": "Sum up the law.", "schema": SUMMARY},
        ],
    })  # fmt: skip
    report = await submit_pipeline_texts(app, pipe, {"uu-7-2025.txt": STATUTE}, batch="uu")
    assert report.queued == 6
    await drain(app)
    assert sim.stats()["calls"] == 6 + 1
    rows = [r async for r in stage_rows(app, "uu", "duties")]
    assert [r["loc"]["section"] for r in rows][1:3] == ["BAB I › Pasal 1", "BAB I › Pasal 2"]
    assert all(r["status"] == "done" for r in rows)
    assert (await batch_status(app, "uu")).done == 1
