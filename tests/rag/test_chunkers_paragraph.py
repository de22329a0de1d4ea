"""Plain text: blank-line paragraphs, bounded in size."""

from __future__ import annotations

from herd.rag.chunkers import ParagraphChunker


def chunks(lines: list[str], **options: int) -> list[tuple[str, str]]:
    return [(c.id, c.text) for c in ParagraphChunker(**options).chunk("doc", lines)]


def test_paragraphs_split_at_blank_and_whitespace_only_lines() -> None:
    assert chunks(["one\n", "  \n", "two a\n", "two b  \n", "\n", "\n", "three"]) == [
        ("doc/p1", "one"),
        ("doc/p2", "two a\ntwo b"),
        ("doc/p3", "three"),
    ]


def test_every_line_ending_gives_the_same_chunks() -> None:
    unix = chunks(["a\nb\n\nc\n"])
    assert chunks(["a\r\nb\r\n\r\nc\r\n"]) == chunks(["a\rb\r\rc\r"]) == unix
    assert chunks(["a", "b", "", "c"]) == unix  # lines without their endings


def test_a_run_of_lines_longer_than_max_chars_is_cut_at_a_line() -> None:
    lines = [f"sentence number {i}\n" for i in range(10)]
    got = chunks(lines, max_chars=60)
    assert "\n".join(text for _, text in got) == "".join(lines).strip()
    assert all(len(text) <= 60 for _, text in got)
    assert [i for i, _ in got] == [f"doc/p{n}" for n in range(1, len(got) + 1)]


def test_a_single_line_longer_than_max_chars_is_kept_whole() -> None:
    assert chunks(["x" * 100], max_chars=10) == [("doc/p1", "x" * 100)]


def test_an_empty_document_has_no_chunks() -> None:
    assert chunks([]) == chunks(["\n", "   \n"]) == []


def test_paragraph_metadata_and_breadcrumb() -> None:
    (chunk,) = ParagraphChunker().chunk("doc", ["\n", "hello\n", "world\n"])
    assert chunk.breadcrumb == "doc ¶1"
    assert chunk.metadata == {"paragraph": 1, "start_line": 2, "end_line": 3}
