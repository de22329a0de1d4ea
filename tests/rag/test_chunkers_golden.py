"""Golden files: a small real-looking input per format and every chunk it must give.

Each ``golden/<input>`` has a ``golden/<case>.expected.json`` beside it with the
full list of chunks (id, breadcrumb, text, metadata; hashes are checked apart,
since a version bump changes them all). After a deliberate change, rewrite the
expected files with ``HERD_UPDATE_GOLDEN=1 python -m pytest tests/rag`` and read
the diff before committing it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from herd.rag.chunkers import Chunk, chunk_file, get_chunker
from herd.rag.chunkers.base import chunk_hash

GOLDEN = Path(__file__).parent / "golden"

# case -> (input file, format, doc id, chunker options)
CASES: dict[str, tuple[str, str, str, dict[str, Any]]] = {
    "kjv-references": ("kjv-references.txt", "verse", "kjv", {}),
    "kjv-chapters": ("kjv-chapters.txt", "verse", "kjv", {}),
    "kjv-gutenberg": ("kjv-gutenberg.txt", "verse", "kjv", {}),
    "uu-13-2003-ayat": ("uu-13-2003.txt", "pasal", "uu-13-2003", {}),
    "uu-13-2003-huruf": ("uu-13-2003.txt", "pasal", "uu-13-2003", {"granularity": "huruf"}),
    "guide": ("guide.md", "markdown", "guide", {}),
    "meditations": ("meditations.txt", "paragraph", "meditations", {}),
    "analects": ("analects.jsonl", "jsonl", "analects", {}),
}


def _as_json(chunk: Chunk) -> dict[str, Any]:
    return {
        "id": chunk.id,
        "breadcrumb": chunk.breadcrumb,
        "text": chunk.text,
        "metadata": chunk.metadata,
    }


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case: str) -> None:
    source, fmt, doc_id, options = CASES[case]
    chunker = get_chunker(fmt, **options)
    with (GOLDEN / source).open(encoding="utf-8", newline="") as file:
        chunks = list(chunker.chunk(doc_id, file))
    got = [_as_json(c) for c in chunks]
    expected_file = GOLDEN / f"{case}.expected.json"
    if os.environ.get("HERD_UPDATE_GOLDEN"):
        text = json.dumps(got, ensure_ascii=False, indent=1)
        expected_file.write_text(text + "\n", encoding="utf-8")
    expected = json.loads(expected_file.read_text(encoding="utf-8"))
    assert [c["id"] for c in got] == [c["id"] for c in expected]
    assert got == expected
    for c in chunks:
        assert c.hash == chunk_hash(c.text, c.metadata, chunker.name, chunker.version)


@pytest.mark.parametrize("case", sorted(CASES))
def test_chunk_file_detects_the_format_of_every_golden_input(case: str) -> None:
    source, fmt, doc_id, options = CASES[case]
    direct = list(get_chunker(fmt, **options).chunk(doc_id, (GOLDEN / source).open()))
    assert list(chunk_file(GOLDEN / source, doc_id=doc_id, **options)) == direct


def test_the_ids_the_issue_names() -> None:
    """The examples of the issue, produced from the golden inputs."""
    ids: set[str] = set()
    for case in ("kjv-references", "uu-13-2003-ayat", "uu-13-2003-huruf", "guide", "meditations"):
        source, fmt, doc_id, options = CASES[case]
        ids |= {c.id for c in get_chunker(fmt, **options).chunk(doc_id, (GOLDEN / source).open())}
    assert {
        "kjv/genesis/1/1",
        "kjv/1-samuel/3/4",
        "kjv/song-of-solomon/2/1",
        "uu-13-2003/bab-iv/pasal-5/ayat-2",
        "uu-13-2003/bab-iv/pasal-5a/ayat-1",
        "uu-13-2003/bab-iv/pasal-5/ayat-2/huruf-a",
        "uu-13-2003/pembukaan/p1",
        "uu-13-2003/penjelasan/umum/p1",
        "uu-13-2003/penjelasan/pasal-demi-pasal/pasal-5a",
        "uu-13-2003/penjelasan/pasal-demi-pasal/pasal-5/ayat-1",
        "guide/guide/install/linux/p1",
        "meditations/p12",
    } <= ids
