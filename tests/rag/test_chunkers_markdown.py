"""Markdown: headings open sections, fences are never split nor read as headings."""

from __future__ import annotations

from herd.rag.chunkers import MarkdownChunker


def chunks(text: str, **options: int) -> list[tuple[str, str]]:
    return [(c.id, c.text) for c in MarkdownChunker(**options).chunk("doc", [text])]


def test_an_unclosed_fence_runs_to_the_end_and_hides_headings() -> None:
    text = "# A\n```\n# not a heading\n\nstill code\n"
    assert chunks(text) == [("doc/a/p1", "```\n# not a heading\n\nstill code")]


def test_a_longer_fence_holds_a_shorter_one() -> None:
    text = "````md\n```\n# x\n```\n````\n## After\ntext\n"
    assert chunks(text) == [
        ("doc/p1", "````md\n```\n# x\n```\n````"),
        ("doc/after/p1", "text"),
    ]


def test_heading_levels_nest_and_unnest() -> None:
    text = "# A\n### C\nc\n## D\nd\n# E\ne\n"
    got = [(c.id, c.breadcrumb) for c in MarkdownChunker().chunk("doc", [text])]
    assert got == [("doc/a/c/p1", "A › C"), ("doc/a/d/p1", "A › D"), ("doc/e/p1", "E")]


def test_closing_hashes_empty_headings_and_hashtags() -> None:
    text = "## Title ##\nbody\n#\nunder an empty heading\n#tag line\n"
    got = list(MarkdownChunker().chunk("doc", [text]))
    assert [(c.id, c.text) for c in got] == [
        ("doc/title/p1", "body"),
        ("doc/untitled/p1", "under an empty heading\n#tag line"),
    ]
    assert got[1].metadata["headings"] == [""]


def test_long_paragraphs_are_cut_at_lines_but_code_is_not() -> None:
    text = "aaaa aaaa\nbbbb bbbb\ncccc\n\n```\n" + "code line\n" * 5 + "```\n"
    got = chunks(text, max_chars=15)
    assert got == [
        ("doc/p1", "aaaa aaaa"),
        ("doc/p2", "bbbb bbbb\ncccc"),
        ("doc/p3", "```\n" + "code line\n" * 5 + "```"),
    ]


def test_code_blocks_say_their_language() -> None:
    (code,) = MarkdownChunker().chunk("doc", ["```python title=x\n", "pass\n", "```\n"])
    assert code.metadata["kind"] == "code" and code.metadata["language"] == "python"
