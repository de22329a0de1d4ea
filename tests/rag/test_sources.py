"""Readers of PDF and HTML files: text, structure and pages for the chunkers."""

from __future__ import annotations

import pytest

from herd.llm.documents import read_document
from herd.rag import sources
from herd.rag.sources import SourceError, chunk_source, kind_of
from tests.rag.pdfs import make_pdf

STATUTE = [
    [
        "UNDANG-UNDANG REPUBLIK INDONESIA",
        "NOMOR 7 TAHUN 2030",
        "",
        "BAB I",
        "KETENTUAN UMUM",
        "",
        "Pasal 1",
        "(1) Setiap pekerja berhak atas upah yang layak.",
        "(2) Upah dibayar paling lambat pada akhir bulan.",
        "",
        "- 1 -",
    ],
    [
        "Pasal 2",
        "(1) Pengusaha wajib memberikan waktu istirahat",
        "kepada pekerja setiap minggu.",
        "",
        "- 2 -",
    ],
    [
        "BAB II",
        "KETENTUAN PENUTUP",
        "",
        "Pasal 3",
        "Undang-Undang ini mulai berlaku pada tanggal diundangkan.",
        "",
        "- 3 -",
    ],
]


def test_a_statute_published_as_pdf_is_chunked_by_ayat_with_its_pages(tmp_path):
    path = tmp_path / "UU_7_2030.pdf"
    path.write_bytes(make_pdf(STATUTE))
    chunks = {c.id: c for c in chunk_source(path)}
    ayat = chunks["uu-7-2030/bab-i/pasal-1/ayat-2"]
    assert ayat.text == "Upah dibayar paling lambat pada akhir bulan."
    assert (ayat.metadata["page"], ayat.metadata["page_end"]) == (1, 1)
    rest = chunks["uu-7-2030/bab-i/pasal-2/ayat-1"]
    assert rest.text == "Pengusaha wajib memberikan waktu istirahat\nkepada pekerja setiap minggu."
    assert rest.metadata["page"] == 2
    assert chunks["uu-7-2030/bab-ii/pasal-3"].metadata["page"] == 3
    # The page numbers at the foot of each page are furniture, not text of an ayat.
    assert not any("- 2 -" in c.text or "- 3 -" in c.text for c in chunks.values())


def test_pages_are_where_a_unit_sits_not_what_it_is(tmp_path):
    one, two = tmp_path / "a" / "UU_7_2030.pdf", tmp_path / "b" / "UU_7_2030.pdf"
    one.parent.mkdir()
    two.parent.mkdir()
    one.write_bytes(make_pdf(STATUTE))
    # The same law, its first page split in two: every later unit moves a page on.
    two.write_bytes(make_pdf([STATUTE[0][:6], STATUTE[0][6:], *STATUTE[1:]]))
    before = {c.id: c for c in chunk_source(one)}
    after = {c.id: c for c in chunk_source(two)}
    moved = "uu-7-2030/bab-ii/pasal-3"
    assert (before[moved].metadata["page"], after[moved].metadata["page"]) == (3, 4)
    assert before[moved].hash == after[moved].hash  # not embedded again for moving


def test_a_manual_as_pdf_is_chunked_by_the_sections_of_its_outline(tmp_path):
    path = tmp_path / "manual.pdf"
    pages = [
        ["Herd manual", "", "1. Installing", "Run pip install herd.", "", "Then herd migrate."],
        ["2. Ingesting", "Give herd ingest a folder.", "It reads PDF and HTML."],
    ]
    path.write_bytes(make_pdf(pages, [("1. Installing", 0, 1), ("2. Ingesting", 1, 1)]))
    chunks = {c.id: c for c in chunk_source(path, place="docs/manual")}
    second = chunks["docs/manual/1-installing/p2"]
    assert (second.text, second.breadcrumb, second.metadata["page"]) == (
        "Then herd migrate.",
        "1. Installing",
        1,
    )
    assert chunks["docs/manual/2-ingesting/p1"].metadata["page"] == 2


def test_html_headings_become_sections_and_scripts_are_dropped(tmp_path):
    path = tmp_path / "guide.html"
    path.write_text(
        "<!doctype html><html><head><title>t</title><style>p{}</style></head><body>"
        "<h1>Guide</h1><p>Welcome &amp; hello.</p><script>var x = 1;</script>"
        "<h2>Install</h2><p>Run the <b>installer</b>.<br>Then wait.</p>"
        "<ul><li>one</li><li>two</li></ul><pre>herd ingest docs/\n  --watch</pre>"
        "</body></html>"
    )
    chunks = {c.id: c for c in chunk_source(path, place="guide")}
    assert chunks["guide/guide/p1"].text == "Welcome & hello."
    install = [c for i, c in chunks.items() if i.startswith("guide/guide/install/")]
    assert [c.text for c in install] == [
        "Run the installer.\nThen wait.",
        "- one",
        "- two",
        "```\nherd ingest docs/\n  --watch\n```",
    ]
    assert install[0].breadcrumb == "Guide › Install"
    assert not any("var x" in c.text or "p{}" in c.text for c in chunks.values())
    assert "page" not in install[0].metadata


def test_the_kind_is_sniffed_when_the_suffix_says_nothing(tmp_path):
    (tmp_path / "scan").write_bytes(make_pdf([["Text of a PDF without a suffix."]]))
    (tmp_path / "page").write_text("  <!DOCTYPE html><p>hi</p>")
    (tmp_path / "notes").write_text("plain words")
    assert [kind_of(tmp_path / n) for n in ("scan", "page", "notes")] == ["pdf", "html", "text"]
    assert [c.text for c in chunk_source(tmp_path / "scan")] == ["Text of a PDF without a suffix."]


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("broken.pdf", b"%PDF-1.4 and then nothing", "not a readable PDF"),
        ("blank.pdf", make_pdf([[]]), "the PDF has no text layer"),
        ("empty.html", b"<html><body><script>1</script></body></html>", "has no text"),
        ("latin.html", b"<p>caf\xe9</p>", "not utf-8-sig text at byte 6"),
    ],
)
def test_a_file_that_cannot_be_read_says_why(tmp_path, name, data, message):
    (tmp_path / name).write_bytes(data)
    with pytest.raises(SourceError, match=message):
        list(chunk_source(tmp_path / name))


def test_a_declared_charset_is_honoured(tmp_path):
    (tmp_path / "latin.html").write_bytes(b'<meta charset="iso-8859-1"><p>caf\xe9</p>')
    assert [c.text for c in chunk_source(tmp_path / "latin.html")] == ["café"]


def test_eval_documents_read_pdfs_through_the_same_reader(tmp_path, monkeypatch):
    path = tmp_path / "doc.pdf"
    path.write_bytes(make_pdf([["Fenced leases"], ["second page"]]))
    assert read_document(path) == "Fenced leases\n\nsecond page"
    seen = []
    real = sources.PdfSource.page_texts

    def spy(self, p, **kw):
        seen.append(p)
        return real(self, p, **kw)

    monkeypatch.setattr(sources.PdfSource, "page_texts", spy)
    read_document(path)
    assert seen == [path]
