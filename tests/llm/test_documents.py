"""Reading documents: clear errors that name the file and the place."""

from __future__ import annotations

import pytest

from herd.llm import documents
from herd.llm.documents import DocumentError, find_documents, read_document


def minimal_pdf(text: str) -> bytes:
    """A one-page PDF with a text layer, written by hand (no PDF writer needed)."""
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R"
        b" /Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1, xref)  # fmt: skip
    return bytes(out)


def test_text_markdown_and_pdf_are_read(tmp_path):
    (tmp_path / "a.txt").write_text("\ufeffplain text")
    (tmp_path / "b.md").write_text("# Title\n\nBody")
    (tmp_path / "c.pdf").write_bytes(minimal_pdf("Fenced leases in a PDF"))
    (tmp_path / "ignored.bin").write_bytes(b"\x00")
    files = list(find_documents([tmp_path]))
    assert [f.name for f in files] == ["a.txt", "b.md", "c.pdf"]
    assert read_document(files[0]) == "plain text"  # the BOM is not content
    assert read_document(files[1]).startswith("# Title")
    assert "Fenced leases in a PDF" in read_document(files[2])


def test_bad_documents_say_what_and_where(tmp_path, monkeypatch):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"line one\nline two \xc3\x28 broken")
    with pytest.raises(DocumentError, match=r"bad.txt: not valid UTF-8 at byte 18 \(line 2\)"):
        read_document(bad)
    empty = tmp_path / "empty.md"
    empty.write_text("\n  \n")
    with pytest.raises(DocumentError, match="empty.md: the document is empty"):
        read_document(empty)
    fake = tmp_path / "fake.pdf"
    fake.write_bytes(b"not a pdf at all")
    with pytest.raises(DocumentError, match="fake.pdf: not a readable PDF"):
        read_document(fake)
    with pytest.raises(DocumentError, match="missing.txt: no such file"):
        list(find_documents([tmp_path / "missing.txt"]))
    monkeypatch.setattr(documents, "MAX_BYTES", 10)
    big = tmp_path / "big.txt"
    big.write_text("x" * 11)
    with pytest.raises(DocumentError, match="big.txt: 11 bytes is more than the 10 allowed"):
        read_document(big)
