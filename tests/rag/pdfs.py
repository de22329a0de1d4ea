"""PDFs made in the test: pages of text lines (Helvetica), and an outline if asked."""

from __future__ import annotations

import io

from pypdf import PdfReader, PdfWriter


def _escaped(line: str) -> bytes:
    return line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)").encode("latin-1")


def make_pdf(pages: list[list[str]], outline: list[tuple[str, int, int]] = ()) -> bytes:
    """One page per list of lines, top to bottom ("" leaves a gap: a paragraph break).

    ``outline``: (title, page index, depth from 1) bookmarks, as a manual has.
    """
    n = len(pages)
    objects: list[bytes] = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [%s] /Count %d >>"
        % (b" ".join(b"%d 0 R" % (4 + 2 * i) for i in range(n)), n),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
    ]
    for i, lines in enumerate(pages):
        ops, y = [], 750
        for line in lines:
            if line:
                ops.append(b"BT /F1 11 Tf 72 %d Td (%s) Tj ET" % (y, _escaped(line)))
            y -= 14
        stream = b"\n".join(ops)
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R"
            b" /Resources << /Font << /F1 3 0 R >> >> >>" % (5 + 2 * i)
        )
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
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
    if not outline:
        return bytes(out)
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(bytes(out))))
    parents: dict[int, object] = {}
    for title, page, depth in outline:
        parents[depth] = writer.add_outline_item(
            title=title, page_number=page, parent=parents.get(depth - 1)
        )
    buffer = io.BytesIO()
    writer.write(buffer)
    return buffer.getvalue()
