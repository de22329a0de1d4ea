"""Reading documents to evaluate: text, Markdown and PDF, with errors that say where."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from herd.errors import HerdError
from herd.rag.sources import SourceError, document_text

SUFFIXES = (".txt", ".md", ".markdown", ".pdf")
MAX_BYTES = 64 * 1024 * 1024  # far beyond any model's context; a bigger file is a mistake


class DocumentError(HerdError):
    """The document cannot be read."""


def find_documents(paths: Iterable[Path]) -> Iterator[Path]:
    """Files as given, and the supported files below any directory, in a stable order."""
    for path in paths:
        if path.is_dir():
            yield from sorted(
                p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES
            )
        elif path.exists():
            yield path
        else:
            raise DocumentError(f"{path}: no such file or directory")


def read_document(path: Path) -> str:
    """The document's text; DocumentError names the file and what is wrong."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise DocumentError(f"{path}: {exc.strerror}") from None
    if size > MAX_BYTES:
        raise DocumentError(f"{path}: {size:,} bytes is more than the {MAX_BYTES:,} allowed")
    if path.suffix.lower() == ".pdf":
        text = _pdf_text(path)
    else:
        data = path.read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = data[: exc.start].count(b"\n") + 1
            raise DocumentError(
                f"{path}: not valid UTF-8 at byte {exc.start} (line {line}): {exc.reason}"
            ) from None
        text = text.removeprefix("\ufeff")
    if not text.strip():
        raise DocumentError(
            f"{path}: the document is empty"
            + (" (no text layer?)" if path.suffix.lower() == ".pdf" else "")
        )
    return text


def _pdf_text(path: Path) -> str:
    """The one PDF reader herd has (``herd.rag.sources``), as ``herd ingest`` uses it."""
    try:
        return document_text(path)
    except SourceError as exc:
        raise DocumentError(f"{path}: {exc}") from None
