"""Indonesian legislation: where each kind of line goes, and the ids it gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from herd.errors import HerdError
from herd.rag.chunkers import ChunkError, PasalChunker
from herd.rag.chunkers.pasal import doc_label

GOLDEN = Path(__file__).parent / "golden"


def chunks(text: str, **options: str) -> list[tuple[str, str]]:
    return [(c.id, c.text) for c in PasalChunker(**options).chunk("uu-1-2020", [text])]  # type: ignore[arg-type]


def test_a_pasal_without_ayat_is_the_chunk() -> None:
    text = "BAB I\nKETENTUAN UMUM\n\nPasal 1\nUndang-undang ini berlaku.\nPasal 2\n(1) Satu.\n"
    assert chunks(text) == [
        ("uu-1-2020/bab-i/pasal-1", "Undang-undang ini berlaku."),
        ("uu-1-2020/bab-i/pasal-2/ayat-1", "Satu."),
    ]


def test_a_law_without_bab_addresses_pasal_from_the_root() -> None:
    text = "Menimbang : bahwa perlu.\nPasal 1\n(1) Satu.\n(2) Dua.\nPasal 1A\nSisipan.\n"
    assert [i for i, _ in chunks(text)] == [
        "uu-1-2020/pembukaan/p1",
        "uu-1-2020/pasal-1/ayat-1",
        "uu-1-2020/pasal-1/ayat-2",
        "uu-1-2020/pasal-1a",
    ]


def test_lead_in_text_before_the_first_ayat_is_the_pasals_own_chunk() -> None:
    text = "Pasal 3\nDengan ketentuan:\n(1) Satu.\n"
    assert chunks(text) == [
        ("uu-1-2020/pasal-3", "Dengan ketentuan:"),
        ("uu-1-2020/pasal-3/ayat-1", "Satu."),
    ]


def test_structure_with_nothing_under_it_is_still_a_chunk() -> None:
    text = "BAB I\nKETENTUAN UMUM\nBAB II\nASAS DAN\nTUJUAN\nPasal 2\n"
    got = list(PasalChunker().chunk("uu-1-2020", [text]))
    assert [(c.id, c.text) for c in got] == [
        ("uu-1-2020/bab-i", ""),
        ("uu-1-2020/bab-ii/pasal-2", ""),
    ]
    assert got[0].metadata["bab_title"] == "KETENTUAN UMUM"
    assert got[1].metadata["bab_title"] == "ASAS DAN TUJUAN"  # a title over two lines


def test_a_bab_title_on_the_header_line() -> None:
    got = list(
        PasalChunker().chunk("uu-1-2020", ["BAB IV HUBUNGAN KERJA\n", "Pasal 5\n", "Isi.\n"])
    )
    assert [(c.id, c.metadata["bab_title"]) for c in got] == [
        ("uu-1-2020/bab-iv/pasal-5", "HUBUNGAN KERJA")
    ]


def test_bagian_and_paragraf_are_in_the_breadcrumb_but_not_the_id() -> None:
    text = "BAB IX\nHUBUNGAN KERJA\nBagian Kedua Belas\nUpah\n"
    text += "Paragraf 3\nUpah Minimum\nPasal 88A\n(1) Isi.\n"
    (chunk,) = PasalChunker().chunk("uu-13-2003", [text])
    assert chunk.id == "uu-13-2003/bab-ix/pasal-88a/ayat-1"
    assert chunk.breadcrumb == (
        "UU 13/2003 › BAB IX › Bagian Kedua Belas › Paragraf 3 › Pasal 88A › Ayat (1)"
    )
    assert {k: chunk.metadata[k] for k in ("bagian", "bagian_title", "paragraf_title")} == {
        "bagian": "Kedua Belas",
        "bagian_title": "Upah",
        "paragraf_title": "Upah Minimum",
    }


def test_a_repeated_pasal_keeps_both() -> None:
    text = "Pasal 5\n(1) Lama.\nPasal 5\n(1) Baru.\n"
    assert chunks(text) == [
        ("uu-1-2020/pasal-5/ayat-1", "Lama."),
        ("uu-1-2020/pasal-5/ayat-1~2", "Baru."),
    ]


def test_huruf_granularity_gives_each_letter_its_own_chunk() -> None:
    text = "Pasal 7\nPengusaha wajib:\na. membayar upah;\nb. memberi cuti; dan\nc. lain-lain.\n"
    assert chunks(text, granularity="huruf") == [
        ("uu-1-2020/pasal-7", "Pengusaha wajib:"),
        ("uu-1-2020/pasal-7/huruf-a", "membayar upah;"),
        ("uu-1-2020/pasal-7/huruf-b", "memberi cuti; dan"),
        ("uu-1-2020/pasal-7/huruf-c", "lain-lain."),
    ]
    (whole,) = PasalChunker().chunk("uu-1-2020", [text])
    assert whole.text.splitlines()[1] == "a. membayar upah;"
    assert whole.metadata["huruf"] == ["a", "b", "c"]


def test_a_reference_to_a_pasal_inside_a_sentence_is_not_a_header() -> None:
    text = "Pasal 1\nSebagaimana dimaksud dalam\nPasal 5 ayat (1) huruf a.\n"
    assert chunks(text) == [
        ("uu-1-2020/pasal-1", "Sebagaimana dimaksud dalam\nPasal 5 ayat (1) huruf a.")
    ]


def test_a_changed_ayat_changes_only_its_own_hash() -> None:
    lines = (GOLDEN / "uu-13-2003.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    before = {c.id: c.hash for c in PasalChunker().chunk("uu-13-2003", lines)}
    edited = [line.replace("kemampuan atau kecakapan", "kecakapan") for line in lines]
    after = {c.id: c.hash for c in PasalChunker().chunk("uu-13-2003", edited)}
    assert [i for i in before if before[i] != after[i]] == ["uu-13-2003/bab-iv/pasal-5/ayat-2"]


def test_an_unknown_granularity_is_refused() -> None:
    with pytest.raises(ChunkError, match="granularity") as info:
        PasalChunker(granularity="pasal")  # type: ignore[arg-type]
    assert isinstance(info.value, HerdError)


@pytest.mark.parametrize(
    ("doc_id", "label"),
    [("uu-13-2003", "UU 13/2003"), ("pp-35-2021", "PP 35/2021"), ("kuhp", "kuhp")],
)
def test_doc_label(doc_id: str, label: str) -> None:
    assert doc_label(doc_id) == label
